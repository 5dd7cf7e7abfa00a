// Slipstream's merge aggregation (HashOrder on the map side, HashMerge on the reduce side: Kryo,
// an aggregated shuffle) against Spark's sort shuffle with the same serializer, local[2], 64 KiB
// blocks: SlipstreamShuffleManagerTest's jobs plus jobs that catch wrong grouping — thousands of
// unequal keys sharing seven hashCodes (negative, zero, positive), a null key, one key with
// 300,000 values, empty partitions and an empty RDD. Each result is compared with the sort
// shuffle's; the reduce tasks' peak execution memory shows which path ran (Spark's
// ExternalAppendOnlyMap reports it, the merge has no such map). Runs in the surefire execution
// "shuffle" (its own JVM).
package io.slipstream.spark.shuffle;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.io.Serializable;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.spark.HashPartitioner;
import org.apache.spark.api.java.JavaPairRDD;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.scheduler.SparkListener;
import org.apache.spark.scheduler.SparkListenerTaskEnd;
import org.apache.spark.sql.SparkSession;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import scala.Tuple2;

class MergeAggregationTest {
    static final int MEMORY_MB = 256;
    static final int BLOCK_KB = 64;

    static ShuffleDaemon daemon;
    static Map<String, List<String>> expected;
    static long sortPeakBytes;
    static SparkSession spark;

    /** A key whose hashCode is shared by every seventh id: equal hash, unequal keys. */
    static final class Collide implements Serializable {
        final int id;

        Collide(int id) {
            this.id = id;
        }

        @Override
        public int hashCode() {
            return id % 7 - 3;
        }

        @Override
        public boolean equals(Object o) {
            return o instanceof Collide c && c.id == id;
        }

        @Override
        public String toString() {
            return "k" + id;
        }
    }

    static SparkSession session(String shuffleManager) {
        SparkSession.Builder b = SlipstreamShuffleManagerTest.base()
                .config("spark.serializer", "org.apache.spark.serializer.KryoSerializer")
                .config("spark.kryo.registrator", CountingRegistrator.class.getName());
        if (shuffleManager != null) {
            b.config("spark.shuffle.manager", shuffleManager).config(SlipstreamShuffleManager.ENDPOINT, daemon.endpoint());
        }
        SparkSession s = b.getOrCreate();
        s.sparkContext().setLogLevel("ERROR");
        return s;
    }

    /** The summed peak execution memory of the job's tasks. */
    static long peakBytes(SparkSession s, Runnable job) throws java.util.concurrent.TimeoutException {
        AtomicLong peak = new AtomicLong();
        SparkListener l = new SparkListener() {
            @Override
            public void onTaskEnd(SparkListenerTaskEnd e) {
                if (e.taskMetrics() != null) {
                    peak.addAndGet(e.taskMetrics().peakExecutionMemory());
                }
            }
        };
        s.sparkContext().addSparkListener(l);
        try {
            job.run();
            s.sparkContext().listenerBus().waitUntilEmpty();
        } finally {
            s.sparkContext().removeSparkListener(l);
        }
        return peak.get();
    }

    /** "count:sum:min" of a group's values. */
    static String summary(Iterable<Integer> v) {
        long n = 0;
        long sum = 0;
        int min = Integer.MAX_VALUE;
        for (int x : v) {
            n++;
            sum += x;
            min = Math.min(min, x);
        }
        return n + ":" + sum + ":" + min;
    }

    static Map<String, List<String>> jobs(SparkSession s) {
        Map<String, List<String>> out = new LinkedHashMap<>(SlipstreamShuffleManagerTest.jobs(s));
        JavaSparkContext sc = JavaSparkContext.fromSparkContext(s.sparkContext());
        List<Integer> ids = ids(30_000);
        JavaPairRDD<Collide, Integer> colliding = sc.parallelize(ids, 5).mapToPair(i -> new Tuple2<>(new Collide(i % 3000), i));
        out.put("collidingGroupByKey", SlipstreamShuffleManagerTest.sorted(
                colliding.groupByKey(4).mapValues(MergeAggregationTest::summary).collect()));
        out.put("collidingReduceByKey", SlipstreamShuffleManagerTest.sorted(colliding.reduceByKey(Integer::sum, 3).collect()));
        out.put("collidingGroups", List.of(Long.toString(colliding.groupByKey(4).count())));
        // One key with 300,000 values beside 3,000 small groups.
        List<Integer> slices = Arrays.asList(0, 1, 2, 3, 4, 5);
        JavaPairRDD<Integer, Integer> skewed = sc.parallelize(slices, 6).flatMapToPair(m -> {
            List<Tuple2<Integer, Integer>> l = new ArrayList<>();
            for (int i = 0; i < 50_000; i++) {
                l.add(new Tuple2<>(0, m * 50_000 + i));
            }
            for (int i = 0; i < 500; i++) {
                l.add(new Tuple2<>(1 + m * 500 + i, i));
            }
            return l.iterator();
        });
        out.put("skewedGroupByKey", SlipstreamShuffleManagerTest.sorted(
                skewed.groupByKey(3).mapValues(MergeAggregationTest::summary).collect()));
        JavaPairRDD<String, Integer> nullKey = sc.parallelizePairs(
                Arrays.asList(new Tuple2<>(null, 1), new Tuple2<>("a", 2), new Tuple2<>(null, 3), new Tuple2<>("b", 4)), 2);
        out.put("nullKey", SlipstreamShuffleManagerTest.sorted(nullKey.groupByKey(2).mapValues(MergeAggregationTest::summary).collect()));
        out.put("emptyRdd", List.of(Long.toString(JavaPairRDD.fromJavaRDD(sc.<Tuple2<Integer, Integer>>emptyRDD())
                .groupByKey(4).count())));
        out.put("sparsePartitions", SlipstreamShuffleManagerTest.sorted(sc.parallelizePairs(
                Arrays.asList(new Tuple2<>(1, 1), new Tuple2<>(2, 2), new Tuple2<>(1, 3)), 2)
                .partitionBy(new HashPartitioner(16)).reduceByKey(Integer::sum, 16).collect()));
        return out;
    }

    /** A groupByKey whose reduce side Spark aggregates in ExternalAppendOnlyMap (peak memory > 0). */
    static void groupJob(SparkSession s) {
        JavaSparkContext sc = JavaSparkContext.fromSparkContext(s.sparkContext());
        List<Integer> ids = ids(20_000);
        sc.parallelize(ids, 4).mapToPair(i -> new Tuple2<>(i % 5000, i)).groupByKey(3).count();
    }

    @BeforeAll
    static void start() throws IOException, java.util.concurrent.TimeoutException {
        daemon = new ShuffleDaemon(MEMORY_MB, BLOCK_KB);
        SparkSession sort = session(null);
        try {
            expected = jobs(sort);
            sortPeakBytes = peakBytes(sort, () -> groupJob(sort));
        } finally {
            sort.stop();
        }
        spark = session(SlipstreamShuffleManager.class.getName());
    }

    @AfterAll
    static void stop() {
        if (spark != null) {
            spark.stop();
        }
        if (daemon != null) {
            daemon.close();
        }
    }

    @Test
    void sameResultsAsSparksSortShuffleWithoutAnAggregationMap() throws java.util.concurrent.TimeoutException {
        Map<String, List<String>> got = jobs(spark);
        assertEquals(expected.keySet(), got.keySet());
        for (String job : expected.keySet()) {
            assertEquals(expected.get(job), got.get(job), job);
        }
        // The colliding keys really collide in groups of ~430 per hash and all 3,000 stay apart.
        assertEquals(List.of("3000"), got.get("collidingGroups"));
        assertTrue(got.get("skewedGroupByKey").contains("(0,300000:44999850000:0)"), got.get("skewedGroupByKey").toString());
        // The merge path ran: Spark's map reports peak memory for the sort shuffle, none here.
        assertTrue(sortPeakBytes > 0, "the sort shuffle's tasks report peak execution memory: " + sortPeakBytes);
        assertEquals(0, peakBytes(spark, () -> groupJob(spark)), "Slipstream's reduce tasks built no aggregation map");
    }

    /** Counts the Kryos built in this JVM (Spark runs the registrator once per new Kryo). */
    public static final class CountingRegistrator implements org.apache.spark.serializer.KryoRegistrator {
        static final AtomicLong BUILT = new AtomicLong();

        @Override
        public void registerClasses(com.esotericsoftware.kryo.Kryo kryo) {
            BUILT.incrementAndGet();
        }
    }

    /** 0 .. n-1. */
    static List<Integer> ids(int n) {
        List<Integer> ids = new ArrayList<>(n);
        for (int i = 0; i < n; i++) {
            ids.add(i);
        }
        return ids;
    }

    @Test
    void mapTasksWriteEveryPartitionWithOneKeptKryo() {
        JavaSparkContext sc = JavaSparkContext.fromSparkContext(spark.sparkContext());
        List<Integer> ids = ids(20_000);
        int maps = 4;
        int reduces = 50;
        // No aggregator: the records go through the writer's stream per record, not the merge.
        JavaPairRDD<Integer, Integer> pairs = sc.parallelize(ids, maps).mapToPair(i -> new Tuple2<>(i, i));
        assertEquals(20_000, pairs.partitionBy(new HashPartitioner(reduces)).count());
        long before = CountingRegistrator.BUILT.get();
        long kept = ThreadKryo.taken();
        assertEquals(20_000, pairs.partitionBy(new HashPartitioner(reduces)).count());
        long built = CountingRegistrator.BUILT.get() - before;
        // A Kryo per partition stream would build maps x reduces; the threads' kept ones build none.
        assertTrue(built < maps, "Kryos built in the second job: " + built + " (kept ones taken: " + (ThreadKryo.taken() - kept) + ")");
        assertTrue(ThreadKryo.taken() - kept >= maps, "map tasks took kept Kryos: " + (ThreadKryo.taken() - kept));
    }

    /** Reduce tasks per executor thread in kryoKeptAcrossReduceTasks (local mode: the executor is this JVM). */
    static final java.util.concurrent.ConcurrentHashMap<Long, Integer> TASKS_BY_THREAD = new java.util.concurrent.ConcurrentHashMap<>();

    @Test
    void kryoKeptAcrossReduceTasksOnOneThread() {
        JavaSparkContext sc = JavaSparkContext.fromSparkContext(spark.sparkContext());
        List<Integer> ids = ids(20_000);
        int reduces = 40;
        TASKS_BY_THREAD.clear();
        long before = ThreadKryo.taken();
        long groups = sc.parallelize(ids, 4).mapToPair(i -> new Tuple2<>(i % 5000, i)).groupByKey(reduces)
                .mapPartitions(it -> {
                    TASKS_BY_THREAD.merge(Thread.currentThread().getId(), 1, Integer::sum);
                    return it;
                }).count();
        long taken = ThreadKryo.taken() - before;
        assertEquals(5000, groups);
        int threads = TASKS_BY_THREAD.size();
        assertEquals(reduces, TASKS_BY_THREAD.values().stream().mapToInt(Integer::intValue).sum());
        assertTrue(threads < reduces, "threads ran several reduce tasks each: " + TASKS_BY_THREAD);
        // Every reduce task after a thread's first took the Kryo its thread kept (built none).
        assertTrue(taken >= reduces - threads, "kept Kryos taken " + taken + " of " + reduces + " tasks on " + threads + " threads");
    }
}
