// Connector tests against a real Slipstream daemon (Daemon) and one shared local Spark
// (TestSpark): schemas, offsets, exact word counts, replay of an uncommitted batch and restart
// from a checkpoint, every result type, an unknown stream, an unreachable daemon, the daemon
// going away and coming back (new epoch), and continuous mode. Seeds are fixed and printed.
package io.slipstream.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import org.apache.spark.api.java.function.VoidFunction2;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.streaming.StreamingQuery;
import org.apache.spark.sql.streaming.Trigger;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestInstance;

import java.io.File;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import java.util.stream.Stream;

@TestInstance(TestInstance.Lifecycle.PER_CLASS)
class SlipstreamSourceTest {
    private Daemon d;
    private SparkSession spark;
    private final List<StreamingQuery> queries = new ArrayList<>();
    private final List<Path> temps = new ArrayList<>();

    @BeforeAll
    void start() throws IOException {
        d = new Daemon(List.of(
                "name = \"w\"\noperator = \"wordcount\"\nwindow_ms = 100",
                "name = \"cp\"\noperator = \"changepoint\"\nwindow_ms = 50\nreference_windows = 4\nthreshold = 5.0\nhistory = 16",
                "name = \"agg\"\noperator = \"aggregate\"\nwindow_ms = 100",
                "name = \"f\"\noperator = \"filter\"\nfilter = \"ge\"\nfilter_value = 10.0"));
        spark = TestSpark.get();
    }

    @AfterAll
    void stop() throws IOException {
        for (StreamingQuery q : queries) {
            try {
                q.stop();
            } catch (Exception ignored) {
                // already failed or stopped
            }
        }
        d.close();
        for (Path p : temps) {
            deleteTree(p);
        }
    }

    private Dataset<Row> source(Daemon dd, String stream, String... kv) {
        var r = spark.readStream().format("slipstream").option("endpoint", dd.endpoint()).option("stream", stream);
        for (int i = 0; i + 1 < kv.length; i += 2) {
            r = r.option(kv[i], kv[i + 1]);
        }
        return r.load();
    }

    private StreamingQuery memory(Dataset<Row> df, String name, Trigger trigger) throws Exception {
        StreamingQuery q = df.writeStream().format("memory").queryName(name).outputMode("append").trigger(trigger).start();
        queries.add(q);
        return q;
    }

    private Path temp(String prefix) throws IOException {
        Path p = Files.createTempDirectory(prefix);
        temps.add(p);
        return p;
    }

    static void deleteTree(Path p) throws IOException {
        if (!Files.exists(p)) {
            return;
        }
        try (Stream<Path> s = Files.walk(p)) {
            s.sorted(Comparator.reverseOrder()).map(Path::toFile).forEach(File::delete);
        }
    }

    private long count(String table) {
        return spark.sql("SELECT count(*) FROM " + table).first().getLong(0);
    }

    private void awaitRows(String table, long n, long timeoutMs) {
        long deadline = System.currentTimeMillis() + timeoutMs;
        while (System.currentTimeMillis() < deadline && count(table) < n) {
            Daemon.sleep(50);
        }
        assertEquals(n, count(table), "rows in " + table);
    }

    /** `datagrams` datagrams of 1..6 Zipf-ish words each from `seed`; adds the multiset to `expect`. */
    static List<String> words(long seed, int datagrams, Map<String, Long> expect) {
        System.out.println("words seed = " + seed);
        Random r = new Random(seed);
        List<String> out = new ArrayList<>();
        for (int i = 0; i < datagrams; i++) {
            StringBuilder b = new StringBuilder();
            int n = 1 + r.nextInt(6);
            for (int k = 0; k < n; k++) {
                String w = "w" + (int) Math.floor(Math.pow(40, r.nextDouble()));
                b.append(w).append(k % 2 == 0 ? ' ' : '\n');
                expect.merge(w, 1L, Long::sum);
            }
            out.add(b.toString());
        }
        return out;
    }

    private static Map<String, Long> sums(List<Row> rows) {
        Map<String, Long> m = new TreeMap<>();
        for (Row r : rows) {
            m.merge(r.getString(r.fieldIndex("word")), r.getLong(r.fieldIndex("count")), Long::sum);
        }
        return m;
    }

    @Test
    void schemaFollowsTheStreamsOperator() {
        assertEquals(ResultType.WORDCOUNT.schema, source(d, "w").schema());
        assertEquals(ResultType.CHANGEPOINT.schema, source(d, "cp").schema());
        assertEquals(ResultType.WINDOW.schema, source(d, "agg").schema());
        assertEquals(ResultType.FILTERED.schema, source(d, "f").schema());
        assertEquals(List.of("window_start_ns", "window_end_ns", "word", "count", "seq"),
                List.of(source(d, "w").schema().fieldNames()));
        // An explicit type needs no daemon to define the query.
        var df = spark.readStream().format("slipstream").option("endpoint", "127.0.0.1:1").option("stream", "x")
                .option("type", "aggregate").load();
        assertEquals(ResultType.WINDOW.schema, df.schema());
    }

    @Test
    void unknownStreamAndUnreachableDaemonAreClearErrors() {
        Exception e = assertThrows(Exception.class, () -> source(d, "nope"));
        assertTrue(e.getMessage().contains("has no stream \"nope\"") && e.getMessage().contains("w, cp, agg, f"), e.getMessage());
        Exception u = assertThrows(Exception.class, () -> spark.readStream().format("slipstream")
                .option("endpoint", "127.0.0.1:1").option("stream", "x").load());
        assertTrue(u.getMessage().contains("cannot reach Slipstream at 127.0.0.1:1"), u.getMessage());
        Exception o = assertThrows(Exception.class, () -> spark.readStream().format("slipstream")
                .option("stream", "x").load());
        assertTrue(o.getMessage().contains("\"endpoint\""), o.getMessage());
    }

    @Test
    void wordCountsAreExactAndOffsetsAreEpochAndSeq() throws Exception {
        StreamingQuery q = memory(source(d, "w"), "wc_exact", Trigger.ProcessingTime(0));
        q.processAllAvailable();
        Map<String, Long> expect = new TreeMap<>();
        d.send("w", words(7, 400, expect));
        Daemon.sleep(400); // the last window closes
        q.processAllAvailable();
        assertEquals(expect, sums(spark.sql("SELECT * FROM wc_exact").collectAsList()));
        SlipstreamClient.Info info = d.info();
        JsonNode end = SlipstreamClient.JSON.readTree(q.lastProgress().sources()[0].endOffset()).path(d.endpoint());
        assertEquals(info.epoch(), end.path("epoch").asText());
        assertEquals(info.stream("w").nextSeq(), end.path("seq").asLong());
        // Every row carries its line's seq; seqs are below the end offset.
        long maxSeq = spark.sql("SELECT max(seq) FROM wc_exact").first().getLong(0);
        assertEquals(end.path("seq").asLong() - 1, maxSeq);
        q.stop();
    }

    /** Rows of each batch id, as foreachBatch saw them (a re-run batch must see the same). */
    static final Map<Long, List<String>> BATCHES = new ConcurrentHashMap<>();
    static final List<String> RERUN_MISMATCH = new ArrayList<>();

    @Test
    void restartFromCheckpointIsExactlyOnce() throws Exception {
        Path ckpt = temp("slipstream-ckpt-");
        BATCHES.clear();
        VoidFunction2<Dataset<Row>, Long> sink = (ds, id) -> {
            List<String> rows = new ArrayList<>();
            for (Row r : ds.collectAsList()) {
                rows.add(r.getLong(r.fieldIndex("seq")) + ":" + r.getString(r.fieldIndex("word")) + ":" + r.getLong(r.fieldIndex("count")));
            }
            List<String> before = BATCHES.putIfAbsent(id, rows);
            if (before != null && !before.equals(rows)) {
                synchronized (RERUN_MISMATCH) {
                    RERUN_MISMATCH.add("batch " + id + ": " + before + " vs " + rows);
                }
            }
        };
        Map<String, Long> expect = new TreeMap<>();
        // Run 1: from latest, data A.
        StreamingQuery q = source(d, "w").writeStream().foreachBatch(sink).option("checkpointLocation", ckpt.toString()).start();
        queries.add(q);
        q.processAllAvailable();
        d.send("w", words(11, 200, expect));
        Daemon.sleep(400);
        q.processAllAvailable();
        q.stop();
        // Forget that the last batch was committed: the restarted query must run it again from
        // its logged offsets and see exactly the same lines.
        File[] commits = ckpt.resolve("commits").toFile().listFiles((dir, n) -> n.matches("\\d+"));
        assertTrue(commits != null && commits.length > 0, "no committed batch");
        long lastId = 0;
        for (File f : commits) {
            lastId = Math.max(lastId, Long.parseLong(f.getName()));
        }
        Files.delete(ckpt.resolve("commits").resolve(Long.toString(lastId)));
        Files.deleteIfExists(ckpt.resolve("commits").resolve("." + lastId + ".crc"));
        // Rewrite the offset log in the single-endpoint form of earlier versions: old
        // checkpoints keep working.
        File[] logged = ckpt.resolve("offsets").toFile().listFiles((dir, n) -> n.matches("\\d+"));
        for (File f : logged) {
            List<String> lines = new ArrayList<>(Files.readAllLines(f.toPath()));
            JsonNode pos = SlipstreamClient.JSON.readTree(lines.get(lines.size() - 1)).path(d.endpoint());
            assertTrue(pos.has("epoch"), lines.toString());
            lines.set(lines.size() - 1, pos.toString());
            Files.write(f.toPath(), lines);
            Files.deleteIfExists(f.toPath().resolveSibling("." + f.getName() + ".crc"));
        }
        long rowsBefore = BATCHES.get(lastId).size();
        assertTrue(rowsBefore > 0, "the replayed batch must not be empty");
        // Data B arrives while the query is down.
        d.send("w", words(12, 200, expect));
        Daemon.sleep(400);
        // Run 2: from the checkpoint.
        StreamingQuery q2 = source(d, "w").writeStream().foreachBatch(sink).option("checkpointLocation", ckpt.toString()).start();
        queries.add(q2);
        q2.processAllAvailable();
        q2.stop();
        assertEquals(List.of(), RERUN_MISMATCH, "a re-run batch saw different lines");
        Map<String, Long> got = new TreeMap<>();
        java.util.Set<String> seen = new java.util.HashSet<>();
        for (List<String> rows : BATCHES.values()) {
            for (String r : rows) {
                assertTrue(seen.add(r.substring(0, r.lastIndexOf(':'))), "row seen twice: " + r);
                String[] p = r.split(":");
                got.merge(p[1], Long.parseLong(p[2]), Long::sum);
            }
        }
        assertEquals(expect, got, "A (before the restart) + B (while down) exactly once");
    }

    @Test
    void everyResultType() throws Exception {
        StreamingQuery qc = memory(source(d, "cp"), "cp_rows", Trigger.ProcessingTime(0));
        StreamingQuery qa = memory(source(d, "agg"), "agg_rows", Trigger.ProcessingTime(0));
        StreamingQuery qf = memory(source(d, "f"), "f_rows", Trigger.ProcessingTime(0));
        qc.processAllAvailable();
        qa.processAllAvailable();
        qf.processAllAvailable();
        // Change point: a stationary stretch (6+ windows of 50 ms at 10.0), then a step to 30.
        long seq0 = d.info().stream("cp").nextSeq();
        for (int i = 0; i < 80; i++) {
            d.send("cp", List.of("10.0\n"));
            Daemon.sleep(5);
        }
        d.send("cp", List.of("30.0\n30.0\n"));
        d.awaitLines("cp", seq0 + 1, 5000);
        // Window aggregates: 1..10 in one datagram (one window).
        d.send("agg", List.of("1\n2\n3\n4\n5\n6\n7\n8\n9\n10\n"));
        // Filter >= 10 over words and numbers.
        d.send("f", List.of("5\n10\n15\n", "20\n"));
        Daemon.sleep(400);
        qc.processAllAvailable();
        qa.processAllAvailable();
        qf.processAllAvailable();

        List<Row> cp = spark.sql("SELECT * FROM cp_rows").collectAsList();
        assertEquals(1, cp.size(), cp.toString());
        Row a = cp.get(0);
        assertEquals(30.0, a.getDouble(a.fieldIndex("value")));
        assertEquals(10.0, a.getDouble(a.fieldIndex("reference")), 1e-9);
        assertEquals(20.0, a.getDouble(a.fieldIndex("deviation")), 1e-9);
        assertEquals("reference", a.getString(a.fieldIndex("method")));
        assertNull(a.get(a.fieldIndex("direction")));
        List<Double> hist = a.getList(a.fieldIndex("history"));
        assertEquals(16, hist.size());
        assertEquals(30.0, hist.get(15));
        assertEquals(10.0, hist.get(0));
        assertTrue(a.getLong(a.fieldIndex("t_ns")) > 0);

        Row w = spark.sql("SELECT sum(count), sum(sum), min(min), max(max), count(*) FROM agg_rows").first();
        assertEquals(10L, w.getLong(0));
        assertEquals(55.0, w.getDouble(1));
        assertEquals(1.0, w.getDouble(2));
        assertEquals(10.0, w.getDouble(3));
        if (w.getLong(4) == 1) {
            Row one = spark.sql("SELECT * FROM agg_rows").first();
            assertEquals(5.5, one.getDouble(one.fieldIndex("avg")));
            assertEquals(5.5, one.getDouble(one.fieldIndex("median")));
            assertEquals(8.25, one.getDouble(one.fieldIndex("variance")), 1e-9);
            assertTrue(one.getLong(one.fieldIndex("window_end_ns")) > one.getLong(one.fieldIndex("window_start_ns")));
        }

        List<Row> f = spark.sql("SELECT value, word FROM f_rows ORDER BY seq").collectAsList();
        assertEquals(List.of(10.0, 15.0, 20.0), f.stream().map(r -> r.getDouble(0)).toList());
        assertTrue(f.stream().allMatch(r -> r.isNullAt(1)));
        qc.stop();
        qa.stop();
        qf.stop();
    }

    @Test
    void daemonGoingAwayAndComingBack() throws Exception {
        try (Daemon dd = new Daemon(List.of("name = \"g\"\noperator = \"filter\"\nfilter = \"ge\"\nfilter_value = 0.0"))) {
            String epoch1 = dd.info().epoch();
            StreamingQuery q = memory(source(dd, "g", "maxUnavailableMs", "30000"), "gone_rows", Trigger.ProcessingTime(100));
            q.processAllAvailable();
            dd.send("g", List.of("1\n2\n3\n4\n5\n"));
            awaitRows("gone_rows", 5, 10_000);
            dd.stop();
            Daemon.sleep(1000); // several triggers find nobody: empty batches, no failure
            assertTrue(q.isActive(), "query died while the daemon was away: " + q.exception());
            dd.start();
            String epoch2 = dd.info().epoch();
            assertNotEquals(epoch1, epoch2);
            dd.send("g", List.of("6\n7\n8\n"));
            awaitRows("gone_rows", 8, 10_000);
            assertTrue(q.isActive());
            List<Row> after = spark.sql("SELECT value, seq FROM gone_rows WHERE value > 5 ORDER BY value").collectAsList();
            assertEquals(List.of(0L, 1L, 2L), after.stream().map(r -> r.getLong(1)).toList(), "new run's seqs start at 0");
            JsonNode end = SlipstreamClient.JSON.readTree(q.lastProgress().sources()[0].endOffset()).path(dd.endpoint());
            assertEquals(epoch2, end.path("epoch").asText());
            q.stop();
        }
    }

    @Test
    void continuousModeDeliversRowsAsTheyArrive() throws Exception {
        try (Daemon dd = new Daemon(List.of("name = \"c\"\noperator = \"filter\"\nfilter = \"ge\"\nfilter_value = 0.0"))) {
            StreamingQuery q = memory(source(dd, "c"), "cont_rows", Trigger.Continuous("1 second"));
            Daemon.sleep(1500); // the long-running task subscribes
            dd.send("c", List.of("1\n2\n3\n"));
            awaitRows("cont_rows", 3, 15_000);
            List<Row> rows = spark.sql("SELECT value FROM cont_rows ORDER BY seq").collectAsList();
            assertEquals(List.of(1.0, 2.0, 3.0), rows.stream().map(r -> r.getDouble(0)).toList());
            q.stop();
        }
    }

}
