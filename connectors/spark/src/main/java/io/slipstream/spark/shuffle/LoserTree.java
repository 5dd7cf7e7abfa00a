// LoserTree: HashMerge's priority queue of sources, a tournament (loser) tree over primitive longs,
// each (key hash << 32 | source number), so the merge orders its cursors without a comparator
// call, an object load per comparison or a box. The merge takes the top, reads that source's
// records of the top hash and puts the source back with its next hash (replaceTop). With 200
// sources of mostly one record per hash that is one replay per record, and a replay is one
// comparison per level on the fixed path from the source's leaf to the root, where a binary
// heap's sift-down makes two per level (which child is smaller, then against the key), each
// branch as unpredictable as the hashes: session 13's profile had the heap's siftDown at ~44% of
// the merge's samples.
// The nodes hold the losers' keys themselves (a key names its source, so no leaf array is read
// during a replay): one load per level instead of a loser's index and then its leaf's key, and
// the match is a min/max the JIT makes branch-free (which of two random hashes is smaller is a
// coin toss for a branch predictor). Session 15's profile had the replay at 13% of the reduce task.
// Leaf i holds source i: sources are numbered below the capacity, each added at most once, then
// the tree is built once (at the first top/replaceTop/removeTop); a source never added, or read
// to its end, is an EMPTY leaf that loses every match.
// Not for: what a source is or how its hash is read (HashMerge.Cursor).
package io.slipstream.spark.shuffle;

final class LoserTree {
    /** A leaf with no source (never added, or read to its end): greater than any key. */
    private static final long EMPTY = Long.MAX_VALUE;
    /** The leaves' first keys, until the tree is built (source i: leaf i, tree node k + i). */
    private long[] leaves;
    /** nodes[n], 1 ≤ n < k: the key that lost the match at internal node n; nodes[0]: the winner's. */
    private final long[] nodes;
    private final int k;
    private int size;

    /** A tree of sources 0 .. capacity-1. */
    LoserTree(int capacity) {
        k = Math.max(1, capacity);
        leaves = new long[k];
        java.util.Arrays.fill(leaves, EMPTY);
        nodes = new long[k];
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

    /** Adds source sourceOf(key)'s first key; only before the first top/replaceTop/removeTop, once per source. */
    void add(long key) {
        int s = sourceOf(key);
        if (leaves == null || s < 0 || s >= k || leaves[s] != EMPTY || key == EMPTY) {
            throw new IllegalStateException("LoserTree: add of source " + s + " after the first top, twice, or past its "
                    + k + " sources");
        }
        leaves[s] = key;
        size++;
    }

    /** The smallest key (the tree must not be empty). */
    long top() {
        build();
        return nodes[0];
    }

    /** Replaces the smallest key with `key` (the same source's): the top source moved on to its next hash. */
    void replaceTop(long key) {
        build();
        replay(sourceOf(nodes[0]), key);
    }

    /** Removes the smallest key: the top source is read to its end. */
    void removeTop() {
        build();
        size--;
        replay(sourceOf(nodes[0]), EMPTY);
    }

    /** Plays every match once, bottom up (nodes k..2k-1 are the leaves, n's children 2n and 2n+1). */
    private void build() {
        if (leaves == null) {
            return;
        }
        long[] winners = new long[2 * k];
        System.arraycopy(leaves, 0, winners, k, k);
        for (int n = k - 1; n >= 1; n--) {
            long a = winners[2 * n];
            long b = winners[2 * n + 1];
            winners[n] = Math.min(a, b);
            nodes[n] = Math.max(a, b);
        }
        nodes[0] = winners[1];
        leaves = null;
    }

    /** Leaf `leaf`'s key is now `key`: plays its matches up to the root. */
    private void replay(int leaf, long key) {
        long w = key;
        for (int n = (k + leaf) >>> 1; n >= 1; n >>>= 1) {
            long l = nodes[n];
            // Keys are unique (the source number is in them) but for EMPTY ones, whose order does not matter.
            nodes[n] = Math.max(l, w);
            w = Math.min(l, w);
        }
        nodes[0] = w;
    }
}
