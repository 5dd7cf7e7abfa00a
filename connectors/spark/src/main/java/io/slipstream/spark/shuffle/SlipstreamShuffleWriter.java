// SlipstreamShuffleWriter: a map task's output, serialized with the job's serializer straight
// into mapped pool blocks, then committed to the daemon as (partition -> block, offset, length).
//
// Partitioning: each non-empty partition writes into its own chunks of the shared blocks
// (Spark's bypass-merge writer keeps one file segment per partition too).
// Sorting by partition id instead would hold every record on the heap until the end (or spill
// it), which is the copy this design exists to avoid; per-partition chunks cost at most one
// partly filled chunk per partition (4 KiB for a small one). Map-side combine runs first, with
// Spark's own Aggregator. Records are not compressed: blocks are shared memory, not a network.
//
// A shuffle the reducer aggregates by merging (HashOrder.applies: an aggregator and a serializer
// whose records can be reordered) flushes the serializer after each record, notes its key hash
// and byte range, and appends each partition's HashOrder index after its records: the records
// stay where they were written. That path, and any shuffle serialized by Spark's Kryo with
// auto-reset, uses one serialization stream for all partitions (pointed at each record's
// partition; Switch) with the Kryo the executor thread kept (ThreadKryo, KryoStreams); other
// serializers (Java's keeps references across a stream's records) one stream per partition.
//
// First successful attempt wins: the commit's answer names the winning attempt, and the
// MapStatus reports that attempt and its sizes, so Spark's map output tracker and the daemon
// agree whichever attempt Spark keeps.
package io.slipstream.spark.shuffle;

import com.esotericsoftware.kryo.Kryo;
import java.io.IOException;
import java.util.ArrayList;
import java.util.List;
import org.apache.spark.Partitioner;
import org.apache.spark.ShuffleDependency;
import org.apache.spark.SparkEnv;
import org.apache.spark.TaskContext;
import org.apache.spark.scheduler.MapStatus;
import org.apache.spark.scheduler.MapStatus$;
import org.apache.spark.serializer.KryoSerializerInstance;
import org.apache.spark.serializer.SerializationStream;
import org.apache.spark.serializer.SerializerInstance;
import org.apache.spark.shuffle.BaseShuffleHandle;
import org.apache.spark.shuffle.ShuffleWriteMetricsReporter;
import org.apache.spark.shuffle.ShuffleWriter;
import scala.Option;
import scala.Product2;
import scala.collection.Iterator;
import scala.reflect.ClassTag;
import scala.reflect.ClassTag$;

final class SlipstreamShuffleWriter<K, V> extends ShuffleWriter<K, V> {
    private static final ClassTag<Object> ANY = ClassTag$.MODULE$.Any();

    private final SlipstreamShuffleManager manager;
    private final BaseShuffleHandle<K, V, ?> handle;
    private final long mapId;
    private final TaskContext context;
    private final ShuffleWriteMetricsReporter metrics;
    private ShuffleClient client;
    private MapStatus status;
    private long[] lengths = new long[0];

    SlipstreamShuffleWriter(SlipstreamShuffleManager manager, BaseShuffleHandle<K, V, ?> handle, long mapId,
            TaskContext context, ShuffleWriteMetricsReporter metrics) {
        this.manager = manager;
        this.handle = handle;
        this.mapId = mapId;
        this.context = context;
        this.metrics = metrics;
    }

    @Override
    @SuppressWarnings({"unchecked", "rawtypes"})
    public void write(Iterator<Product2<K, V>> records) throws IOException {
        ShuffleDependency<K, V, ?> dep = handle.dependency();
        Iterator<? extends Product2<K, ?>> it = dep.mapSideCombine()
                ? (Iterator) dep.aggregator().get().combineValuesByKey((Iterator) records, context)
                : records;
        Partitioner partitioner = dep.partitioner();
        int parts = partitioner.numPartitions();
        int shuffle = handle.shuffleId();
        String app = manager.appId();
        client = manager.connect();
        client.register(app, shuffle, parts, manager.tenant());
        long t0 = System.nanoTime();
        SerializerInstance ser = dep.serializer().newInstance();
        List<int[]> segments = new ArrayList<>();
        PartitionOutput[] outs = new PartitionOutput[parts];
        SerializationStream[] streams = new SerializationStream[parts];
        ThreadKryo.Key kryoKey = ThreadKryo.key(dep.serializer());
        Boolean unsafe = ThreadKryo.useUnsafe(ser);
        Kryo kryo = kryoKey != null && unsafe != null ? ThreadKryo.takeOrBorrow(kryoKey, (KryoSerializerInstance) ser) : null;
        boolean ordered = HashOrder.applies(dep, ser, kryo, manager.mergeAggregation());
        // Kryo with records that stand alone (auto-reset) writes every partition with one Kryo.
        boolean kryoOne = kryo != null && ThreadKryo.autoReset(kryo);
        if (kryo != null && !kryoOne) {
            ThreadKryo.give(kryoKey, kryo);
        }
        HashOrder.Builder[] index = ordered ? new HashOrder.Builder[parts] : null;
        try (BlockArena arena = new BlockArena(client, app, shuffle, manager.blockDir(), manager.blockBytes())) {
            // Ordered or Kryo: one stream for every partition, pointed at the record's partition
            // before each record and flushed after it (a Kryo stream per partition built a Kryo
            // per partition and task: 200 per map task at 200 reducers).
            Switch sw = ordered || kryoOne ? new Switch() : null;
            SerializationStream one = kryoOne ? KryoStreams.out(kryo, sw, unsafe, k -> ThreadKryo.give(kryoKey, k))
                    : ordered ? ser.serializeStream(sw) : null;
            while (it.hasNext()) {
                Product2<K, ?> r = it.next();
                int p = partitioner.getPartition(r._1());
                if (outs[p] == null) {
                    outs[p] = new PartitionOutput(p, arena, segments);
                    if (ordered) {
                        index[p] = new HashOrder.Builder();
                    } else if (one == null) {
                        streams[p] = ser.serializeStream(outs[p]);
                    }
                }
                if (one != null) {
                    sw.target = outs[p];
                    long start = outs[p].written();
                    one.writeKey(r._1(), ANY);
                    one.writeValue(r._2(), ANY);
                    // The record's bytes end here (Spark's relocation contract: flush per record).
                    one.flush();
                    if (ordered) {
                        index[p].add(HashOrder.hash(r._1()), start, outs[p].written() - start);
                    }
                } else {
                    streams[p].writeKey(r._1(), ANY);
                    streams[p].writeValue(r._2(), ANY);
                }
                metrics.incRecordsWritten(1);
            }
            if (one != null) {
                sw.target = null;
                one.close();
            }
            long bytes = 0;
            for (int p = 0; p < parts; p++) {
                if (outs[p] == null) {
                    continue;
                }
                if (ordered) {
                    outs[p].write(index[p].finish());
                    index[p] = null;
                } else if (one == null) {
                    streams[p].close();
                }
                outs[p].close();
                bytes += outs[p].written();
            }
            ShuffleClient.Committed won = client.commit(app, shuffle, context.partitionId(), mapId, segments);
            lengths = new long[parts];
            for (ShuffleClient.Segment s : won.segments()) {
                lengths[s.partition()] += s.length();
            }
            metrics.incBytesWritten(bytes);
            status = MapStatus$.MODULE$.apply(SparkEnv.get().blockManager().shuffleServerId(), lengths, won.attempt());
        }
        metrics.incWriteTime(System.nanoTime() - t0);
    }

    /**
     * The ordered path's one serialization stream writes here: into the partition of the record
     * being written. Bytes with no partition (a serializer header or trailer, which relocatable
     * serializers do not write) are an error, not a silent misplacement.
     */
    private static final class Switch extends java.io.OutputStream {
        PartitionOutput target;

        @Override
        public void write(int b) throws IOException {
            out().write(b);
        }

        @Override
        public void write(byte[] b, int off, int len) throws IOException {
            if (len > 0) {
                out().write(b, off, len);
            }
        }

        private PartitionOutput out() throws IOException {
            if (target == null) {
                throw new IOException("serializer wrote bytes outside a record: not relocatable");
            }
            return target;
        }

        @Override
        public void close() {
            // the partitions' outputs are closed by the writer, after their indexes
        }
    }

    @Override
    public Option<MapStatus> stop(boolean success) {
        if (client != null) {
            // Uncommitted blocks (a failed task) go back to the pool with the connection.
            client.close();
            client = null;
        }
        return success && status != null ? Option.apply(status) : Option.empty();
    }

    @Override
    public long[] getPartitionLengths() {
        return lengths;
    }
}
