// The shuffle manager against the real daemon (a [shuffle] table, 64 KiB blocks so records and
// partitions span blocks): the same jobs give the same results as Spark's sort shuffle;
// segments lost with a daemon restart make Spark recompute (FetchFailed); a full pool and an
// absent daemon are clear errors. Runs in its own JVM (the surefire execution "shuffle"): the
// shuffle manager is fixed when a SparkContext starts.
package io.slipstream.spark.shuffle;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.IOException;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.spark.SparkConf;
import org.apache.spark.FetchFailed;
import org.apache.spark.HashPartitioner;
import org.apache.spark.api.java.JavaPairRDD;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.scheduler.SparkListener;
import org.apache.spark.scheduler.SparkListenerTaskEnd;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.util.LongAccumulator;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.MethodOrderer;
import org.junit.jupiter.api.Order;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestMethodOrder;
import scala.Tuple2;

@TestMethodOrder(MethodOrderer.OrderAnnotation.class)
class SlipstreamShuffleManagerTest {
    static final int MEMORY_MB = 256;
    static final int BLOCK_KB = 64;

    static ShuffleDaemon daemon;
    static Map<String, List<String>> expected;
    static SparkSession spark;

    /** The tests' session settings (local[2], no UI, loopback). */
    static SparkSession.Builder base() {
        return SparkSession.builder()
                .master("local[2]")
                .appName("slipstream-shuffle-tests")
                .config("spark.ui.enabled", "false")
                .config("spark.sql.shuffle.partitions", "7")
                .config("spark.driver.host", "127.0.0.1")
                .config("spark.driver.bindAddress", "127.0.0.1");
    }

    static SparkSession session(String shuffleManager) {
        SparkSession.Builder b = base();
        if (shuffleManager != null) {
            b.config("spark.shuffle.manager", shuffleManager).config(SlipstreamShuffleManager.ENDPOINT, daemon.endpoint());
        }
        SparkSession s = b.getOrCreate();
        s.sparkContext().setLogLevel("ERROR");
        return s;
    }

    @BeforeAll
    static void start() throws IOException {
        daemon = new ShuffleDaemon(MEMORY_MB, BLOCK_KB);
        SparkSession sort = session(null);
        expected = jobs(sort);
        sort.stop();
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

    /** Each job's result as sorted text (order-sensitive ones keep their order). */
    static Map<String, List<String>> jobs(SparkSession s) {
        JavaSparkContext sc = JavaSparkContext.fromSparkContext(s.sparkContext());
        List<Tuple2<Integer, Integer>> data = new ArrayList<>();
        for (int i = 0; i < 12_000; i++) {
            // Skewed: a third of the records share key 0.
            data.add(new Tuple2<>(i % 3 == 0 ? 0 : i % 997, i));
        }
        JavaPairRDD<Integer, Integer> pairs = sc.parallelizePairs(data, 6);
        Map<String, List<String>> out = new LinkedHashMap<>();
        out.put("groupByKey", sorted(pairs.groupByKey(5).mapValues(v -> {
            List<Integer> l = new ArrayList<>();
            v.forEach(l::add);
            Collections.sort(l);
            return l.size() + ":" + l.stream().mapToLong(Integer::longValue).sum() + ":" + l.get(0);
        }).collect()));
        out.put("reduceByKey", sorted(pairs.reduceByKey(Integer::sum, 4).collect()));
        out.put("sortByKey", pairs.mapToPair(t -> new Tuple2<>(t._2() * 7919 % 12_007, t._1())).sortByKey(true, 3).collect()
                .stream().map(Tuple2::toString).toList());
        JavaPairRDD<Integer, String> names = sc.parallelizePairs(
                Arrays.asList(new Tuple2<>(0, "zero"), new Tuple2<>(5, "five"), new Tuple2<>(996, "last"), new Tuple2<>(5, "v")), 2);
        out.put("join", sorted(pairs.join(names, 3).collect()));
        // More partitions than keys: most reduce partitions are empty. A group's order is the
        // order map outputs arrive in (not fixed across executors): compare it sorted.
        out.put("emptyPartitions", sorted(sc.parallelizePairs(Arrays.asList(new Tuple2<>(1, 1), new Tuple2<>(2, 2), new Tuple2<>(1, 3)), 2)
                .partitionBy(new HashPartitioner(16)).groupByKey().mapValues(v -> {
                    List<Integer> l = new ArrayList<>();
                    v.forEach(l::add);
                    Collections.sort(l);
                    return l.toString();
                }).collect()));
        // Records larger than a block (64 KiB here).
        out.put("largeRecords", sorted(sc.parallelize(Arrays.asList(0, 1, 2, 3, 4, 5), 3)
                .mapToPair(i -> new Tuple2<>(i % 2, "x".repeat(150_000 + i)))
                .groupByKey(2).mapValues(v -> {
                    long n = 0;
                    for (String x : v) {
                        n += x.length();
                    }
                    return n;
                }).collect()));
        out.put("sql", s.range(0, 20_000).selectExpr("id % 101 as k", "id as v").groupBy("k").sum("v").collectAsList()
                .stream().map(Row::toString).sorted().toList());
        return out;
    }

    static <T> List<String> sorted(List<T> l) {
        return l.stream().map(Object::toString).sorted().toList();
    }

    @Test
    @Order(1)
    void sameResultsAsSparksSortShuffle() throws IOException {
        Map<String, List<String>> got = jobs(spark);
        for (String job : expected.keySet()) {
            assertEquals(expected.get(job), got.get(job), job);
        }
        String m = daemon.metrics();
        assertTrue(m.contains("# HELP slipstream_shuffle_commits_total"), m);
        assertTrue(!m.contains("slipstream_shuffle_commits_total 0\n"), m);
        assertTrue(!m.contains("slipstream_shuffle_lookups_total 0\n"), m);
    }

    @Test
    @Order(2)
    void lostSegmentsMakeSparkRecompute() throws Exception {
        JavaSparkContext sc = JavaSparkContext.fromSparkContext(spark.sparkContext());
        LongAccumulator mapped = sc.sc().longAccumulator("mapped");
        AtomicInteger fetchFailed = new AtomicInteger();
        SparkListener l = new SparkListener() {
            @Override
            public void onTaskEnd(SparkListenerTaskEnd e) {
                if (e.reason() instanceof FetchFailed) {
                    fetchFailed.incrementAndGet();
                }
            }
        };
        sc.sc().addSparkListener(l);
        try {
            List<Integer> xs = new ArrayList<>();
            for (int i = 0; i < 5000; i++) {
                xs.add(i);
            }
            JavaPairRDD<Integer, Integer> sums = sc.parallelize(xs, 4).mapToPair(i -> {
                mapped.add(1);
                return new Tuple2<>(i % 10, i);
            }).reduceByKey(Integer::sum, 3);
            List<String> first = sorted(sums.collect());
            long mapsFirst = mapped.value();
            assertEquals(5000, mapsFirst);
            // Again without loss: the map stage is skipped (Spark reuses the shuffle output).
            assertEquals(first, sorted(sums.collect()));
            assertEquals(5000, mapped.value());
            // The daemon crashes and comes back empty: reducers find no segment, raise
            // FetchFailed, and Spark runs the map stage again.
            daemon.restart(MEMORY_MB, BLOCK_KB);
            assertEquals(first, sorted(sums.collect()));
            assertTrue(mapped.value() > 5000, "map tasks recomputed: " + mapped.value());
            sc.sc().listenerBus().waitUntilEmpty();
            assertTrue(fetchFailed.get() > 0, "a FetchFailed task end was seen");
        } finally {
            sc.sc().removeSparkListener(l);
        }
    }

    @Test
    @Order(3)
    void aFullPoolIsAClearFailureAndNothingIsCorrupted() throws IOException {
        daemon.restart(1, 64); // 16 blocks of 64 KiB
        JavaSparkContext sc = JavaSparkContext.fromSparkContext(spark.sparkContext());
        List<Integer> xs = new ArrayList<>();
        for (int i = 0; i < 64; i++) {
            xs.add(i);
        }
        JavaPairRDD<Integer, String> big = sc.parallelize(xs, 2).mapToPair(i -> new Tuple2<>(i % 4, "y".repeat(40_000)));
        Exception e = assertThrows(Exception.class, () -> big.groupByKey(2).count());
        StringBuilder why = new StringBuilder();
        for (Throwable t = e; t != null; t = t.getCause()) {
            why.append(t.getMessage()).append('\n');
        }
        assertTrue(why.toString().contains("shuffle pool full"), why.toString());
        assertTrue(daemon.metrics().contains("slipstream_shuffle_alloc_refused_total "), "metric listed");
        // Room again: the same kind of job completes with the right answer.
        daemon.restart(MEMORY_MB, BLOCK_KB);
        assertEquals(List.of("(0,16)", "(1,16)", "(2,16)", "(3,16)"), sorted(big.groupByKey(2).mapValues(v -> {
            int n = 0;
            for (String x : v) {
                n += x.length() == 40_000 ? 1 : 0;
            }
            return n;
        }).collect()));
    }

    @Test
    @Order(4)
    void anAbsentDaemonIsAClearError() throws IOException {
        SparkConf conf = new SparkConf().set(SlipstreamShuffleManager.ENDPOINT, "127.0.0.1:" + ShuffleDaemon.freeTcp());
        IllegalStateException e = assertThrows(IllegalStateException.class, () -> new SlipstreamShuffleManager(conf, true));
        assertTrue(e.getMessage().contains("unreachable") && e.getMessage().contains("[shuffle]"), e.getMessage());
    }
}
