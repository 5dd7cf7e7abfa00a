// ShuffleDaemon: a real `slipstream serve` with a [shuffle] table for the shuffle manager tests,
// on free loopback ports with its block files in a temp directory. The binary comes from
// -Dslipstream.bin or $SLIPSTREAM_BIN (default ../../target/release/slipstream). restart() brings
// it back on the same ports and directory (everything it held is lost, as in a crash).
// Not for: anything but tests.
package io.slipstream.spark.shuffle;

import java.io.File;
import java.io.IOException;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.Comparator;
import java.util.concurrent.TimeUnit;
import java.util.stream.Stream;

final class ShuffleDaemon implements AutoCloseable {
    static final String HOST = "127.0.0.1";

    final int shufflePort;
    final int adminPort;
    private final int kvPort;
    final Path dir;
    private final Path config;
    private final Path log;
    /** More config text ([shaping], [[tenant]] entries), or "". */
    private final String extra;
    private Process proc;

    ShuffleDaemon(int memoryMb, int blockKb) throws IOException {
        this(memoryMb, blockKb, "");
    }

    /** With `extra` appended to the config file (e.g. tenants with a shuffle_mb share). */
    ShuffleDaemon(int memoryMb, int blockKb, String extra) throws IOException {
        this.extra = extra;
        kvPort = freeTcp();
        shufflePort = freeTcp();
        adminPort = freeTcp();
        Path shm = Path.of("/dev/shm");
        dir = Files.createTempDirectory(Files.isDirectory(shm) ? shm : Path.of(System.getProperty("java.io.tmpdir")),
                "slipstream-shuffle-test-");
        config = Files.createTempFile("slipstream-shuffle-", ".toml");
        log = Files.createTempFile("slipstream-shuffle-", ".log");
        start(memoryMb, blockKb);
    }

    String endpoint() {
        return HOST + ":" + shufflePort;
    }

    static String bin() {
        String b = System.getProperty("slipstream.bin");
        if (b == null || b.isBlank() || b.startsWith("${")) {
            b = System.getenv("SLIPSTREAM_BIN");
        }
        if (b == null || b.isBlank()) {
            b = new File("../../target/release/slipstream").getAbsolutePath();
        }
        return b;
    }

    static int freeTcp() throws IOException {
        try (ServerSocket s = new ServerSocket(0, 1, InetAddress.getByName(HOST))) {
            return s.getLocalPort();
        }
    }

    void start(int memoryMb, int blockKb) throws IOException {
        Files.writeString(config, "[server]\nadmin = \"" + HOST + ":" + adminPort + "\"\n[shuffle]\ntcp_port = " + shufflePort
                + "\nmemory_mb = " + memoryMb + "\nblock_kb = " + blockKb + "\ndir = \"" + dir + "\"\n" + extra);
        String bin = bin();
        if (!new File(bin).canExecute()) {
            throw new IllegalStateException("slipstream binary not found at " + bin + " (cargo build --release -p slipstream)");
        }
        proc = new ProcessBuilder(bin, "serve", "-p", Integer.toString(kvPort), "-l", HOST, "--config", config.toString())
                .redirectErrorStream(true).redirectOutput(log.toFile()).start();
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
        while (System.nanoTime() < deadline) {
            if (!proc.isAlive()) {
                throw new IOException("slipstream exited at start: " + Files.readString(log));
            }
            try (ShuffleClient c = new ShuffleClient(endpoint(), 200, 1000)) {
                c.hello(null);
                return;
            } catch (ShuffleClient.ShuffleServiceException e) {
                return; // a daemon with tenants refuses HELLO without one: it is answering
            } catch (IOException e) {
                sleep(50);
            }
        }
        // Not left running behind a failed start (the caller has no object to close).
        stop(true);
        throw new IOException("slipstream's shuffle port did not answer within 10 s: " + Files.readString(log));
    }

    /** SIGKILL and start again: the registry and every block are gone. */
    void restart(int memoryMb, int blockKb) throws IOException {
        stop(true);
        start(memoryMb, blockKb);
    }

    /** The daemon's Prometheus text. */
    String metrics() throws IOException {
        java.net.http.HttpClient h = java.net.http.HttpClient.newHttpClient();
        try {
            return h.send(java.net.http.HttpRequest.newBuilder(java.net.URI.create("http://" + HOST + ":" + adminPort + "/metrics")).build(),
                    java.net.http.HttpResponse.BodyHandlers.ofString()).body();
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new IOException(e);
        }
    }

    private void stop(boolean kill) {
        if (proc == null) {
            return;
        }
        if (kill) {
            proc.destroyForcibly();
        } else {
            proc.destroy();
        }
        try {
            if (!proc.waitFor(5, TimeUnit.SECONDS)) {
                proc.destroyForcibly().waitFor(5, TimeUnit.SECONDS);
            }
        } catch (InterruptedException e) {
            proc.destroyForcibly();
            Thread.currentThread().interrupt();
        }
        proc = null;
    }

    static void sleep(long ms) {
        try {
            Thread.sleep(ms);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
    }

    @Override
    public void close() {
        stop(false);
        try (Stream<Path> files = Files.walk(dir)) {
            files.sorted(Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
            Files.deleteIfExists(config);
            Files.deleteIfExists(log);
        } catch (IOException ignored) {
            // temp files: best effort
        }
    }
}
