// ShuffleBench: the measuring side of bench/shuffle_bench.sh. Spark's GroupByTest shape (the
// one NetSpark measured): `maps` tasks each make records/maps pairs (random int key, a byte[]
// value), cached and counted first, then groupByKey(reduces).count(). For each shuffle manager in
// turn (a new SparkSession each: the manager is fixed when a context starts), `warmups` warm-up
// rounds (default 1; more take the executors' JIT compilation out of the measured rounds, the
// same number for every manager) and `runs` measured rounds; the map (shuffle write) and reduce (shuffle read + group) stage
// times come from Spark's own stage submission/completion times, each stage's task CPU time
// (executorCpuTime summed over its tasks), the reduce stage's fetch wait, summed task run time
// (executorRunTime) and GC time from its task
// metrics; per executor, the reduce stage's tasks (reduce_executors: executorSpans), and the host
// CPU while the reduce stage ran: the daemons', the JVMs' and, of the JVMs', their JIT compiler
// threads' (reduce_daemon_cpu_ms, reduce_jvm_cpu_ms, reduce_jit_cpu_ms), and the 12 thread groups
// that used the most of it (reduce_threads_cpu_ms: "driver|executor|daemon <thread name>=ms;...").
// Host CPU per round from /proc (utime + stime): this JVM (driver, master, workers),
// every process it started (the executor JVMs) and the process trees in `daemon_pid` (the daemon;
// on a standalone cluster the daemons and the workers with their executors), so a manager
// that moves work out of the executors is charged for it. One JSON line per round on stdout.
//
// Managers: `sort` (Spark's built-in sort shuffle, its defaults: lz4 on, 32 KiB file buffers,
// 48 MiB in flight), `tuned` (the built-in shuffle with the settings of TUNED) and `slipstream`.
//
// Usage: ShuffleBench endpoint=H:P records=N maps=M reduces=R value_bytes=B runs=3 [warmups=1]
//   master=local-cluster[2,1,1024] jar=PATH managers=sort,tuned,slipstream daemon_pid=PID[,PID...]
//   [jfr_dir=DIR: executors record JFR (profile settings) into DIR] [tuned_conf=k=v;k=v]
//   [kryo=1: every manager serializes with Kryo (Spark's recommended serializer; with it
//   Slipstream aggregates by merging, HashMerge); kryo=0: Spark's default Java serializer]
//   [clean=1: before each round, a driver GC and a 3 s pause (untimed), so Spark's ContextCleaner
//   drops the previous round's shuffle (its files, or its blocks in the daemon's pool) first —
//   for inputs whose shuffles do not fit the pool or disk twice, e.g. 16M records]
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
import org.apache.spark.scheduler.SparkListenerStageSubmitted;
import org.apache.spark.scheduler.SparkListenerTaskEnd;
import org.apache.spark.scheduler.StageInfo;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.storage.StorageLevel;
import scala.Tuple2;

public final class ShuffleBench {
    private ShuffleBench() {}

    /**
     * The tuned built-in baseline: the sort shuffle with these settings. Tried on this machine
     * (docs/benchmarks.md): compression off made the reduce stage ~3x slower in task CPU (the
     * deserializer then reads Netty's buffers unbuffered), so it stays on (lz4); bigger file
     * buffers helped the map side at 8x8. At 200x200 Spark's default bypass-merge writer (taken
     * up to 200 reducers when nothing is combined map-side) opens a file and a buffer per reducer
     * per map task: with 1 MiB buffers its map stage took 75 s at 4M records; the serialized
     * writer (bypassMergeThreshold below the reducer count: one sorted file per map task) took
     * 3.3 s, and its reduce stage was the fastest of the sweep (session 17).
     */
    static final String[][] TUNED = {
        {"spark.shuffle.sort.bypassMergeThreshold", "1"},
        {"spark.shuffle.file.buffer", "1m"},
        {"spark.shuffle.unsafe.file.output.buffer", "1m"},
    };

    /** utime + stime of `pid` in seconds (0 if it is gone). */
    static double cpuSeconds(long pid) {
        try {
            String stat = java.nio.file.Files.readString(java.nio.file.Path.of("/proc/" + pid + "/stat"));
            String[] f = stat.substring(stat.lastIndexOf(')') + 2).split(" ");
            // After the name: state(0) ... utime is field 14 of the line, index 11 here.
            return (Long.parseLong(f[11]) + Long.parseLong(f[12])) / 100.0;
        } catch (java.io.IOException | RuntimeException e) {
            return 0;
        }
    }

    /**
     * CPU seconds of this JVM, its descendants (the executor JVMs of local-cluster), and each of
     * `roots` with its descendants (the daemon; on a standalone cluster also the workers, whose
     * descendants are the executors), by pid.
     */
    static Map<Long, Double> hostCpu(List<Long> roots) {
        Map<Long, Double> m = new HashMap<>();
        List<ProcessHandle> tops = new ArrayList<>();
        tops.add(ProcessHandle.current());
        roots.forEach(pid -> ProcessHandle.of(pid).ifPresent(tops::add));
        for (ProcessHandle top : tops) {
            m.put(top.pid(), cpuSeconds(top.pid()));
            top.descendants().forEach(p -> m.put(p.pid(), cpuSeconds(p.pid())));
        }
        return m;
    }

    /** `daemon_pid=PID[,PID...]`: the process trees counted beside this JVM's (0 or empty: none). */
    static List<Long> roots(String pids) {
        List<Long> out = new ArrayList<>();
        for (String p : pids.split(",")) {
            long pid = p.isBlank() ? 0 : Long.parseLong(p.trim());
            if (pid > 0) {
                out.add(pid);
            }
        }
        return out;
    }

    /** CPU seconds spent between two snapshots (a process that appeared counts from 0). */
    static double cpuBetween(Map<Long, Double> a, Map<Long, Double> b) {
        double s = 0;
        for (Map.Entry<Long, Double> e : b.entrySet()) {
            s += Math.max(0, e.getValue() - a.getOrDefault(e.getKey(), 0.0));
        }
        return s;
    }

    /** One finished task: where and when it ran (driver clock), its run and deserialize ms. */
    record Task(String executor, String host, long launchMs, long finishMs, long runMs, long deserializeMs) {}

    /**
     * The reduce stage's tasks per executor, `executor@host:tasks/span/busy/run/deser` (ms): span
     * from its first launch to its last finish, busy the summed launch-to-finish of its tasks
     * (so span - busy is the executor idle between its tasks: launch round trips), run their
     * executorRunTime, deser their deserialize time. Plus the stage's start (submission to first
     * launch) and tail (last finish to completion) ms.
     */
    static String executorSpans(List<Task> tasks, long submittedMs, long completedMs) {
        if (tasks == null || tasks.isEmpty()) {
            return "";
        }
        Map<String, List<Task>> by = new java.util.TreeMap<>();
        for (Task t : tasks) {
            by.computeIfAbsent(t.executor() + "@" + t.host(), k -> new ArrayList<>()).add(t);
        }
        StringBuilder sb = new StringBuilder();
        long first = Long.MAX_VALUE;
        long last = 0;
        for (Map.Entry<String, List<Task>> e : by.entrySet()) {
            long lo = Long.MAX_VALUE;
            long hi = 0;
            long busy = 0;
            long run = 0;
            long deser = 0;
            for (Task t : e.getValue()) {
                lo = Math.min(lo, t.launchMs());
                hi = Math.max(hi, t.finishMs());
                busy += t.finishMs() - t.launchMs();
                run += t.runMs();
                deser += t.deserializeMs();
            }
            first = Math.min(first, lo);
            last = Math.max(last, hi);
            sb.append(e.getKey()).append(':').append(e.getValue().size()).append('/').append(hi - lo).append('/')
                    .append(busy).append('/').append(run).append('/').append(deser).append(' ');
        }
        sb.append("start:").append(first - submittedMs).append(" tail:").append(completedMs - last);
        return sb.toString();
    }

    /** The command name of `pid` ("" if it is gone). */
    static String comm(long pid) {
        try {
            return java.nio.file.Files.readString(java.nio.file.Path.of("/proc/" + pid + "/comm")).trim();
        } catch (java.io.IOException e) {
            return "";
        }
    }

    /**
     * CPU seconds of every thread of `pids`, by "pid/tid", each with its group: the process
     * ("driver" for this JVM, which also runs local-cluster's master and workers; "daemon" for
     * a process named slipstream; else "executor") and the thread's name with digits as N
     * ("executor C2 CompilerThreN"), so the CPU of a stage can be told apart by what ran it.
     */
    static Map<String, Map.Entry<String, Double>> threadCpu(java.util.Set<Long> pids) {
        Map<String, Map.Entry<String, Double>> m = new HashMap<>();
        long self = ProcessHandle.current().pid();
        for (long pid : pids) {
            java.io.File[] tasks = new java.io.File("/proc/" + pid + "/task").listFiles();
            if (tasks == null) {
                continue;
            }
            String proc = pid == self ? "driver" : comm(pid).equals("slipstream") ? "daemon" : "executor";
            for (java.io.File t : tasks) {
                try {
                    String stat = java.nio.file.Files.readString(t.toPath().resolve("stat"));
                    String comm = stat.substring(stat.indexOf('(') + 1, stat.lastIndexOf(')'));
                    String[] f = stat.substring(stat.lastIndexOf(')') + 2).split(" ");
                    m.put(pid + "/" + t.getName(), Map.entry(proc + " " + comm.replaceAll("[0-9]+", "N"),
                            (Long.parseLong(f[11]) + Long.parseLong(f[12])) / 100.0));
                } catch (java.io.IOException | RuntimeException e) {
                    // the thread ended between listing and reading
                }
            }
        }
        return m;
    }

    /** CPU ms per thread group between two threadCpu snapshots (a thread that appeared counts from 0). */
    static Map<String, Long> threadGroupMs(Map<String, Map.Entry<String, Double>> a, Map<String, Map.Entry<String, Double>> b) {
        Map<String, Double> s = new HashMap<>();
        for (Map.Entry<String, Map.Entry<String, Double>> e : b.entrySet()) {
            Map.Entry<String, Double> before = a.get(e.getKey());
            double d = e.getValue().getValue() - (before == null ? 0 : before.getValue());
            s.merge(e.getValue().getKey(), Math.max(0, d), Double::sum);
        }
        Map<String, Long> ms = new HashMap<>();
        s.forEach((k, v) -> ms.put(k, Math.round(v * 1000)));
        return ms;
    }

    /** The `n` thread groups with the most CPU, "group=ms;..." (most first, 0 ms left out). */
    static String topGroups(Map<String, Long> ms, int n) {
        StringBuilder sb = new StringBuilder();
        ms.entrySet().stream().filter(e -> e.getValue() > 0)
                .sorted((x, y) -> Long.compare(y.getValue(), x.getValue())).limit(n)
                .forEach(e -> sb.append(sb.length() == 0 ? "" : ";").append(e.getKey()).append('=').append(e.getValue()));
        return sb.toString();
    }

    /** CPU ms between two snapshots of the processes whose command is (`daemon`) or is not "slipstream". */
    static long cpuMsOf(Map<Long, Double> a, Map<Long, Double> b, boolean daemon) {
        double s = 0;
        for (Map.Entry<Long, Double> e : b.entrySet()) {
            if (comm(e.getKey()).equals("slipstream") == daemon) {
                s += Math.max(0, e.getValue() - a.getOrDefault(e.getKey(), 0.0));
            }
        }
        return Math.round(s * 1000);
    }

    /** Stage id -> wall ms and the tasks' summed CPU ms, from Spark's listener bus. */
    static final class Stages extends SparkListener {
        final Map<Integer, Long> ms = new HashMap<>();
        final Map<Integer, Long> cpuMs = new HashMap<>();
        final Map<Integer, Long> fetchWaitMs = new HashMap<>();
        final Map<Integer, Long> writeBytes = new HashMap<>();
        /** The tasks' summed run time (executorRunTime) and GC time: where wall time that is not CPU went. */
        final Map<Integer, Long> runMs = new HashMap<>();
        final Map<Integer, Long> gcMs = new HashMap<>();
        /** Per stage, its tasks as they ended: where the stage's wall time went besides task run time. */
        final Map<Integer, List<Task>> tasks = new HashMap<>();
        final Map<Integer, String> spans = new HashMap<>();
        /** Per stage, host CPU ms while it ran (listener-bus time, so edges are approximate): the
         * Slipstream daemons' and every other counted process's (JVMs). */
        final Map<Integer, long[]> stageCpuMs = new HashMap<>();
        private final Map<Integer, Map<Long, Double>> cpuAtSubmit = new HashMap<>();
        private final Map<Integer, Map<String, Map.Entry<String, Double>>> threadsAtSubmit = new HashMap<>();
        /** Per stage, the JVMs' JIT compiler threads' CPU ms while it ran (part of the JVMs' CPU). */
        final Map<Integer, Long> jitMs = new HashMap<>();
        /** Per stage, the thread groups (threadCpu) that used the most CPU while it ran, topGroups. */
        final Map<Integer, String> threadMs = new HashMap<>();
        private final List<Long> roots;

        Stages(List<Long> roots) {
            this.roots = roots;
        }

        @Override
        public synchronized void onStageSubmitted(SparkListenerStageSubmitted e) {
            Map<Long, Double> cpu = hostCpu(roots);
            cpuAtSubmit.put(e.stageInfo().stageId(), cpu);
            threadsAtSubmit.put(e.stageInfo().stageId(), threadCpu(cpu.keySet()));
        }

        @Override
        public synchronized void onTaskEnd(SparkListenerTaskEnd e) {
            if (e.taskInfo() == null || e.taskMetrics() == null) {
                return;
            }
            tasks.computeIfAbsent(e.stageId(), k -> new ArrayList<>()).add(new Task(e.taskInfo().executorId(),
                    e.taskInfo().host(), e.taskInfo().launchTime(), e.taskInfo().finishTime(),
                    e.taskMetrics().executorRunTime(), e.taskMetrics().executorDeserializeTime()));
        }

        @Override
        public synchronized void onStageCompleted(SparkListenerStageCompleted e) {
            StageInfo s = e.stageInfo();
            if (s.submissionTime().isDefined() && s.completionTime().isDefined()) {
                ms.put(s.stageId(), (Long) s.completionTime().get() - (Long) s.submissionTime().get());
                Map<Long, Double> cpu0 = cpuAtSubmit.remove(s.stageId());
                if (cpu0 != null) {
                    Map<Long, Double> cpu1 = hostCpu(roots);
                    stageCpuMs.put(s.stageId(), new long[] {cpuMsOf(cpu0, cpu1, true), cpuMsOf(cpu0, cpu1, false)});
                    Map<String, Map.Entry<String, Double>> threads0 = threadsAtSubmit.remove(s.stageId());
                    Map<String, Long> groups = threadGroupMs(threads0 == null ? Map.of() : threads0, threadCpu(cpu1.keySet()));
                    jitMs.put(s.stageId(), groups.entrySet().stream().filter(g -> g.getKey().contains("CompilerThre"))
                            .mapToLong(Map.Entry::getValue).sum());
                    threadMs.put(s.stageId(), topGroups(groups, 12));
                }
                spans.put(s.stageId(), executorSpans(tasks.remove(s.stageId()), (Long) s.submissionTime().get(),
                        (Long) s.completionTime().get()));
                // CPU of the stage's task threads: less at the mercy of other load than wall time.
                cpuMs.put(s.stageId(), s.taskMetrics().executorCpuTime() / 1_000_000);
                fetchWaitMs.put(s.stageId(), s.taskMetrics().shuffleReadMetrics().fetchWaitTime());
                writeBytes.put(s.stageId(), s.taskMetrics().shuffleWriteMetrics().bytesWritten());
                runMs.put(s.stageId(), s.taskMetrics().executorRunTime());
                gcMs.put(s.stageId(), s.taskMetrics().jvmGCTime());
            }
        }
    }

    public static void main(String[] args) throws Exception {
        Map<String, String> o = args(args);
        long records = Long.parseLong(o.getOrDefault("records", "1000000"));
        int maps = Integer.parseInt(o.getOrDefault("maps", "8"));
        int reduces = Integer.parseInt(o.getOrDefault("reduces", "8"));
        int valueBytes = Integer.parseInt(o.getOrDefault("value_bytes", "100"));
        int runs = Integer.parseInt(o.getOrDefault("runs", "3"));
        int warmups = Integer.parseInt(o.getOrDefault("warmups", "1"));
        String endpoint = o.getOrDefault("endpoint", "127.0.0.1:7300");
        String master = o.getOrDefault("master", "local[2]");
        String jar = o.get("jar");
        List<Long> daemonPid = roots(o.getOrDefault("daemon_pid", "0"));
        String jfrDir = o.get("jfr_dir");
        boolean kryo = !o.getOrDefault("kryo", "1").equals("0");
        boolean clean = o.getOrDefault("clean", "0").equals("1");
        // tuned_conf=k=v;k=v replaces TUNED (for trying other settings of the built-in shuffle).
        String[][] tuned = tuned(o);
        // The order the managers run in (the script alternates it between invocations).
        List<String> managers = List.of(o.getOrDefault("managers", "sort,slipstream").split(","));
        for (String manager : managers) {
            SparkSession.Builder b = builder("shuffle-bench-" + manager, manager, master, jar, endpoint, tuned, jfrDir);
            if (kryo) {
                b.config("spark.serializer", "org.apache.spark.serializer.KryoSerializer");
            }
            SparkSession spark = b.getOrCreate();
            spark.sparkContext().setLogLevel("ERROR");
            Stages stages = new Stages(daemonPid);
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
            for (int round = 0; round < warmups + runs; round++) {
                synchronized (stages) {
                    stages.ms.clear();
                    stages.cpuMs.clear();
                    stages.fetchWaitMs.clear();
                    stages.writeBytes.clear();
                    stages.runMs.clear();
                    stages.gcMs.clear();
                    stages.spans.clear();
                    stages.stageCpuMs.clear();
                    stages.jitMs.clear();
                    stages.threadMs.clear();
                }
                if (clean) {
                    System.gc();
                    Thread.sleep(3000);
                }
                Map<Long, Double> cpu0 = hostCpu(daemonPid);
                long t0 = System.nanoTime();
                long groups = pairs.groupByKey(reduces).count();
                long endToEndMs = (System.nanoTime() - t0) / 1_000_000;
                double hostCpuS = cpuBetween(cpu0, hostCpu(daemonPid));
                spark.sparkContext().listenerBus().waitUntilEmpty();
                long mapMs;
                long reduceMs;
                long mapCpuMs;
                long reduceCpuMs;
                long fetchWaitMs;
                long shuffleWriteBytes;
                long reduceRunMs;
                long reduceGcMs;
                String reduceSpans;
                long[] reduceHostCpuMs;
                long reduceJitMs;
                String reduceThreads;
                synchronized (stages) {
                    // The job's two stages: the shuffle map stage has the lower id.
                    List<Integer> ids = new ArrayList<>(stages.ms.keySet());
                    java.util.Collections.sort(ids);
                    mapMs = ids.size() == 2 ? stages.ms.get(ids.get(0)) : -1L;
                    reduceMs = ids.size() == 2 ? stages.ms.get(ids.get(1)) : -1L;
                    mapCpuMs = ids.size() == 2 ? stages.cpuMs.get(ids.get(0)) : -1L;
                    reduceCpuMs = ids.size() == 2 ? stages.cpuMs.get(ids.get(1)) : -1L;
                    fetchWaitMs = ids.size() == 2 ? stages.fetchWaitMs.get(ids.get(1)) : -1L;
                    shuffleWriteBytes = ids.size() == 2 ? stages.writeBytes.get(ids.get(0)) : -1L;
                    reduceRunMs = ids.size() == 2 ? stages.runMs.get(ids.get(1)) : -1L;
                    reduceGcMs = ids.size() == 2 ? stages.gcMs.get(ids.get(1)) : -1L;
                    reduceSpans = ids.size() == 2 ? stages.spans.getOrDefault(ids.get(1), "") : "";
                    reduceHostCpuMs = ids.size() == 2 ? stages.stageCpuMs.getOrDefault(ids.get(1), new long[] {-1, -1})
                            : new long[] {-1, -1};
                    reduceJitMs = ids.size() == 2 ? stages.jitMs.getOrDefault(ids.get(1), -1L) : -1L;
                    reduceThreads = ids.size() == 2 ? stages.threadMs.getOrDefault(ids.get(1), "") : "";
                }
                System.out.printf("{\"manager\":\"%s\",\"round\":%d,\"warmup\":%b,\"records\":%d,\"maps\":%d,\"reduces\":%d,"
                        + "\"value_bytes\":%d,\"groups\":%d,\"map_stage_ms\":%d,\"reduce_stage_ms\":%d,\"job_ms\":%d,"
                        + "\"map_cpu_ms\":%d,\"reduce_cpu_ms\":%d,\"fetch_wait_ms\":%d,\"master\":\"%s\",\"order\":\"%s\","
                        + "\"host_cpu_s\":%.2f,\"shuffle_write_bytes\":%d,\"payload_bytes\":%d,\"reduce_stage_id\":%d,"
                        + "\"kryo\":%b,\"reduce_run_ms\":%d,\"reduce_gc_ms\":%d,\"reduce_executors\":\"%s\",\"reduce_daemon_cpu_ms\":%d,\"reduce_jvm_cpu_ms\":%d,\"reduce_jit_cpu_ms\":%d,\"reduce_threads_cpu_ms\":\"%s\"}%n",
                        manager, round, round < warmups, n, maps, reduces, valueBytes, groups, mapMs, reduceMs, endToEndMs,
                        mapCpuMs, reduceCpuMs, fetchWaitMs, master, String.join(",", managers), hostCpuS,
                        shuffleWriteBytes, n * (valueBytes + 4L), lastStage(stages), kryo, reduceRunMs, reduceGcMs, reduceSpans, reduceHostCpuMs[0], reduceHostCpuMs[1], reduceJitMs, reduceThreads);
            }
            spark.stop();
        }
    }

    /**
     * A session builder for one manager, the same for every bench driver here (GroupBy, PageRank):
     * `jar` in spark.jars (executor JVMs load the manager and the job's code from it), `tuned`'s
     * settings for the tuned sort shuffle, Slipstream's manager and endpoint, and JFR recordings
     * per executor JVM into `jfrDir`/`manager`/ when `jfrDir` is set.
     */
    static SparkSession.Builder builder(String app, String manager, String master, String jar, String endpoint,
            String[][] tuned, String jfrDir) {
        // SPARK_LOCAL_IP (Spark's own per-host setting) when the executors are on other hosts.
        String driverHost = System.getenv().getOrDefault("SPARK_LOCAL_IP", "127.0.0.1");
        SparkSession.Builder b = SparkSession.builder().master(master).appName(app)
                .config("spark.ui.enabled", "false")
                .config("spark.driver.host", driverHost)
                .config("spark.driver.bindAddress", driverHost);
        if (jar != null) {
            b.config("spark.jars", jar);
        }
        if (manager.equals("tuned")) {
            for (String[] kv : tuned) {
                b.config(kv[0], kv[1]);
            }
        }
        if (jfrDir != null) {
            // Made here: JFR writes one file per JVM into an existing directory, but takes a
            // missing one for a file name (and the executors then overwrite each other).
            new java.io.File(jfrDir, manager).mkdirs();
            // One recording per executor JVM (a directory: JFR names the files), for the
            // reduce stage's profile (bench/shuffle_profile.py reads the task threads' samples).
            b.config("spark.executor.extraJavaOptions", "-XX:StartFlightRecording=settings=profile,filename="
                    + jfrDir + "/" + manager + "/");
        }
        if (manager.equals("slipstream")) {
            b.config("spark.shuffle.manager", SlipstreamShuffleManager.class.getName())
                    .config(SlipstreamShuffleManager.ENDPOINT, endpoint);
        }
        return b;
    }

    /** `tuned_conf=k=v;k=v` from the arguments, or TUNED. */
    static String[][] tuned(Map<String, String> o) {
        if (!o.containsKey("tuned_conf")) {
            return TUNED;
        }
        return java.util.Arrays.stream(o.get("tuned_conf").split(";")).filter(x -> !x.isBlank())
                .map(x -> x.split("=", 2)).toArray(String[][]::new);
    }

    /** `k=v` arguments as a map. */
    static Map<String, String> args(String[] args) {
        Map<String, String> o = new HashMap<>();
        for (String a : args) {
            int eq = a.indexOf('=');
            if (eq < 0) {
                throw new IllegalArgumentException("argument not k=v: " + a);
            }
            o.put(a.substring(0, eq), a.substring(eq + 1));
        }
        return o;
    }

    static int lastStage(Stages stages) {
        synchronized (stages) {
            return stages.ms.keySet().stream().mapToInt(Integer::intValue).max().orElse(-1);
        }
    }
}
