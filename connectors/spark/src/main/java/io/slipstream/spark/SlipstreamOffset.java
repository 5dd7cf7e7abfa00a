// SlipstreamOffset: the source's offset, one position per endpoint (ingest node):
//   {"h1:7100":{"epoch":"<daemon run id>","seq":N},"h2:7100":{...}}
// N = the seq of the next line to read (so a batch (start, end] reads seqs start.seq..end.seq-1
// of each endpoint). Keys are the endpoints as the `endpoint(s)` option names them, in sorted
// order (Spark compares offsets by their JSON). An endpoint with no entry has no position yet
// (never reached): it starts at its earliest retained line when first reached.
// The single-endpoint form of earlier versions, {"epoch":…,"seq":N}, is still read (old
// checkpoints, startingOffsets) when the query names exactly one endpoint.
// Not for: deciding what a changed epoch means (SlipstreamMicroBatchStream does).
package io.slipstream.spark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import org.apache.spark.sql.connector.read.streaming.Offset;
import org.apache.spark.sql.connector.read.streaming.PartitionOffset;

import java.io.IOException;
import java.io.Serializable;
import java.util.Collections;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.SortedMap;
import java.util.TreeMap;

public final class SlipstreamOffset extends Offset {
    /** A position in one endpoint's stream: its run (epoch) and the next seq to read. */
    public record Position(String epoch, long seq) implements Serializable {
        public Position {
            if (epoch == null || epoch.isEmpty()) {
                throw new IllegalArgumentException("slipstream: offset position without an epoch");
            }
        }
    }

    /** One endpoint's position as a continuous reader reports it (position null: not reached yet). */
    public record EndpointOffset(String endpoint, Position position) implements PartitionOffset {}

    /** Endpoint key -> position, sorted by key. */
    public final SortedMap<String, Position> positions;

    public SlipstreamOffset(Map<String, Position> positions) {
        this.positions = Collections.unmodifiableSortedMap(new TreeMap<>(positions));
    }

    public Position get(String endpoint) {
        return positions.get(endpoint);
    }

    @Override
    public String json() {
        ObjectNode o = SlipstreamClient.JSON.createObjectNode();
        for (Map.Entry<String, Position> e : positions.entrySet()) {
            ObjectNode p = o.putObject(e.getKey());
            p.put("epoch", e.getValue().epoch());
            p.put("seq", e.getValue().seq());
        }
        return o.toString();
    }

    /**
     * Parses `json` for a query reading `endpoints` (their keys). The old single-endpoint form
     * is accepted when there is exactly one endpoint.
     */
    public static SlipstreamOffset fromJson(String json, List<String> endpoints) {
        JsonNode v;
        try {
            v = SlipstreamClient.JSON.readTree(json);
        } catch (IOException e) {
            throw new IllegalArgumentException("slipstream: bad offset " + json, e);
        }
        if (v == null || !v.isObject()) {
            throw new IllegalArgumentException("slipstream: bad offset " + json + ": expected {\"host:port\":{\"epoch\":\"…\",\"seq\":N},…}");
        }
        TreeMap<String, Position> m = new TreeMap<>();
        if (v.has("epoch") || v.has("seq")) {
            if (endpoints.size() != 1) {
                throw new IllegalArgumentException("slipstream: offset " + json + " is the single-endpoint form; with "
                        + endpoints.size() + " endpoints give {\"host:port\":{\"epoch\":\"…\",\"seq\":N},…}");
            }
            m.put(endpoints.get(0), position(v, json));
            return new SlipstreamOffset(m);
        }
        for (Iterator<Map.Entry<String, JsonNode>> it = v.fields(); it.hasNext();) {
            Map.Entry<String, JsonNode> e = it.next();
            m.put(e.getKey(), position(e.getValue(), json));
        }
        return new SlipstreamOffset(m);
    }

    private static Position position(JsonNode v, String json) {
        String epoch = v.path("epoch").asText("");
        if (epoch.isEmpty() || !v.path("seq").canConvertToLong() || v.path("seq").asLong() < 0) {
            throw new IllegalArgumentException("slipstream: bad offset " + json + ": expected {\"epoch\":\"…\",\"seq\":N} per endpoint");
        }
        return new Position(epoch, v.path("seq").asLong());
    }

    @Override
    public boolean equals(Object o) {
        return o instanceof SlipstreamOffset other && other.positions.equals(positions);
    }

    @Override
    public int hashCode() {
        return positions.hashCode();
    }
}
