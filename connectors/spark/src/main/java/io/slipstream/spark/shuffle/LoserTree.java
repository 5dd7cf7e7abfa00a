// LoserTree: HashMerge's priority queue of sources, a tournament (loser) tree over primitive longs,
// each (key hash << 32 | source number), so the merge orders its cursors without a comparator
// call, an object load per comparison or a box. The merge takes the top, reads that source's
// records of the top hash and puts the source back with its next hash (replaceTop). With 200
// sources of mostly one record per hash that is one replay per record, and a replay is one
// comparison per level on the fixed path from the source's leaf to the root, where a binary
// heap's sift-down makes two per level (which child is smaller, then against the key), each
// branch as unpredictable as the hashes: session 13's profile had the heap's siftDown at ~44% of
// the merge's samples.
// Sources are added first, then the tree is built once (at the first top/replaceTop/removeTop);
// a source read to its end stays as an EMPTY leaf that loses every match.
// Not for: what a source is or how its hash is read (HashMerge.Cursor).
package io.slipstream.spark.shuffle;

final class LoserTree {
    /** A leaf with no source (never added, or read to its end): greater than any key. */
    private static final long EMPTY = Long.MAX_VALUE;
    /** Each leaf's key (source slot i: leaf i, tree node leaves.length + i). */
    private final long[] leaves;
    /** losers[n], 1 ≤ n < k: the leaf that lost the match at internal node n; losers[0]: the winner. */
    private final int[] losers;
    private int added;
    private int size;
    private boolean built;

    /** A tree of at most `capacity` sources. */
    LoserTree(int capacity) {
        int k = Math.max(1, capacity);
        leaves = new long[k];
        java.util.Arrays.fill(leaves, EMPTY);
        losers = new int[k];
    }

    /** Orders by hash (signed, as HashOrder sorts), then by source number (0 ≤ source). */
    static long key(int hash, int source) {
        return ((long) hash << 32) | source;
    }

    static int hashOf(long key) {
        return (int) (key >> 32);
    }

    static int sourceOf(long key) {
        return (int) key;
    }

    boolean isEmpty() {
        return size == 0;
    }

    int size() {
        return size;
    }

    /** Adds a source's first key; only before the first top/replaceTop/removeTop. */
    void add(long key) {
        if (built || added == leaves.length) {
            throw new IllegalStateException("LoserTree: add after the first top, or past its " + leaves.length + " sources");
        }
        leaves[added++] = key;
        size++;
    }

    /** The smallest key (the tree must not be empty). */
    long top() {
        build();
        return leaves[losers[0]];
    }

    /** Replaces the smallest key with `key`: the top source moved on to its next hash. */
    void replaceTop(long key) {
        build();
        int w = losers[0];
        leaves[w] = key;
        replay(w);
    }

    /** Removes the smallest key: the top source is read to its end. */
    void removeTop() {
        build();
        int w = losers[0];
        leaves[w] = EMPTY;
        size--;
        replay(w);
    }

    /** Plays every match once, bottom up (nodes k..2k-1 are the leaves, n's children 2n and 2n+1). */
    private void build() {
        if (built) {
            return;
        }
        built = true;
        int k = leaves.length;
        int[] winners = new int[2 * k];
        for (int i = 0; i < k; i++) {
            winners[k + i] = i;
        }
        for (int n = k - 1; n >= 1; n--) {
            int a = winners[2 * n];
            int b = winners[2 * n + 1];
            if (leaves[a] <= leaves[b]) {
                winners[n] = a;
                losers[n] = b;
            } else {
                winners[n] = b;
                losers[n] = a;
            }
        }
        losers[0] = winners[1];
    }

    /** Leaf `leaf`'s key changed: replays its matches up to the root. */
    private void replay(int leaf) {
        int w = leaf;
        long wk = leaves[w];
        for (int n = (leaves.length + leaf) >>> 1; n >= 1; n >>>= 1) {
            int l = losers[n];
            long lk = leaves[l];
            // Keys are unique (the source number is in them) but for EMPTY leaves, whose order does not matter.
            if (lk < wk) {
                losers[n] = w;
                w = l;
                wk = lk;
            }
        }
        losers[0] = w;
    }
}
