// ChangePointAlertJob: example — Slipstream's change-point alerts as rows of a Spark query:
// each alert (value, reference, deviation and the raw values around it) printed as it arrives.
//   ChangePointAlertJob ENDPOINTS STREAM [SECONDS] [MASTER] [continuous]
// With `continuous` the query uses Trigger.Continuous (an alert reaches the sink in a few ms);
// otherwise micro-batches as fast as possible (about 0.2 s on a laptop-class host).
// Not for: benchmarks (bench/SparkBench).
package io.slipstream.spark.examples;

import static org.apache.spark.sql.functions.col;
import static org.apache.spark.sql.functions.size;

import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.streaming.StreamingQuery;
import org.apache.spark.sql.streaming.Trigger;

public final class ChangePointAlertJob {
    private ChangePointAlertJob() {}

    public static void main(String[] args) throws Exception {
        if (args.length < 2) {
            System.err.println("usage: ChangePointAlertJob ENDPOINTS STREAM [SECONDS] [MASTER] [continuous]");
            System.exit(2);
        }
        long seconds = args.length > 2 ? Long.parseLong(args[2]) : 0;
        boolean continuous = args.length > 4 && args[4].equals("continuous");
        SparkSession.Builder b = SparkSession.builder().appName("slipstream-changepoint");
        if (args.length > 3) {
            b = b.master(args[3]);
        }
        SparkSession spark = b.getOrCreate();
        Dataset<Row> alerts = spark.readStream().format("slipstream")
                .option("endpoints", args[0]).option("stream", args[1]).load()
                .select(col("seq"), col("t_ns"), col("value"), col("reference"), col("deviation"),
                        size(col("history")).as("history_values"));
        StreamingQuery q = alerts.writeStream().format("console").option("truncate", "false")
                .trigger(continuous ? Trigger.Continuous("1 second") : Trigger.ProcessingTime(0)).start();
        if (seconds > 0) {
            q.awaitTermination(seconds * 1000);
            q.stop();
        } else {
            q.awaitTermination();
        }
        spark.stop();
    }
}
