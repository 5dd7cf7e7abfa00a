// HashMerge: reduce-side aggregation by merging, for shuffles whose map outputs carry a HashOrder
// index. Each source (one map output's bytes of one partition, in mapped pool blocks) is read in
// its index's order — key hash ascending — by one deserialization stream; a k-way merge on the
// hash brings every record of one hash together, a small list (a hash map past RUN_KEYS_LINEAR)
// tells apart unequal keys of equal hash, and Spark's Aggregator functions (createCombiner /
// mergeValue, or mergeCombiners after a map-side combine) fold each key's records. The pairs of a
// hash are handed out once the next hash starts: memory is one hash's keys and combiners, not the
// partition (Spark's ExternalAppendOnlyMap holds every key of the partition, and spills).
//
// A source is done (its blocks may go, the `done` callback) when its last record is read.
// Not for: the index format (HashOrder), mapping or releasing blocks (SlipstreamShuffleReader),
// ordering by key (Spark's ExternalSorter runs after this when the shuffle has a key ordering).
package io.slipstream.spark.shuffle;

import java.io.InputStream;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.NoSuchElementException;
import java.util.Objects;
import java.util.PriorityQueue;
import org.apache.spark.Aggregator;
import org.apache.spark.serializer.DeserializationStream;
import org.apache.spark.serializer.SerializerInstance;
import scala.Product2;
import scala.Tuple2;
import scala.collection.AbstractIterator;
import scala.reflect.ClassTag;
import scala.reflect.ClassTag$;

final class HashMerge extends AbstractIterator<Product2<Object, Object>> {
    private static final ClassTag<Object> ANY = ClassTag$.MODULE$.Any();
    /** Keys of one hash compared by a linear scan up to this many; a hash map past it. */
    static final int RUN_KEYS_LINEAR = 8;

    /** One map output's bytes of one partition (the parts in order), and what to do when read. */
    record Source(List<ByteBuffer> parts, Runnable done) {}

    private final Aggregator<Object, Object, Object> agg;
    /** Records are (key, combiner) from a map-side combine, not (key, value). */
    private final boolean combined;
    private final Runnable perRecord;
    private final PriorityQueue<Cursor> heap = new PriorityQueue<>((a, b) -> Integer.compare(a.hash, b.hash));
    private final ArrayList<Object> keys = new ArrayList<>();
    private final ArrayList<Object> combiners = new ArrayList<>();
    private Map<Object, Integer> slots;
    private int emitted;

    /** `perRecord` runs once per record read (Spark's records-read metric). */
    HashMerge(List<Source> sources, SerializerInstance ser, Aggregator<Object, Object, Object> agg, boolean combined,
            Runnable perRecord) {
        this.agg = agg;
        this.combined = combined;
        this.perRecord = perRecord;
        for (Source s : sources) {
            Cursor c = new Cursor(s);
            if (c.count == 0) {
                s.done().run();
                continue;
            }
            c.stream = ser.deserializeStream(c);
            heap.add(c);
        }
    }

    @Override
    public boolean hasNext() {
        if (emitted < keys.size()) {
            return true;
        }
        nextRun();
        return emitted < keys.size();
    }

    @Override
    public Product2<Object, Object> next() {
        if (!hasNext()) {
            throw new NoSuchElementException();
        }
        int i = emitted++;
        Tuple2<Object, Object> t = new Tuple2<>(keys.get(i), combiners.get(i));
        keys.set(i, null);
        combiners.set(i, null);
        return t;
    }

    /** Reads every record of the smallest hash left and folds it into keys/combiners. */
    private void nextRun() {
        keys.clear();
        combiners.clear();
        slots = null;
        emitted = 0;
        Cursor first = heap.peek();
        if (first == null) {
            return;
        }
        int h = first.hash;
        while (!heap.isEmpty() && heap.peek().hash == h) {
            Cursor c = heap.poll();
            do {
                Object k = c.stream.readKey(ANY);
                Object v = c.stream.readValue(ANY);
                perRecord.run();
                fold(k, v);
            } while (c.advance() && c.hash == h);
            if (c.next < c.count) {
                heap.add(c);
            } else {
                c.finish();
            }
        }
    }

    private void fold(Object k, Object v) {
        int i = slot(k);
        if (i < 0) {
            keys.add(k);
            combiners.add(combined ? v : agg.createCombiner().apply(v));
            if (slots != null) {
                slots.put(k, keys.size() - 1);
            } else if (keys.size() > RUN_KEYS_LINEAR) {
                slots = new HashMap<>();
                for (int j = 0; j < keys.size(); j++) {
                    slots.put(keys.get(j), j);
                }
            }
        } else {
            Object c = combiners.get(i);
            combiners.set(i, combined ? agg.mergeCombiners().apply(c, v) : agg.mergeValue().apply(c, v));
        }
    }

    /** Where key `k` is among this hash's keys, or -1. */
    private int slot(Object k) {
        if (slots != null) {
            Integer i = slots.get(k);
            return i == null ? -1 : i;
        }
        for (int j = 0; j < keys.size(); j++) {
            if (Objects.equals(keys.get(j), k)) {
                return j;
            }
        }
        return -1;
    }

    /**
     * One source: its bytes seen as one run (parts in order), and an InputStream that hands the
     * deserializer the records' bytes in index order. `next` is the entry whose record the
     * deserializer reads next, `hash` its hash; the stream may run ahead of it (buffering).
     */
    static final class Cursor extends InputStream {
        private final ByteBuffer[] parts;
        private final long[] starts;
        private final long length;
        private final Runnable done;
        /** Where the index starts (= where the records' region ends). */
        private final long indexAt;
        final int count;
        int next;
        int hash;
        DeserializationStream stream;
        /** The entry being served to the stream, and its bytes left [pos, end). */
        private int served = -1;
        private long pos;
        private long end;
        /** The last part used by index reads and by record reads (each goes forward mostly). */
        private int indexPart;
        private int recordPart;

        Cursor(Source s) {
            done = s.done();
            parts = s.parts().toArray(new ByteBuffer[0]);
            starts = new long[parts.length];
            long n = 0;
            for (int i = 0; i < parts.length; i++) {
                starts[i] = n;
                n += parts[i].remaining();
            }
            length = n;
            if (length < HashOrder.TRAILER_BYTES || getInt(length - 4) != HashOrder.MAGIC) {
                throw new IllegalStateException("Slipstream shuffle segment of " + length + " bytes has no order index");
            }
            count = getInt(length - 8);
            indexAt = length - HashOrder.TRAILER_BYTES - (long) count * HashOrder.ENTRY_BYTES;
            if (count < 0 || indexAt < 0) {
                throw new IllegalStateException("Slipstream shuffle order index of " + count + " entries in " + length + " bytes");
            }
            if (count > 0) {
                hash = getInt(indexAt);
            }
        }

        /** Moves to the next entry; false at the end. */
        boolean advance() {
            next++;
            if (next < count) {
                hash = getInt(indexAt + (long) next * HashOrder.ENTRY_BYTES);
                return true;
            }
            return false;
        }

        /** Not InputStream.close (the stream's close calls that): the source is read. */
        void finish() {
            stream.close();
            stream = null;
            done.run();
        }

        /** The part holding byte `at`, scanning on from `hint` (binary search when behind it). */
        private int partOf(long at, int hint) {
            int i = hint;
            if (at < starts[i]) {
                i = java.util.Arrays.binarySearch(starts, at);
                return i >= 0 ? i : -i - 2;
            }
            while (i + 1 < parts.length && starts[i + 1] <= at) {
                i++;
            }
            return i;
        }

        private byte byteAt(long at) {
            int i = recordPart = partOf(at, recordPart);
            ByteBuffer p = parts[i];
            return p.get(p.position() + (int) (at - starts[i]));
        }

        /** An int of the index or trailer. */
        private int getInt(long at) {
            int i = indexPart = partOf(at, indexPart);
            ByteBuffer p = parts[i];
            long off = at - starts[i];
            if (off + 4 <= p.remaining()) {
                return p.getInt(p.position() + (int) off);
            }
            int v = 0;
            for (int k = 0; k < 4; k++) {
                v = (v << 8) | (byteAt(at + k) & 0xff);
            }
            return v;
        }

        private long getLong(long at) {
            return ((long) getInt(at) << 32) | (getInt(at + 4) & 0xffffffffL);
        }

        /** True when [pos, end) has bytes; moves to the next entry's record when it has none. */
        private boolean more() {
            while (pos == end) {
                if (served + 1 >= count) {
                    return false;
                }
                served++;
                long e = indexAt + (long) served * HashOrder.ENTRY_BYTES;
                long start = getLong(e + 4);
                int len = getInt(e + 12);
                if (start < 0 || len < 0 || start + len > indexAt) {
                    throw new IllegalStateException("Slipstream shuffle order index entry " + served + " (" + start + ", " + len
                            + ") outside the " + indexAt + " bytes of records");
                }
                pos = start;
                end = start + len;
            }
            return true;
        }

        @Override
        public int read() {
            if (!more()) {
                return -1;
            }
            return byteAt(pos++) & 0xff;
        }

        @Override
        public int read(byte[] dst, int off, int len) {
            if (len == 0) {
                return 0;
            }
            if (!more()) {
                return -1;
            }
            int i = recordPart = partOf(pos, recordPart);
            ByteBuffer p = parts[i];
            long inPart = pos - starts[i];
            int n = (int) Math.min(Math.min(len, end - pos), p.remaining() - inPart);
            p.get(p.position() + (int) inPart, dst, off, n);
            pos += n;
            return n;
        }
    }
}
