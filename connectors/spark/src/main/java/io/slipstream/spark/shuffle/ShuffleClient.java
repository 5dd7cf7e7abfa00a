// ShuffleClient: one control connection to the Slipstream daemon's shuffle service (the line
// protocol of crates/shuffle/src/proto.rs). A Spark task holds one for its life: blocks it
// allocates but does not commit, and blocks it pinned by LOOKUP, are given back when the
// connection closes. Not for: mapping blocks (BlockMap) or Spark's interfaces.
package io.slipstream.spark.shuffle;

import java.io.BufferedInputStream;
import java.io.BufferedOutputStream;
import java.io.Closeable;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;

final class ShuffleClient implements Closeable {
    /** Longest answer line read (a segment line is five numbers). */
    private static final int LINE_BYTES_MAX = 4096;

    /**
     * One segment: map output `map` (attempt `attempt`) of a partition, in block `block`, whose
     * file the daemon identifies as `file` (LOOKUP's answer; 0 when it names none: COMMIT's
     * answer, or an older daemon).
     */
    record Segment(int partition, int map, long attempt, int block, int offset, int length, long file) {}

    /** COMMIT's answer: the winning attempt and its segments. */
    record Committed(long attempt, List<Segment> segments) {}

    /** What HELLO says: the block size and the directory of the block files. */
    record Hello(int blockBytes, String dir) {}

    private final Socket socket;
    private final InputStream in;
    private final OutputStream out;
    private final String endpoint;
    /** RELEASE lines sent whose answers are not read yet (release): read before the next answer. */
    private int unanswered;
    /**
     * Most blocks held before they are sent (release), all in one RELEASE line: 20 ids of up to
     * 10 digits and the command fit the daemon's 256-byte request line.
     */
    static final int RELEASES_HELD_MAX = 20;
    /** Longest the oldest held RELEASE waits for more, looked at by the next release (ns). */
    static final long RELEASE_HOLD_NS_MAX = 2_000_000;
    /** Blocks to release, not sent yet, and when the first of them was held. */
    private final int[] heldBlocks = new int[RELEASES_HELD_MAX];
    private int held;
    private long heldSinceNs;

    ShuffleClient(String endpoint, int connectTimeoutMs, int readTimeoutMs) throws IOException {
        this.endpoint = endpoint;
        int colon = endpoint.lastIndexOf(':');
        if (colon <= 0) {
            throw new IllegalArgumentException("spark.slipstream.shuffle.endpoint must be HOST:PORT, not " + endpoint);
        }
        String host = endpoint.substring(0, colon);
        int port = Integer.parseInt(endpoint.substring(colon + 1));
        socket = new Socket();
        try {
            socket.connect(new InetSocketAddress(host, port), connectTimeoutMs);
            socket.setSoTimeout(readTimeoutMs);
            socket.setTcpNoDelay(true);
            in = new BufferedInputStream(socket.getInputStream(), 64 * 1024);
            out = new BufferedOutputStream(socket.getOutputStream(), 64 * 1024);
        } catch (IOException e) {
            socket.close();
            throw new IOException("Slipstream shuffle service at " + endpoint + " unreachable (" + e.getMessage()
                    + "): start the daemon with a [shuffle] table, or drop spark.shuffle.manager", e);
        }
    }

    /** Writes a request line into the buffer, after the held blocks' RELEASE (answers come in request order). */
    private void send(String line) throws IOException {
        sendHeld();
        write(line);
    }

    private void write(String line) throws IOException {
        out.write(line.getBytes(StandardCharsets.US_ASCII));
        out.write('\r');
        out.write('\n');
    }

    private String readLine() throws IOException {
        StringBuilder b = new StringBuilder(64);
        while (b.length() < LINE_BYTES_MAX) {
            int c = in.read();
            if (c < 0) {
                throw new IOException("Slipstream shuffle service at " + endpoint + " closed the connection");
            }
            if (c == '\n') {
                int n = b.length();
                return n > 0 && b.charAt(n - 1) == '\r' ? b.substring(0, n - 1) : b.toString();
            }
            b.append((char) c);
        }
        throw new IOException("answer line too long from " + endpoint);
    }

    /** Flushes, reads one line; an error line becomes an IOException with the daemon's words. */
    private String call() throws IOException {
        flush();
        skipUnanswered();
        String line = readLine();
        if (line.startsWith("CLIENT_ERROR") || line.startsWith("SERVER_ERROR")) {
            throw new ShuffleServiceException(line);
        }
        return line;
    }

    private void expectOk() throws IOException {
        String line = call();
        if (!line.equals("OK")) {
            throw new IOException("unexpected answer " + line);
        }
    }

    /** HELLO; `tenant` (or null) is checked by the daemon: an unknown tenant is an error here. */
    Hello hello(String tenant) throws IOException {
        send(tenant == null ? "HELLO" : "HELLO " + tenant);
        String[] w = call().split(" ", 4);
        if (w.length != 4 || !w[0].equals("OK") || !w[1].equals("1")) {
            throw new IOException("not a Slipstream shuffle service (protocol 1) at " + endpoint + ": " + String.join(" ", w));
        }
        return new Hello(Integer.parseInt(w[2]), w[3]);
    }

    /** `tenant`: the tenant the application is charged to, or null (a daemon without tenants). */
    void register(String app, int shuffle, int partitions, String tenant) throws IOException {
        send("REGISTER " + app + " " + shuffle + " " + partitions + (tenant == null ? "" : " " + tenant));
        expectOk();
    }

    int alloc(String app, int shuffle) throws IOException {
        send("ALLOC " + app + " " + shuffle);
        String line = call();
        if (!line.startsWith("BLOCK ")) {
            throw new IOException("unexpected answer " + line);
        }
        return Integer.parseInt(line.substring(6));
    }

    /** Segments of one map attempt; `segs` are int[]{partition, block, offset, length}. */
    Committed commit(String app, int shuffle, int map, long attempt, List<int[]> segs) throws IOException {
        send("COMMIT " + app + " " + shuffle + " " + map + " " + attempt + " " + segs.size());
        StringBuilder b = new StringBuilder();
        for (int[] s : segs) {
            b.setLength(0);
            b.append(s[0]).append(' ').append(s[1]).append(' ').append(s[2]).append(' ').append(s[3]);
            send(b.toString());
        }
        String[] head = call().split(" ");
        if (head.length != 3 || !head[0].equals("COMMITTED")) {
            throw new IOException("unexpected answer " + String.join(" ", head));
        }
        long won = Long.parseLong(head[1]);
        int n = Integer.parseInt(head[2]);
        List<Segment> out = new ArrayList<>(n);
        for (int i = 0; i < n; i++) {
            String[] w = readLine().split(" ");
            out.add(new Segment(Integer.parseInt(w[0]), map, won, Integer.parseInt(w[1]), Integer.parseInt(w[2]),
                    Integer.parseInt(w[3]), 0));
        }
        expectEnd();
        return new Committed(won, out);
    }

    /**
     * The committed segments of reduce partition `reduce`, in map order (pins their blocks). A
     * segment line is `<map> <attempt> <block> <offset> <length> [<file>]`: a daemon before the
     * file identity sends five words (file 0).
     */
    List<Segment> lookup(String app, int shuffle, int reduce) throws IOException {
        send("LOOKUP " + app + " " + shuffle + " " + reduce);
        String head = call();
        if (!head.startsWith("SEGMENTS ")) {
            throw new IOException("unexpected answer " + head);
        }
        int n = Integer.parseInt(head.substring(9));
        List<Segment> out = new ArrayList<>(n);
        for (int i = 0; i < n; i++) {
            String[] w = readLine().split(" ");
            out.add(new Segment(reduce, Integer.parseInt(w[0]), Long.parseLong(w[1]), Integer.parseInt(w[2]),
                    Integer.parseInt(w[3]), Integer.parseInt(w[4]), w.length > 5 ? Long.parseLong(w[5]) : 0));
        }
        expectEnd();
        return out;
    }

    private void expectEnd() throws IOException {
        String end = readLine();
        if (!end.equals("END")) {
            throw new IOException("unexpected answer " + end);
        }
    }

    /**
     * RELEASE without waiting for the daemon's answer, its answer read before the next call's
     * (or dropped with the connection). A reduce task releases one to two blocks per map output
     * it read, so at 200 maps a task releases hundreds: each sent alone cost a write here and a
     * wake-up, a read and a write in the daemon, and each line a parse and a registry lock. So
     * they are held and sent together, in one line, once RELEASES_HELD_MAX are held, once the
     * oldest held one is RELEASE_HOLD_NS_MAX old (looked at here, at the next release), or with
     * the next call; at close the connection's end drops the pins anyway. A block thus goes a
     * little later than read (a peer's copy block is freed then; a map output's block is only
     * unpinned).
     */
    void release(int block) throws IOException {
        long now = System.nanoTime();
        if (held == 0) {
            heldSinceNs = now;
        }
        heldBlocks[held++] = block;
        if (held >= RELEASES_HELD_MAX || now - heldSinceNs >= RELEASE_HOLD_NS_MAX) {
            flush();
        }
    }

    /** Sends what the buffer holds (requests, and the held blocks' RELEASE line). */
    private void flush() throws IOException {
        sendHeld();
        out.flush();
    }

    /** Writes the held blocks' RELEASE line into the buffer. */
    private void sendHeld() throws IOException {
        if (held > 0) {
            StringBuilder b = new StringBuilder(8 + 11 * held).append("RELEASE");
            for (int i = 0; i < held; i++) {
                b.append(' ').append(heldBlocks[i]);
            }
            held = 0;
            write(b.toString());
            unanswered++;
        }
    }

    /** Reads the answers of release; an error there changes nothing (the pin goes at close). */
    private void skipUnanswered() throws IOException {
        while (unanswered > 0) {
            readLine();
            unanswered--;
        }
    }

    void lost(String app, int shuffle, int map, long attempt) throws IOException {
        send("LOST " + app + " " + shuffle + " " + map + " " + attempt);
        expectOk();
    }

    void unregister(String app, int shuffle) throws IOException {
        send("UNREGISTER " + app + " " + shuffle);
        expectOk();
    }

    void unregisterApp(String app) throws IOException {
        send("UNREGISTER_APP " + app);
        expectOk();
    }

    /**
     * DRIVER: this connection is `app`'s driver (the daemon unregisters the application when it
     * ends without UNREGISTER_APP); from now on it waits for answers without a timeout.
     */
    void driver(String app) throws IOException {
        send("DRIVER " + app);
        expectOk();
        socket.setSoTimeout(0);
    }

    /** Blocks until the daemon closes the connection (or this one is closed); a driver's link. */
    void awaitClose() {
        try {
            while (in.read() >= 0) {
                // nothing is sent on a driver's connection after DRIVER's answer
            }
        } catch (IOException closed) {
            // closed from this side (stop) or reset: the same end
        }
    }

    @Override
    public void close() {
        try {
            socket.close();
        } catch (IOException ignored) {
            // closing: nothing to do
        }
    }

    /** The daemon refused a request (its CLIENT_ERROR / SERVER_ERROR line). */
    static final class ShuffleServiceException extends IOException {
        ShuffleServiceException(String line) {
            super("Slipstream shuffle service: " + line);
        }
    }
}
