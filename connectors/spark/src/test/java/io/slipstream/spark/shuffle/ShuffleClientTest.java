// ShuffleClientTest: the control connection against a real daemon (ShuffleDaemon). RELEASE is
// not awaited (ShuffleClient.release): the test checks that the released pins are gone while the
// connection is still open (an unregistered shuffle's blocks are freed, not held by the reader),
// and that the answers left unread, an error among them, do not shift the next call's answer.
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
            // The reader's connection is open: pins not released would keep the blocks in use.
            long inUse = -1;
            for (int i = 0; i < 50; i++) { // the last RELEASE may still be on its way: up to 5 s
                inUse = gauge(daemon.metrics(), "slipstream_shuffle_blocks_in_use");
                if (inUse == 0) {
                    break;
                }
                Thread.sleep(100);
            }
            assertEquals(0, inUse, "blocks still in use after their pins were released and the shuffle unregistered");
        }
    }
}
