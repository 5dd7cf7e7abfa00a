// HashMergeCursorTest: HashMerge's Cursor and Feed over a source split into parts at random
// places (empty parts too), so both the one-part fast paths (index in one part, record in the
// part used last) and the fallbacks (index across parts, a record across parts, a record behind
// the part used last) are read back byte for byte, with and without the merge's warm-up pass
// first (it must not move the parts). No Spark: the bytes are made here in
// HashOrder's format. Randomized: prints its seed (rerun with -Dslipstream.seed=N).
package io.slipstream.spark.shuffle;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Random;
import org.junit.jupiter.api.Test;

class HashMergeCursorTest {
    static final int CASES = 300;

    /** The records' bytes, then the index (built by HashOrder.Builder), as one array. */
    record Made(byte[] bytes, byte[][] records, int[] hashes) {}

    static Made make(Random r, int count) {
        byte[][] records = new byte[count][];
        int[] hashes = new int[count];
        HashOrder.Builder b = new HashOrder.Builder();
        java.io.ByteArrayOutputStream out = new java.io.ByteArrayOutputStream();
        for (int i = 0; i < count; i++) {
            records[i] = new byte[1 + r.nextInt(r.nextBoolean() ? 8 : 300)];
            r.nextBytes(records[i]);
            hashes[i] = r.nextInt(6) - 3; // few hashes: equal ones keep write order
            b.add(hashes[i], out.size(), records[i].length);
            out.write(records[i], 0, records[i].length);
        }
        byte[] index = b.finish();
        out.write(index, 0, index.length);
        return new Made(out.toByteArray(), records, hashes);
    }

    /** `bytes` as parts cut at random places, each a slice at a nonzero position of a larger buffer. */
    static List<ByteBuffer> split(Random r, byte[] bytes, int cuts) {
        int[] at = new int[cuts];
        for (int i = 0; i < cuts; i++) {
            at[i] = r.nextInt(bytes.length + 1);
        }
        Arrays.sort(at);
        List<ByteBuffer> parts = new ArrayList<>();
        int from = 0;
        for (int i = 0; i <= cuts; i++) {
            int to = i < cuts ? at[i] : bytes.length;
            ByteBuffer big = ByteBuffer.allocateDirect(to - from + 16);
            big.position(7);
            big.put(bytes, from, to - from);
            parts.add(big.slice(7, to - from));
            from = to;
        }
        return parts;
    }

    @Test
    void readsEveryRecordInHashOrderWhereverThePartsAreCut() {
        TestSeed seed = TestSeed.of("HashMergeCursorTest");
        Random r = seed.random();
        for (int c = 0; c < CASES; c++) {
            int count = 1 + r.nextInt(60);
            Made m = make(r, count);
            int cuts = c % 3 == 0 ? 0 : r.nextInt(8);
            boolean[] done = new boolean[1];
            HashMerge.Cursor cur = new HashMerge.Cursor(new HashMerge.Source(split(r, m.bytes(), cuts), () -> done[0] = true));
            assertEquals(count, cur.count, "seed " + seed + " case " + c);
            if (r.nextBoolean()) {
                cur.warm(); // the merge's warm-up reads the parts without moving them
            }
            // Expected order: hash ascending, then write order (HashOrder's stable sort).
            Integer[] order = new Integer[count];
            for (int i = 0; i < count; i++) {
                order[i] = i;
            }
            Arrays.sort(order, (a, b) -> a.equals(b) ? 0 : m.hashes()[a] != m.hashes()[b]
                    ? Integer.compare(m.hashes()[a], m.hashes()[b]) : Integer.compare(a, b));
            HashMerge.Feed feed = new HashMerge.Feed();
            for (int k = 0; k < count; k++) {
                int i = order[k];
                assertEquals(m.hashes()[i], cur.hash, "seed " + seed + " case " + c + " entry " + k);
                feed.serve(cur);
                byte[] got = new byte[m.records()[i].length];
                int n = 0;
                if (r.nextBoolean()) {
                    while (n < got.length) {
                        int b = feed.read();
                        got[n++] = (byte) b;
                    }
                } else {
                    while (n < got.length) {
                        n += feed.read(got, n, got.length - n);
                    }
                }
                assertEquals(-1, feed.read(), "seed " + seed + " case " + c + ": a record ends at its length");
                feed.check();
                assertArrayEquals(m.records()[i], got, "seed " + seed + " case " + c + " entry " + k);
                assertEquals(k + 1 < count, cur.advance());
            }
            assertFalse(done[0]); // the merge, not the cursor, calls done
        }
    }

    @Test
    void aSegmentWithoutTheIndexIsAClearError() {
        byte[] junk = new byte[64];
        assertThrows(IllegalStateException.class, () -> new HashMerge.Cursor(new HashMerge.Source(
                List.of(ByteBuffer.wrap(junk, 0, 30), ByteBuffer.wrap(junk, 30, 34).slice()), () -> {})));
    }
}
