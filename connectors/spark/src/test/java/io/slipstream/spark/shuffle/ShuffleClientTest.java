// ShuffleClientTest: the control connection against a real daemon (ShuffleDaemon). RELEASE is
// not awaited and its blocks are held to be sent in one line (ShuffleClient.release): the tests
// check that the released pins are gone while the connection is still open (an unregistered
// shuffle's blocks are freed, not held by the reader) once the held blocks went (with the next
// call, or at RELEASES_HELD_MAX held), not before, and that the answers left unread, an error
// among them, do not shift the next call's answer (the daemon writes pipelined answers together),
// nor keep the other blocks of an erring line pinned.
package io.slipstream.spark.shuffle;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.util.List;
import org.junit.jupiter.api.Test;

class ShuffleClientTest {
    static long gauge(String metrics, String name) {
        for (String line : metrics.split("\n")) {
            if (line.startsWith(name + " ")) {
                return Long.parseLong(line.substring(name.length() + 1).trim());
            }
        }
        throw new AssertionError(name + " not in the metrics");
    }

    @Test
    void unawaitedReleasesUnpinAndLeaveTheNextAnswerInPlace() throws Exception {
        try (ShuffleDaemon daemon = new ShuffleDaemon(16, 64);
                ShuffleClient writer = new ShuffleClient(daemon.endpoint(), 5_000, 10_000);
                ShuffleClient reader = new ShuffleClient(daemon.endpoint(), 5_000, 10_000)) {
            writer.hello(null);
            writer.register("app", 0, 2, null);
            int b1 = writer.alloc("app", 0);
            writer.commit("app", 0, 0, 7, List.of(new int[] {0, b1, 0, 100}, new int[] {1, b1, 100, 50}));
            int b2 = writer.alloc("app", 0); // a commit takes the blocks allocated before it
            writer.commit("app", 0, 1, 8, List.of(new int[] {0, b2, 0, 30}));
            List<ShuffleClient.Segment> p0 = reader.lookup("app", 0, 0); // pins b1 and b2
            assertEquals(2, p0.size());
            reader.release(b1);
            reader.release(b2);
            reader.release(b2); // no longer pinned: an error answer, read and dropped
            // The next call reads its own answer, not one of the three above.
            List<ShuffleClient.Segment> p1 = reader.lookup("app", 0, 1); // pins b1 again
            assertEquals(1, p1.size());
            assertEquals(50, p1.get(0).length());
            reader.release(b1);
            writer.unregister("app", 0);
            // Held, not sent: the reader still pins b1, so the unregistered shuffle keeps it.
            assertEquals(1, gauge(daemon.metrics(), "slipstream_shuffle_blocks_in_use"), "a held RELEASE was sent");
            reader.hello(null); // the next call sends it (and reads its answer first)
            // The reader's connection is open: pins not released would keep the blocks in use.
            assertEquals(0, gauge(daemon.metrics(), "slipstream_shuffle_blocks_in_use"),
                    "blocks still in use after their pins were released and the shuffle unregistered");
        }
    }

    @Test
    void heldReleasesGoByThemselvesAtTheBatchSize() throws Exception {
        try (ShuffleDaemon daemon = new ShuffleDaemon(16, 64);
                ShuffleClient writer = new ShuffleClient(daemon.endpoint(), 5_000, 10_000);
                ShuffleClient reader = new ShuffleClient(daemon.endpoint(), 5_000, 10_000)) {
            writer.register("app", 0, 1, null);
            int b1 = writer.alloc("app", 0);
            writer.commit("app", 0, 0, 7, List.of(new int[] {0, b1, 0, 100}));
            assertEquals(1, reader.lookup("app", 0, 0).size()); // pins b1
            writer.unregister("app", 0);
            reader.release(b1);
            for (int i = 1; i < ShuffleClient.RELEASES_HELD_MAX; i++) {
                reader.release(b1 + 1000); // not pinned: error answers, read and dropped later
            }
            // No further call on the reader: the batch went when it was full.
            long inUse = -1;
            for (int i = 0; i < 50; i++) { // the batch may still be on its way: up to 5 s
                inUse = gauge(daemon.metrics(), "slipstream_shuffle_blocks_in_use");
                if (inUse == 0) {
                    break;
                }
                Thread.sleep(100);
            }
            assertEquals(0, inUse, "a full batch of RELEASEs was not sent");
            reader.hello(null); // and the line's error answer is read before this call's own
        }
    }
}
