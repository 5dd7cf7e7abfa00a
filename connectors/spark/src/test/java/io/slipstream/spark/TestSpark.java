// TestSpark: the one local SparkSession (local[2]) every connector test shares, so the Maven
// test phase pays Spark's start-up once. Not for: anything but tests.
package io.slipstream.spark;

import org.apache.spark.sql.SparkSession;

final class TestSpark {
    private static SparkSession session;

    private TestSpark() {}

    static synchronized SparkSession get() {
        if (session == null) {
            session = SparkSession.builder()
                    .master("local[2]")
                    .appName("slipstream-spark-tests")
                    .config("spark.ui.enabled", "false")
                    .config("spark.sql.shuffle.partitions", "2")
                    .config("spark.sql.streaming.stopTimeout", "10s")
                    .config("spark.driver.host", "127.0.0.1")
                    .config("spark.driver.bindAddress", "127.0.0.1")
                    .getOrCreate();
            session.sparkContext().setLogLevel("WARN");
            Runtime.getRuntime().addShutdownHook(new Thread(() -> session.stop()));
        }
        return session;
    }
}
