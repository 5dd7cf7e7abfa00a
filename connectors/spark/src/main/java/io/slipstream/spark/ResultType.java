// ResultType: the four Slipstream result line types, each with its Spark schema and its
// conversion from one JSON result line to rows. Times (`*_ns`) are the daemon's
// CLOCK_MONOTONIC nanoseconds (not wall-clock), so they are longs, not timestamps.
// Not for: reading lines (SlipstreamClient) or offsets.
package io.slipstream.spark;

import com.fasterxml.jackson.databind.JsonNode;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.util.GenericArrayData;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;

import java.util.Iterator;
import java.util.List;
import java.util.Locale;
import java.util.Map;

public enum ResultType {
    /** One row per (window, word); a window's untracked words (`overflow`) as one row with word = null. */
    WORDCOUNT("wordcount", new StructType()
            .add("window_start_ns", DataTypes.LongType, false)
            .add("window_end_ns", DataTypes.LongType, false)
            .add("word", DataTypes.StringType, true)
            .add("count", DataTypes.LongType, false)
            .add("seq", DataTypes.LongType, false)),
    /** One row per alert, with the raw values around it. */
    CHANGEPOINT("changepoint", new StructType()
            .add("t_ns", DataTypes.LongType, false)
            .add("value", DataTypes.DoubleType, false)
            .add("reference", DataTypes.DoubleType, false)
            .add("deviation", DataTypes.DoubleType, false)
            .add("threshold", DataTypes.DoubleType, false)
            .add("method", DataTypes.StringType, false)
            .add("direction", DataTypes.StringType, true)
            .add("statistic", DataTypes.DoubleType, true)
            .add("history", DataTypes.createArrayType(DataTypes.DoubleType, false), false)
            .add("seq", DataTypes.LongType, false)),
    /** One row per closed window of the `aggregate` operator. */
    WINDOW("window", new StructType()
            .add("window_start_ns", DataTypes.LongType, false)
            .add("window_end_ns", DataTypes.LongType, false)
            .add("count", DataTypes.LongType, false)
            .add("sum", DataTypes.DoubleType, false)
            .add("avg", DataTypes.DoubleType, false)
            .add("min", DataTypes.DoubleType, false)
            .add("max", DataTypes.DoubleType, false)
            .add("median", DataTypes.DoubleType, true)
            .add("variance", DataTypes.DoubleType, false)
            .add("truncated", DataTypes.BooleanType, false)
            .add("seq", DataTypes.LongType, false)),
    /** One row per record the filter passed: `value` for numeric streams, `word` for words. */
    FILTERED("filtered", new StructType()
            .add("t_ns", DataTypes.LongType, false)
            .add("value", DataTypes.DoubleType, true)
            .add("word", DataTypes.StringType, true)
            .add("seq", DataTypes.LongType, false));

    /** The `type` field of the lines this result type reads. */
    public final String lineType;
    public final StructType schema;

    ResultType(String lineType, StructType schema) {
        this.lineType = lineType;
        this.schema = schema;
    }

    /** From the `type` option: a line type or an operator name, case-insensitive. */
    public static ResultType fromName(String name) {
        String n = name.trim().toLowerCase(Locale.ROOT);
        switch (n) {
            case "wordcount": return WORDCOUNT;
            case "changepoint": return CHANGEPOINT;
            case "window": case "aggregate": return WINDOW;
            case "filtered": case "filter": return FILTERED;
            default:
                throw new IllegalArgumentException("slipstream: type \"" + name
                        + "\": expected wordcount, changepoint, window (aggregate) or filtered (filter)");
        }
    }

    /** The result type a stream's operator (as INFO names it) produces. */
    public static ResultType ofOperator(String operator) {
        return fromName(operator);
    }

    private static Double optDouble(JsonNode n) {
        return n == null || n.isNull() || n.isMissingNode() ? null : n.asDouble();
    }

    private static UTF8String optStr(JsonNode n) {
        return n == null || n.isNull() || n.isMissingNode() ? null : UTF8String.fromString(n.asText());
    }

    /** Appends the rows of one result line of this type (other line types add nothing). */
    public void toRows(JsonNode v, List<InternalRow> out) {
        if (!lineType.equals(v.path("type").asText())) {
            return;
        }
        long seq = v.path("seq").asLong();
        switch (this) {
            case WORDCOUNT: {
                long a = v.path("window_start_ns").asLong();
                long b = v.path("window_end_ns").asLong();
                Iterator<Map.Entry<String, JsonNode>> it = v.path("counts").fields();
                while (it.hasNext()) {
                    Map.Entry<String, JsonNode> e = it.next();
                    out.add(new GenericInternalRow(new Object[] {a, b, UTF8String.fromString(e.getKey()), e.getValue().asLong(), seq}));
                }
                long overflow = v.path("overflow").asLong(0);
                if (overflow > 0) {
                    out.add(new GenericInternalRow(new Object[] {a, b, null, overflow, seq}));
                }
                break;
            }
            case CHANGEPOINT: {
                JsonNode h = v.path("history");
                double[] hist = new double[h.size()];
                for (int i = 0; i < hist.length; i++) {
                    hist[i] = h.get(i).asDouble();
                }
                out.add(new GenericInternalRow(new Object[] {
                    v.path("t_ns").asLong(), v.path("value").asDouble(), v.path("reference").asDouble(),
                    v.path("deviation").asDouble(), v.path("threshold").asDouble(),
                    UTF8String.fromString(v.path("method").asText("reference")),
                    optStr(v.get("direction")), optDouble(v.get("statistic")),
                    new GenericArrayData(hist), seq}));
                break;
            }
            case WINDOW:
                out.add(new GenericInternalRow(new Object[] {
                    v.path("window_start_ns").asLong(), v.path("window_end_ns").asLong(), v.path("count").asLong(),
                    v.path("sum").asDouble(), v.path("avg").asDouble(), v.path("min").asDouble(),
                    v.path("max").asDouble(), optDouble(v.get("median")), v.path("variance").asDouble(),
                    v.path("truncated").asBoolean(false), seq}));
                break;
            case FILTERED:
                out.add(new GenericInternalRow(new Object[] {
                    v.path("t_ns").asLong(), optDouble(v.get("value")), optStr(v.get("word")), seq}));
                break;
            default:
                break;
        }
    }
}
