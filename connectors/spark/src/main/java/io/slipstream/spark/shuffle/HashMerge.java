// HashMerge: reduce-side aggregation by merging, for shuffles whose map outputs carry a HashOrder
// index. Each source (one map output's bytes of one partition, in mapped pool blocks) is walked in
// its index's order — key hash ascending; a k-way merge on the hash brings every record of one
// hash together, a small list (a hash map past RUN_KEYS_LINEAR) tells apart unequal keys of equal
// hash, and Spark's Aggregator functions (createCombiner / mergeValue, or mergeCombiners after a
// map-side combine) fold each key's records. The pairs of a hash are handed out once the next
// hash starts: memory is one hash's keys and combiners, not the partition (Spark's
// ExternalAppendOnlyMap holds every key of the partition, and spills).
//
// One deserialization stream reads every record, fed one record's bytes at a time (Feed): the
// records of a relocatable serializer can be read in any order (HashOrder), and one stream
// borrows one Kryo instance where a stream per source would build one per map output (each task
// deserializes its own serializer, whose Kryo pool starts empty). The feed never hands out more
// than the record being read, so the deserializer cannot read ahead into another source; a
// record it reads only part of is an error, not a silent misread. With Spark's own Kryo
// serializer instance the merge skips the stream (KryoRecords): the same Kryo, Input class and
// calls, over a copy of the one record's bytes.
//
// Before the merge each source's bytes are loaded once in address order (Cursor.warm): the merge
// reads them in hash order, random within each source, and the pool blocks were written long
// before (by another process, out of the caches): without the warm-up nearly every record read
// began with a memory miss.
//
// A source is done (its blocks may go, the `done` callback) when its last record is read.
// Not for: the index format (HashOrder), mapping or releasing blocks (SlipstreamShuffleReader),
// ordering by key (Spark's ExternalSorter runs after this when the shuffle has a key ordering).
package io.slipstream.spark.shuffle;

import com.esotericsoftware.kryo.Kryo;
import com.esotericsoftware.kryo.KryoException;
import com.esotericsoftware.kryo.io.Input;
import com.esotericsoftware.kryo.io.UnsafeInput;
import java.io.InputStream;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.NoSuchElementException;
import java.util.Objects;
import java.util.function.Consumer;
import java.util.function.LongConsumer;
import org.apache.spark.Aggregator;
import org.apache.spark.serializer.DeserializationStream;
import org.apache.spark.serializer.KryoSerializerInstance;
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
    private final LongConsumer recordsRead;
    /** The sources not read to their end, by their next hash (LoserTree keys name `cursors` slots). */
    private final Cursor[] cursors;
    private final LoserTree tree;
    private final ArrayList<Object> keys = new ArrayList<>();
    private final ArrayList<Object> combiners = new ArrayList<>();
    private Map<Object, Integer> slots;
    private int emitted;
    private final Feed feed = new Feed();
    /** Spark's stream over `feed`; null when `kryo` reads. */
    private final DeserializationStream stream;
    private final KryoRecords kryo;
    /** The record read last (readRecord). */
    private Object key;
    private Object value;
    /** The sum of the bytes the cursors' warm-up loaded (a field, so the loads are not optimized away). */
    long warmed;

    /** `recordsRead` is told how many records each hash's run read (Spark's records-read metric). */
    HashMerge(List<Source> sources, SerializerInstance ser, Aggregator<Object, Object, Object> agg, boolean combined,
            LongConsumer recordsRead) {
        this(sources, ser, null, KryoRecords.releaseTo(ser), agg, combined, recordsRead);
    }

    /**
     * As above; with Spark's KryoSerializerInstance the records are read with `kept` (a Kryo the
     * thread kept for this serializer, ThreadKryo) or else one borrowed from `ser`, and that Kryo
     * goes to `giveBack` once every record is read (not when the merge stops early or fails).
     */
    HashMerge(List<Source> sources, SerializerInstance ser, Kryo kept, Consumer<Kryo> giveBack,
            Aggregator<Object, Object, Object> agg, boolean combined, LongConsumer recordsRead) {
        this.agg = agg;
        this.combined = combined;
        this.recordsRead = recordsRead;
        cursors = new Cursor[sources.size()];
        tree = new LoserTree(sources.size());
        for (int i = 0; i < cursors.length; i++) {
            Source s = sources.get(i);
            Cursor c = new Cursor(s);
            if (c.count == 0) {
                s.done().run();
                continue;
            }
            cursors[i] = c;
            tree.add(LoserTree.key(c.hash, i));
        }
        long w = 0;
        for (Cursor c : cursors) {
            if (c != null) {
                w += c.warm();
            }
        }
        warmed = w;
        kryo = KryoRecords.of(ser, kept, giveBack);
        stream = kryo == null ? ser.deserializeStream(feed) : null;
        if (kryo == null) {
            giveBack.accept(kept);
        } else if (tree.isEmpty()) {
            kryo.close();
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
        if (tree.isEmpty()) {
            return;
        }
        int h = LoserTree.hashOf(tree.top());
        long read = 0;
        while (!tree.isEmpty() && LoserTree.hashOf(tree.top()) == h) {
            int i = LoserTree.sourceOf(tree.top());
            Cursor c = cursors[i];
            do {
                readRecord(c);
                read++;
                fold(key, value);
            } while (c.advance() && c.hash == h);
            if (c.next < c.count) {
                tree.replaceTop(LoserTree.key(c.hash, i));
            } else {
                tree.removeTop();
                cursors[i] = null;
                c.done.run();
            }
        }
        recordsRead.accept(read);
        if (tree.isEmpty()) {
            if (kryo != null) {
                kryo.close();
            } else {
                stream.close();
            }
        }
    }

    /** Reads `c`'s entry `next` into key and value. */
    private void readRecord(Cursor c) {
        if (kryo != null) {
            kryo.read(c);
            key = kryo.key;
            value = kryo.value;
            return;
        }
        feed.serve(c);
        key = stream.readKey(ANY);
        value = stream.readValue(ANY);
        feed.check();
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
     * One source: its bytes seen as one run (parts in order), walked in its index's order. The
     * index is read from one buffer: straight from the part that holds it, or, when it straddles
     * parts (the writer appends a partition's index into the rest of its current block, so it
     * often runs into the next), from a copy made once here (16 bytes per record; reading such
     * an index in place searched the parts for every int). A record's part is found by a range
     * check on the part used last (most segments are one to three parts); the general search
     * over `starts` is the fallback only.
     */
    static final class Cursor {
        static final int CACHE_LINE_BYTES = 64;
        private final ByteBuffer[] parts;
        private final long[] starts;
        private final long length;
        final Runnable done;
        /** Where the index starts (= where the records' region ends). */
        private final long indexAt;
        final int count;
        /** The entry read next, and its hash. */
        int next;
        int hash;
        /** The whole index: the part holding it, or a copy when it straddles parts; its offset there. */
        private final ByteBuffer indexBuf;
        private final int indexOff;
        /** The part used last by record reads, its bytes [partStart, partEnd) of the source, and its buffer position. */
        private int recordPart;
        private long partStart;
        private long partEnd;
        private ByteBuffer partBuf;
        private int partPos;

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
            if ((long) count * HashOrder.ENTRY_BYTES > Integer.MAX_VALUE - HashOrder.TRAILER_BYTES) {
                throw new IllegalStateException("Slipstream shuffle order index of " + count + " entries (over 2 GiB)");
            }
            int ip = partOf(indexAt);
            if (length - starts[ip] <= parts[ip].remaining()) {
                indexBuf = parts[ip];
                indexOff = indexBuf.position() + (int) (indexAt - starts[ip]);
            } else {
                indexBuf = ByteBuffer.wrap(copyOut(indexAt, count * HashOrder.ENTRY_BYTES));
                indexOff = 0;
            }
            usePart(0);
            if (count > 0) {
                hash = indexInt(0);
            }
        }

        /**
         * Loads one byte of every cache line of the source's bytes, in address order: the merge
         * then reads them in hash order (random within the source) from the cache instead of
         * taking a memory miss per record. Returns their sum (for the caller to keep).
         */
        long warm() {
            long sum = 0;
            for (ByteBuffer p : parts) {
                int end = p.limit();
                for (int at = p.position(); at < end; at += CACHE_LINE_BYTES) {
                    sum += p.get(at);
                }
            }
            return sum;
        }

        /** Moves to the next entry; false at the end. */
        boolean advance() {
            next++;
            if (next < count) {
                hash = indexInt(next * HashOrder.ENTRY_BYTES);
                return true;
            }
            return false;
        }

        /** Entry `next`'s record: {start, end} in this source's bytes, checked against the index. */
        long recordStart() {
            int e = next * HashOrder.ENTRY_BYTES;
            long start = ((long) indexInt(e + 4) << 32) | (indexInt(e + 8) & 0xffffffffL);
            int len = indexInt(e + 12);
            if (start < 0 || len <= 0 || start + len > indexAt) {
                throw new IllegalStateException("Slipstream shuffle order index entry " + next + " (" + start + ", " + len
                        + ") outside the " + indexAt + " bytes of records");
            }
            return start;
        }

        int recordLength() {
            return indexInt(next * HashOrder.ENTRY_BYTES + 12);
        }

        /** The int at `off` bytes into the index. */
        private int indexInt(int off) {
            return indexBuf.getInt(indexOff + off);
        }

        /** A copy of the `n` bytes at `at`, across parts. */
        private byte[] copyOut(long at, int n) {
            byte[] out = new byte[n];
            int done = 0;
            while (done < n) {
                // partOf skips empty parts (the last part starting at `at`), so each turn copies some.
                int i = partOf(at);
                ByteBuffer p = parts[i];
                int off = (int) (at - starts[i]);
                int k = Math.min(n - done, p.remaining() - off);
                p.get(p.position() + off, out, done, k);
                done += k;
                at += k;
            }
            return out;
        }

        /** The part holding byte `at` (< length). */
        private int partOf(long at) {
            int i = java.util.Arrays.binarySearch(starts, at);
            if (i < 0) {
                return -i - 2;
            }
            // An empty part starts where the next begins: take the last part starting at `at`.
            while (i + 1 < parts.length && starts[i + 1] == at) {
                i++;
            }
            return i;
        }

        private void usePart(int i) {
            recordPart = i;
            partStart = starts[i];
            partBuf = parts[i];
            partPos = partBuf.position();
            partEnd = partStart + partBuf.remaining();
        }

        /** Makes the part holding byte `at` of the records current. */
        private void seek(long at) {
            if (at < partStart || at >= partEnd) {
                usePart(partOf(at));
            }
        }

        private byte byteAt(long at) {
            seek(at);
            return partBuf.get(partPos + (int) (at - partStart));
        }

        /** An int of the trailer. */
        private int getInt(long at) {
            int i = partOf(at);
            ByteBuffer p = parts[i];
            long off = at - starts[i];
            if (off + 4 <= p.remaining()) {
                return p.getInt(p.position() + (int) off);
            }
            int v = 0;
            for (int k = 0; k < 4; k++) {
                int j = partOf(at + k);
                v = (v << 8) | (parts[j].get(parts[j].position() + (int) (at + k - starts[j])) & 0xff);
            }
            return v;
        }

        /** Copies up to `len` bytes at `at` (within one part) into `dst`; how many. */
        int copy(long at, byte[] dst, int off, int len) {
            seek(at);
            int n = (int) Math.min(len, partEnd - at);
            partBuf.get(partPos + (int) (at - partStart), dst, off, n);
            return n;
        }
    }

    /**
     * Reads records with the task's Kryo directly, for Spark's KryoSerializerInstance exactly:
     * what its KryoDeserializationStream does per record (readClassAndObject for the key, then
     * for the value, with a Kryo borrowed from the instance, through Kryo's Input, or UnsafeInput
     * when the instance was made with spark.kryo.unsafe), but over a copy of the one record's
     * bytes (Input.setBuffer) instead of an InputStream that Input refills per record through
     * Feed (Input.fill was 13% of a 200x200 reduce task, session 15). A record must be read to
     * exactly its end, as with Feed.
     */
    static final class KryoRecords {
        /** Where the Kryo goes when the merge is done. */
        private final Consumer<Kryo> giveBack;
        private Kryo kryo;
        private final Input input;
        private byte[] bytes = new byte[256];
        Object key;
        Object value;

        private KryoRecords(Kryo kryo, Consumer<Kryo> giveBack, boolean unsafe) {
            this.kryo = kryo;
            this.giveBack = giveBack;
            this.input = unsafe ? new UnsafeInput() : new Input();
        }

        /** For `ser` if it is Spark's KryoSerializerInstance itself (not a subclass), else null. */
        static KryoRecords of(SerializerInstance ser) {
            return of(ser, null, releaseTo(ser));
        }

        /** Gives a Kryo back to `ser`'s own pool (Spark's releaseKryo); drops it for other serializers. */
        static Consumer<Kryo> releaseTo(SerializerInstance ser) {
            if (ser instanceof KryoSerializerInstance k) {
                return x -> {
                    if (x != null) {
                        k.releaseKryo(x);
                    }
                };
            }
            return x -> {};
        }

        /**
         * As above, reading with `kept` if not null, else with a Kryo borrowed from `ser`; the Kryo
         * goes to `giveBack` at close().
         */
        static KryoRecords of(SerializerInstance ser, Kryo kept, Consumer<Kryo> giveBack) {
            Boolean unsafe = ThreadKryo.useUnsafe(ser);
            if (unsafe == null) {
                return null;
            }
            return new KryoRecords(ThreadKryo.orBorrow(kept, (KryoSerializerInstance) ser), giveBack, unsafe);
        }

        /** Reads `c`'s entry `next` into key and value. */
        void read(Cursor c) {
            long start = c.recordStart();
            int len = c.recordLength();
            if (bytes.length < len) {
                bytes = new byte[Math.max(len, 2 * bytes.length)];
            }
            for (int n = 0; n < len; ) {
                n += c.copy(start + n, bytes, n, len - n);
            }
            input.setBuffer(bytes, 0, len);
            try {
                key = kryo.readClassAndObject(input);
                value = kryo.readClassAndObject(input);
            } catch (KryoException e) {
                if (String.valueOf(e.getMessage()).contains("Buffer underflow")) {
                    throw new IllegalStateException("Slipstream shuffle record of " + len + " bytes read past its end: "
                            + "the order index does not match the serializer's records", e);
                }
                throw e;
            }
            if (input.position() != len) {
                throw new IllegalStateException("Slipstream shuffle record read " + (len - input.position())
                        + " bytes short of its end: the order index does not match the serializer's records");
            }
        }

        /** Gives the Kryo back (the merge is done); once. */
        void close() {
            if (kryo != null) {
                giveBack.accept(kryo);
                kryo = null;
            }
        }
    }

    /** The one deserialization stream's input: the bytes of the record being read, then EOF. */
    static final class Feed extends InputStream {
        private Cursor cur;
        private long pos;
        private long end;

        /** Serves `c`'s entry `next` (the previous record must be read to its end). */
        void serve(Cursor c) {
            cur = c;
            pos = c.recordStart();
            end = pos + c.recordLength();
        }

        /** The deserializer read the record to its end (else the index and the records disagree). */
        void check() {
            if (pos != end) {
                throw new IllegalStateException("Slipstream shuffle record read " + (end - pos) + " bytes short of its end: "
                        + "the order index does not match the serializer's records");
            }
        }

        @Override
        public int read() {
            if (pos == end) {
                return -1;
            }
            return cur.byteAt(pos++) & 0xff;
        }

        @Override
        public int read(byte[] dst, int off, int len) {
            if (len == 0) {
                return 0;
            }
            if (pos == end) {
                return -1;
            }
            int n = cur.copy(pos, dst, off, (int) Math.min(len, end - pos));
            pos += n;
            return n;
        }
    }
}
