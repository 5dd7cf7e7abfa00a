// WordCountJob: example — running word totals from a Slipstream `wordcount` stream. Slipstream
// counts words per window at ingress; Spark only sums the compact per-window counts, and with
// several ingest nodes (ENDPOINTS = h1:7100,h2:7100,...) it merges their counts the same way.
//   WordCountJob ENDPOINTS STREAM [SECONDS] [MASTER]
// e.g. run.sh wordcount (local[2]), or on a cluster:
//   spark-submit --master spark://HOST:7077 --jars slipstream-spark-0.1.0.jar \
//     --class io.slipstream.spark.examples.WordCountJob slipstream-spark-0.1.0.jar 10.0.0.5:7100 words
// Not for: benchmarks (bench/SparkBench).
package io.slipstream.spark.examples;

import static org.apache.spark.sql.functions.col;
import static org.apache.spark.sql.functions.desc;
import static org.apache.spark.sql.functions.sum;

import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.streaming.StreamingQuery;
import org.apache.spark.sql.streaming.Trigger;

public final class WordCountJob {
    private WordCountJob() {}

    public static void main(String[] args) throws Exception {
        if (args.length < 2) {
            System.err.println("usage: WordCountJob ENDPOINTS STREAM [SECONDS] [MASTER]");
            System.exit(2);
        }
        long seconds = args.length > 2 ? Long.parseLong(args[2]) : 0;
        SparkSession.Builder b = SparkSession.builder().appName("slipstream-wordcount");
        if (args.length > 3) {
            // Local mode (the make target): a few shuffle partitions instead of 200, or each
            // small aggregation batch takes seconds on a 2-core host.
            b = b.master(args[3]).config("spark.sql.shuffle.partitions", "2");
        }
        SparkSession spark = b.getOrCreate();
        Dataset<Row> counts = spark.readStream().format("slipstream")
                .option("endpoints", args[0]).option("stream", args[1]).load();
        // Each node's rows count what that node received; summing per word adds the nodes up
        // (per window: groupBy("window_start_ns", "word")).
        Dataset<Row> totals = counts.where(col("word").isNotNull())
                .groupBy("word").agg(sum("count").as("total")).orderBy(desc("total")).limit(10);
        StreamingQuery q = totals.writeStream().outputMode("complete").format("console")
                .option("truncate", "false").trigger(Trigger.ProcessingTime("2 seconds")).start();
        if (seconds > 0) {
            q.awaitTermination(seconds * 1000);
            q.stop();
        } else {
            q.awaitTermination();
        }
        spark.stop();
    }
}
