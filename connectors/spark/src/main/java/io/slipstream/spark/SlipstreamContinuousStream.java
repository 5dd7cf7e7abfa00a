// SlipstreamContinuousStream: continuous processing (Trigger.Continuous): one long-running
// task holds a tail subscription `SUBSCRIBE stream FROM seq EPOCH e` and hands each result line
// to Spark as it arrives, so a change-point alert becomes a row without waiting for a
// micro-batch. Spark's continuous mode is at-least-once: after a failure it restarts from the
// last epoch's committed offset, so lines since then may be seen twice.
// Restart of the daemon (new epoch) or an outage: the reader reconnects (every 100 ms, for up
// to maxUnavailableMs); in a new epoch it logs that the rest of the old run is gone and
// continues from the new run's start, like the micro-batch reader.
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

public final class SlipstreamContinuousStream implements ContinuousStream {
    private static final Logger LOG = LoggerFactory.getLogger(SlipstreamContinuousStream.class);
    /** How often a blocked reader wakes to notice it was stopped. */
    static final int POLL_MS = 100;

    private final SlipstreamOptions opts;
    private final ResultType type;

    SlipstreamContinuousStream(SlipstreamOptions opts, ResultType type) {
        this.opts = opts;
        this.type = type;
    }

    @Override
    public Offset initialOffset() {
        // Same starting rules as micro-batch.
        return new SlipstreamMicroBatchStream(opts, type).initialOffset();
    }

    @Override
    public InputPartition[] planInputPartitions(Offset start) {
        return new InputPartition[] {new TailPartition(opts, type, (SlipstreamOffset) start)};
    }

    @Override
    public ContinuousPartitionReaderFactory createContinuousReaderFactory() {
        return new TailReaderFactory();
    }

    @Override
    public Offset mergeOffsets(PartitionOffset[] offsets) {
        if (offsets.length != 1) {
            throw new IllegalStateException("slipstream: expected one partition offset, got " + offsets.length);
        }
        return (SlipstreamOffset) offsets[0];
    }

    @Override
    public Offset deserializeOffset(String json) {
        return SlipstreamOffset.fromJson(json);
    }

    @Override
    public void commit(Offset end) {}

    @Override
    public void stop() {}

    record TailPartition(SlipstreamOptions opts, ResultType type, SlipstreamOffset start) implements InputPartition, Serializable {}

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
        private String epoch;
        /** Seq of the next line not yet fully handed to Spark. */
        private long next;
        /** Seq of the line whose rows are in `rows` (valid while rows is not empty). */
        private long pendingSeq;
        private InternalRow current;
        private long unavailableSinceMs;

        TailReader(TailPartition p) {
            this.p = p;
            this.epoch = p.start().epoch;
            this.next = p.start().seq;
        }

        private void connect() throws IOException {
            try {
                sub = new SlipstreamClient.Subscription(p.opts().endpoint, p.opts().stream, Long.toString(next), -1, epoch);
            } catch (SlipstreamClient.ServerError e) {
                if ("epoch".equals(e.code) && e.epoch != null) {
                    LOG.warn("slipstream: {} restarted (epoch {} -> {}): stream {} results after seq {} of the old run are gone; "
                            + "continuing from the start of the new run", p.opts().endpoint, epoch, e.epoch, p.opts().stream, next);
                    epoch = e.epoch;
                    next = 0;
                    sub = new SlipstreamClient.Subscription(p.opts().endpoint, p.opts().stream, "0", -1, epoch);
                } else if ("data_loss".equals(e.code) && !p.opts().failOnDataLoss && e.firstSeq > next) {
                    LOG.warn("slipstream: stream {} seqs {}..{} are no longer retained; skipping them (failOnDataLoss=false)",
                            p.opts().stream, next, e.firstSeq - 1);
                    next = e.firstSeq;
                    sub = new SlipstreamClient.Subscription(p.opts().endpoint, p.opts().stream, Long.toString(next), -1, epoch);
                } else {
                    throw e;
                }
            }
            sub.setReadTimeoutMs(POLL_MS);
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
                        throw new IOException("slipstream: " + p.opts().endpoint + " unreachable for more than "
                                + p.opts().maxUnavailableMs + " ms: " + e.getMessage(), e);
                    }
                    closeSub();
                    try {
                        Thread.sleep(POLL_MS);
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
            return new SlipstreamOffset(epoch, rows.isEmpty() ? next : pendingSeq);
        }

        @Override
        public void close() {
            closeSub();
        }
    }
}
