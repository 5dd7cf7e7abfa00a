// PageRankBench: the measuring side of `PAGERANK=1 bench/shuffle_bench.sh` — issue 17's GraphX
// PageRank (NetSpark's second job): GraphX's own `PageRank.run` for `iterations` iterations on a
// generated power-law graph, per shuffle manager (sort, tuned sort, Slipstream) in one driver run.
//
// Graph: GraphX's `GraphGenerators.logNormalGraph(vertices, parts, mu, sigma, seed)` (the
// generator of Spark's own graphx SynthBenchmark: log-normal out-degrees, generated in the
// executors from a fixed seed), its destinations then skewed `dst -> floor(n * (dst / n)^skew)` so
// in-degrees follow a power law too (vertex 0 receives about n^(-1/skew) of all edges; skew=1
// keeps logNormalGraph's uniform destinations). Built, cached and counted once per manager before
// the first round; the same graph for every manager (same seed, same partitions).
//
// Per-iteration time: GraphX's PageRank ends each iteration with one job,
// `rankGraph.edges.foreachPartition(x => {})` ("foreachPartition at PageRank.scala"), which
// materialises that iteration's two shuffles (aggregateMessages' messages to the vertex
// partitions, the new ranks shipped to the edge partitions). The listener takes each such job's
// submission → end time from Spark's listener bus (SparkListenerJobStart/End), and the summed task
// CPU, shuffle write bytes and fetch wait of that job's stages, and each stage's wall time (the
// stages that ran, in stage-id order). Iteration 0 also builds the
// initial rank graph (out-degrees), so the summary reports iterations 1..n-1 apart.
//
// Ranks check: after every round, the sum of all ranks, a few fixed vertices and the top 5 are
// compared with the first manager's first round; any difference beyond 1e-9 relative
// (floating-point sums may add in another order) prints `"ranks_match":false` and the driver
// exits 1 at the end (the bench script then fails).
//
// One warm-up round and `runs` measured rounds per manager; one JSON line per round on stdout.
// Usage: PageRankBench endpoint=H:P vertices=N parts=P mu=M sigma=S skew=K seed=X iterations=10
//   runs=R master=local-cluster[2,1,1024] jar=PATH managers=sort,tuned,slipstream daemon_pid=PID
//   [tuned_conf=k=v;k=v] [jfr_dir=DIR] [kryo=1]
// Not for: correctness tests of the shuffle manager (src/test/.../shuffle).
package io.slipstream.spark.bench;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.apache.spark.SparkConf;
import org.apache.spark.api.java.JavaRDD;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.graphx.Edge;
import org.apache.spark.graphx.Graph;
import org.apache.spark.graphx.GraphXUtils;
import org.apache.spark.graphx.lib.PageRank;
import org.apache.spark.graphx.util.GraphGenerators;
import org.apache.spark.scheduler.SparkListener;
import org.apache.spark.scheduler.SparkListenerJobEnd;
import org.apache.spark.scheduler.SparkListenerJobStart;
import org.apache.spark.scheduler.SparkListenerStageCompleted;
import org.apache.spark.scheduler.StageInfo;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.storage.StorageLevel;
import scala.Tuple2;
import scala.reflect.ClassTag;
import scala.reflect.ClassTag$;

public final class PageRankBench {
    private PageRankBench() {}

    /** The call site of the job that closes each PageRank iteration (GraphX's PageRank.scala). */
    static final String ITERATION_CALL_SITE = "foreachPartition at PageRank.scala";

    /** Relative difference allowed between two managers' ranks (sums may add in another order). */
    static final double RANK_TOLERANCE = 1e-9;

    /** Iteration jobs (by job id): start/end ms and their stages' task CPU, shuffle write, fetch wait. */
    static final class Jobs extends SparkListener {
        final Map<Integer, Long> start = new HashMap<>();
        final Map<Integer, Long> end = new HashMap<>();
        final Map<Integer, Integer> stageJob = new HashMap<>();
        final Map<Integer, Long> cpuMs = new HashMap<>();
        final Map<Integer, Long> writeBytes = new HashMap<>();
        final Map<Integer, Long> fetchWaitMs = new HashMap<>();
        /** Per job: its stages that ran (skipped ones never complete), by stage id: wall ms. */
        final Map<Integer, java.util.TreeMap<Integer, Long>> stageMs = new HashMap<>();

        @Override
        public synchronized void onJobStart(SparkListenerJobStart e) {
            // The result stage (the highest id of the job's stages) carries the job's call site.
            StageInfo last = null;
            for (StageInfo s : scala.jdk.javaapi.CollectionConverters.asJava(e.stageInfos())) {
                if (last == null || s.stageId() > last.stageId()) {
                    last = s;
                }
            }
            if (last == null || !last.name().startsWith(ITERATION_CALL_SITE)) {
                return;
            }
            start.put(e.jobId(), e.time());
            for (StageInfo s : scala.jdk.javaapi.CollectionConverters.asJava(e.stageInfos())) {
                stageJob.put(s.stageId(), e.jobId());
            }
        }

        @Override
        public synchronized void onJobEnd(SparkListenerJobEnd e) {
            if (start.containsKey(e.jobId())) {
                end.put(e.jobId(), e.time());
            }
        }

        @Override
        public synchronized void onStageCompleted(SparkListenerStageCompleted e) {
            StageInfo s = e.stageInfo();
            Integer job = stageJob.get(s.stageId());
            if (job == null) {
                return;
            }
            cpuMs.merge(job, s.taskMetrics().executorCpuTime() / 1_000_000, Long::sum);
            writeBytes.merge(job, s.taskMetrics().shuffleWriteMetrics().bytesWritten(), Long::sum);
            fetchWaitMs.merge(job, s.taskMetrics().shuffleReadMetrics().fetchWaitTime(), Long::sum);
            if (s.submissionTime().isDefined() && s.completionTime().isDefined()) {
                stageMs.computeIfAbsent(job, j -> new java.util.TreeMap<>()).put(s.stageId(),
                        (Long) s.completionTime().get() - (Long) s.submissionTime().get());
            }
        }

        synchronized void clear() {
            start.clear();
            end.clear();
            stageJob.clear();
            cpuMs.clear();
            writeBytes.clear();
            fetchWaitMs.clear();
            stageMs.clear();
        }
    }

    /** What a round's ranks are compared by. */
    record Ranks(double sum, Map<Long, Double> sample, List<Long> topIds, List<Double> topRanks) {
        /** The largest relative difference to `o` (infinite if the top vertices differ). */
        double maxRelDiff(Ranks o) {
            double d = rel(sum, o.sum);
            for (Map.Entry<Long, Double> e : sample.entrySet()) {
                Double other = o.sample.get(e.getKey());
                d = Math.max(d, other == null ? Double.POSITIVE_INFINITY : rel(e.getValue(), other));
            }
            if (!topIds.equals(o.topIds)) {
                return Double.POSITIVE_INFINITY;
            }
            for (int i = 0; i < topRanks.size(); i++) {
                d = Math.max(d, rel(topRanks.get(i), o.topRanks.get(i)));
            }
            return d;
        }

        static double rel(double a, double b) {
            return Math.abs(a - b) / Math.max(1.0, Math.max(Math.abs(a), Math.abs(b)));
        }
    }

    @SuppressWarnings("unchecked")
    static <T> ClassTag<T> tag(Class<?> c) {
        return (ClassTag<T>) ClassTag$.MODULE$.apply(c);
    }

    public static void main(String[] args) throws Exception {
        Map<String, String> o = ShuffleBench.args(args);
        int vertices = Integer.parseInt(o.getOrDefault("vertices", "200000"));
        int parts = Integer.parseInt(o.getOrDefault("parts", "8"));
        double mu = Double.parseDouble(o.getOrDefault("mu", "2.0"));
        double sigma = Double.parseDouble(o.getOrDefault("sigma", "1.3"));
        double skew = Double.parseDouble(o.getOrDefault("skew", "3"));
        long seed = Long.parseLong(o.getOrDefault("seed", "17"));
        int iterations = Integer.parseInt(o.getOrDefault("iterations", "10"));
        int runs = Integer.parseInt(o.getOrDefault("runs", "3"));
        String endpoint = o.getOrDefault("endpoint", "127.0.0.1:7300");
        String master = o.getOrDefault("master", "local[2]");
        String jar = o.get("jar");
        List<Long> daemonPid = ShuffleBench.roots(o.getOrDefault("daemon_pid", "0"));
        boolean kryo = !o.getOrDefault("kryo", "1").equals("0");
        String[][] tuned = ShuffleBench.tuned(o);
        List<String> managers = List.of(o.getOrDefault("managers", "sort,slipstream").split(","));
        // Fixed vertices whose ranks are compared across managers (besides the top 5).
        long[] sampleIds = {0, 1, 2, vertices / 3, vertices / 2, vertices - 1};
        Ranks reference = null;
        boolean allMatch = true;
        for (String manager : managers) {
            SparkSession.Builder b = ShuffleBench.builder("pagerank-bench-" + manager, manager, master, jar, endpoint,
                    tuned, o.get("jfr_dir"));
            if (kryo) {
                // GraphX's recommended serializer setup, the same for every manager.
                SparkConf conf = new SparkConf(false).set("spark.serializer", "org.apache.spark.serializer.KryoSerializer");
                GraphXUtils.registerKryoClasses(conf);
                for (Tuple2<String, String> kv : conf.getAll()) {
                    b.config(kv._1(), kv._2());
                }
            }
            SparkSession spark = b.getOrCreate();
            spark.sparkContext().setLogLevel("ERROR");
            Jobs jobs = new Jobs();
            spark.sparkContext().addSparkListener(jobs);
            JavaSparkContext sc = JavaSparkContext.fromSparkContext(spark.sparkContext());

            Graph<Object, Object> generated = GraphGenerators.logNormalGraph(spark.sparkContext(), vertices, parts, mu,
                    sigma, seed);
            final double n = vertices;
            final double k = skew;
            JavaRDD<Edge<Object>> edges = generated.edges().toJavaRDD().map(e -> new Edge<Object>(e.srcId(),
                    (long) Math.floor(n * Math.pow(e.dstId() / n, k)), e.attr()));
            Graph<Object, Object> graph = Graph.fromEdges(edges.rdd(), (Object) 0L, StorageLevel.MEMORY_ONLY(),
                    StorageLevel.MEMORY_ONLY(), tag(Object.class), tag(Object.class));
            long edgeCount = graph.edges().count();
            long vertexCount = graph.vertices().count();
            Set<Integer> kept = new HashSet<>(sc.getPersistentRDDs().keySet());

            for (int round = 0; round <= runs; round++) {
                jobs.clear();
                Map<Long, Double> cpu0 = ShuffleBench.hostCpu(daemonPid);
                long t0 = System.nanoTime();
                Graph<Object, Object> ranked = PageRank.run(graph, iterations, 0.15, tag(Object.class), tag(Object.class));
                long pagerankMs = (System.nanoTime() - t0) / 1_000_000;
                double hostCpuS = ShuffleBench.cpuBetween(cpu0, ShuffleBench.hostCpu(daemonPid));
                spark.sparkContext().listenerBus().waitUntilEmpty();
                List<Long> iterMs = new ArrayList<>();
                List<Long> iterCpuMs = new ArrayList<>();
                List<Long> iterWriteBytes = new ArrayList<>();
                List<Long> iterFetchWaitMs = new ArrayList<>();
                List<List<Long>> iterStageMs = new ArrayList<>();
                synchronized (jobs) {
                    List<Integer> ids = new ArrayList<>(jobs.start.keySet());
                    java.util.Collections.sort(ids);
                    for (int id : ids) {
                        iterMs.add(jobs.end.getOrDefault(id, -1L) - jobs.start.get(id));
                        iterCpuMs.add(jobs.cpuMs.getOrDefault(id, 0L));
                        iterWriteBytes.add(jobs.writeBytes.getOrDefault(id, 0L));
                        iterFetchWaitMs.add(jobs.fetchWaitMs.getOrDefault(id, 0L));
                        iterStageMs.add(new ArrayList<>(jobs.stageMs.getOrDefault(id, new java.util.TreeMap<>()).values()));
                    }
                }

                // The ranks (outside the timed part): sum, fixed vertices, top 5.
                JavaRDD<Tuple2<Object, Object>> v = ranked.vertices().toJavaRDD();
                double sum = v.map(t -> (Double) t._2()).reduce(Double::sum);
                Map<Long, Double> sample = new HashMap<>();
                Set<Long> want = new HashSet<>();
                for (long id : sampleIds) {
                    want.add(id);
                }
                for (Tuple2<Object, Object> t : v.filter(t -> want.contains((Long) t._1())).collect()) {
                    sample.put((Long) t._1(), (Double) t._2());
                }
                List<Long> topIds = new ArrayList<>();
                List<Double> topRanks = new ArrayList<>();
                for (Tuple2<Object, Object> t : v.top(5, new ByRank())) {
                    topIds.add((Long) t._1());
                    topRanks.add((Double) t._2());
                }
                Ranks ranks = new Ranks(sum, sample, topIds, topRanks);
                if (reference == null) {
                    reference = ranks;
                }
                double diff = ranks.maxRelDiff(reference);
                boolean match = diff <= RANK_TOLERANCE;
                allMatch &= match;
                // Each round's graphs go (PageRank leaves its last rank graph cached).
                for (Map.Entry<Integer, JavaRDD<?>> e : sc.getPersistentRDDs().entrySet()) {
                    if (!kept.contains(e.getKey())) {
                        e.getValue().unpersist(true);
                    }
                }
                System.out.printf("{\"job\":\"pagerank\",\"manager\":\"%s\",\"round\":%d,\"warmup\":%b,\"vertices\":%d,"
                        + "\"edges\":%d,\"parts\":%d,\"mu\":%s,\"sigma\":%s,\"skew\":%s,\"seed\":%d,\"kryo\":%b,"
                        + "\"iterations\":%d,\"master\":\"%s\",\"order\":\"%s\",\"pagerank_ms\":%d,\"iter_ms\":%s,"
                        + "\"iter_cpu_ms\":%s,\"iter_shuffle_write_bytes\":%s,\"iter_fetch_wait_ms\":%s,\"iter_stage_ms\":%s,"
                        + "\"host_cpu_s\":%.2f,\"rank_sum\":%.12f,\"top_ids\":%s,\"max_rel_diff\":%.3e,"
                        + "\"ranks_match\":%b}%n",
                        manager, round, round == 0, vertexCount, edgeCount, parts, mu, sigma, skew, seed, kryo,
                        iterations, master, String.join(",", managers), pagerankMs, iterMs, iterCpuMs,
                        iterWriteBytes, iterFetchWaitMs, iterStageMs, hostCpuS, sum, topIds,
                        Double.isInfinite(diff) ? Double.MAX_VALUE : diff, match);
            }
            spark.stop();
        }
        if (!allMatch) {
            System.err.println("PageRankBench: ranks differ between managers or rounds (see ranks_match)");
            System.exit(1);
        }
    }

    /** Orders (vertex, rank) pairs by rank, then by id (so ties give one top list). */
    static final class ByRank implements java.util.Comparator<Tuple2<Object, Object>>, java.io.Serializable {
        private static final long serialVersionUID = 1L;

        @Override
        public int compare(Tuple2<Object, Object> a, Tuple2<Object, Object> b) {
            int c = Double.compare((Double) a._2(), (Double) b._2());
            return c != 0 ? c : Long.compare((Long) b._1(), (Long) a._1());
        }
    }
}
