// HashHeap: HashMerge's priority queue of sources, a binary min-heap of primitive longs, each
// (key hash << 32 | source number), so the merge orders its cursors without a comparator call,
// an object load per comparison or a box. The merge takes the top, reads that source's records
// of the top hash and puts the source back with its next hash in one sift (replaceTop) where
// PriorityQueue needs a poll and an add (two sifts): with 200 sources of mostly one record per
// hash, that is one sift per record.
// Not for: what a source is or how its hash is read (HashMerge.Cursor).
package io.slipstream.spark.shuffle;

final class HashHeap {
    private final long[] keys;
    private int size;

    /** A heap of at most `capacity` sources. */
    HashHeap(int capacity) {
        keys = new long[capacity];
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

    void add(long key) {
        int i = size++;
        while (i > 0) {
            int parent = (i - 1) >>> 1;
            long p = keys[parent];
            if (p <= key) {
                break;
            }
            keys[i] = p;
            i = parent;
        }
        keys[i] = key;
    }

    /** The smallest key (the heap must not be empty). */
    long top() {
        return keys[0];
    }

    /** Replaces the smallest key with `key`: the top source moved on to its next hash. */
    void replaceTop(long key) {
        siftDown(key);
    }

    /** Removes the smallest key: the top source is read to its end. */
    void removeTop() {
        long last = keys[--size];
        if (size > 0) {
            siftDown(last);
        }
    }

    private void siftDown(long key) {
        int n = size;
        int half = n >>> 1;
        int i = 0;
        while (i < half) {
            int c = 2 * i + 1;
            long ck = keys[c];
            int r = c + 1;
            if (r < n && keys[r] < ck) {
                c = r;
                ck = keys[r];
            }
            if (key <= ck) {
                break;
            }
            keys[i] = ck;
            i = c;
        }
        keys[i] = key;
    }
}
