// One query reading several Slipstream daemons (option `endpoints`), against three real daemons
// on loopback (Daemon) and the shared local Spark (TestSpark): option and offset rules, word
// counts of the three merged exactly by Spark (the README's groupBy window_start_ns, word),
// exactly-once across a restart from the checkpoint, one daemon killed and restarted (new
// epoch) while the others keep flowing, an endpoint down from the start, maxUnavailableMs, and
// continuous mode with one task per endpoint. Seeds are fixed and printed.
package io.slipstream.spark;

import static org.apache.spark.sql.functions.col;
import static org.apache.spark.sql.functions.sum;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.fasterxml.jackson.databind.JsonNode;
import org.apache.spark.api.java.function.VoidFunction2;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.ForeachWriter;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.streaming.StreamingQuery;
import org.apache.spark.sql.streaming.StreamingQueryProgress;
import org.apache.spark.sql.streaming.Trigger;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestInstance;

import java.io.File;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Queue;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentLinkedQueue;

@TestInstance(TestInstance.Lifecycle.PER_CLASS)
class MultiEndpointTest {
    private static final String WORDS = "name = \"w\"\noperator = \"wordcount\"\nwindow_ms = 100";
    private static final String ALL = "name = \"g\"\noperator = \"filter\"\nfilter = \"ge\"\nfilter_value = 0.0";

    /** Three daemons, each with a wordcount stream `w` and a pass-all filter stream `g`. */
    private final List<Daemon> ds = new ArrayList<>();
    private SparkSession spark;
    private final List<StreamingQuery> queries = new ArrayList<>();
    private final List<Path> temps = new ArrayList<>();

    @BeforeAll
    void start() throws IOException {
        for (int i = 0; i < 3; i++) {
            ds.add(new Daemon(List.of(WORDS, ALL)));
        }
        spark = TestSpark.get();
    }

    @AfterEach
    void stopQueries() {
        for (StreamingQuery q : queries) {
            try {
                q.stop();
            } catch (Exception ignored) {
                // already failed or stopped
            }
        }
        queries.clear();
    }

    @AfterAll
    void stop() throws IOException {
        for (Daemon d : ds) {
            d.close();
        }
        for (Path p : temps) {
            SlipstreamSourceTest.deleteTree(p);
        }
    }

    private String endpoints() {
        return String.join(",", ds.stream().map(Daemon::endpoint).toList());
    }

    private Dataset<Row> source(String endpoints, String stream, String... kv) {
        var r = spark.readStream().format("slipstream").option("endpoints", endpoints).option("stream", stream);
        for (int i = 0; i + 1 < kv.length; i += 2) {
            r = r.option(kv[i], kv[i + 1]);
        }
        return r.load();
    }

    private StreamingQuery track(StreamingQuery q) {
        queries.add(q);
        return q;
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

    private static JsonNode endOffset(StreamingQuery q) throws IOException {
        return SlipstreamClient.JSON.readTree(q.lastProgress().sources()[0].endOffset());
    }

    @Test
    void optionsAndOffsetForms() {
        Map<String, String> both = Map.of("endpoint", "a:1", "endpoints", "a:1,b:2", "stream", "s");
        Exception e = assertThrows(IllegalArgumentException.class, () -> new SlipstreamOptions(both));
        assertTrue(e.getMessage().contains("either option \"endpoint\" or \"endpoints\""), e.getMessage());
        Exception twice = assertThrows(IllegalArgumentException.class,
                () -> new SlipstreamOptions(Map.of("endpoints", "a:1, b:2,a:1", "stream", "s")));
        assertTrue(twice.getMessage().contains("names a:1 twice"), twice.getMessage());
        Exception empty = assertThrows(IllegalArgumentException.class,
                () -> new SlipstreamOptions(Map.of("endpoints", " , ", "stream", "s")));
        assertTrue(empty.getMessage().contains("\"endpoints\" is empty"), empty.getMessage());
        SlipstreamOptions o = new SlipstreamOptions(Map.of("endpoints", "b:2, a:1,[::1]:3", "stream", "s"));
        assertEquals(List.of("b:2", "a:1", "[::1]:3"), o.keys());

        // The map form round-trips with sorted keys; the old single-endpoint form is read for one endpoint.
        SlipstreamOffset off = SlipstreamOffset.fromJson("{\"b:2\":{\"epoch\":\"e2\",\"seq\":5},\"a:1\":{\"epoch\":\"e1\",\"seq\":7}}", o.keys());
        assertEquals("{\"a:1\":{\"epoch\":\"e1\",\"seq\":7},\"b:2\":{\"epoch\":\"e2\",\"seq\":5}}", off.json());
        assertEquals(off, SlipstreamOffset.fromJson(off.json(), o.keys()));
        SlipstreamOffset legacy = SlipstreamOffset.fromJson("{\"epoch\":\"ab\",\"seq\":3}", List.of("h:7100"));
        assertEquals("{\"h:7100\":{\"epoch\":\"ab\",\"seq\":3}}", legacy.json());
        Exception ambiguous = assertThrows(IllegalArgumentException.class,
                () -> SlipstreamOffset.fromJson("{\"epoch\":\"ab\",\"seq\":3}", o.keys()));
        assertTrue(ambiguous.getMessage().contains("single-endpoint form"), ambiguous.getMessage());
        assertThrows(IllegalArgumentException.class, () -> SlipstreamOffset.fromJson("{\"a:1\":{\"seq\":3}}", o.keys()));

        // Through Spark: both options given is refused when the query is defined.
        Exception viaSpark = assertThrows(Exception.class, () -> spark.readStream().format("slipstream")
                .option("endpoint", "127.0.0.1:1").option("endpoints", "127.0.0.1:1").option("stream", "x")
                .option("type", "filter").load());
        assertTrue(viaSpark.getMessage().contains("not both"), viaSpark.getMessage());
    }

    @Test
    void countsOfSeveralNodesAreMergedExactly() throws Exception {
        // The README's query: one (window, word) total over all nodes.
        Dataset<Row> merged = source(endpoints(), "w").where(col("word").isNotNull())
                .groupBy("window_start_ns", "word").agg(sum("count").as("count"));
        StreamingQuery q = track(merged.writeStream().format("memory").queryName("merged_wc").outputMode("complete")
                .trigger(Trigger.ProcessingTime(0)).start());
        q.processAllAvailable();
        Map<String, Long> expect = new TreeMap<>();
        for (int i = 0; i < ds.size(); i++) {
            ds.get(i).send("w", SlipstreamSourceTest.words(21 + i, 300, expect));
        }
        Daemon.sleep(400); // the last windows close
        q.processAllAvailable();
        Map<String, Long> got = new TreeMap<>();
        for (Row r : spark.sql("SELECT word, count FROM merged_wc").collectAsList()) {
            got.merge(r.getString(0), r.getLong(1), Long::sum);
        }
        assertEquals(expect, got, "per-word totals over the three nodes");
        // Spark merged rows of different nodes into one (window, word) group: fewer groups than rows read.
        long rowsRead = 0;
        for (StreamingQueryProgress p : q.recentProgress()) {
            rowsRead += p.numInputRows();
        }
        long groups = count("merged_wc");
        assertTrue(groups < rowsRead, "groups " + groups + " vs rows read " + rowsRead);
        JsonNode end = endOffset(q);
        for (Daemon d : ds) {
            SlipstreamClient.Info info = d.info();
            assertEquals(info.epoch(), end.path(d.endpoint()).path("epoch").asText(), end.toString());
            assertEquals(info.stream("w").nextSeq(), end.path(d.endpoint()).path("seq").asLong(), end.toString());
        }
    }

    /** Rows of each batch id, sorted, as foreachBatch saw them (a re-run batch must see the same). */
    static final Map<Long, List<String>> BATCHES = new ConcurrentHashMap<>();
    static final Queue<String> RERUN_MISMATCH = new ConcurrentLinkedQueue<>();

    @Test
    void restartFromCheckpointIsExactlyOncePerEndpoint() throws Exception {
        Path ckpt = Files.createTempDirectory("slipstream-multi-ckpt-");
        temps.add(ckpt);
        BATCHES.clear();
        RERUN_MISMATCH.clear();
        VoidFunction2<Dataset<Row>, Long> sink = (df, id) -> {
            List<String> rows = new ArrayList<>();
            for (Row r : df.collectAsList()) {
                rows.add(r.getLong(r.fieldIndex("window_start_ns")) + ":" + r.getLong(r.fieldIndex("seq")) + ":"
                        + r.getString(r.fieldIndex("word")) + ":" + r.getLong(r.fieldIndex("count")));
            }
            rows.sort(null);
            List<String> before = BATCHES.putIfAbsent(id, rows);
            if (before != null && !before.equals(rows)) {
                RERUN_MISMATCH.add("batch " + id + ": " + before + " vs " + rows);
            }
        };
        Map<String, Long> expect = new TreeMap<>();
        // Run 1: from latest, data A to every node.
        StreamingQuery q = track(source(endpoints(), "w").writeStream().foreachBatch(sink)
                .option("checkpointLocation", ckpt.toString()).start());
        q.processAllAvailable();
        for (int i = 0; i < ds.size(); i++) {
            ds.get(i).send("w", SlipstreamSourceTest.words(31 + i, 150, expect));
        }
        Daemon.sleep(400);
        q.processAllAvailable();
        q.stop();
        // Forget that the last batch was committed: the restarted query must run it again from
        // its logged offsets (one range per endpoint) and see exactly the same lines.
        File[] commits = ckpt.resolve("commits").toFile().listFiles((dir, n) -> n.matches("\\d+"));
        assertTrue(commits != null && commits.length > 0, "no committed batch");
        long lastId = 0;
        for (File f : commits) {
            lastId = Math.max(lastId, Long.parseLong(f.getName()));
        }
        Files.delete(ckpt.resolve("commits").resolve(Long.toString(lastId)));
        Files.deleteIfExists(ckpt.resolve("commits").resolve("." + lastId + ".crc"));
        assertFalse(BATCHES.get(lastId).isEmpty(), "the replayed batch must not be empty");
        // Data B arrives at every node while the query is down.
        for (int i = 0; i < ds.size(); i++) {
            ds.get(i).send("w", SlipstreamSourceTest.words(41 + i, 150, expect));
        }
        Daemon.sleep(400);
        // Run 2: from the checkpoint.
        StreamingQuery q2 = track(source(endpoints(), "w").writeStream().foreachBatch(sink)
                .option("checkpointLocation", ckpt.toString()).start());
        q2.processAllAvailable();
        q2.stop();
        assertEquals(List.of(), new ArrayList<>(RERUN_MISMATCH), "a re-run batch saw different lines");
        Map<String, Long> got = new TreeMap<>();
        for (List<String> rows : BATCHES.values()) {
            for (String r : rows) {
                String[] p = r.split(":");
                got.merge(p[2], Long.parseLong(p[3]), Long::sum);
            }
        }
        assertEquals(expect, got, "A (before the restart) + B (while down), from three nodes, exactly once");
    }

    @Test
    void oneNodeKilledAndRestartedWhileTheOthersFlow() throws Exception {
        Daemon a = ds.get(0);
        Daemon b = ds.get(1);
        Daemon c = ds.get(2);
        String epochB1 = b.info().epoch();
        StreamingQuery q = track(source(endpoints(), "g", "maxUnavailableMs", "30000").writeStream().format("memory")
                .queryName("multi_gone").outputMode("append").trigger(Trigger.ProcessingTime(100)).start());
        q.processAllAvailable();
        a.send("g", List.of("1\n2\n3\n"));
        b.send("g", List.of("11\n12\n13\n"));
        c.send("g", List.of("21\n22\n23\n"));
        awaitRows("multi_gone", 9, 30_000);
        b.kill();
        // The others keep flowing while b is away.
        for (int i = 0; i < 10; i++) {
            a.send("g", List.of((4 + i) + "\n"));
            c.send("g", List.of((24 + i) + "\n"));
            Daemon.sleep(100);
        }
        awaitRows("multi_gone", 29, 30_000);
        assertTrue(q.isActive(), "query died while one node was away: " + q.exception());
        b.start(); // a new run: new epoch, seqs from 0
        String epochB2 = b.info().epoch();
        assertNotEquals(epochB1, epochB2);
        b.send("g", List.of("14\n15\n"));
        awaitRows("multi_gone", 31, 30_000);
        assertTrue(q.isActive());
        List<Row> fromB = spark.sql("SELECT value, seq FROM multi_gone WHERE value >= 14 AND value < 20 ORDER BY value")
                .collectAsList();
        assertEquals(List.of(0L, 1L), fromB.stream().map(r -> r.getLong(1)).toList(), "b's new run starts at seq 0");
        List<Double> all = spark.sql("SELECT value FROM multi_gone ORDER BY value").collectAsList().stream()
                .map(r -> r.getDouble(0)).toList();
        List<Double> want = new ArrayList<>();
        for (int[] range : new int[][] {{1, 13}, {11, 15}, {21, 33}}) { // a, b (both runs), c
            for (int v = range[0]; v <= range[1]; v++) {
                want.add((double) v);
            }
        }
        want.sort(null);
        assertEquals(want, all, "every value once");
        awaitEpoch(q, b, epochB2);
    }

    /** The query's end offset names `d`'s run `epoch` (after its next trigger). */
    private static void awaitEpoch(StreamingQuery q, Daemon d, String epoch) throws IOException {
        long deadline = System.currentTimeMillis() + 5000;
        String seen = "";
        while (System.currentTimeMillis() < deadline) {
            seen = endOffset(q).path(d.endpoint()).path("epoch").asText();
            if (seen.equals(epoch)) {
                return;
            }
            Daemon.sleep(100);
        }
        assertEquals(epoch, seen);
    }

    @Test
    void anEndpointDownFromTheStartAndMaxUnavailable() throws Exception {
        Daemon a = ds.get(0);
        String down = "127.0.0.1:1";
        // Down first in the list: the schema comes from the next endpoint that answers.
        StreamingQuery q = track(source(down + "," + a.endpoint(), "g", "maxUnavailableMs", "60000").writeStream()
                .format("memory").queryName("multi_down").outputMode("append").trigger(Trigger.ProcessingTime(100)).start());
        q.processAllAvailable();
        a.send("g", List.of("1\n2\n"));
        awaitRows("multi_down", 2, 30_000);
        assertTrue(q.isActive(), "" + q.exception());
        assertTrue(endOffset(q).path(down).isMissingNode(), "no position for an endpoint never reached");
        q.stop();

        StreamingQuery q2 = track(source(down + "," + a.endpoint(), "g", "maxUnavailableMs", "500").writeStream()
                .format("memory").queryName("multi_down2").outputMode("append").trigger(Trigger.ProcessingTime(100)).start());
        Exception e = assertThrows(Exception.class, () -> q2.awaitTermination(20_000));
        assertTrue(e.getMessage().contains("cannot reach Slipstream at " + down) && e.getMessage().contains("maxUnavailableMs = 500"),
                e.getMessage());
    }

    @Test
    void availableNowFromAnOffsetJsonReadsWhatEachNodeHasThenStops() throws Exception {
        // startingOffsets as a JSON of each node's current position (what a checkpoint holds).
        StringBuilder start = new StringBuilder("{");
        for (Daemon d : ds) {
            SlipstreamClient.Info info = d.info();
            start.append(start.length() > 1 ? "," : "").append('"').append(d.endpoint()).append("\":{\"epoch\":\"")
                    .append(info.epoch()).append("\",\"seq\":").append(info.stream("g").nextSeq()).append('}');
        }
        start.append('}');
        List<Double> want = new ArrayList<>();
        for (int i = 0; i < ds.size(); i++) {
            long before = ds.get(i).info().stream("g").nextSeq();
            ds.get(i).send("g", List.of((1000 + i) + "\n" + (2000 + i) + "\n"));
            ds.get(i).awaitLines("g", before + 2, 5000);
            want.add(1000.0 + i);
            want.add(2000.0 + i);
        }
        StreamingQuery q = track(source(endpoints(), "g", "startingOffsets", start.toString()).writeStream().format("memory")
                .queryName("multi_now").outputMode("append").trigger(Trigger.AvailableNow()).start());
        assertTrue(q.awaitTermination(60_000), "AvailableNow did not stop");
        List<Double> got = spark.sql("SELECT value FROM multi_now ORDER BY value").collectAsList().stream()
                .map(r -> r.getDouble(0)).toList();
        want.sort(null);
        assertEquals(want, got);
    }

    /** Reads one planned range straight through the reader (no Spark): the values of its rows. */
    private static List<Double> readRange(SlipstreamMicroBatchStream.RangePartition p) throws IOException {
        List<Double> out = new ArrayList<>();
        try (var r = new SlipstreamMicroBatchStream.RangeReader(p)) {
            for (int i = 0; i < 1000 && r.next(); i++) {
                out.add(r.get().getDouble(1));
            }
        }
        return out;
    }

    @Test
    void aPlannedRangeWaitsForItsEndpoint() throws Exception {
        try (Daemon dd = new Daemon(List.of(ALL))) {
            dd.send("g", List.of("1\n2\n3\n"));
            dd.awaitLines("g", 3, 5000);
            String epoch = dd.info().epoch();
            SlipstreamClient.Endpoint ep = new SlipstreamOptions(Map.of("endpoint", dd.endpoint(), "stream", "g")).endpoints.get(0);
            SlipstreamOptions patient = new SlipstreamOptions(Map.of("endpoint", dd.endpoint(), "stream", "g", "maxUnavailableMs", "10000"));
            var range = new SlipstreamMicroBatchStream.RangePartition(patient, ResultType.FILTERED, ep, epoch, 0, 3);
            assertEquals(List.of(1.0, 2.0, 3.0), readRange(range), "an exact range read");
            // Killed after the batch was planned, back as a new run while the reader waits: the
            // range is gone, the read ends (empty) instead of failing the batch.
            dd.kill();
            Thread back = new Thread(() -> {
                Daemon.sleep(500);
                try {
                    dd.start();
                } catch (IOException e) {
                    throw new java.io.UncheckedIOException(e);
                }
            });
            back.start();
            long t0 = System.currentTimeMillis();
            assertEquals(List.of(), readRange(range));
            long waitedMs = System.currentTimeMillis() - t0;
            back.join(15_000);
            assertTrue(waitedMs >= 400 && waitedMs < 10_000, "waited " + waitedMs + " ms");
            assertNotEquals(epoch, dd.info().epoch());
            // Away longer than maxUnavailableMs: the read fails with a clear message.
            dd.kill();
            SlipstreamOptions impatient = new SlipstreamOptions(Map.of("endpoint", dd.endpoint(), "stream", "g", "maxUnavailableMs", "300"));
            var range2 = new SlipstreamMicroBatchStream.RangePartition(impatient, ResultType.FILTERED, ep, epoch, 0, 3);
            IOException e = assertThrows(IOException.class, () -> readRange(range2));
            assertTrue(e.getMessage().contains("unreachable for more than 300 ms"), e.getMessage());
        }
    }

    /** Continuous mode's sink: rows from every task, in this JVM (local mode). */
    static final Queue<Double> CONTINUOUS_ROWS = new ConcurrentLinkedQueue<>();

    static final class CollectValues extends ForeachWriter<Row> {
        @Override
        public boolean open(long partitionId, long epochId) {
            return true;
        }

        @Override
        public void process(Row r) {
            CONTINUOUS_ROWS.add(r.getDouble(r.fieldIndex("value")));
        }

        @Override
        public void close(Throwable errorOrNull) {}
    }

    @Test
    void continuousModeReadsEveryEndpoint() throws Exception {
        // Two endpoints: one long-running task each, which is all local[2] has.
        Daemon a = ds.get(0);
        Daemon c = ds.get(2);
        CONTINUOUS_ROWS.clear();
        StreamingQuery q = track(source(a.endpoint() + "," + c.endpoint(), "g").writeStream().foreach(new CollectValues())
                .trigger(Trigger.Continuous("1 second")).start());
        Daemon.sleep(2000); // the tasks subscribe
        a.send("g", List.of("101\n102\n"));
        c.send("g", List.of("201\n202\n203\n"));
        long deadline = System.currentTimeMillis() + 30_000;
        while (System.currentTimeMillis() < deadline && CONTINUOUS_ROWS.size() < 5) {
            Daemon.sleep(50);
        }
        List<Double> got = new ArrayList<>(CONTINUOUS_ROWS);
        got.sort(null);
        assertEquals(List.of(101.0, 102.0, 201.0, 202.0, 203.0), got);
        assertTrue(q.isActive(), "" + q.exception());
    }
}
