// LoserTreeTest: HashMerge's loser tree against java.util.PriorityQueue on random keys (few
// distinct hashes, negative ones too, so ties on the hash are ordered by source number), under
// the merge's own use: add the sources (a tree may have room for more, some numbers skipped),
// then replaceTop with a later hash or removeTop until empty; adding a source twice, or one
// past the capacity, or after the first top, is refused. Randomized: prints its seed (rerun with -Dslipstream.seed=N).
package io.slipstream.spark.shuffle;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.PriorityQueue;
import java.util.Random;
import org.junit.jupiter.api.Test;

class LoserTreeTest {
    static final int CASES = 500;

    @Test
    void popsKeysInTheOrderOfAPriorityQueue() {
        TestSeed seed = TestSeed.of("LoserTreeTest");
        Random r = seed.random();
        for (int c = 0; c < CASES; c++) {
            int sources = 1 + r.nextInt(c % 2 == 0 ? 8 : 300);
            int spread = 1 + r.nextInt(c % 3 == 0 ? 4 : 1 << 20);
            // Some trees have room for more sources than are added, and some source numbers are
            // never added (HashMerge skips empty sources: leaf i is source i).
            LoserTree tree = new LoserTree(sources + (c % 5 == 0 ? r.nextInt(3) : 0));
            PriorityQueue<Long> ref = new PriorityQueue<>();
            boolean skip = c % 4 == 1;
            for (int s = 0; s < sources; s++) {
                if (skip && r.nextInt(3) == 0) {
                    continue;
                }
                long k = LoserTree.key(r.nextInt(spread) - spread / 2, s);
                tree.add(k);
                ref.add(k);
            }
            int steps = 0;
            while (!ref.isEmpty()) {
                assertEquals(ref.size(), tree.size(), "seed " + seed + " case " + c);
                long top = ref.poll();
                assertEquals(top, tree.top(), "seed " + seed + " case " + c + " step " + steps);
                int hash = LoserTree.hashOf(top);
                int source = LoserTree.sourceOf(top);
                assertTrue(source >= 0 && source < sources);
                if (r.nextInt(4) == 0) {
                    tree.removeTop();
                } else {
                    // A source's hashes only go up (HashOrder sorts them); up to Integer.MAX_VALUE.
                    int next = (int) Math.min(Integer.MAX_VALUE, (long) hash + r.nextInt(spread));
                    long k = LoserTree.key(next, source);
                    tree.replaceTop(k);
                    ref.add(k);
                }
                steps++;
            }
            assertTrue(tree.isEmpty(), "seed " + seed + " case " + c);
        }
    }

    @Test
    void addsOutsideTheContractAreRefused() {
        LoserTree tree = new LoserTree(3);
        tree.add(LoserTree.key(5, 1));
        assertThrows(IllegalStateException.class, () -> tree.add(LoserTree.key(6, 1)));
        assertThrows(IllegalStateException.class, () -> tree.add(LoserTree.key(6, 3)));
        tree.add(LoserTree.key(-2, 2));
        assertEquals(LoserTree.key(-2, 2), tree.top());
        assertThrows(IllegalStateException.class, () -> tree.add(LoserTree.key(9, 0)));
        tree.removeTop();
        assertEquals(LoserTree.key(5, 1), tree.top());
        assertEquals(1, tree.size());
    }

    @Test
    void keysOrderByHashThenSource() {
        assertTrue(LoserTree.key(Integer.MIN_VALUE, 5) < LoserTree.key(-1, 0));
        assertTrue(LoserTree.key(-1, 299) < LoserTree.key(0, 0));
        assertTrue(LoserTree.key(7, 1) < LoserTree.key(7, 2));
        assertTrue(LoserTree.key(Integer.MAX_VALUE - 1, Integer.MAX_VALUE) < LoserTree.key(Integer.MAX_VALUE, 0));
        assertEquals(-3, LoserTree.hashOf(LoserTree.key(-3, 12)));
        assertEquals(12, LoserTree.sourceOf(LoserTree.key(-3, 12)));
    }
}
