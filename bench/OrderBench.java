// OrderBench (`java bench/OrderBench.java`, one core, ~10 s): what the order of a segment's
// records costs the shuffle's merge (HashMerge reads a map output's records in key-hash order,
// HashOrder, while the writer lays them out in arrival order). One reducer's input at 4M
// records 200x200: SEGS segments of RECS records of REC bytes, read merge-like (one record of
// each segment in turn, segments in a random order per turn), each segment's records either in
// write order (sequential) or in a random order (hash order over records written in arrival
// order). Each "task" reads a fresh window of a 512 MB buffer (cold, like a new reducer's input).
// Prints ns per record for both orders, 6 repetitions. Not for: Spark or the daemon (no I/O).
import java.nio.ByteBuffer;
import java.util.Random;

public class OrderBench {
    public static void main(String[] a) {
        int SEGS = 200, RECS = 100, REC = 112;
        int window = SEGS * RECS * REC;
        ByteBuffer buf = ByteBuffer.allocateDirect(512 << 20);
        Random r = new Random(1);
        for (int i = 0; i < buf.capacity(); i += 8) buf.putLong(i, r.nextLong());
        int tasks = buf.capacity() / window;
        int[][] perm = new int[SEGS][RECS];
        int[] segOrder = new int[SEGS * RECS];
        for (int s = 0; s < SEGS; s++) for (int i = 0; i < RECS; i++) segOrder[s * RECS + i] = s;
        shuffle(segOrder, r);
        for (int s = 0; s < SEGS; s++) { for (int i = 0; i < RECS; i++) perm[s][i] = i; shuffle(perm[s], r); }
        long sink = 0;
        for (int rep = 0; rep < 6; rep++) {
            for (boolean random : new boolean[] {false, true}) {
                long t0 = System.nanoTime();
                for (int t = 0; t < tasks; t++) {
                    int base = t * window;
                    int[] next = new int[SEGS];
                    for (int k = 0; k < segOrder.length; k++) {
                        int s = segOrder[k];
                        int i = next[s]++;
                        int rec = random ? perm[s][i] : i;
                        int at = base + s * RECS * REC + rec * REC;
                        for (int b = 0; b < REC; b += 8) sink += buf.getLong(at + b);
                    }
                }
                long ns = System.nanoTime() - t0;
                System.out.printf("rep %d %s: %.1f ns per record (%d tasks)%n", rep, random ? "hash order (random in segment)" : "write order (sequential)",
                        (double) ns / ((long) tasks * SEGS * RECS), tasks);
            }
        }
        System.out.println(sink == 42 ? "" : "ok");
    }
    static void shuffle(int[] x, Random r) { for (int i = x.length - 1; i > 0; i--) { int j = r.nextInt(i + 1); int t = x[i]; x[i] = x[j]; x[j] = t; } }
}
