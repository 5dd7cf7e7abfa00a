// ChangePointRule: the paper's reference rule for the plain-Spark baseline, the same rule as
// Slipstream's `changepoint` operator (crates/stream/src/changepoint.rs): tumbling windows of
// `window_ns` on receive time; a closed window's mean joins a ring of the last N means; armed
// once N means are in; alert when |v - mean of the N means| > threshold; an alert clears the
// ring and the current window (re-arm after N more windows).
//
// Split for Spark: per micro-batch, Spark computes in parallel (a) the per-window sums and
// counts of the batch (reduceByKey) and (b) the records that deviate from the reference known
// at the batch start (filter); the driver then walks those few results in time order with this
// class. A step is therefore seen at the end of the micro-batch it falls in, as in the paper.
// Not for: Slipstream itself.
package io.slipstream.spark.baseline;

import java.io.Serializable;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

public final class ChangePointRule implements Serializable {
    public record Alert(long tNs, double value, double reference) {}

    private final long windowNs;
    private final int n;
    private final double threshold;
    private final ArrayDeque<Double> means = new ArrayDeque<>();
    /** Windows (id -> {sum, count}) not yet closed, and the first window id that may count. */
    private final TreeMap<Long, double[]> open = new TreeMap<>();
    private long minWindow = Long.MIN_VALUE;
    private long maxTimeNs = Long.MIN_VALUE;

    public ChangePointRule(long windowNs, int n, double threshold) {
        this.windowNs = windowNs;
        this.n = n;
        this.threshold = threshold;
    }

    /** The reference to test against now, or NaN while not armed. */
    public double reference() {
        if (means.size() < n) {
            return Double.NaN;
        }
        double s = 0;
        for (double m : means) {
            s += m;
        }
        return s / means.size();
    }

    public double threshold() {
        return threshold;
    }

    public long windowOf(long tNs) {
        return Math.floorDiv(tNs, windowNs);
    }

    /**
     * One micro-batch: its per-window {sum, count} and its deviating records (t_ns, value),
     * computed by Spark against `reference()`. Returns the alert, if any.
     */
    public List<Alert> batch(Map<Long, double[]> windowSums, List<double[]> deviating, long batchMaxTimeNs) {
        List<Alert> alerts = new ArrayList<>();
        double ref = reference();
        deviating.sort((a, b) -> Double.compare(a[0], b[0]));
        Alert alert = null;
        if (!Double.isNaN(ref)) {
            for (double[] d : deviating) {
                if (Math.abs(d[1] - ref) > threshold) {
                    alert = new Alert((long) d[0], d[1], ref);
                    break;
                }
            }
        }
        for (Map.Entry<Long, double[]> e : windowSums.entrySet()) {
            if (e.getKey() < minWindow) {
                continue;
            }
            open.merge(e.getKey(), e.getValue().clone(), (x, y) -> new double[] {x[0] + y[0], x[1] + y[1]});
        }
        maxTimeNs = Math.max(maxTimeNs, batchMaxTimeNs);
        if (alert != null) {
            alerts.add(alert);
            // Re-arm: drop the reference and every window before the alert's; its window starts
            // afresh (approximately: with the whole window's values, as this batch was summed).
            means.clear();
            minWindow = windowOf(alert.tNs());
            open.headMap(minWindow).clear();
        }
        // Windows whose end has passed (by receive time) are closed.
        long current = windowOf(maxTimeNs);
        while (!open.isEmpty() && open.firstKey() < current) {
            double[] sc = open.pollFirstEntry().getValue();
            if (sc[1] > 0) {
                means.addLast(sc[0] / sc[1]);
                while (means.size() > n) {
                    means.removeFirst();
                }
            }
        }
        return alerts;
    }
}
