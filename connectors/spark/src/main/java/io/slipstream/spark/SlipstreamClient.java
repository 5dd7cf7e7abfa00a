// SlipstreamClient: the connector's side of the Slipstream results protocol (crates/streamsvc
// hub): `INFO` (epoch, each stream's operator and retained seq range) and range / tail reads
// (`SUBSCRIBE name FROM a [UNTIL b] [EPOCH e]`). Plain blocking sockets with timeouts, one
// connection per request; used on the driver (INFO) and in executors (reads).
// Not for: Spark types (ResultType turns lines into rows) or offset bookkeeping.
package io.slipstream.spark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;

import java.io.BufferedReader;
import java.io.Closeable;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.io.Serializable;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.net.SocketTimeoutException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;

public final class SlipstreamClient {
    static final ObjectMapper JSON = new ObjectMapper();
    /** Longest line accepted from the daemon (a change-point alert with 65536 history values). */
    static final int LINE_CHARS_MAX = 8 << 20;

    private SlipstreamClient() {}

    /** Where the daemon's results port is, and how long to wait for it. */
    public record Endpoint(String host, int port, int connectTimeoutMs, int readTimeoutMs) implements Serializable {
        static Endpoint parse(String hostPort, int connectTimeoutMs, int readTimeoutMs) {
            if (hostPort == null || hostPort.isBlank()) {
                throw new IllegalArgumentException("slipstream: option \"endpoint\" (host:port of the [results] tcp_port) "
                        + "or \"endpoints\" (host:port,host:port,... for several daemons) is required");
            }
            int colon = hostPort.lastIndexOf(':');
            if (colon <= 0 || colon == hostPort.length() - 1) {
                throw new IllegalArgumentException("slipstream: endpoint \"" + hostPort + "\": expected host:port");
            }
            int port;
            try {
                port = Integer.parseInt(hostPort.substring(colon + 1));
            } catch (NumberFormatException e) {
                throw new IllegalArgumentException("slipstream: endpoint \"" + hostPort + "\": port is not a number");
            }
            if (port < 1 || port > 65535) {
                throw new IllegalArgumentException("slipstream: endpoint \"" + hostPort + "\": port out of range");
            }
            String host = hostPort.substring(0, colon);
            if (host.startsWith("[") && host.endsWith("]")) {
                host = host.substring(1, host.length() - 1);
            }
            return new Endpoint(host, port, connectTimeoutMs, readTimeoutMs);
        }

        @Override
        public String toString() {
            return (host.contains(":") ? "[" + host + "]" : host) + ":" + port;
        }
    }

    /** One stream as INFO describes it. */
    public record StreamInfo(String name, String operator, long firstSeq, long nextSeq) implements Serializable {}

    /** The INFO / hello line. */
    public record Info(String epoch, List<StreamInfo> streams) implements Serializable {
        StreamInfo stream(String name) {
            for (StreamInfo s : streams) {
                if (s.name().equals(name)) {
                    return s;
                }
            }
            return null;
        }

        String names() {
            List<String> n = new ArrayList<>();
            for (StreamInfo s : streams) {
                n.add(s.name());
            }
            return String.join(", ", n);
        }

        static Info parse(JsonNode v) throws IOException {
            String epoch = v.path("epoch").asText("");
            if (epoch.isEmpty() || !v.path("streams").isArray()) {
                throw new IOException("slipstream: malformed info line: " + v);
            }
            List<StreamInfo> streams = new ArrayList<>();
            for (JsonNode s : v.path("streams")) {
                streams.add(new StreamInfo(s.path("name").asText(), s.path("operator").asText(),
                        s.path("first_seq").asLong(), s.path("next_seq").asLong()));
            }
            return new Info(epoch, streams);
        }
    }

    /** An `error` line from the daemon: its code and text (and the retained range if given). */
    public static final class ServerError extends IOException {
        public final String code;
        public final long firstSeq;
        public final long nextSeq;
        public final String epoch;

        ServerError(JsonNode v) {
            super("Slipstream refused the request (" + v.path("code").asText("?") + "): " + v.path("error").asText());
            this.code = v.path("code").asText("");
            this.firstSeq = v.path("first_seq").asLong(-1);
            this.nextSeq = v.path("next_seq").asLong(-1);
            this.epoch = v.path("epoch").asText(null);
        }
    }

    static Socket connect(Endpoint ep) throws IOException {
        Socket s = new Socket();
        try {
            s.setTcpNoDelay(true);
            s.connect(new InetSocketAddress(ep.host(), ep.port()), ep.connectTimeoutMs());
            s.setSoTimeout(ep.readTimeoutMs());
            return s;
        } catch (IOException e) {
            s.close();
            throw new IOException("cannot reach Slipstream at " + ep + " (the [results] tcp_port of a running `slipstream serve`): " + e.getMessage(), e);
        }
    }

    /** Sends `INFO`, returns the parsed answer. */
    public static Info info(Endpoint ep) throws IOException {
        try (Socket s = connect(ep)) {
            s.getOutputStream().write("INFO\n".getBytes(StandardCharsets.UTF_8));
            BufferedReader r = new BufferedReader(new InputStreamReader(s.getInputStream(), StandardCharsets.UTF_8));
            String line = readLine(r);
            if (line == null) {
                throw new IOException("Slipstream at " + ep + " closed the connection without answering INFO");
            }
            JsonNode v = JSON.readTree(line);
            if ("error".equals(v.path("type").asText())) {
                throw new ServerError(v);
            }
            if (!"info".equals(v.path("type").asText())) {
                throw new IOException("Slipstream at " + ep + " answered INFO with " + line
                        + " (is this a Slipstream build with replay support?)");
            }
            return Info.parse(v);
        }
    }

    /** A line reader bounded by {@link #LINE_CHARS_MAX}. Returns null at end of stream. */
    static String readLine(BufferedReader r) throws IOException {
        return readLine(r, new StringBuilder());
    }

    /**
     * Same, accumulating into `b`, which keeps a partial line across a read timeout (the
     * caller passes the same builder again) and is emptied when a line is returned.
     */
    static String readLine(BufferedReader r, StringBuilder b) throws IOException {
        while (true) {
            int c = r.read();
            if (c < 0) {
                String last = b.length() == 0 ? null : b.toString();
                b.setLength(0);
                return last;
            }
            if (c == '\n') {
                String line = b.toString();
                b.setLength(0);
                return line;
            }
            if (b.length() >= LINE_CHARS_MAX) {
                throw new IOException("slipstream: result line longer than " + LINE_CHARS_MAX + " characters");
            }
            b.append((char) c);
        }
    }

    /**
     * A subscription reading `name` from `fromSeq` (exclusive `untilSeq`, or -1 for a tail),
     * checked against `epoch` (null: any). The hello line is read by the constructor.
     */
    public static final class Subscription implements Closeable {
        private final Socket sock;
        private final BufferedReader reader;
        private final StringBuilder partial = new StringBuilder();
        public final Info hello;

        public Subscription(Endpoint ep, String name, String from, long untilSeq, String epoch) throws IOException {
            sock = connect(ep);
            boolean ok = false;
            try {
                StringBuilder req = new StringBuilder("SUBSCRIBE ").append(name).append(" FROM ").append(from);
                if (untilSeq >= 0) {
                    req.append(" UNTIL ").append(untilSeq);
                }
                if (epoch != null) {
                    req.append(" EPOCH ").append(epoch);
                }
                req.append('\n');
                OutputStream out = sock.getOutputStream();
                out.write(req.toString().getBytes(StandardCharsets.UTF_8));
                out.flush();
                reader = new BufferedReader(new InputStreamReader(sock.getInputStream(), StandardCharsets.UTF_8), 1 << 16);
                String first = readLine(reader);
                if (first == null) {
                    throw new IOException("Slipstream at " + ep + " closed the connection without a hello line");
                }
                JsonNode v = JSON.readTree(first);
                if ("error".equals(v.path("type").asText())) {
                    throw new ServerError(v);
                }
                if (!"hello".equals(v.path("type").asText())) {
                    throw new IOException("Slipstream at " + ep + ": expected a hello line, got " + first);
                }
                hello = Info.parse(v);
                ok = true;
            } finally {
                if (!ok) {
                    sock.close();
                }
            }
        }

        /** The next line, or null at the end of the range (the daemon closed). */
        public String next() throws IOException {
            return readLine(reader, partial);
        }

        /** Like next() but returns "" when nothing arrived within the read timeout. */
        public String poll() throws IOException {
            try {
                return readLine(reader, partial);
            } catch (SocketTimeoutException e) {
                return "";
            }
        }

        public void setReadTimeoutMs(int ms) throws IOException {
            sock.setSoTimeout(ms);
        }

        @Override
        public void close() throws IOException {
            sock.close();
        }
    }
}
