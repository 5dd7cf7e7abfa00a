// The driver's link (DriverLink) against the real daemon, without a SparkContext: a driver's
// manager announces itself at its first registerShuffle; a driver JVM killed with SIGKILL (no
// stop(), no UNREGISTER_APP) has its application's blocks freed by the daemon; after a daemon
// restart the link is announced again, and its end still frees the application.
package io.slipstream.spark.shuffle;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.BufferedReader;
import java.io.File;
import java.io.IOException;
import java.io.InputStreamReader;
import java.lang.management.ManagementFactory;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.function.BooleanSupplier;
import org.apache.spark.SparkConf;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

class DriverLinkTest {
    static final int MEMORY_MB = 4;
    static final int BLOCK_KB = 64;
    /** Longest a test waits for the daemon or the link to catch up (ms). */
    static final long WAIT_MS = 20_000;

    static ShuffleDaemon daemon;

    @BeforeAll
    static void start() throws IOException {
        daemon = new ShuffleDaemon(MEMORY_MB, BLOCK_KB);
    }

    @AfterAll
    static void stop() {
        daemon.close();
    }

    static SlipstreamShuffleManager driverManager(String endpoint, String app) {
        SparkConf conf = new SparkConf(false)
                .set(SlipstreamShuffleManager.ENDPOINT, endpoint)
                .set("spark.app.id", app);
        return new SlipstreamShuffleManager(conf, true);
    }

    /** What an executor does: `maps` map outputs of (app, 0) committed on its own connection. */
    static void commitMaps(String endpoint, String app, int maps) throws IOException {
        try (ShuffleClient c = new ShuffleClient(endpoint, 5_000, 30_000)) {
            c.register(app, 0, 2, null);
            for (int m = 0; m < maps; m++) {
                int blk = c.alloc(app, 0);
                c.commit(app, 0, m, 1, List.of(new int[] {0, blk, 0, 5}));
            }
        }
    }

    static void await(String what, BooleanSupplier done) {
        long end = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(WAIT_MS);
        while (!done.getAsBoolean()) {
            assertTrue(System.nanoTime() < end, what + " within " + WAIT_MS + " ms");
            ShuffleDaemon.sleep(20);
        }
    }

    static long blocksInUse() {
        try {
            return LocalClusterShuffleTest.metric(daemon.metrics(), "slipstream_shuffle_blocks_in_use");
        } catch (IOException e) {
            return -1;
        }
    }

    /** A driver JVM: its manager registers a shuffle, an "executor" commits 3 maps, then it waits to be killed. */
    public static void main(String[] args) throws Exception {
        SlipstreamShuffleManager m = driverManager(args[0], args[1]);
        m.registerShuffle(0, null);
        DriverLink link = m.driverLink();
        long end = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(WAIT_MS);
        while (link.announcements() == 0 && System.nanoTime() < end) {
            Thread.sleep(20);
        }
        commitMaps(args[0], args[1], 3);
        System.out.println(link.announcements() > 0 ? "ready" : "not announced");
        System.out.flush();
        Thread.sleep(WAIT_MS * 3);
    }

    @Test
    void aKilledDriverJvmHasItsApplicationsBlocksFreed() throws Exception {
        List<String> cmd = new ArrayList<>();
        cmd.add(new File(System.getProperty("java.home"), "bin/java").getPath());
        cmd.addAll(ManagementFactory.getRuntimeMXBean().getInputArguments());
        cmd.add("-cp");
        cmd.add(System.getProperty("java.class.path"));
        cmd.add(DriverLinkTest.class.getName());
        cmd.add(daemon.endpoint());
        cmd.add("app-killed-driver");
        Process p = new ProcessBuilder(cmd).redirectError(ProcessBuilder.Redirect.DISCARD).start();
        try (BufferedReader out = new BufferedReader(new InputStreamReader(p.getInputStream(), StandardCharsets.UTF_8))) {
            assertEquals("ready", out.readLine());
            assertEquals(3, blocksInUse(), "the driver's application holds its blocks while it lives");
            p.destroyForcibly(); // SIGKILL: no stop(), no UNREGISTER_APP
            assertTrue(p.waitFor(10, TimeUnit.SECONDS));
            await("blocks_in_use 0 after the driver was killed", () -> blocksInUse() == 0);
            assertEquals(0, LocalClusterShuffleTest.metric(daemon.metrics(), "slipstream_shuffle_shuffles"));
        } finally {
            p.destroyForcibly();
        }
    }

    @Test
    void theLinkIsAnnouncedAgainAfterADaemonRestart() throws Exception {
        SlipstreamShuffleManager m = driverManager(daemon.endpoint(), "app-restart");
        assertNull(m.driverLink(), "no link before a shuffle");
        m.registerShuffle(0, null);
        DriverLink link = m.driverLink();
        assertNotNull(link);
        await("DRIVER announced", () -> link.announcements() == 1);
        daemon.restart(MEMORY_MB, BLOCK_KB);
        await("DRIVER announced again after the restart", () -> link.announcements() == 2);
        commitMaps(daemon.endpoint(), "app-restart", 2);
        assertEquals(2, blocksInUse());
        link.close(); // what the kernel does to a crashed driver's socket
        await("blocks_in_use 0 after the link ended", () -> blocksInUse() == 0);
        m.stop();
        assertNull(m.driverLink());
    }
}
