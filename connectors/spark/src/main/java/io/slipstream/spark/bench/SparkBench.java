// SparkBench: the measuring side of bench/spark_bench.sh. One JVM per setup, Spark in local
// mode (local[2]), the generator (`slipstream send`) started per run from here so every setup
// gets the same datagrams. Prints one JSON line per measurement on stdout.
//
// Modes (first argument), options key=value:
//   wc-plain  udp=PORT batch_ms=1000 rates=R1,R2,..  plain Spark (DStream + UdpReceiver) word count
//   wc-slip   endpoint=H:P stream=S udp=PORT rates=..  Slipstream wordcount results -> Spark
//   cp-plain  udp=PORT batch_ms=B trials=N            plain Spark change-point rule (ChangePointRule)
//   cp-sub    endpoint=H:P stream=S udp=PORT trials=N  plain TCP subscriber (no Spark)
//   cp-spark  endpoint=H:P stream=S udp=PORT trials=N trigger=micro|continuous
// Common: bind=ADDR (plain receivers' UDP address, 127.0.0.1), bin=PATH (slipstream), send_prefix="ip netns exec NS" and send_host=ADDR (where the
//   generator runs and sends; default here, 127.0.0.1), send_cmd="CMD ARGS" (instead of `bin send`: a generator taking
//   send's options, e.g. bench/xdpgen_send.sh), setup=NAME (wc-slip's label), step_s=3, words=16 (records per datagram), batch=64 (sendmmsg),
//   daemon_pid=PID (its CPU is added), rate=5000 (cp datagrams/s), window_ms=10, n=4,
//   threshold=5, pre_ms, post_ms, warmup_trials=0 (cp: trials run first and not counted),
//   trigger_ms (wc-slip: micro-batch trigger, 100; cp-spark trigger=micro: 0 = as fast as possible),
//   sink=groupby|collect (wc-slip: how the batch's rows are summed),
//   stop_on_inexact=true (word count: stop stepping at the first inexact rate), idle_s=0 (a
//   window of that many seconds with no input after the first run, sampled as idle-begin/-end),
//   sample_cmd="CMD ARGS" (run with label=RUN-begin|RUN-end and jvm=PID at the edges of each
//   measured window, bench/stream_cpu.sh's CPU sampler), measure=rate (cp-plain / cp-spark: a
//   steady stream at `rate` datagrams/s of `values` values each for step_s seconds with one
//   step in the middle, `runs` times, instead of latency trials).
//
// Word count: rates are stepped up; each run sends step_s seconds with --expect-counts and is
// exact when the summed counts equal the generator's multiset. Stepping stops at the first
// inexact rate. CPU: utime+stime of this JVM (and the daemon) over each run, from /proc.
// Change point: each trial is one generator run, level alternating 10 / 30, step +-20 after
// pre_ms; latency = CLOCK_MONOTONIC when the alert is seen here - the generator's
// step_sent_mono_ns.
// Not for: correctness tests (src/test).
package io.slipstream.spark.bench;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import io.slipstream.spark.baseline.ChangePointRule;
import io.slipstream.spark.baseline.UdpReceiver;
import org.apache.spark.api.java.JavaPairRDD;
import org.apache.spark.api.java.JavaRDD;
import org.apache.spark.api.java.function.VoidFunction2;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.ForeachWriter;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.streaming.StreamingQuery;
import org.apache.spark.sql.streaming.Trigger;
import org.apache.spark.streaming.Durations;
import org.apache.spark.streaming.api.java.JavaReceiverInputDStream;
import org.apache.spark.streaming.api.java.JavaStreamingContext;
import scala.Tuple2;

import java.io.BufferedReader;
import java.io.File;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;

public final class SparkBench {
    static final ObjectMapper JSON = new ObjectMapper();
    /** Alerts seen (CLOCK_MONOTONIC ns when seen, alert value); filled by whichever path runs. */
    static final LinkedBlockingQueue<double[]> ALERTS = new LinkedBlockingQueue<>();
    /** Word totals counted by the Spark job under test. */
    static final ConcurrentHashMap<String, Long> TOTALS = new ConcurrentHashMap<>();
    static volatile long batchesDone;
    /** Values the plain-Spark change-point job has counted into its windows (measure=rate). */
    static final java.util.concurrent.atomic.AtomicLong VALUES = new java.util.concurrent.atomic.AtomicLong();

    private final Map<String, String> o = new HashMap<>();
    private final String mode;

    private SparkBench(String[] args) {
        mode = args[0];
        for (int i = 1; i < args.length; i++) {
            int eq = args[i].indexOf('=');
            if (eq > 0) {
                o.put(args[i].substring(0, eq), args[i].substring(eq + 1));
            }
        }
    }

    private String s(String k, String d) {
        return o.getOrDefault(k, d);
    }

    private long l(String k, long d) {
        return Long.parseLong(o.getOrDefault(k, Long.toString(d)));
    }

    public static void main(String[] args) throws Exception {
        if (args.length < 1) {
            System.err.println("usage: SparkBench wc-plain|wc-slip|cp-plain|cp-sub|cp-spark key=value...");
            System.exit(2);
        }
        new SparkBench(args).run();
        System.exit(0);
    }

    private static SparkSession spark() {
        SparkSession s = SparkSession.builder().master("local[2]").appName("slipstream-spark-bench")
                .config("spark.ui.enabled", "false")
                .config("spark.sql.shuffle.partitions", "2")
                .config("spark.driver.host", "127.0.0.1")
                .config("spark.driver.bindAddress", "127.0.0.1")
                // Continuous queries: how often the read task asks the driver for the current
                // epoch (Spark's default, 100 ms, is ten RPCs per 1 s epoch: measured 0.36 CPU-s
                // of the driver's RPC thread per 10 s run); once per second is once per epoch.
                .config("spark.sql.streaming.continuous.executorPollIntervalMs", "1000")
                // Offset and commit logs through Hadoop's FileSystem API: the default FileContext
                // manager resolves links and sets permissions on the local file system by starting
                // `readlink` and `chmod` processes (no native Hadoop library here): measured 20
                // processes per second (~0.07 cores) for a continuous query with 1 s epochs, ~4 per
                // second with this one.
                .config("spark.sql.streaming.checkpointFileManagerClass",
                        "org.apache.spark.sql.execution.streaming.FileSystemBasedCheckpointFileManager")
                // ... and the `chmod` left per log file (and its .crc) done in the JVM instead of by a
                // process (NioLocalFileSystem). Set for every setup; plain Spark's DStream jobs keep
                // no checkpoint, so only the Slipstream queries write through it.
                .config("spark.hadoop.fs.file.impl", NioLocalFileSystem.class.getName())
                .getOrCreate();
        s.sparkContext().setLogLevel("ERROR");
        return s;
    }

    private void run() throws Exception {
        switch (mode) {
            case "wc-plain" -> wcPlain();
            case "wc-slip" -> wcSlip();
            case "cp-plain" -> cpPlain();
            case "cp-sub" -> cpSub();
            case "cp-spark" -> cpSpark();
            default -> throw new IllegalArgumentException("unknown mode " + mode);
        }
    }

    // ------------------------------------------------------------------ CPU and generator

    /** utime+stime of a process in seconds (clock ticks of 100 Hz, Linux's USER_HZ). */
    static double cpuSeconds(long pid) {
        if (pid <= 0) {
            return 0;
        }
        try {
            String stat = Files.readString(new File("/proc/" + pid + "/stat").toPath());
            String[] f = stat.substring(stat.lastIndexOf(')') + 2).split(" ");
            return (Long.parseLong(f[11]) + Long.parseLong(f[12])) / 100.0;
        } catch (IOException | RuntimeException e) {
            return 0;
        }
    }

    /** Children's user + system seconds from bash's `times` output (its last line); -1 if absent. */
    static double childrenTimes(String stderr) {
        String[] lines = stderr.strip().split("\n");
        java.util.regex.Matcher m = java.util.regex.Pattern.compile("(\\d+)m([0-9.]+)s\\s+(\\d+)m([0-9.]+)s")
                .matcher(lines[lines.length - 1]);
        if (!m.find()) {
            return -1;
        }
        return Long.parseLong(m.group(1)) * 60 + Double.parseDouble(m.group(2)) + Long.parseLong(m.group(3)) * 60
                + Double.parseDouble(m.group(4));
    }

    /** CPU of the last generator run (its process tree, from bash's `times`), seconds. */
    static volatile double lastSendCpuS;

    private double cpuNow() {
        return cpuSeconds(ProcessHandle.current().pid()) + cpuSeconds(l("daemon_pid", 0));
    }

    /** Runs the sample_cmd (if any) with label=`label` and jvm=this JVM's pid, and waits for it. */
    private void sample(String label) throws IOException, InterruptedException {
        String cmd = s("sample_cmd", "").trim();
        if (cmd.isEmpty()) {
            return;
        }
        List<String> argv = new ArrayList<>(List.of(cmd.split(" +")));
        argv.add("label=" + label);
        argv.add("jvm=" + ProcessHandle.current().pid());
        Process p = new ProcessBuilder(argv).inheritIO().start();
        if (!p.waitFor(60, TimeUnit.SECONDS)) {
            p.destroyForcibly();
            throw new IOException("sample_cmd timed out");
        }
    }

    /**
     * Runs `slipstream send` with `args`; returns its summary JSON line. The generator runs
     * under bash, whose `times` (to stderr) gives the generator's own CPU (lastSendCpuS): the
     * JVM's reaped-children total over the same time would also hold any other process the JVM
     * started meanwhile (the CPU sampler, Hadoop's shell commands), which are not the senders'.
     */
    private JsonNode send(List<String> args) throws IOException, InterruptedException {
        List<String> cmd = new ArrayList<>(List.of("bash", "-c", "\"$@\"; rc=$?; times >&2; exit $rc", "send"));
        // send_prefix: a command the generator runs under (the XDP column runs it in a client
        // network namespace: "ip netns exec NS"), words separated by spaces.
        for (String w : s("send_prefix", "").trim().split(" ")) {
            if (!w.isEmpty()) {
                cmd.add(w);
            }
        }
        // send_cmd: another generator taking `send`'s options and printing its summary line
        // (bench/xdpgen_send.sh: the live-frame generator), words separated by spaces.
        String sendCmd = s("send_cmd", "").trim();
        if (sendCmd.isEmpty()) {
            cmd.add(s("bin", "target/release/slipstream"));
            cmd.add("send");
        } else {
            cmd.addAll(List.of(sendCmd.split(" +")));
        }
        cmd.addAll(args);
        ProcessBuilder pb = new ProcessBuilder(cmd).redirectErrorStream(false);
        pb.environment().put("LC_ALL", "C"); // `times` prints 0m1.230s
        Process p = pb.start();
        String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
        boolean done = p.waitFor(600, TimeUnit.SECONDS);
        String err = done ? new String(p.getErrorStream().readAllBytes(), StandardCharsets.UTF_8) : "";
        if (!done || p.exitValue() != 0) {
            p.destroyForcibly();
            throw new IOException("slipstream send failed: " + err);
        }
        lastSendCpuS = childrenTimes(err);
        String[] lines = out.strip().split("\n");
        return JSON.readTree(lines[lines.length - 1]);
    }

    private static void emit(Map<String, Object> m) throws IOException {
        System.out.println(JSON.writeValueAsString(m));
        System.out.flush();
    }

    // ------------------------------------------------------------------ word count

    private interface Job {
        void stop() throws Exception;
    }

    private void wcPlain() throws Exception {
        SparkSession spark = spark();
        JavaStreamingContext ssc = new JavaStreamingContext(
                org.apache.spark.api.java.JavaSparkContext.fromSparkContext(spark.sparkContext()),
                Durations.milliseconds(l("batch_ms", 1000)));
        JavaReceiverInputDStream<String> words = ssc.receiverStream(new UdpReceiver(s("bind", "127.0.0.1"), (int) l("udp", 0), true));
        words.countByValue().foreachRDD((JavaPairRDD<String, Long> rdd) -> {
            for (Tuple2<String, Long> t : rdd.collect()) {
                TOTALS.merge(t._1(), t._2(), Long::sum);
            }
            batchesDone++;
        });
        ssc.start();
        Thread.sleep(2000); // the receiver binds
        wcSteps("plain-spark", () -> ssc.stop(false, true), l("batch_ms", 1000));
        ssc.stop(false, false);
    }

    private void wcSlip() throws Exception {
        SparkSession spark = spark();
        Dataset<Row> df = spark.readStream().format("slipstream").option("endpoint", s("endpoint", ""))
                .option("stream", s("stream", "wc")).load();
        // sink=groupby: Spark sums each batch's rows per word (a shuffle per batch); collect: the
        // batch's rows (already counts per word and window: the daemon counted) are collected
        // and summed here; foreach: a ForeachWriter sums the rows where the source's task reads
        // them (no second query to plan per batch). trigger=continuous (foreach only): one
        // long-running read task, no micro-batch planning at all (epochs every trigger_ms).
        String sinkKind = s("sink", "groupby");
        boolean continuous = s("trigger", "micro").equals("continuous");
        Trigger trigger = continuous ? Trigger.Continuous(l("trigger_ms", 1000)) : Trigger.ProcessingTime(l("trigger_ms", 100));
        StreamingQuery q;
        if (sinkKind.equals("foreach") || continuous) {
            q = df.select("word", "count").writeStream().foreach(new CountWriter()).trigger(trigger).start();
        } else {
            boolean group = sinkKind.equals("groupby");
            VoidFunction2<Dataset<Row>, Long> sink = (ds, id) -> {
                List<Row> rows = group ? ds.groupBy("word").sum("count").collectAsList()
                        : ds.select("word", "count").collectAsList();
                for (Row r : rows) {
                    if (!r.isNullAt(0)) {
                        TOTALS.merge(r.getString(0), r.getLong(1), Long::sum);
                    }
                }
                batchesDone++;
            };
            q = df.writeStream().foreachBatch(sink).trigger(trigger).start();
        }
        if (continuous) {
            Thread.sleep(3000); // the continuous task subscribes
        } else {
            q.processAllAvailable();
        }
        wcSteps(s("setup", "slipstream-spark"), q::stop, 300);
        q.stop();
    }

    /** sink=foreach: adds each (word, count) row to the totals (same JVM in local mode). */
    public static final class CountWriter extends ForeachWriter<Row> {
        @Override
        public boolean open(long partitionId, long epochId) {
            return true;
        }

        @Override
        public void process(Row r) {
            if (!r.isNullAt(0)) {
                TOTALS.merge(r.getString(0), r.getLong(1), Long::sum);
            }
        }

        @Override
        public void close(Throwable error) {}
    }

    /** Steps the rate up until counts are not exact. `settleMs`: how long results may lag. */
    private void wcSteps(String setup, Job job, long settleMs) throws Exception {
        File expect = File.createTempFile("spark-bench-expect-", ".json");
        try {
            int run = 0;
            for (String r : s("rates", "10000,20000").split(",")) {
                long rate = Long.parseLong(r.trim());
                // Quiet: nothing from the previous run is still on its way.
                waitQuiet(settleMs);
                TOTALS.clear();
                sample("run" + run + "-begin");
                double cpu0 = cpuNow();
                double jvm0 = cpuSeconds(ProcessHandle.current().pid());
                long t0 = System.nanoTime();
                JsonNode sum = send(List.of("--to", s("send_host", "127.0.0.1") + ":" + l("udp", 0), "--kind", "words",
                        "--rate-per-s", Long.toString(rate), "--duration-s", s("step_s", "3"),
                        "--records-per-datagram", s("words", "16"), "--batch", s("batch", "64"),
                        "--seed", Long.toString(rate), "--expect-counts", expect.getPath()));
                JsonNode want = JSON.readTree(expect);
                long expected = 0;
                for (JsonNode v : want) {
                    expected += v.asLong();
                }
                waitQuiet(settleMs, expected);
                double cpu = cpuNow() - cpu0;
                sample("run" + run + "-end");
                long wantTotal = 0;
                boolean exact = true;
                Iterator<Map.Entry<String, JsonNode>> it = want.fields();
                while (it.hasNext()) {
                    Map.Entry<String, JsonNode> e = it.next();
                    wantTotal += e.getValue().asLong();
                    if (TOTALS.getOrDefault(e.getKey(), 0L) != e.getValue().asLong()) {
                        exact = false;
                    }
                }
                long got = TOTALS.values().stream().mapToLong(Long::longValue).sum();
                if (got != wantTotal) {
                    exact = false;
                }
                Map<String, Object> m = new java.util.LinkedHashMap<>();
                m.put("bench", "wordcount");
                m.put("setup", setup);
                m.put("rate_per_s", rate);
                m.put("achieved_rate_per_s", sum.path("rate_per_s").asDouble());
                m.put("datagrams", sum.path("datagrams").asLong());
                m.put("records", wantTotal);
                m.put("counted", got);
                m.put("exact", exact);
                m.put("cpu_s", cpu);
                m.put("jvm_cpu_s", cpuSeconds(ProcessHandle.current().pid()) - jvm0);
                m.put("cpu_s_per_million_records", wantTotal > 0 ? cpu / (wantTotal / 1e6) : 0);
                m.put("wall_s", (System.nanoTime() - t0) / 1e9);
                m.put("send_elapsed_s", sum.path("elapsed_s").asDouble());
                m.put("gen_cpu_s", lastSendCpuS);
                m.put("run", run++);
                emit(m);
                idleWindow(run);
                if (!exact && !s("stop_on_inexact", "true").equals("false")) {
                    break;
                }
            }
        } finally {
            expect.delete();
        }
    }

    /** Waits until no batch has changed the totals for `settleMs` (at most 30 s). */
    private static void waitQuiet(long settleMs) throws InterruptedException {
        waitQuiet(settleMs, -1);
    }

    /**
     * Waits until the totals reach `target` (> 0: every word sent was counted; an over-count
     * is still seen, as inexact) or no batch has changed them for `settleMs` x 2 (at least 1 s;
     * 10 s when a target is given, so a slow batch on a busy machine is not cut off), at most 30 s.
     */
    private static void waitQuiet(long settleMs, long target) throws InterruptedException {
        long deadline = System.currentTimeMillis() + 30_000;
        long quietMs = target > 0 ? Math.max(settleMs * 2, 10_000) : Math.max(settleMs * 2, 1000);
        long lastSum = -1;
        long lastChange = System.currentTimeMillis();
        while (System.currentTimeMillis() < deadline) {
            long sum = TOTALS.values().stream().mapToLong(Long::longValue).sum();
            if (target > 0 && sum >= target) {
                return;
            }
            if (sum != lastSum) {
                lastSum = sum;
                lastChange = System.currentTimeMillis();
            } else if (System.currentTimeMillis() - lastChange > quietMs) {
                return;
            }
            Thread.sleep(50);
        }
    }

    // ------------------------------------------------------------------ change point

    private void cpPlain() throws Exception {
        SparkSession spark = spark();
        long batchMs = l("batch_ms", 1000);
        JavaStreamingContext ssc = new JavaStreamingContext(
                org.apache.spark.api.java.JavaSparkContext.fromSparkContext(spark.sparkContext()),
                Durations.milliseconds(batchMs));
        ChangePointRule rule = new ChangePointRule(l("window_ms", 10) * 1_000_000L, (int) l("n", 4),
                Double.parseDouble(s("threshold", "5")));
        JavaReceiverInputDStream<String> lines = ssc.receiverStream(new UdpReceiver(s("bind", "127.0.0.1"), (int) l("udp", 0), false));
        lines.foreachRDD((JavaRDD<String> rdd) -> {
            JavaRDD<double[]> tv = rdd.map(x -> {
                int tab = x.indexOf('\t');
                return new double[] {Double.parseDouble(x.substring(0, tab)), Double.parseDouble(x.substring(tab + 1))};
            }).cache();
            long windowNs = l("window_ms", 10) * 1_000_000L;
            Map<Long, double[]> sums = new HashMap<>();
            long[] maxT = {Long.MIN_VALUE};
            for (Tuple2<Long, double[]> t : tv.mapToPair(a -> new Tuple2<>(Math.floorDiv((long) a[0], windowNs), new double[] {a[1], 1, a[0]}))
                    .reduceByKey((a, b) -> new double[] {a[0] + b[0], a[1] + b[1], Math.max(a[2], b[2])}).collect()) {
                sums.put(t._1(), new double[] {t._2()[0], t._2()[1]});
                VALUES.addAndGet((long) t._2()[1]);
                maxT[0] = Math.max(maxT[0], (long) t._2()[2]);
            }
            double ref = rule.reference();
            double thr = rule.threshold();
            List<double[]> dev = Double.isNaN(ref) ? new ArrayList<>() : new ArrayList<>(tv.filter(a -> Math.abs(a[1] - ref) > thr).collect());
            tv.unpersist();
            for (ChangePointRule.Alert a : rule.batch(sums, dev, maxT[0])) {
                ALERTS.add(new double[] {System.nanoTime(), a.value(), a.tNs()});
            }
        });
        ssc.start();
        Thread.sleep(2000);
        long pre = l("pre_ms", batchMs + 300);
        if (s("measure", "trials").equals("rate")) {
            cpRate("plain-spark-" + batchMs + "ms", target -> waitQuietValues(batchMs, target));
        } else {
            cpTrials("plain-spark-" + batchMs + "ms", pre, batchMs * 3 + 3000);
        }
        ssc.stop(false, false);
    }

    private void cpSub() throws Exception {
        String[] hp = s("endpoint", "").split(":");
        Socket sock = new Socket(hp[0], Integer.parseInt(hp[1]));
        sock.setTcpNoDelay(true);
        OutputStream out = sock.getOutputStream();
        out.write(("SUBSCRIBE " + s("stream", "cp") + "\n").getBytes(StandardCharsets.UTF_8));
        out.flush();
        Thread reader = new Thread(() -> {
            try (BufferedReader r = new BufferedReader(new InputStreamReader(sock.getInputStream(), StandardCharsets.UTF_8))) {
                String line;
                while ((line = r.readLine()) != null) {
                    if (line.contains("\"type\":\"changepoint\"")) {
                        long seen = System.nanoTime();
                        JsonNode v = JSON.readTree(line);
                        ALERTS.add(new double[] {seen, v.path("value").asDouble(), v.path("t_ns").asDouble()});
                    }
                }
            } catch (IOException ignored) {
                // socket closed at the end
            }
        });
        reader.setDaemon(true);
        reader.start();
        Thread.sleep(300);
        cpTrials("slipstream-subscriber", l("pre_ms", 120), 3000);
        sock.close();
    }

    /** Records when each alert row reaches the sink (same JVM in local mode). */
    public static final class AlertWriter extends ForeachWriter<Row> {
        @Override
        public boolean open(long partitionId, long epochId) {
            return true;
        }

        @Override
        public void process(Row r) {
            ALERTS.add(new double[] {System.nanoTime(), r.getDouble(r.fieldIndex("value")), r.getLong(r.fieldIndex("t_ns"))});
        }

        @Override
        public void close(Throwable error) {}
    }

    private void cpSpark() throws Exception {
        SparkSession spark = spark();
        String trig = s("trigger", "micro");
        Dataset<Row> df = spark.readStream().format("slipstream").option("endpoint", s("endpoint", ""))
                .option("stream", s("stream", "cp")).load().select("t_ns", "value", "reference", "seq");
        // (asyncProgressTrackingEnabled, which takes the offset log off the critical path, is
        // refused by Spark 4.0 for the foreach sink: "Sink ForeachSink does not support async
        // progress tracking".)
        StreamingQuery q = df.writeStream().foreach(new AlertWriter())
                .trigger(trig.equals("continuous") ? Trigger.Continuous("1 second") : Trigger.ProcessingTime(l("trigger_ms", 0)))
                .start();
        Thread.sleep(3000); // first batches / the continuous task subscribes
        if (s("measure", "trials").equals("rate")) {
            cpRate(s("setup", "slipstream-spark-" + trig), target -> Thread.sleep(l("settle_ms", 1500)));
        } else {
            cpTrials("slipstream-spark-" + trig, l("pre_ms", 200), 5000);
        }
        q.stop();
    }

    /** Waits until the plain job's value count has not changed for two batches (at most 30 s). */
    private static void waitQuietValues(long batchMs, long target) throws InterruptedException {
        long deadline = System.currentTimeMillis() + 30_000;
        long last = -1;
        long lastChange = System.currentTimeMillis();
        while (System.currentTimeMillis() < deadline) {
            long v = VALUES.get();
            if (target > 0 && v >= target) {
                return;
            }
            if (v != last) {
                last = v;
                lastChange = System.currentTimeMillis();
            } else if (System.currentTimeMillis() - lastChange > batchMs * 2 + 500) {
                return;
            }
            Thread.sleep(50);
        }
    }

    /** Waits for a run's results: `target` values sent (-1 before a run). */
    private interface Settle {
        void await(long target) throws Exception;
    }

    /**
     * measure=rate: `runs` steady runs (rate datagrams/s, `values` values each, step_s seconds,
     * one step of +-20 half-way, levels alternating 10 / 30 so each run starts where the last
     * ended), each between two samples. counted = values the plain job windowed (-1 for
     * Slipstream setups: the daemon's records counter, read by the sampler, says it).
     */
    private void cpRate(String setup, Settle settle) throws Exception {
        long rate = l("rate", 10000);
        long values = l("values", 16);
        double stepS = Double.parseDouble(s("step_s", "10"));
        int runs = (int) l("runs", 2);
        boolean plain = setup.startsWith("plain");
        for (int run = 0; run < runs; run++) {
            settle.await(-1);
            ALERTS.clear();
            VALUES.set(0);
            double mean = run % 2 == 0 ? 10 : 30;
            double by = run % 2 == 0 ? 20 : -20;
            sample("run" + run + "-begin");
            double cpu0 = cpuNow();
            JsonNode sum = send(List.of("--to", s("send_host", "127.0.0.1") + ":" + l("udp", 0), "--kind", "numbers",
                    "--rate-per-s", Long.toString(rate), "--duration-s", Double.toString(stepS),
                    "--records-per-datagram", Long.toString(values), "--batch", s("batch", "64"), "--decimals", "6",
                    "--mean", Double.toString(mean), "--stddev", "1", "--seed", Integer.toString(run + 1),
                    "--step-at-ms", Long.toString((long) (stepS * 500)), "--step-by", Double.toString(by)));
            settle.await(sum.path("records").asLong());
            double cpu = cpuNow() - cpu0;
            sample("run" + run + "-end");
            long step = sum.path("step_sent_mono_ns").asLong();
            int before = 0;
            int after = 0;
            double firstMs = Double.NaN;
            for (double[] a : ALERTS) {
                if (a[0] < step) {
                    before++;
                } else {
                    after++;
                    if (Double.isNaN(firstMs)) {
                        firstMs = (a[0] - step) / 1e6;
                    }
                }
            }
            Map<String, Object> m = new java.util.LinkedHashMap<>();
            m.put("bench", "changepoint-rate");
            m.put("setup", setup);
            m.put("run", run);
            m.put("rate_per_s", rate);
            m.put("values_per_datagram", values);
            m.put("achieved_rate_per_s", sum.path("rate_per_s").asDouble());
            m.put("datagrams", sum.path("datagrams").asLong());
            m.put("records", sum.path("records").asLong());
            m.put("counted", plain ? VALUES.get() : -1);
            m.put("alerts_before_step", before);
            m.put("alerts_after_step", after);
            m.put("first_alert_ms", firstMs);
            m.put("cpu_s", cpu);
            m.put("send_elapsed_s", sum.path("elapsed_s").asDouble());
            m.put("gen_cpu_s", lastSendCpuS);
            emit(m);
            idleWindow(run + 1);
        }
    }

    /**
     * idle_s=N: after the first run, one window of N seconds with no input between two samples
     * (labels idle-begin / idle-end): the setup's cost when nothing arrives (Spark's batches,
     * timers, the daemon's ticks).
     */
    private void idleWindow(int runsDone) throws IOException, InterruptedException {
        long idleS = l("idle_s", 0);
        if (idleS <= 0 || runsDone != 1) {
            return;
        }
        sample("idle-begin");
        Thread.sleep(idleS * 1000);
        sample("idle-end");
    }

    private void cpTrials(String setup, long preMs, long waitMs) throws Exception {
        int trials = (int) l("trials", 100);
        // Trials run first and not counted: the JVM's first-run costs (class loading, JIT) are
        // the measuring side's, not the path's. Even, so the level alternation carries on.
        int warm = (int) (l("warmup_trials", 0) / 2 * 2);
        long rate = l("rate", 5000);
        long postMs = l("post_ms", 30);
        List<Double> lat = new ArrayList<>();
        int missed = 0;
        int falseAlarms = 0;
        long records = 0;
        // Warm-up: settle the level at 10 and arm the detector.
        send(List.of("--to", s("send_host", "127.0.0.1") + ":" + l("udp", 0), "--kind", "numbers", "--rate-per-s", Long.toString(rate),
                "--duration-s", "1.0", "--mean", "10", "--stddev", "1", "--seed", "999"));
        Thread.sleep(Math.max(500, waitMs / 3));
        ALERTS.clear();
        double cpu0 = cpuNow();
        for (int k = -warm; k < trials; k++) {
            if (k == 0) {
                cpu0 = cpuNow(); // CPU counts the measured trials only
            }
            double mean = k % 2 == 0 ? 10 : 30;
            double by = k % 2 == 0 ? 20 : -20;
            double dur = (preMs + postMs) / 1000.0;
            JsonNode sum = send(List.of("--to", s("send_host", "127.0.0.1") + ":" + l("udp", 0), "--kind", "numbers",
                    "--rate-per-s", Long.toString(rate), "--duration-s", Double.toString(dur),
                    "--mean", Double.toString(mean), "--stddev", "1", "--seed", Integer.toString(k >= 0 ? k + 1 : 1000 - k),
                    "--step-at-ms", Long.toString(preMs), "--step-by", Double.toString(by)));
            boolean counted = k >= 0;
            if (counted) {
                records += sum.path("records").asLong();
            }
            long step = sum.path("step_sent_mono_ns").asLong();
            double[] hit = null;
            long deadline = System.nanoTime() + waitMs * 1_000_000L;
            while (System.nanoTime() < deadline) {
                double[] a = ALERTS.poll(Math.max(1, (deadline - System.nanoTime()) / 1_000_000L), TimeUnit.MILLISECONDS);
                if (a == null) {
                    break;
                }
                if (a[0] < step) {
                    falseAlarms += counted ? 1 : 0;
                    continue;
                }
                hit = a;
                break;
            }
            if (!counted) {
                continue;
            }
            if (hit == null) {
                missed++;
            } else {
                lat.add((hit[0] - step) / 1e6);
            }
        }
        double cpu = cpuNow() - cpu0;
        List<Double> sorted = new ArrayList<>(lat);
        sorted.sort(Double::compare);
        Map<String, Object> m = new java.util.LinkedHashMap<>();
        m.put("bench", "changepoint");
        m.put("setup", setup);
        m.put("trials", trials);
        m.put("warmup_trials", warm);
        m.put("detected", lat.size());
        m.put("missed", missed);
        m.put("false_alarms", falseAlarms);
        m.put("mean_ms", lat.stream().mapToDouble(Double::doubleValue).average().orElse(Double.NaN));
        m.put("p50_ms", pct(sorted, 0.50));
        m.put("p99_ms", pct(sorted, 0.99));
        m.put("max_ms", sorted.isEmpty() ? Double.NaN : sorted.get(sorted.size() - 1));
        m.put("records", records);
        m.put("cpu_s", cpu);
        m.put("cpu_s_per_million_records", records > 0 ? cpu / (records / 1e6) : 0);
        m.put("latencies_ms", lat);
        emit(m);
    }

    /** Nearest-rank percentile. */
    static double pct(List<Double> sorted, double p) {
        if (sorted.isEmpty()) {
            return Double.NaN;
        }
        int i = (int) Math.ceil(p * sorted.size()) - 1;
        return sorted.get(Math.max(0, Math.min(sorted.size() - 1, i)));
    }
}
