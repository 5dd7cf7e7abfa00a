// SlipstreamSource: the DataSource V2 entry point registered as "slipstream"
// (META-INF/services/org.apache.spark.sql.sources.DataSourceRegister):
//   spark.readStream.format("slipstream").option("endpoint","127.0.0.1:7100")
//        .option("stream","sensor").load()
//   (or .option("endpoints","h1:7100,h2:7100") for several daemons: one partition each)
// The schema is the stream's result type (ResultType), asked from the daemon unless the
// `type` option names it. Reading: micro-batch (SlipstreamMicroBatchStream) or continuous
// (SlipstreamContinuousStream). Not for batch (non-streaming) reads.
package io.slipstream.spark;

import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.streaming.ContinuousStream;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

import java.util.EnumSet;
import java.util.Map;
import java.util.Set;

public final class SlipstreamSource implements TableProvider, DataSourceRegister {
    @Override
    public String shortName() {
        return "slipstream";
    }

    @Override
    public StructType inferSchema(CaseInsensitiveStringMap options) {
        return new SlipstreamOptions(options).resolveType().schema;
    }

    @Override
    public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
        SlipstreamOptions opts = new SlipstreamOptions(properties);
        ResultType type = opts.type != null ? ResultType.fromName(opts.type) : typeOfSchema(schema, opts);
        return new SlipstreamTable(opts, type);
    }

    private static ResultType typeOfSchema(StructType schema, SlipstreamOptions opts) {
        for (ResultType t : ResultType.values()) {
            if (t.schema.equals(schema)) {
                return t;
            }
        }
        return opts.resolveType();
    }

    static final class SlipstreamTable implements Table, SupportsRead {
        private final SlipstreamOptions opts;
        private final ResultType type;

        SlipstreamTable(SlipstreamOptions opts, ResultType type) {
            this.opts = opts;
            this.type = type;
        }

        @Override
        public String name() {
            return "slipstream:" + opts.label() + "/" + opts.stream;
        }

        @Override
        @SuppressWarnings("deprecation")
        public StructType schema() {
            return type.schema;
        }

        @Override
        public Set<TableCapability> capabilities() {
            return EnumSet.of(TableCapability.MICRO_BATCH_READ, TableCapability.CONTINUOUS_READ);
        }

        @Override
        public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
            return () -> new SlipstreamScan(opts, type);
        }
    }

    static final class SlipstreamScan implements Scan {
        private final SlipstreamOptions opts;
        private final ResultType type;

        SlipstreamScan(SlipstreamOptions opts, ResultType type) {
            this.opts = opts;
            this.type = type;
        }

        @Override
        public StructType readSchema() {
            return type.schema;
        }

        @Override
        public String description() {
            return "Slipstream " + type.lineType + " results of stream " + opts.stream + " at " + opts.label();
        }

        @Override
        public MicroBatchStream toMicroBatchStream(String checkpointLocation) {
            return new SlipstreamMicroBatchStream(opts, type);
        }

        @Override
        public ContinuousStream toContinuousStream(String checkpointLocation) {
            return new SlipstreamContinuousStream(opts, type);
        }
    }
}
