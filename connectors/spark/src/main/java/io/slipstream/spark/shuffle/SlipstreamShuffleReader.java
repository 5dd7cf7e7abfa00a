// SlipstreamShuffleReader: a reduce task's input. Spark's map output tracker says which map
// outputs (index, attempt) hold data for these partitions; the daemon says where (LOOKUP). A map
// output the daemon does not have, or has from another attempt, or whose block cannot be
// mapped, raises Spark's FetchFailedException so Spark recomputes that map task (a block that
// cannot be mapped is first reported LOST, so the recomputed attempt may commit). Blocks are
// mapped read-only (once per executor: BlockMaps) and deserialized in place; each is released
// to the daemon (RELEASE) as soon as the last segment this task reads from it is consumed. A shuffle whose map outputs carry a
// HashOrder index (an aggregator and a relocatable serializer, e.g. Kryo) is aggregated by
// HashMerge: the map outputs merged in key-hash order, one hash's keys in memory at a time, with
// Spark's Aggregator functions; otherwise aggregation is Spark's own (Aggregator:
// ExternalAppendOnlyMap), as in its BlockStoreShuffleReader. Key ordering is Spark's
// ExternalSorter either way. Under HashMerge every map output is read at once, so a block goes
// when all of its segments' last records are read (near the task's end) rather than one map
// output after the other.
package io.slipstream.spark.shuffle;

import com.esotericsoftware.kryo.Kryo;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.function.Consumer;
import org.apache.spark.InterruptibleIterator;
import org.apache.spark.ShuffleDependency;
import org.apache.spark.SparkEnv;
import org.apache.spark.TaskContext;
import org.apache.spark.serializer.DeserializationStream;
import org.apache.spark.serializer.KryoSerializerInstance;
import org.apache.spark.serializer.SerializerInstance;
import org.apache.spark.shuffle.BaseShuffleHandle;
import org.apache.spark.shuffle.FetchFailedException;
import org.apache.spark.shuffle.ShuffleReadMetricsReporter;
import org.apache.spark.shuffle.ShuffleReader;
import org.apache.spark.storage.BlockId;
import org.apache.spark.storage.BlockManagerId;
import org.apache.spark.storage.ShuffleBlockId;
import org.apache.spark.util.TaskCompletionListener;
import org.apache.spark.util.collection.ExternalSorter;
import scala.Option;
import scala.Product2;
import scala.Tuple2;
import scala.Tuple3;
import scala.collection.AbstractIterator;
import scala.collection.Iterator;

final class SlipstreamShuffleReader<K, C> implements ShuffleReader<K, C> {
    private final SlipstreamShuffleManager manager;
    private final BaseShuffleHandle<K, ?, C> handle;
    private final int startMap;
    private final int endMap;
    private final int startPartition;
    private final int endPartition;
    private final TaskContext context;
    private final ShuffleReadMetricsReporter metrics;

    /** What the tracker expects: map output `mapIndex` from attempt `mapId`. */
    private record Expect(long mapId, int mapIndex, BlockManagerId where) {}

    /** One map output's segments of one partition: one serialization stream; `id`: its place in the task's list. */
    private record Group(int id, int reduce, Expect expect, List<ShuffleClient.Segment> segments) {}

    SlipstreamShuffleReader(SlipstreamShuffleManager manager, BaseShuffleHandle<K, ?, C> handle, int startMap, int endMap,
            int startPartition, int endPartition, TaskContext context, ShuffleReadMetricsReporter metrics) {
        this.manager = manager;
        this.handle = handle;
        this.startMap = startMap;
        this.endMap = endMap;
        this.startPartition = startPartition;
        this.endPartition = endPartition;
        this.context = context;
        this.metrics = metrics;
    }

    @Override
    @SuppressWarnings({"unchecked", "rawtypes"})
    public Iterator<Product2<K, C>> read() {
        ShuffleDependency<K, ?, C> dep = handle.dependency();
        int shuffle = handle.shuffleId();
        long t0 = System.nanoTime();
        Map<Integer, List<Expect>> expected = expected(shuffle);
        ShuffleClient client;
        List<Group> groups = new ArrayList<>();
        try {
            client = manager.connect();
        } catch (IOException e) {
            throw sneaky(e);
        }
        context.addTaskCompletionListener(new TaskCompletionListener() {
            @Override
            public void onTaskCompletion(TaskContext ctx) {
                client.close(); // the daemon drops this task's pins
            }
        });
        for (int reduce = startPartition; reduce < endPartition; reduce++) {
            List<Expect> want = expected.get(reduce);
            if (want == null) {
                continue;
            }
            Map<Integer, List<ShuffleClient.Segment>> byMap = new HashMap<>();
            try {
                for (ShuffleClient.Segment s : client.lookup(manager.appId(), shuffle, reduce)) {
                    byMap.computeIfAbsent(s.map(), k -> new ArrayList<>()).add(s);
                }
            } catch (IOException e) {
                Expect first = want.get(0);
                throw sneaky(new FetchFailedException(first.where(), shuffle, first.mapId(), first.mapIndex(), reduce,
                        "Slipstream shuffle lookup failed: " + e.getMessage(), e));
            }
            for (Expect e : want) {
                List<ShuffleClient.Segment> segs = byMap.get(e.mapIndex());
                if (segs == null || segs.get(0).attempt() != e.mapId()) {
                    throw sneaky(new FetchFailedException(e.where(), shuffle, e.mapId(), e.mapIndex(), reduce,
                            "Slipstream shuffle has no segment of map " + e.mapIndex() + " attempt " + e.mapId()
                                    + " for partition " + reduce + (segs == null ? "" : " (it has attempt " + segs.get(0).attempt() + ")")
                                    + ": lost or the daemon restarted",
                            null));
                }
                groups.add(new Group(groups.size(), reduce, e, segs));
            }
        }
        metrics.incFetchWaitTime((System.nanoTime() - t0) / 1_000_000);
        Blocks blocks = new Blocks(client, groups, shuffle);
        // Runs before the listener above (Spark calls them in reverse): the pins go after the maps.
        context.addTaskCompletionListener(new TaskCompletionListener() {
            @Override
            public void onTaskCompletion(TaskContext ctx) {
                blocks.releaseAll();
            }
        });
        Iterator<Product2<K, C>> it;
        SerializerInstance ser = dep.serializer().newInstance();
        // The Kryo this executor thread kept from its last merge for the same settings (ThreadKryo):
        // a task that takes it builds none; the merge gives it (or the one it built) back at its end.
        ThreadKryo.Key kryoKey = ThreadKryo.key(dep.serializer());
        Kryo kept = ThreadKryo.take(kryoKey);
        boolean merge = HashOrder.applies(dep, ser, kept, manager.mergeAggregation());
        if (merge) {
            List<HashMerge.Source> sources = new ArrayList<>(groups.size());
            for (Group g : groups) {
                sources.add(new HashMerge.Source(blocks.open(g), () -> blocks.done(g)));
            }
            Consumer<Kryo> giveBack = kryoKey != null ? k -> ThreadKryo.give(kryoKey, k) : HashMerge.KryoRecords.releaseTo(ser);
            it = new InterruptibleIterator(context, new HashMerge(sources, ser, kept, giveBack,
                    (org.apache.spark.Aggregator) dep.aggregator().get(), dep.mapSideCombine(), metrics::incRecordsRead));
        } else {
            it = new InterruptibleIterator(context, new Records(blocks, groups, ser, kryoKey, kept));
        }
        if (!merge && dep.aggregator().isDefined()) {
            it = dep.mapSideCombine()
                    ? (Iterator) dep.aggregator().get().combineCombinersByKey((Iterator) it, context)
                    : (Iterator) dep.aggregator().get().combineValuesByKey((Iterator) it, context);
        }
        if (dep.keyOrdering().isDefined()) {
            ExternalSorter sorter = new ExternalSorter(context, Option.empty(), Option.empty(), dep.keyOrdering(), dep.serializer());
            it = sorter.insertAllAndUpdateMetrics((Iterator) it);
        }
        return it;
    }

    private Map<Integer, List<Expect>> expected(int shuffle) {
        Map<Integer, List<Expect>> out = new HashMap<>();
        Iterator<Tuple2<BlockManagerId, scala.collection.Seq<Tuple3<BlockId, Object, Object>>>> byAddress = SparkEnv.get()
                .mapOutputTracker().getMapSizesByExecutorId(shuffle, startMap, endMap, startPartition, endPartition);
        while (byAddress.hasNext()) {
            Tuple2<BlockManagerId, scala.collection.Seq<Tuple3<BlockId, Object, Object>>> t = byAddress.next();
            Iterator<Tuple3<BlockId, Object, Object>> blocks = t._2().iterator();
            while (blocks.hasNext()) {
                Tuple3<BlockId, Object, Object> b = blocks.next();
                ShuffleBlockId id = (ShuffleBlockId) b._1();
                out.computeIfAbsent(id.reduceId(), k -> new ArrayList<>()).add(new Expect(id.mapId(), (Integer) b._3(), t._1()));
            }
        }
        for (List<Expect> l : out.values()) {
            l.sort((a, b) -> Integer.compare(a.mapIndex(), b.mapIndex()));
        }
        return out;
    }

    /**
     * The groups' blocks: each mapped on first use, unmapped and released after its last group.
     * Blocks are numbered densely once for the task and kept in arrays: a 200x200 reducer holds
     * 200-400 blocks and touches each when a group opens and when it is done (session 15's
     * profile had this bookkeeping, in maps of boxed ids and a list per group per call, at 6.5%
     * of the reduce task).
     */
    private final class Blocks {
        private final ShuffleClient client;
        private final int shuffle;
        /** By dense number: the daemon's block id, the groups still to read it, the executor's mapping while held. */
        private final int[] ids;
        private final int[] usesLeft;
        private final BlockMaps.Entry[] held;
        /** By group id: each segment's dense block number, and the group's distinct ones. */
        private final int[][] segmentBlocks;
        private final int[][] groupBlocks;

        Blocks(ShuffleClient client, List<Group> groups, int shuffle) {
            this.client = client;
            this.shuffle = shuffle;
            int segments = 0;
            for (Group g : groups) {
                segments += g.segments().size();
            }
            Map<Integer, Integer> dense = new HashMap<>();
            ids = new int[segments];
            usesLeft = new int[segments];
            held = new BlockMaps.Entry[segments];
            segmentBlocks = new int[groups.size()][];
            groupBlocks = new int[groups.size()][];
            for (Group g : groups) {
                List<ShuffleClient.Segment> segs = g.segments();
                int[] sb = new int[segs.size()];
                int[] distinct = new int[segs.size()];
                int nd = 0;
                for (int k = 0; k < sb.length; k++) {
                    int block = segs.get(k).block();
                    Integer d = dense.get(block);
                    if (d == null) {
                        d = dense.size();
                        dense.put(block, d);
                        ids[d] = block;
                    }
                    sb[k] = d;
                    if (!contains(distinct, nd, d)) {
                        distinct[nd++] = d;
                        usesLeft[d]++;
                    }
                }
                segmentBlocks[g.id()] = sb;
                groupBlocks[g.id()] = java.util.Arrays.copyOf(distinct, nd);
            }
        }

        private static boolean contains(int[] a, int n, int v) {
            for (int i = 0; i < n; i++) {
                if (a[i] == v) {
                    return true;
                }
            }
            return false;
        }

        /** The group's segments as slices of the mapped blocks, in order. */
        List<ByteBuffer> open(Group g) {
            int[] sb = segmentBlocks[g.id()];
            List<ByteBuffer> parts = new ArrayList<>(sb.length);
            long bytes = 0;
            for (int k = 0; k < sb.length; k++) {
                ShuffleClient.Segment s = g.segments().get(k);
                BlockMaps.Entry m = held[sb[k]];
                if (m == null) {
                    try {
                        m = manager.blockMaps().acquire(shuffle, s.block(), s.file());
                    } catch (IOException e) {
                        lost(g, e);
                    }
                    held[sb[k]] = m;
                }
                parts.add(m.buf.slice(s.offset(), s.length()));
                bytes += s.length();
            }
            metrics.incLocalBlocksFetched(1);
            metrics.incLocalBytesRead(bytes);
            return parts;
        }

        private void lost(Group g, IOException e) {
            Expect x = g.expect();
            try {
                client.lost(manager.appId(), shuffle, x.mapIndex(), x.mapId());
            } catch (IOException ignored) {
                // the FetchFailed below recomputes the map output either way
            }
            throw sneaky(new FetchFailedException(x.where(), shuffle, x.mapId(), x.mapIndex(), g.reduce(),
                    "Slipstream shuffle block unreadable: " + e.getMessage(), e));
        }

        /** At task end: lets go of the blocks of groups not read to their end (a failed or cut-short task). */
        void releaseAll() {
            for (int d = 0; d < held.length; d++) {
                if (held[d] != null) {
                    manager.blockMaps().release(held[d]);
                    held[d] = null;
                }
            }
        }

        /** The group is read: its blocks that no other group still needs go now. */
        void done(Group g) {
            for (int d : groupBlocks[g.id()]) {
                if (--usesLeft[d] == 0) {
                    BlockMaps.Entry m = held[d];
                    if (m != null) {
                        held[d] = null;
                        manager.blockMaps().release(m);
                    }
                    try {
                        client.release(ids[d]);
                    } catch (IOException ignored) {
                        // the pin goes with the connection at task end anyway
                    }
                }
            }
        }
    }

    /**
     * The records of every group in turn (write order). With Spark's Kryo every group is read with
     * one Kryo — the thread's kept one (ThreadKryo), else one borrowed from `ser` — reset before
     * each group as Spark's stream borrows it, and kept for the thread's next task once every
     * group is read; other serializers open their own stream per group.
     */
    private final class Records extends AbstractIterator<Product2<Object, Object>> {
        private final Blocks blocks;
        private final List<Group> groups;
        private final SerializerInstance ser;
        private final ThreadKryo.Key kryoKey;
        private final Boolean unsafe;
        private Kryo kryo;
        private int next;
        private Group group;
        private DeserializationStream stream;
        private Iterator<Tuple2<Object, Object>> current;

        Records(Blocks blocks, List<Group> groups, SerializerInstance ser, ThreadKryo.Key kryoKey, Kryo kept) {
            this.blocks = blocks;
            this.groups = groups;
            this.ser = ser;
            this.kryoKey = kryoKey;
            this.unsafe = ThreadKryo.useUnsafe(ser);
            if (kryoKey != null && unsafe != null) {
                kryo = ThreadKryo.orBorrow(kept, (KryoSerializerInstance) ser);
            } else {
                ThreadKryo.give(kryoKey, kept);
            }
        }

        @Override
        public boolean hasNext() {
            while (current == null || !current.hasNext()) {
                if (current != null) {
                    finishGroup();
                }
                if (next >= groups.size()) {
                    ThreadKryo.give(kryoKey, kryo);
                    kryo = null;
                    return false;
                }
                openGroup(groups.get(next++));
            }
            return true;
        }

        @Override
        public Product2<Object, Object> next() {
            if (!hasNext()) {
                throw new java.util.NoSuchElementException();
            }
            metrics.incRecordsRead(1);
            return current.next();
        }

        private void openGroup(Group g) {
            group = g;
            SegmentInput in = new SegmentInput(blocks.open(g));
            if (kryo != null) {
                kryo.reset();
                stream = KryoStreams.in(kryo, in, unsafe);
            } else {
                stream = ser.deserializeStream(in);
            }
            current = stream.asKeyValueIterator();
        }

        private void finishGroup() {
            stream.close();
            stream = null;
            current = null;
            blocks.done(group);
            group = null;
        }
    }

    @SuppressWarnings("unchecked")
    static <E extends Throwable> RuntimeException sneaky(Throwable t) throws E {
        throw (E) t;
    }
}
