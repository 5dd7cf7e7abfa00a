// SlipstreamOptions: the source's options, parsed and checked once (serializable, so the same
// object travels to executors inside input partitions).
//   endpoint          host:port of the daemon's [results] tcp_port
//   endpoints         h1:port,h2:port,...: several daemons (ingest nodes), one input partition
//                     each; exactly one of endpoint / endpoints is required
//   stream            the [[stream]] name (required)
//   type              wordcount | changepoint | window | filtered (or the operator names
//                     aggregate / filter); default: asked from the daemon (INFO)
//   startingOffsets   latest (default, like Kafka) | earliest (all still retained) |
//                     an offset JSON (SlipstreamOffset)
//   failOnDataLoss    true (default): fail the query when results it needs are no longer
//                     retained; false: log, skip to the oldest retained line and go on
//   connectTimeoutMs  5000; readTimeoutMs 30000 (range reads)
//   maxUnavailableMs  60000: how long an endpoint may be unreachable (restart) before the
//                     query fails; meanwhile its part of each batch is empty
// Not for: talking to the daemon.
package io.slipstream.spark;

import org.apache.spark.sql.util.CaseInsensitiveStringMap;

import java.io.Serializable;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Map;

public final class SlipstreamOptions implements Serializable {
    /** Most endpoints one query reads (a limit on threads and partitions per trigger). */
    static final int ENDPOINTS_MAX = 256;

    /** The daemons to read, in the order the option names them; keys are Endpoint.toString(). */
    public final List<SlipstreamClient.Endpoint> endpoints;
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
        endpoints = parseEndpoints(o.get("endpoint"), o.get("endpoints"), connect, read);
        stream = o.get("stream");
        if (stream == null || stream.isBlank() || stream.contains("\n") || stream.contains(",")) {
            throw new IllegalArgumentException("slipstream: option \"stream\" (the [[stream]] name) is required and must be one name");
        }
        String t = o.get("type");
        type = t == null ? null : ResultType.fromName(t).lineType;
        startingOffsets = o.getOrDefault("startingOffsets", "latest").trim();
        if (!startingOffsets.equalsIgnoreCase("latest") && !startingOffsets.equalsIgnoreCase("earliest")) {
            SlipstreamOffset.fromJson(startingOffsets, keys()); // throws a clear error if malformed
        }
        failOnDataLoss = !"false".equalsIgnoreCase(o.getOrDefault("failOnDataLoss", "true").trim());
        maxUnavailableMs = intOpt(o, "maxUnavailableMs", 60_000, 0, Integer.MAX_VALUE);
    }

    private static List<SlipstreamClient.Endpoint> parseEndpoints(String one, String many, int connect, int read) {
        if (one != null && many != null) {
            throw new IllegalArgumentException("slipstream: give either option \"endpoint\" or \"endpoints\", not both");
        }
        if (many == null) {
            return List.of(SlipstreamClient.Endpoint.parse(one, connect, read));
        }
        List<SlipstreamClient.Endpoint> out = new ArrayList<>();
        HashSet<String> seen = new HashSet<>();
        for (String hp : many.split(",")) {
            if (hp.isBlank()) {
                continue;
            }
            SlipstreamClient.Endpoint ep = SlipstreamClient.Endpoint.parse(hp.trim(), connect, read);
            if (!seen.add(ep.toString())) {
                throw new IllegalArgumentException("slipstream: option \"endpoints\" names " + ep + " twice");
            }
            out.add(ep);
        }
        if (out.isEmpty()) {
            throw new IllegalArgumentException("slipstream: option \"endpoints\" is empty: expected host:port[,host:port...]");
        }
        if (out.size() > ENDPOINTS_MAX) {
            throw new IllegalArgumentException("slipstream: option \"endpoints\" names " + out.size()
                    + " endpoints; at most " + ENDPOINTS_MAX);
        }
        return List.copyOf(out);
    }

    /** The endpoints' keys (host:port) as offsets name them, in option order. */
    public List<String> keys() {
        List<String> k = new ArrayList<>();
        for (SlipstreamClient.Endpoint e : endpoints) {
            k.add(e.toString());
        }
        return k;
    }

    /** For messages and the table name: "h:p" or "h1:p,h2:p". */
    public String label() {
        return String.join(",", keys());
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

    /**
     * The result type: the option, or the stream's operator from INFO of the first endpoint that
     * answers (clear error if it has no such stream, or if none answers).
     */
    public ResultType resolveType() {
        if (type != null) {
            return ResultType.fromName(type);
        }
        java.io.IOException first = null;
        for (SlipstreamClient.Endpoint ep : endpoints) {
            SlipstreamClient.Info info;
            try {
                info = SlipstreamClient.info(ep);
            } catch (java.io.IOException e) {
                first = first == null ? e : first;
                continue;
            }
            return ResultType.ofOperator(streamOf(ep, info).operator());
        }
        throw new IllegalStateException("slipstream: " + first.getMessage()
                + (endpoints.size() > 1 ? " (and no other endpoint answered either)" : "")
                + " (to define the query without the daemon, set option \"type\")", first);
    }

    /** The stream this query reads in `info` (from `ep`), or a clear error if it has none. */
    SlipstreamClient.StreamInfo streamOf(SlipstreamClient.Endpoint ep, SlipstreamClient.Info info) {
        SlipstreamClient.StreamInfo s = info.stream(stream);
        if (s == null) {
            throw new IllegalArgumentException("slipstream: Slipstream at " + ep + " has no stream \"" + stream
                    + "\" (its streams: " + (info.streams().isEmpty() ? "none" : info.names()) + ")");
        }
        return s;
    }
}
