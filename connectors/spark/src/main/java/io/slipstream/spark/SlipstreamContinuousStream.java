// SlipstreamContinuousStream: continuous processing (Trigger.Continuous): one long-running
// task per endpoint holds a tail subscription `SUBSCRIBE stream FROM seq EPOCH e` and hands each
// result line to Spark as it arrives, so a change-point alert becomes a row without waiting for
// a micro-batch (Spark needs a free core per endpoint for these tasks). Spark's continuous
// mode is at-least-once: after a failure it restarts from the last epoch's committed offset, so
// lines since then may be seen twice.
// Restart of a daemon (new epoch) or an outage: its reader reconnects (every 100 ms, for up
// to maxUnavailableMs; the other endpoints' readers go on); in a new epoch it logs that the
// rest of the old run is gone and continues from the new run's start, like the micro-batch
// reader. An endpoint without a position (not reached yet) is read from its earliest line.
// Not for: micro-batch (SlipstreamMicroBatchStream).
package io.slipstream.spark;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.streaming.ContinuousPartitionReader;
import org.apache.spark.sql.connector.read.streaming.ContinuousPartitionReaderFactory;
import org.apache.spark.sql.connector.read.streaming.ContinuousStream;
import org.apache.spark.sql.connector.read.streaming.Offset;
import org.apache.spark.sql.connector.read.streaming.PartitionOffset;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.io.IOException;
import java.io.Serializable;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;

public final class SlipstreamContinuousStream implements ContinuousStream {
    private static final Logger LOG = LoggerFactory.getLogger(SlipstreamContinuousStream.class);
    /**
     * How often a reader blocked on an idle stream wakes to notice it was stopped (a socket read
     * does not end on an interrupt). Each wake is a read timeout, i.e. an exception: at 100 ms
     * this was ~10% of an idle continuous query's CPU; the stream sends a stats line every second
     * anyway.
     */
    static final int IDLE_READ_MS = 1000;
    /** Wait before reconnecting to an unreachable daemon. */
    static final int RECONNECT_MS = 100;

    private final SlipstreamOptions opts;
    private final ResultType type;
    /** Same starting rules as micro-batch (and computed once there). */
    private final SlipstreamMicroBatchStream starter;

    SlipstreamContinuousStream(SlipstreamOptions opts, ResultType type) {
        this.opts = opts;
        this.type = type;
        this.starter = new SlipstreamMicroBatchStream(opts, type);
    }

    @Override
    public Offset initialOffset() {
        return starter.initialOffset();
    }

    @Override
    public InputPartition[] planInputPartitions(Offset start) {
        SlipstreamOffset so = (SlipstreamOffset) start;
        InputPartition[] parts = new InputPartition[opts.endpoints.size()];
        for (int i = 0; i < parts.length; i++) {
            SlipstreamClient.Endpoint ep = opts.endpoints.get(i);
            parts[i] = new TailPartition(opts, type, ep, so.get(ep.toString()));
        }
        return parts;
    }

    @Override
    public ContinuousPartitionReaderFactory createContinuousReaderFactory() {
        return new TailReaderFactory();
    }

    @Override
    public Offset mergeOffsets(PartitionOffset[] offsets) {
        Map<String, SlipstreamOffset.Position> m = new TreeMap<>();
        for (PartitionOffset o : offsets) {
            SlipstreamOffset.EndpointOffset e = (SlipstreamOffset.EndpointOffset) o;
            if (e.position() != null) {
                m.put(e.endpoint(), e.position());
            }
        }
        return new SlipstreamOffset(m);
    }

    @Override
    public Offset deserializeOffset(String json) {
        return SlipstreamOffset.fromJson(json, opts.keys());
    }

    @Override
    public void commit(Offset end) {}

    @Override
    public void stop() {}

    /** One endpoint's tail from `start` (null: from its earliest retained line). */
    record TailPartition(SlipstreamOptions opts, ResultType type, SlipstreamClient.Endpoint endpoint,
                         SlipstreamOffset.Position start) implements InputPartition, Serializable {}

    static final class TailReaderFactory implements ContinuousPartitionReaderFactory {
        @Override
        public ContinuousPartitionReader<InternalRow> createReader(InputPartition partition) {
            return new TailReader((TailPartition) partition);
        }
    }

    static final class TailReader implements ContinuousPartitionReader<InternalRow> {
        private final TailPartition p;
        private final ArrayDeque<InternalRow> rows = new ArrayDeque<>();
        private final List<InternalRow> scratch = new ArrayList<>();
        private SlipstreamClient.Subscription sub;
        /** The run being read (null: not reached yet, no position). */
        private String epoch;
        /** Seq of the next line not yet fully handed to Spark. */
        private long next;
        /** Seq of the line whose rows are in `rows` (valid while rows is not empty). */
        private long pendingSeq;
        private InternalRow current;
        private long unavailableSinceMs;

        TailReader(TailPartition p) {
            this.p = p;
            this.epoch = p.start() == null ? null : p.start().epoch();
            this.next = p.start() == null ? 0 : p.start().seq();
        }

        private void connect() throws IOException {
            if (epoch == null) {
                sub = new SlipstreamClient.Subscription(p.endpoint(), p.opts().stream, "EARLIEST", -1, null);
                SlipstreamClient.StreamInfo s;
                try {
                    s = p.opts().streamOf(p.endpoint(), sub.hello);
                } catch (IllegalArgumentException e) {
                    closeSub();
                    throw e;
                }
                epoch = sub.hello.epoch();
                next = s.firstSeq();
                LOG.info("slipstream: {} reached: reading stream {} from its earliest retained seq {}", p.endpoint(),
                        p.opts().stream, next);
                sub.setReadTimeoutMs(IDLE_READ_MS);
                return;
            }
            try {
                sub = new SlipstreamClient.Subscription(p.endpoint(), p.opts().stream, Long.toString(next), -1, epoch);
            } catch (SlipstreamClient.ServerError e) {
                if ("epoch".equals(e.code) && e.epoch != null) {
                    LOG.warn("slipstream: {} restarted (epoch {} -> {}): stream {} results after seq {} of the old run are gone; "
                            + "continuing from the start of the new run", p.endpoint(), epoch, e.epoch, p.opts().stream, next);
                    epoch = e.epoch;
                    next = 0;
                    sub = new SlipstreamClient.Subscription(p.endpoint(), p.opts().stream, "0", -1, epoch);
                } else if ("data_loss".equals(e.code) && !p.opts().failOnDataLoss && e.firstSeq > next) {
                    LOG.warn("slipstream: stream {} seqs {}..{} are no longer retained; skipping them (failOnDataLoss=false)",
                            p.opts().stream, next, e.firstSeq - 1);
                    next = e.firstSeq;
                    sub = new SlipstreamClient.Subscription(p.endpoint(), p.opts().stream, Long.toString(next), -1, epoch);
                } else {
                    throw e;
                }
            }
            sub.setReadTimeoutMs(IDLE_READ_MS);
        }

        @Override
        public boolean next() throws IOException {
            if (!rows.isEmpty()) {
                current = rows.poll();
                if (rows.isEmpty()) {
                    next = pendingSeq + 1;
                }
                return true;
            }
            while (true) {
                if (Thread.currentThread().isInterrupted()) {
                    return false; // the query is stopping: end this partition quietly
                }
                String line;
                try {
                    if (sub == null) {
                        connect();
                    }
                    line = sub.poll();
                    unavailableSinceMs = 0;
                } catch (SlipstreamClient.ServerError e) {
                    if ("data_loss".equals(e.code)) {
                        throw new IllegalStateException("slipstream: stream " + p.opts().stream + " seq " + next
                                + " is no longer retained (first retained " + e.firstSeq + "). Set failOnDataLoss=false to skip.", e);
                    }
                    throw e;
                } catch (IOException e) {
                    line = null;
                    long now = System.currentTimeMillis();
                    if (unavailableSinceMs == 0) {
                        unavailableSinceMs = now;
                        LOG.warn("slipstream: {}; reconnecting", e.getMessage());
                    } else if (now - unavailableSinceMs > p.opts().maxUnavailableMs) {
                        throw new IOException("slipstream: " + p.endpoint() + " unreachable for more than "
                                + p.opts().maxUnavailableMs + " ms: " + e.getMessage(), e);
                    }
                    closeSub();
                    try {
                        Thread.sleep(RECONNECT_MS);
                    } catch (InterruptedException ie) {
                        Thread.currentThread().interrupt();
                        return false;
                    }
                    continue;
                }
                if (line == null) {
                    // The daemon closed (stopped or restarting): reconnect.
                    closeSub();
                    continue;
                }
                if (line.isEmpty()) {
                    continue; // read timeout: check for a stop, then wait again
                }
                var v = SlipstreamClient.JSON.readTree(line);
                if ("error".equals(v.path("type").asText())) {
                    closeSub();
                    SlipstreamClient.ServerError e = new SlipstreamClient.ServerError(v);
                    if ("data_loss".equals(e.code) && !p.opts().failOnDataLoss) {
                        continue; // connect() skips ahead
                    }
                    throw new IllegalStateException("slipstream: " + e.getMessage(), e);
                }
                if (!v.has("seq")) {
                    continue;
                }
                long seq = v.path("seq").asLong();
                scratch.clear();
                p.type().toRows(v, scratch);
                if (scratch.isEmpty()) {
                    next = seq + 1;
                    continue;
                }
                rows.addAll(scratch);
                pendingSeq = seq;
                current = rows.poll();
                if (rows.isEmpty()) {
                    next = seq + 1;
                }
                return true;
            }
        }

        private void closeSub() {
            if (sub != null) {
                try {
                    sub.close();
                } catch (IOException ignored) {
                    // closing a dead socket: nothing to do
                }
                sub = null;
            }
        }

        @Override
        public InternalRow get() {
            return current;
        }

        @Override
        public PartitionOffset getOffset() {
            // A line whose rows are only partly handed over is read again after a restart.
            return new SlipstreamOffset.EndpointOffset(p.endpoint().toString(),
                    epoch == null ? null : new SlipstreamOffset.Position(epoch, rows.isEmpty() ? next : pendingSeq));
        }

        @Override
        public void close() {
            closeSub();
        }
    }
}
