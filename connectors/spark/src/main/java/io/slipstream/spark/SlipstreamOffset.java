// SlipstreamOffset: a position in one Slipstream stream: `{"epoch":"<daemon run id>","seq":N}`,
// N = the seq of the next line to read (so a batch (start, end] reads seqs start.seq..end.seq-1).
// Not for: deciding what a changed epoch means (SlipstreamMicroBatchStream does).
package io.slipstream.spark;

import com.fasterxml.jackson.databind.JsonNode;
import org.apache.spark.sql.connector.read.streaming.Offset;
import org.apache.spark.sql.connector.read.streaming.PartitionOffset;

import java.io.IOException;
import java.util.Objects;

public final class SlipstreamOffset extends Offset implements PartitionOffset {
    public final String epoch;
    public final long seq;

    public SlipstreamOffset(String epoch, long seq) {
        this.epoch = Objects.requireNonNull(epoch);
        this.seq = seq;
    }

    @Override
    public String json() {
        // Epochs are hex ids (the daemon checks), so no escaping is needed.
        return "{\"epoch\":\"" + epoch + "\",\"seq\":" + seq + "}";
    }

    public static SlipstreamOffset fromJson(String json) {
        try {
            JsonNode v = SlipstreamClient.JSON.readTree(json);
            String epoch = v.path("epoch").asText("");
            if (epoch.isEmpty() || !v.path("seq").canConvertToLong()) {
                throw new IllegalArgumentException("slipstream: bad offset " + json + ": expected {\"epoch\":\"…\",\"seq\":N}");
            }
            return new SlipstreamOffset(epoch, v.path("seq").asLong());
        } catch (IOException e) {
            throw new IllegalArgumentException("slipstream: bad offset " + json, e);
        }
    }

    @Override
    public boolean equals(Object o) {
        return o instanceof SlipstreamOffset other && other.epoch.equals(epoch) && other.seq == seq;
    }

    @Override
    public int hashCode() {
        return Objects.hash(epoch, seq);
    }
}
