// The shuffle manager as users run Spark: `local-cluster[2,1,1024]`, a standalone master and two
// workers in this JVM, each starting one executor JVM (1 core, 1024 MiB) from the SPARK_HOME
// that `pip install pyspark==4.0.1` lays out (scripts/setup.sh; `make test-spark` exports
// SPARK_HOME). Map tasks and reduce tasks run in different JVMs, so every segment a reducer
// reads was committed by another process. The same jobs as SlipstreamShuffleManagerTest give the
// same results with Spark's sort shuffle and with Slipstream; a segment the daemon loses raises
// FetchFailed and Spark recomputes; an executor JVM killed (SIGKILL) while it runs a reduce task
// is recomputed and the result is still the same; a daemon restarted between jobs, and a full
// pool, behave as in local mode; an application's end gives every block back even though its
// driver wrote and read nothing. Runs in the surefire execution "shuffle" (its own JVM).
// Both managers serialize with Kryo here, so Slipstream's aggregated shuffles take the merge path
// (HashOrder/HashMerge) across JVMs, through the kill and restart tests; SlipstreamShuffleManagerTest
// keeps Spark's default Java serializer (Spark's own aggregation on the reduce side).
//
// Executors get this module's classes with spark.executor.extraClassPath (target/classes for
// the manager, target/test-classes for the jobs' lambdas): the shuffle manager is created when
// an executor starts, so its class must be on the executor's own classpath (or in spark.jars,
// which Spark 4 adds before it creates the manager). With neither, every executor dies at start
// with ClassNotFoundException, the worker starts another, and a job waits for executors
// forever: that was the first local-cluster attempt's "timeout before the first job".
package io.slipstream.spark.shuffle;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.File;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.TreeMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicReference;
import java.util.stream.Stream;
import org.apache.spark.FetchFailed;
import org.apache.spark.ShuffleDependency;
import org.apache.spark.api.java.JavaFutureAction;
import org.apache.spark.api.java.JavaPairRDD;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.scheduler.SparkListener;
import org.apache.spark.scheduler.SparkListenerExecutorRemoved;
import org.apache.spark.scheduler.SparkListenerStageSubmitted;
import org.apache.spark.scheduler.SparkListenerTaskEnd;
import org.apache.spark.scheduler.SparkListenerTaskStart;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.util.LongAccumulator;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.MethodOrderer;
import org.junit.jupiter.api.Order;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestMethodOrder;
import org.junit.jupiter.api.Timeout;
import scala.Tuple2;

@TestMethodOrder(MethodOrderer.OrderAnnotation.class)
@Timeout(value = 600, unit = TimeUnit.SECONDS)
class LocalClusterShuffleTest {
    static final String MASTER = "local-cluster[2,1,1024]";
    static final int MEMORY_MB = 256;
    static final int BLOCK_KB = 64;
    /** Bound on every job of this class (executor JVMs start slowly on a loaded machine). */
    static final long JOB_SECONDS_MAX = 240;

    static ShuffleDaemon daemon;
    static Map<String, List<String>> expected;
    static SparkSession spark;
    static final List<String> appIds = new ArrayList<>();

    /** pyspark's SPARK_HOME: the executors' JVMs are started from its jars. */
    static Path sparkHome() {
        String h = System.getenv("SPARK_HOME");
        if (h == null || h.isBlank()) {
            throw new IllegalStateException("SPARK_HOME is not set: local-cluster starts executors from a Spark "
                    + "installation; `make test-spark` sets it to pip's pyspark==4.0.1 (scripts/setup.sh installs it)");
        }
        Path p = Path.of(h);
        if (!Files.isRegularFile(p.resolve("jars/spark-core_2.13-4.0.1.jar"))) {
            throw new IllegalStateException("SPARK_HOME=" + h + " has no jars/spark-core_2.13-4.0.1.jar (pip install pyspark==4.0.1)");
        }
        return p;
    }

    static SparkSession session(String shuffleManager) {
        sparkHome();
        String cp = new File("target/classes").getAbsolutePath() + File.pathSeparator
                + new File("target/test-classes").getAbsolutePath();
        SparkSession.Builder b = SparkSession.builder()
                .master(MASTER)
                .appName("slipstream-shuffle-local-cluster")
                .config("spark.ui.enabled", "false")
                .config("spark.sql.shuffle.partitions", "7")
                .config("spark.driver.host", "127.0.0.1")
                .config("spark.driver.bindAddress", "127.0.0.1")
                .config("spark.executor.extraClassPath", cp)
                .config("spark.serializer", "org.apache.spark.serializer.KryoSerializer")
                // One core per executor: a serial collector instead of one GC thread per host core.
                .config("spark.executor.extraJavaOptions", "-XX:+UseSerialGC");
        if (shuffleManager != null) {
            b.config("spark.shuffle.manager", shuffleManager).config(SlipstreamShuffleManager.ENDPOINT, daemon.endpoint());
        }
        SparkSession s = b.getOrCreate();
        s.sparkContext().setLogLevel("WARN");
        appIds.add(s.sparkContext().applicationId());
        // Both executors up, or a clear failure: an executor that cannot start (its class path,
        // SPARK_HOME) is restarted by its worker forever and a job would wait for it forever.
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(JOB_SECONDS_MAX);
        while (s.sparkContext().statusTracker().getExecutorInfos().length < 3) { // the driver + 2
            if (System.nanoTime() > deadline) {
                String app = s.sparkContext().applicationId();
                s.stop();
                throw new IllegalStateException("local-cluster executors not registered in " + JOB_SECONDS_MAX
                        + " s; their logs: target/local-cluster-logs/" + app + "/*/stderr");
            }
            try {
                Thread.sleep(200);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
                throw new IllegalStateException("interrupted", e);
            }
        }
        return s;
    }

    @BeforeAll
    @Timeout(value = 900, unit = TimeUnit.SECONDS)
    static void start() throws IOException {
        daemon = new ShuffleDaemon(MEMORY_MB, BLOCK_KB);
        SparkSession sort = session(null);
        try {
            expected = SlipstreamShuffleManagerTest.jobs(sort);
        } finally {
            sort.stop();
        }
        spark = session(SlipstreamShuffleManager.class.getName());
    }

    @AfterAll
    static void stop() throws IOException {
        if (spark != null) {
            spark.stop();
        }
        if (daemon != null) {
            daemon.close();
        }
        // The workers write each executor's stdout/stderr (and a copy of spark.jars) under
        // SPARK_HOME/work/<app>: the logs move to target/local-cluster-logs/<app>/<executor>/
        // (where to look when a job here fails), and nothing is left in SPARK_HOME.
        Path work = Path.of(System.getenv().getOrDefault("SPARK_HOME", "/nonexistent"), "work");
        Path keep = Path.of("target", "local-cluster-logs");
        for (String app : appIds) {
            Path d = work.resolve(app);
            if (!Files.isDirectory(d)) {
                continue;
            }
            try (Stream<Path> files = Files.walk(d)) {
                for (Path f : files.sorted(Comparator.reverseOrder()).toList()) {
                    String name = f.getFileName().toString();
                    if (Files.isRegularFile(f) && (name.equals("stderr") || name.equals("stdout"))) {
                        Path to = keep.resolve(work.relativize(f));
                        Files.createDirectories(to.getParent());
                        Files.copy(f, to, java.nio.file.StandardCopyOption.REPLACE_EXISTING);
                    }
                    Files.delete(f);
                }
            }
        }
    }

    static JavaSparkContext sc() {
        return JavaSparkContext.fromSparkContext(spark.sparkContext());
    }

    /** The job's result within JOB_SECONDS_MAX, or the test fails (never waits forever). */
    static <T> T within(JavaFutureAction<T> job) throws Exception {
        try {
            return job.get(JOB_SECONDS_MAX, TimeUnit.SECONDS);
        } catch (java.util.concurrent.TimeoutException e) {
            job.cancel(true);
            throw new AssertionError("job not done in " + JOB_SECONDS_MAX + " s", e);
        }
    }

    static int shuffleId(JavaPairRDD<?, ?> shuffled) {
        return ((ShuffleDependency<?, ?, ?>) shuffled.rdd().dependencies().head()).shuffleId();
    }

    /** Sums of i over i % 10, i in [0, n): the answer of the recompute tests, computed here. */
    static List<String> sumsByTen(int n) {
        Map<Integer, Integer> m = new TreeMap<>();
        for (int i = 0; i < n; i++) {
            m.merge(i % 10, i, Integer::sum);
        }
        List<String> out = new ArrayList<>();
        m.forEach((k, v) -> out.add(new Tuple2<>(k, v).toString()));
        return out.stream().sorted().toList();
    }

    /** (i % 10, sum of i) for i in [0, n) through a shuffle into `reduces` partitions; `mapped`
     * counts the records the map side made (more than n when map tasks ran again). */
    static JavaPairRDD<Integer, Integer> sumsByTenRdd(int n, int reduces, LongAccumulator mapped) {
        List<Integer> xs = new ArrayList<>(n);
        for (int i = 0; i < n; i++) {
            xs.add(i);
        }
        return sc().parallelize(xs, 4).mapToPair(i -> {
            mapped.add(1);
            return new Tuple2<>(i % 10, i);
        }).reduceByKey(Integer::sum, reduces);
    }

    /** Counts FetchFailed task ends and removed executors while installed. */
    static final class Watch extends SparkListener implements AutoCloseable {
        final AtomicInteger fetchFailed = new AtomicInteger();
        final AtomicInteger executorsRemoved = new AtomicInteger();

        Watch() {
            sc().sc().addSparkListener(this);
        }

        @Override
        public void onTaskEnd(SparkListenerTaskEnd e) {
            if (e.reason() instanceof FetchFailed) {
                fetchFailed.incrementAndGet();
            }
        }

        @Override
        public void onExecutorRemoved(SparkListenerExecutorRemoved e) {
            executorsRemoved.incrementAndGet();
        }

        void drain() throws java.util.concurrent.TimeoutException {
            sc().sc().listenerBus().waitUntilEmpty();
        }

        @Override
        public void close() {
            sc().sc().removeSparkListener(this);
        }
    }

    @Test
    @Order(1)
    void sameResultsAsSparksSortShuffleAcrossExecutorJvms() throws IOException {
        Map<String, List<String>> got = SlipstreamShuffleManagerTest.jobs(spark);
        for (String job : expected.keySet()) {
            assertEquals(expected.get(job), got.get(job), job);
        }
        String m = daemon.metrics();
        assertFalse(m.contains("slipstream_shuffle_commits_total 0\n"), m);
        assertFalse(m.contains("slipstream_shuffle_lookups_total 0\n"), m);
        // Two executor JVMs really ran tasks (not the driver).
        assertTrue(spark.sparkContext().getExecutorMemoryStatus().size() >= 3, "driver + 2 executors");
    }

    @Test
    @Order(2)
    void aLostSegmentRaisesFetchFailedAndSparkRecomputes() throws Exception {
        LongAccumulator mapped = sc().sc().longAccumulator("mapped-lost");
        JavaPairRDD<Integer, Integer> sums = sumsByTenRdd(5000, 3, mapped);
        try (Watch w = new Watch()) {
            assertEquals(sumsByTen(5000), SlipstreamShuffleManagerTest.sorted(within(sums.collectAsync())));
            assertEquals(5000, mapped.value());
            // The daemon drops one map output (what LOST does for a reader that found its block
            // unreadable): the next reader of it must raise FetchFailed, not return less data.
            String app = SlipstreamShuffleManager.daemonAppId(spark.sparkContext().applicationId());
            int shuffle = shuffleId(sums);
            try (ShuffleClient c = new ShuffleClient(daemon.endpoint(), 2000, 10_000)) {
                List<ShuffleClient.Segment> segs = c.lookup(app, shuffle, 0);
                assertFalse(segs.isEmpty(), "partition 0 has segments");
                ShuffleClient.Segment s = segs.get(0);
                c.lost(app, shuffle, s.map(), s.attempt());
                assertTrue(c.lookup(app, shuffle, 0).stream().noneMatch(x -> x.map() == s.map()), "map output dropped");
            }
            assertEquals(sumsByTen(5000), SlipstreamShuffleManagerTest.sorted(within(sums.collectAsync())));
            w.drain();
            assertTrue(w.fetchFailed.get() > 0, "a FetchFailed task end was seen");
            assertTrue(mapped.value() > 5000 && mapped.value() < 10_000,
                    "only the lost map output was recomputed: " + mapped.value());
        }
    }

    /** The executor JVM of `execId` in application `app` (a child of a worker in this JVM). */
    static Optional<ProcessHandle> executorJvm(String app, String execId) {
        return ProcessHandle.current().descendants().filter(p -> {
            String[] args = p.info().arguments().orElse(new String[0]);
            boolean backend = false;
            boolean ourApp = false;
            boolean ourExec = false;
            for (int i = 0; i < args.length; i++) {
                backend |= args[i].endsWith("CoarseGrainedExecutorBackend");
                ourApp |= args[i].equals("--app-id") && i + 1 < args.length && args[i + 1].equals(app);
                ourExec |= args[i].equals("--executor-id") && i + 1 < args.length && args[i + 1].equals(execId);
            }
            return backend && ourApp && ourExec;
        }).findFirst();
    }

    /**
     * SIGKILL to an executor JVM that holds map output of the job and is running one of its reduce
     * tasks. Spark reruns that reduce task elsewhere and drops the executor's map outputs from its
     * tracker (no external shuffle service). The rerun reads them from the daemon, which still
     * has them (they never lived in the executor), or, if the tracker's loss reaches the reduce
     * stage first, Spark recomputes those map tasks; either way the lost map outputs are
     * recomputed by the next job at the latest, and every answer is the same.
     */
    @Test
    @Order(3)
    void anExecutorKilledDuringTheReduceStageIsRecomputed() throws Exception {
        LongAccumulator mapped = sc().sc().longAccumulator("mapped-kill");
        JavaPairRDD<Integer, Integer> sums = sumsByTenRdd(20_000, 4, mapped);
        // Each reduce task takes a while, so the kill lands while the victim's reduce task runs.
        JavaPairRDD<Integer, Integer> slow = sums.mapPartitionsToPair(it -> {
            Thread.sleep(3000);
            return it;
        }, true);
        AtomicReference<Integer> reduceStage = new AtomicReference<>();
        java.util.Set<String> mapExecutors = java.util.concurrent.ConcurrentHashMap.newKeySet();
        AtomicReference<String> victim = new AtomicReference<>();
        AtomicInteger reduceTasksLost = new AtomicInteger();
        CountDownLatch victimReducing = new CountDownLatch(1);
        SparkListener l = new SparkListener() {
            @Override
            public void onStageSubmitted(SparkListenerStageSubmitted e) {
                if (!e.stageInfo().parentIds().isEmpty() && reduceStage.get() == null) {
                    reduceStage.set(e.stageInfo().stageId());
                }
            }

            @Override
            public void onTaskEnd(SparkListenerTaskEnd e) {
                Integer r = reduceStage.get();
                if (r == null && e.taskInfo().successful()) {
                    mapExecutors.add(e.taskInfo().executorId());
                } else if (r != null && e.stageId() == r && e.reason() instanceof org.apache.spark.ExecutorLostFailure) {
                    reduceTasksLost.incrementAndGet();
                }
            }

            @Override
            public void onTaskStart(SparkListenerTaskStart e) {
                Integer r = reduceStage.get();
                String exec = e.taskInfo().executorId();
                if (r != null && e.stageId() == r && mapExecutors.contains(exec) && victim.compareAndSet(null, exec)) {
                    victimReducing.countDown();
                }
            }
        };
        try (Watch w = new Watch()) {
            sc().sc().addSparkListener(l);
            JavaFutureAction<List<Tuple2<Integer, Integer>>> job = slow.collectAsync();
            assertTrue(victimReducing.await(JOB_SECONDS_MAX, TimeUnit.SECONDS), "a reduce task started on a map executor");
            String app = spark.sparkContext().applicationId();
            ProcessHandle jvm = executorJvm(app, victim.get()).orElse(null);
            assertNotNull(jvm, "executor " + victim.get() + "'s JVM found among this JVM's descendants");
            assertTrue(jvm.destroyForcibly(), "SIGKILL sent to executor " + victim.get());
            jvm.onExit().get(30, TimeUnit.SECONDS);
            assertEquals(sumsByTen(20_000), SlipstreamShuffleManagerTest.sorted(within(job)));
            w.drain();
            assertTrue(w.executorsRemoved.get() >= 1, "Spark saw the executor go");
            assertTrue(reduceTasksLost.get() >= 1, "the victim's reduce task was lost and rerun");
        } finally {
            sc().sc().removeSparkListener(l);
        }
        // The executor the worker started in the killed one's place serves the next job too,
        // and by now the killed executor's map outputs have been recomputed.
        assertEquals(sumsByTen(20_000), SlipstreamShuffleManagerTest.sorted(within(sums.collectAsync())));
        assertTrue(mapped.value() > 20_000, "map tasks recomputed: " + mapped.value());
    }

    @Test
    @Order(4)
    void aDaemonRestartedBetweenJobsIsRecomputed() throws Exception {
        LongAccumulator mapped = sc().sc().longAccumulator("mapped-restart");
        JavaPairRDD<Integer, Integer> sums = sumsByTenRdd(5000, 3, mapped);
        try (Watch w = new Watch()) {
            assertEquals(sumsByTen(5000), SlipstreamShuffleManagerTest.sorted(within(sums.collectAsync())));
            daemon.restart(MEMORY_MB, BLOCK_KB);
            assertEquals(sumsByTen(5000), SlipstreamShuffleManagerTest.sorted(within(sums.collectAsync())));
            w.drain();
            assertTrue(w.fetchFailed.get() > 0, "a FetchFailed task end was seen");
            assertTrue(mapped.value() >= 10_000, "every map output recomputed: " + mapped.value());
        }
    }

    @Test
    @Order(5)
    void aFullPoolIsAClearFailureAndNothingIsCorrupted() throws Exception {
        daemon.restart(1, 64); // 16 blocks of 64 KiB
        List<Integer> xs = new ArrayList<>();
        for (int i = 0; i < 64; i++) {
            xs.add(i);
        }
        JavaPairRDD<Integer, String> big = sc().parallelize(xs, 2).mapToPair(i -> new Tuple2<>(i % 4, "y".repeat(40_000)));
        Exception e = assertThrows(Exception.class, () -> within(big.groupByKey(2).countAsync()));
        StringBuilder why = new StringBuilder();
        for (Throwable t = e; t != null; t = t.getCause()) {
            why.append(t.getMessage()).append('\n');
        }
        assertTrue(why.toString().contains("shuffle pool full"), why.toString());
        assertTrue(daemon.metrics().matches("(?s).*slipstream_shuffle_alloc_refused_total [1-9].*"), "refusals counted");
        // Room again: the same job completes with the right answer.
        daemon.restart(MEMORY_MB, BLOCK_KB);
        assertEquals(List.of("(0,16)", "(1,16)", "(2,16)", "(3,16)"), SlipstreamShuffleManagerTest.sorted(within(
                big.groupByKey(2).mapValues(v -> {
                    int n = 0;
                    for (String x : v) {
                        n += x.length() == 40_000 ? 1 : 0;
                    }
                    return n;
                }).collectAsync())));
    }

    /** A metric of the daemon's text (the unlabelled sample), or the test fails. */
    static long metric(String text, String name) {
        java.util.regex.Matcher m = java.util.regex.Pattern.compile("(?m)^" + name + " (\\d+)$").matcher(text);
        assertTrue(m.find(), name + " in\n" + text);
        return Long.parseLong(m.group(1));
    }

    @Test
    @Order(6)
    void anApplicationsEndFreesEveryBlockAndFile() throws Exception {
        // A new application whose shuffle stays registered (its RDD is held, so Spark's
        // ContextCleaner drops none of it): its end alone must give every block back. The
        // driver's manager reads and writes nothing here, so it never looked its app id up.
        spark.stop();
        spark = session(SlipstreamShuffleManager.class.getName());
        LongAccumulator mapped = sc().sc().longAccumulator("mapped-end");
        // Held until the application ends: a shuffle dependency the driver's GC collects is
        // dropped by the ContextCleaner (its blocks freed, and the app id looked up) first.
        JavaPairRDD<Integer, Integer> sums = sumsByTenRdd(5000, 3, mapped);
        assertEquals(sumsByTen(5000), SlipstreamShuffleManagerTest.sorted(within(sums.collectAsync())));
        assertTrue(metric(daemon.metrics(), "slipstream_shuffle_blocks_in_use") > 0, "the job's blocks are held");
        spark.stop();
        spark = null;
        java.lang.ref.Reference.reachabilityFence(sums);
        String m = daemon.metrics();
        assertEquals(0, metric(m, "slipstream_shuffle_blocks_in_use"), m);
        assertEquals(0, metric(m, "slipstream_shuffle_shuffles"), m);
        // Files: only the freed ones the pool keeps for reuse (pool.rs free_keep).
        long files;
        try (Stream<Path> f = Files.list(daemon.dir)) {
            files = f.filter(p -> p.getFileName().toString().startsWith("blk-")).count();
        }
        assertEquals(metric(m, "slipstream_shuffle_blocks_free"), files, m);
    }
}
