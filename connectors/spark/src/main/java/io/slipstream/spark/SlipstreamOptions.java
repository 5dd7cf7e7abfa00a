// SlipstreamOptions: the source's options, parsed and checked once (serializable, so the same
// object travels to executors inside input partitions).
//   endpoint          host:port of the daemon's [results] tcp_port (required)
//   stream            the [[stream]] name (required)
//   type              wordcount | changepoint | window | filtered (or the operator names
//                     aggregate / filter); default: asked from the daemon (INFO)
//   startingOffsets   latest (default, like Kafka) | earliest (all still retained) |
//                     {"epoch":"…","seq":N}
//   failOnDataLoss    true (default): fail the query when results it needs are no longer
//                     retained; false: log, skip to the oldest retained line and go on
//   connectTimeoutMs  5000; readTimeoutMs 30000 (range reads)
//   maxUnavailableMs  60000: how long the daemon may be unreachable (restart) before the
//                     query fails; meanwhile batches are empty
// Not for: talking to the daemon.
package io.slipstream.spark;

import org.apache.spark.sql.util.CaseInsensitiveStringMap;

import java.io.Serializable;
import java.util.Map;

public final class SlipstreamOptions implements Serializable {
    public final SlipstreamClient.Endpoint endpoint;
    public final String stream;
    /** Null: ask the daemon. */
    public final String type;
    public final String startingOffsets;
    public final boolean failOnDataLoss;
    public final long maxUnavailableMs;

    public SlipstreamOptions(Map<String, String> raw) {
        CaseInsensitiveStringMap o = raw instanceof CaseInsensitiveStringMap c ? c : new CaseInsensitiveStringMap(raw);
        int connect = intOpt(o, "connectTimeoutMs", 5000, 1, 600_000);
        int read = intOpt(o, "readTimeoutMs", 30_000, 1, 3_600_000);
        endpoint = SlipstreamClient.Endpoint.parse(o.get("endpoint"), connect, read);
        stream = o.get("stream");
        if (stream == null || stream.isBlank() || stream.contains("\n") || stream.contains(",")) {
            throw new IllegalArgumentException("slipstream: option \"stream\" (the [[stream]] name) is required and must be one name");
        }
        String t = o.get("type");
        type = t == null ? null : ResultType.fromName(t).lineType;
        startingOffsets = o.getOrDefault("startingOffsets", "latest").trim();
        if (!startingOffsets.equalsIgnoreCase("latest") && !startingOffsets.equalsIgnoreCase("earliest")) {
            SlipstreamOffset.fromJson(startingOffsets); // throws a clear error if malformed
        }
        failOnDataLoss = !"false".equalsIgnoreCase(o.getOrDefault("failOnDataLoss", "true").trim());
        maxUnavailableMs = intOpt(o, "maxUnavailableMs", 60_000, 0, Integer.MAX_VALUE);
    }

    private static int intOpt(CaseInsensitiveStringMap o, String key, int dflt, int min, int max) {
        String v = o.get(key);
        if (v == null) {
            return dflt;
        }
        try {
            int n = Integer.parseInt(v.trim());
            if (n < min || n > max) {
                throw new NumberFormatException();
            }
            return n;
        } catch (NumberFormatException e) {
            throw new IllegalArgumentException("slipstream: option " + key + " = \"" + v + "\": expected " + min + ".." + max);
        }
    }

    /** The result type: the option, or the stream's operator from INFO (clear error if no such stream). */
    public ResultType resolveType() {
        if (type != null) {
            return ResultType.fromName(type);
        }
        SlipstreamClient.Info info;
        try {
            info = SlipstreamClient.info(endpoint);
        } catch (java.io.IOException e) {
            throw new IllegalStateException("slipstream: " + e.getMessage()
                    + " (to define the query without the daemon, set option \"type\")", e);
        }
        SlipstreamClient.StreamInfo s = info.stream(stream);
        if (s == null) {
            throw new IllegalArgumentException("slipstream: Slipstream at " + endpoint + " has no stream \"" + stream
                    + "\" (its streams: " + (info.streams().isEmpty() ? "none" : info.names()) + ")");
        }
        return ResultType.ofOperator(s.operator());
    }
}
