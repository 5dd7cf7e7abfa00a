// HashHeapTest: HashMerge's primitive heap against java.util.PriorityQueue on random keys (few
// distinct hashes, negative ones too, so ties on the hash are ordered by source number), under
// the merge's own use: add every source, then replaceTop with a later hash or removeTop until
// empty. Randomized: prints its seed (rerun with -Dslipstream.seed=N).
package io.slipstream.spark.shuffle;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.PriorityQueue;
import java.util.Random;
import org.junit.jupiter.api.Test;

class HashHeapTest {
    static final int CASES = 500;

    @Test
    void popsKeysInTheOrderOfAPriorityQueue() {
        TestSeed seed = TestSeed.of("HashHeapTest");
        Random r = seed.random();
        for (int c = 0; c < CASES; c++) {
            int sources = 1 + r.nextInt(c % 2 == 0 ? 8 : 300);
            int spread = 1 + r.nextInt(c % 3 == 0 ? 4 : 1 << 20);
            HashHeap heap = new HashHeap(sources);
            PriorityQueue<Long> ref = new PriorityQueue<>();
            for (int s = 0; s < sources; s++) {
                long k = HashHeap.key(r.nextInt(spread) - spread / 2, s);
                heap.add(k);
                ref.add(k);
            }
            int steps = 0;
            while (!ref.isEmpty()) {
                assertEquals(ref.size(), heap.size(), "seed " + seed + " case " + c);
                long top = ref.poll();
                assertEquals(top, heap.top(), "seed " + seed + " case " + c + " step " + steps);
                int hash = HashHeap.hashOf(top);
                int source = HashHeap.sourceOf(top);
                assertTrue(source >= 0 && source < sources);
                if (r.nextInt(4) == 0) {
                    heap.removeTop();
                } else {
                    // A source's hashes only go up (HashOrder sorts them); up to Integer.MAX_VALUE.
                    int next = (int) Math.min(Integer.MAX_VALUE, (long) hash + r.nextInt(spread));
                    long k = HashHeap.key(next, source);
                    heap.replaceTop(k);
                    ref.add(k);
                }
                steps++;
            }
            assertTrue(heap.isEmpty(), "seed " + seed + " case " + c);
        }
    }

    @Test
    void keysOrderByHashThenSource() {
        assertTrue(HashHeap.key(Integer.MIN_VALUE, 5) < HashHeap.key(-1, 0));
        assertTrue(HashHeap.key(-1, 299) < HashHeap.key(0, 0));
        assertTrue(HashHeap.key(7, 1) < HashHeap.key(7, 2));
        assertTrue(HashHeap.key(Integer.MAX_VALUE - 1, Integer.MAX_VALUE) < HashHeap.key(Integer.MAX_VALUE, 0));
        assertEquals(-3, HashHeap.hashOf(HashHeap.key(-3, 12)));
        assertEquals(12, HashHeap.sourceOf(HashHeap.key(-3, 12)));
    }
}
