"""PySpark usage of the Slipstream source (the connector jar must be on Spark's classpath):

    pyspark --jars connectors/spark/target/slipstream-spark-0.1.0.jar
    spark-submit --jars connectors/spark/target/slipstream-spark-0.1.0.jar \
        connectors/spark/examples/pyspark_example.py 127.0.0.1:7200 words

Prints the top words of a Slipstream `wordcount` stream every 2 s. The first argument may name
several daemons (ingest nodes), h1:7200,h2:7200: their counts are summed. Not for benchmarks.
"""

import sys

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

endpoints = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:7200"
stream = sys.argv[2] if len(sys.argv) > 2 else "words"

spark = SparkSession.builder.appName("slipstream-pyspark").getOrCreate()
counts = (
    spark.readStream.format("slipstream")
    .option("endpoints", endpoints)
    .option("stream", stream)
    .load()
)
top = (
    counts.where(F.col("word").isNotNull())
    .groupBy("word")
    .agg(F.sum("count").alias("total"))
    .orderBy(F.desc("total"))
    .limit(10)
)
query = (
    top.writeStream.outputMode("complete")
    .format("console")
    .trigger(processingTime="2 seconds")
    .start()
)
query.awaitTermination()
