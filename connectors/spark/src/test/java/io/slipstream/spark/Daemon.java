// Daemon: a real `slipstream serve` for the connector tests, on free loopback ports, with a
// temp TOML config of [[stream]]s. The binary comes from -Dslipstream.bin or $SLIPSTREAM_BIN
// (default ../../target/release/slipstream). stop() kills it (also from close(), so
// try-with-resources and @AfterAll clean up on failure), kill() SIGKILLs it; start() / restart()
// bring it back on the same ports (a new run: a new epoch).
// Not for: anything but tests.
package io.slipstream.spark;

import java.io.File;
import java.io.IOException;
import java.net.DatagramPacket;
import java.net.DatagramSocket;
import java.net.InetAddress;
import java.net.ServerSocket;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.TimeUnit;

final class Daemon implements AutoCloseable {
    static final String HOST = "127.0.0.1";

    final Map<String, Integer> udpPorts = new LinkedHashMap<>();
    int resultsPort;
    private int kvPort;
    private final List<String> streamTables;
    private Path config;
    private Path log;
    private Process proc;

    /** Each entry: the body of one [[stream]] table without udp_port, e.g. name = "w"\noperator = "wordcount". */
    Daemon(List<String> streamTables) throws IOException {
        this.streamTables = streamTables;
        IOException last = null;
        for (int attempt = 0; attempt < 3; attempt++) { // a free port may be taken before we bind it
            pickPorts();
            try {
                start();
                return;
            } catch (IOException e) {
                last = e;
                stop();
            }
        }
        throw last;
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

    String endpoint() {
        return HOST + ":" + resultsPort;
    }

    private static int freeTcp() throws IOException {
        try (ServerSocket s = new ServerSocket(0, 1, InetAddress.getByName(HOST))) {
            return s.getLocalPort();
        }
    }

    private static int freeUdp() throws IOException {
        try (DatagramSocket s = new DatagramSocket(0, InetAddress.getByName(HOST))) {
            return s.getLocalPort();
        }
    }

    private void pickPorts() throws IOException {
        kvPort = freeTcp();
        resultsPort = freeTcp();
        StringBuilder cfg = new StringBuilder("[results]\ntcp_port = " + resultsPort + "\n");
        udpPorts.clear();
        for (String t : streamTables) {
            int p = freeUdp();
            String name = t.replaceAll("(?s).*name\\s*=\\s*\"([^\"]+)\".*", "$1");
            udpPorts.put(name, p);
            cfg.append("\n[[stream]]\n").append(t.strip()).append("\nudp_port = ").append(p).append('\n');
        }
        config = Files.createTempFile("slipstream-spark-", ".toml");
        Files.writeString(config, cfg.toString());
        log = Files.createTempFile("slipstream-spark-", ".log");
    }

    void start() throws IOException {
        String bin = bin();
        if (!new File(bin).canExecute()) {
            throw new IllegalStateException("slipstream binary not found at " + bin + " (build it: cargo build --release -p slipstream)");
        }
        proc = new ProcessBuilder(bin, "serve", "-p", Integer.toString(kvPort), "-l", HOST, "--config", config.toString())
                .redirectErrorStream(true).redirectOutput(log.toFile()).start();
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(10);
        while (System.nanoTime() < deadline) {
            if (!proc.isAlive()) {
                throw new IOException("slipstream exited at start: " + Files.readString(log));
            }
            try {
                SlipstreamClient.info(new SlipstreamClient.Endpoint(HOST, resultsPort, 200, 1000));
                return;
            } catch (IOException e) {
                sleep(50);
            }
        }
        throw new IOException("slipstream did not answer INFO within 10 s: " + Files.readString(log));
    }

    void stop() {
        if (proc != null) {
            proc.destroy();
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
    }

    /** SIGKILL: the daemon vanishes without closing anything cleanly. */
    void kill() {
        if (proc != null) {
            proc.destroyForcibly();
            try {
                proc.waitFor(5, TimeUnit.SECONDS);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
            proc = null;
        }
    }

    void restart() throws IOException {
        stop();
        start();
    }

    SlipstreamClient.Info info() throws IOException {
        return SlipstreamClient.info(new SlipstreamClient.Endpoint(HOST, resultsPort, 1000, 5000));
    }

    /** Sends each payload as one UDP datagram to stream `name`. */
    void send(String name, List<String> payloads) throws IOException {
        InetAddress to = InetAddress.getByName(HOST);
        int port = udpPorts.get(name);
        try (DatagramSocket s = new DatagramSocket()) {
            int i = 0;
            for (String p : payloads) {
                byte[] b = p.getBytes(StandardCharsets.UTF_8);
                s.send(new DatagramPacket(b, b.length, to, port));
                if (++i % 64 == 0) {
                    sleep(1); // keep loopback from outrunning the receive buffer in tests
                }
            }
        }
    }

    /** Waits until stream `name` has produced at least `lines` result lines (bounded). */
    void awaitLines(String name, long lines, long timeoutMs) throws IOException {
        long deadline = System.currentTimeMillis() + timeoutMs;
        long have = -1;
        while (System.currentTimeMillis() < deadline) {
            have = info().stream(name).nextSeq();
            if (have >= lines) {
                return;
            }
            sleep(20);
        }
        throw new AssertionError("stream " + name + " produced " + have + " lines, expected >= " + lines);
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
        stop();
        try {
            if (config != null) Files.deleteIfExists(config);
            if (log != null) Files.deleteIfExists(log);
        } catch (IOException ignored) {
            // temp files: best effort
        }
    }
}
