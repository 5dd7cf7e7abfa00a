// ShuffleBench: the measuring side of bench/shuffle_bench.sh. Spark's GroupByTest shape (the
// one NetSpark measured): `maps` tasks each make records/maps pairs (random int key, a byte[]
// value), cached and counted first, then groupByKey(reduces).count(). For each shuffle manager in
// turn (a new SparkSession each: the manager is fixed when a context starts), one warm-up round
// and `runs` measured rounds; the map (shuffle write) and reduce (shuffle read + group) stage
// times come from Spark's own stage submission/completion times, each stage's task CPU time
// (executorCpuTime summed over its tasks) and the reduce stage's fetch wait from its task
// metrics. One JSON line per round on stdout.
//
// Usage: ShuffleBench endpoint=H:P records=N maps=M reduces=R value_bytes=B runs=3
//   master=local-cluster[2,1,1024] jar=PATH managers=sort,slipstream
// With executor JVMs (local-cluster, spark://), `jar` (this module's jar) goes to spark.jars, as
// users pass it with --jars: the executors load the shuffle manager and the job's code from it.
// Not for: correctness (src/test/.../shuffle).
package io.slipstream.spark.bench;

import io.slipstream.spark.shuffle.SlipstreamShuffleManager;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;
import org.apache.spark.api.java.JavaPairRDD;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.scheduler.SparkListener;
import org.apache.spark.scheduler.SparkListenerStageCompleted;
import org.apache.spark.scheduler.StageInfo;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.storage.StorageLevel;
import scala.Tuple2;

public final class ShuffleBench {
    private ShuffleBench() {}

    /** Stage id -> wall ms and the tasks' summed CPU ms, from Spark's listener bus. */
    static final class Stages extends SparkListener {
        final Map<Integer, Long> ms = new HashMap<>();
        final Map<Integer, Long> cpuMs = new HashMap<>();
        final Map<Integer, Long> fetchWaitMs = new HashMap<>();

        @Override
        public synchronized void onStageCompleted(SparkListenerStageCompleted e) {
            StageInfo s = e.stageInfo();
            if (s.submissionTime().isDefined() && s.completionTime().isDefined()) {
                ms.put(s.stageId(), (Long) s.completionTime().get() - (Long) s.submissionTime().get());
                // CPU of the stage's task threads: less at the mercy of other load than wall time.
                cpuMs.put(s.stageId(), s.taskMetrics().executorCpuTime() / 1_000_000);
                fetchWaitMs.put(s.stageId(), s.taskMetrics().shuffleReadMetrics().fetchWaitTime());
            }
        }
    }

    public static void main(String[] args) throws Exception {
        Map<String, String> o = new HashMap<>();
        for (String a : args) {
            int eq = a.indexOf('=');
            o.put(a.substring(0, eq), a.substring(eq + 1));
        }
        long records = Long.parseLong(o.getOrDefault("records", "1000000"));
        int maps = Integer.parseInt(o.getOrDefault("maps", "8"));
        int reduces = Integer.parseInt(o.getOrDefault("reduces", "8"));
        int valueBytes = Integer.parseInt(o.getOrDefault("value_bytes", "100"));
        int runs = Integer.parseInt(o.getOrDefault("runs", "3"));
        String endpoint = o.getOrDefault("endpoint", "127.0.0.1:7300");
        String master = o.getOrDefault("master", "local[2]");
        String jar = o.get("jar");
        // The order the managers run in (the script alternates it between invocations).
        List<String> managers = List.of(o.getOrDefault("managers", "sort,slipstream").split(","));
        for (String manager : managers) {
            SparkSession.Builder b = SparkSession.builder().master(master).appName("shuffle-bench-" + manager)
                    .config("spark.ui.enabled", "false")
                    .config("spark.driver.host", "127.0.0.1")
                    .config("spark.driver.bindAddress", "127.0.0.1");
            if (jar != null) {
                b.config("spark.jars", jar);
            }
            if (manager.equals("slipstream")) {
                b.config("spark.shuffle.manager", SlipstreamShuffleManager.class.getName())
                        .config(SlipstreamShuffleManager.ENDPOINT, endpoint);
            }
            SparkSession spark = b.getOrCreate();
            spark.sparkContext().setLogLevel("ERROR");
            Stages stages = new Stages();
            spark.sparkContext().addSparkListener(stages);
            JavaSparkContext sc = JavaSparkContext.fromSparkContext(spark.sparkContext());
            List<Integer> mapIds = new ArrayList<>();
            for (int i = 0; i < maps; i++) {
                mapIds.add(i);
            }
            long perMap = records / maps;
            JavaPairRDD<Integer, byte[]> pairs = sc.parallelize(mapIds, maps).flatMapToPair(m -> {
                Random r = new Random(m);
                List<Tuple2<Integer, byte[]>> out = new ArrayList<>((int) perMap);
                for (long i = 0; i < perMap; i++) {
                    byte[] v = new byte[valueBytes];
                    r.nextBytes(v);
                    out.add(new Tuple2<>(r.nextInt(Integer.MAX_VALUE), v));
                }
                return out.iterator();
            }).persist(StorageLevel.MEMORY_ONLY());
            long n = pairs.count();
            for (int round = 0; round <= runs; round++) {
                synchronized (stages) {
                    stages.ms.clear();
                    stages.cpuMs.clear();
                    stages.fetchWaitMs.clear();
                }
                long t0 = System.nanoTime();
                long groups = pairs.groupByKey(reduces).count();
                long endToEndMs = (System.nanoTime() - t0) / 1_000_000;
                spark.sparkContext().listenerBus().waitUntilEmpty();
                long mapMs;
                long reduceMs;
                long mapCpuMs;
                long reduceCpuMs;
                long fetchWaitMs;
                synchronized (stages) {
                    // The job's two stages: the shuffle map stage has the lower id.
                    List<Integer> ids = new ArrayList<>(stages.ms.keySet());
                    java.util.Collections.sort(ids);
                    mapMs = ids.size() == 2 ? stages.ms.get(ids.get(0)) : -1L;
                    reduceMs = ids.size() == 2 ? stages.ms.get(ids.get(1)) : -1L;
                    mapCpuMs = ids.size() == 2 ? stages.cpuMs.get(ids.get(0)) : -1L;
                    reduceCpuMs = ids.size() == 2 ? stages.cpuMs.get(ids.get(1)) : -1L;
                    fetchWaitMs = ids.size() == 2 ? stages.fetchWaitMs.get(ids.get(1)) : -1L;
                }
                System.out.printf("{\"manager\":\"%s\",\"round\":%d,\"warmup\":%b,\"records\":%d,\"maps\":%d,\"reduces\":%d,"
                        + "\"value_bytes\":%d,\"groups\":%d,\"map_stage_ms\":%d,\"reduce_stage_ms\":%d,\"job_ms\":%d,"
                        + "\"map_cpu_ms\":%d,\"reduce_cpu_ms\":%d,\"fetch_wait_ms\":%d,\"master\":\"%s\",\"order\":\"%s\"}%n",
                        manager, round, round == 0, n, maps, reduces, valueBytes, groups, mapMs, reduceMs, endToEndMs,
                        mapCpuMs, reduceCpuMs, fetchWaitMs, master, String.join(",", managers));
            }
            spark.stop();
        }
    }
}
