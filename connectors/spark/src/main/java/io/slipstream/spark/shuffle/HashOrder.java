// HashOrder: the order index a map task writes after each partition's records when the shuffle
// is aggregated on the reduce side by merging (SlipstreamShuffleReader's HashMerge), and the one
// rule for when it is written and read.
//
// Format, appended by the writer to the partition's own bytes (same pool blocks, same commit,
// nothing new for the daemon): the records as the serializer wrote them (write order), then one
// ENTRY_BYTES entry per record in (key hash, write position) order — hash (int), start (long:
// byte offset in the partition's bytes), length (int) — then the trailer: record count (int),
// MAGIC (int). All big-endian. The records are not moved: the reducer reads them in the index's
// order from the mapped blocks. A partition that has no record has no bytes and no index.
//
// The hash is key.hashCode() computed in the map task; it is only compared among the records one
// reducer merges (Spark's HashPartitioner relies on the same hashCode across JVMs). Equal hashes
// with unequal keys are told apart by equals() in the reducer.
//
// Only for serializers whose records can be read in another order than written (Spark's
// supportsRelocationOfSerializedObjects: Kryo with auto-reset, Spark SQL's UnsafeRow serializer);
// a Java-serialized shuffle keeps Spark's own aggregation (ExternalAppendOnlyMap). Not for:
// merging (HashMerge) or where the bytes go (PartitionOutput).
package io.slipstream.spark.shuffle;

import com.esotericsoftware.kryo.Kryo;
import java.nio.ByteBuffer;
import java.util.Arrays;
import org.apache.spark.ShuffleDependency;
import org.apache.spark.serializer.KryoSerializer;
import org.apache.spark.serializer.KryoSerializerInstance;
import org.apache.spark.serializer.Serializer;
import org.apache.spark.serializer.SerializerInstance;

final class HashOrder {
    private HashOrder() {}

    /** One index entry: hash (int), start (long), length (int). */
    static final int ENTRY_BYTES = 16;
    /** The trailer: record count (int), MAGIC (int). */
    static final int TRAILER_BYTES = 8;
    /** "SSHO": marks a partition's bytes as ending in an order index. */
    static final int MAGIC = 0x5353484f;

    /**
     * Whether this shuffle's partitions carry an order index (writer and reader agree on it);
     * `ser` is the task's instance of dep's serializer (the one it reads or writes with).
     */
    static boolean applies(ShuffleDependency<?, ?, ?> dep, SerializerInstance ser, boolean enabled) {
        return applies(dep, ser, null, enabled);
    }

    /** As above; `kept` is a Kryo the thread kept for dep's serializer (ThreadKryo), or null. */
    static boolean applies(ShuffleDependency<?, ?, ?> dep, SerializerInstance ser, Kryo kept, boolean enabled) {
        return enabled && dep.aggregator().isDefined() && relocatable(dep.serializer(), ser, kept);
    }

    /**
     * Spark's supportsRelocationOfSerializedObjects, asked without a second Kryo per task. A task
     * deserializes its own copy of the dependency's serializer, so KryoSerializer's lazy answer
     * (newInstance().getAutoReset(): a new Kryo, registrations and all) was computed again in
     * every task — 6.7% of a 200x200 reduce task's profile (session 15). For KryoSerializer
     * itself (not a subclass, which may answer otherwise) the same question is put to the
     * task's own instance, whose Kryo the task builds anyway — or, when the thread kept a Kryo
     * built for this serializer's settings (`kept`, ThreadKryo), of that Kryo: no Kryo built.
     */
    static boolean relocatable(Serializer serializer, SerializerInstance ser) {
        return relocatable(serializer, ser, null);
    }

    static boolean relocatable(Serializer serializer, SerializerInstance ser, Kryo kept) {
        if (kept != null && serializer.getClass() == KryoSerializer.class) {
            return ThreadKryo.autoReset(kept);
        }
        if (serializer.getClass() == KryoSerializer.class && ser instanceof KryoSerializerInstance k) {
            return k.getAutoReset();
        }
        return serializer.supportsRelocationOfSerializedObjects();
    }

    static int hash(Object key) {
        return key == null ? 0 : key.hashCode();
    }

    /** A partition's records in write order, as the writer sees them: the index before sorting. */
    static final class Builder {
        private int[] hashes = new int[64];
        private long[] starts = new long[64];
        private int[] lengths = new int[64];
        private int n;

        void add(int hash, long start, long length) {
            if (n == hashes.length) {
                int m = n * 2;
                hashes = Arrays.copyOf(hashes, m);
                starts = Arrays.copyOf(starts, m);
                lengths = Arrays.copyOf(lengths, m);
            }
            if (length > Integer.MAX_VALUE) {
                throw new IllegalArgumentException("a shuffle record of " + length + " bytes (more than 2 GiB)");
            }
            hashes[n] = hash;
            starts[n] = start;
            lengths[n] = (int) length;
            n++;
        }

        int count() {
            return n;
        }

        /**
         * The index and trailer, in entry order (hash, then write order: a stable sort, so the
         * values of one key keep their map-side order). The bytes of the index are written
         * through the partition's stream like the records'.
         */
        byte[] finish() {
            long[] order = new long[n];
            for (int i = 0; i < n; i++) {
                // Signed hash in the high half, write number (< 2^31) in the low half.
                order[i] = ((long) hashes[i] << 32) | i;
            }
            Arrays.sort(order);
            ByteBuffer b = ByteBuffer.allocate(n * ENTRY_BYTES + TRAILER_BYTES);
            for (long o : order) {
                int i = (int) o;
                b.putInt(hashes[i]).putLong(starts[i]).putInt(lengths[i]);
            }
            b.putInt(n).putInt(MAGIC);
            return b.array();
        }
    }
}
