// SlipstreamMicroBatchStream: micro-batch reading with replayable offsets {epoch, seq}.
//
// Each batch (start, end] is one range read `SUBSCRIBE stream FROM start.seq UNTIL end.seq
// EPOCH end.epoch` served from the daemon's retention ring, so re-running a batch after a
// failure (Spark replays uncommitted batches from its offset log) reads exactly the same lines:
// with an idempotent sink (file sink, foreachBatch keyed by batch id) results are exactly-once.
//
// Restart semantics:
// - Same epoch (the daemon kept running; the query restarted from its checkpoint): exact
//   replay from the last committed offset, as long as the lines are still retained (about
//   16 MiB per stream); older ones are a data loss (failOnDataLoss).
// - New epoch (the daemon restarted): its results between the last committed offset and the
//   restart are gone (the daemon keeps nothing across runs). This is logged as a warning and
//   reading continues from the start (seq 0) of the new epoch.
// - Daemon unreachable: batches are empty (the last known offset is reported) for up to
//   maxUnavailableMs, then the query fails.
// Not for: continuous mode (SlipstreamContinuousStream).
package io.slipstream.spark;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.connector.read.streaming.Offset;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.io.IOException;
import java.io.Serializable;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.List;

public final class SlipstreamMicroBatchStream implements MicroBatchStream {
    private static final Logger LOG = LoggerFactory.getLogger(SlipstreamMicroBatchStream.class);

    private final SlipstreamOptions opts;
    private final ResultType type;
    /** The last offset latestOffset() reported (returned again while the daemon is away). */
    private SlipstreamOffset lastLatest;
    /** When the daemon first failed to answer in the current outage (0: it answers). */
    private long unavailableSinceMs;

    SlipstreamMicroBatchStream(SlipstreamOptions opts, ResultType type) {
        this.opts = opts;
        this.type = type;
    }

    private SlipstreamClient.StreamInfo streamOf(SlipstreamClient.Info info) {
        SlipstreamClient.StreamInfo s = info.stream(opts.stream);
        if (s == null) {
            throw new IllegalArgumentException("slipstream: Slipstream at " + opts.endpoint + " has no stream \""
                    + opts.stream + "\" (its streams: " + (info.streams().isEmpty() ? "none" : info.names()) + ")");
        }
        return s;
    }

    @Override
    public Offset initialOffset() {
        if (!opts.startingOffsets.equalsIgnoreCase("latest") && !opts.startingOffsets.equalsIgnoreCase("earliest")) {
            return SlipstreamOffset.fromJson(opts.startingOffsets);
        }
        SlipstreamClient.Info info;
        try {
            info = SlipstreamClient.info(opts.endpoint);
        } catch (IOException e) {
            throw new IllegalStateException("slipstream: " + e.getMessage(), e);
        }
        SlipstreamClient.StreamInfo s = streamOf(info);
        long seq = opts.startingOffsets.equalsIgnoreCase("earliest") ? s.firstSeq() : s.nextSeq();
        return new SlipstreamOffset(info.epoch(), seq);
    }

    @Override
    public Offset latestOffset() {
        SlipstreamClient.Info info;
        try {
            info = SlipstreamClient.info(opts.endpoint);
        } catch (IOException e) {
            long now = System.currentTimeMillis();
            if (unavailableSinceMs == 0) {
                unavailableSinceMs = now;
            }
            if (now - unavailableSinceMs > opts.maxUnavailableMs || lastLatest == null) {
                throw new IllegalStateException("slipstream: " + e.getMessage() + " (unreachable for "
                        + (now - unavailableSinceMs) + " ms; maxUnavailableMs = " + opts.maxUnavailableMs + ")", e);
            }
            LOG.warn("slipstream: {}; no new data this trigger (unreachable for {} ms)", e.getMessage(), now - unavailableSinceMs);
            return lastLatest;
        }
        if (unavailableSinceMs != 0) {
            LOG.info("slipstream: {} reachable again", opts.endpoint);
            unavailableSinceMs = 0;
        }
        SlipstreamClient.StreamInfo s = streamOf(info);
        SlipstreamOffset latest = new SlipstreamOffset(info.epoch(), s.nextSeq());
        if (lastLatest != null && !lastLatest.epoch.equals(info.epoch())) {
            LOG.warn("slipstream: {} restarted (epoch {} -> {}): stream {} results after seq {} of the old run were "
                    + "not read and are gone; continuing from the start of the new run", opts.endpoint,
                    lastLatest.epoch, info.epoch(), opts.stream, lastLatest.seq);
        }
        lastLatest = latest;
        return latest;
    }

    @Override
    public InputPartition[] planInputPartitions(Offset start, Offset end) {
        SlipstreamOffset s = (SlipstreamOffset) start;
        SlipstreamOffset e = (SlipstreamOffset) end;
        long from = s.seq;
        if (!s.epoch.equals(e.epoch)) {
            LOG.warn("slipstream: batch spans a daemon restart (epoch {} -> {}): results of stream {} after seq {} "
                    + "of the old run are gone; reading seqs 0..{} of the new run", s.epoch, e.epoch, opts.stream, s.seq, e.seq);
            from = 0;
        }
        if (from >= e.seq) {
            return new InputPartition[0];
        }
        return new InputPartition[] {new RangePartition(opts, type, e.epoch, from, e.seq)};
    }

    @Override
    public PartitionReaderFactory createReaderFactory() {
        return new RangeReaderFactory();
    }

    @Override
    public Offset deserializeOffset(String json) {
        return SlipstreamOffset.fromJson(json);
    }

    @Override
    public void commit(Offset end) {
        // Nothing to release: the daemon's ring is bounded by bytes, not by readers' progress.
    }

    @Override
    public void stop() {}

    @Override
    public String toString() {
        return "Slipstream[" + opts.endpoint + "/" + opts.stream + "]";
    }

    /** Seqs [from, until) of one epoch. */
    record RangePartition(SlipstreamOptions opts, ResultType type, String epoch, long from, long until)
            implements InputPartition, Serializable {}

    static final class RangeReaderFactory implements PartitionReaderFactory {
        @Override
        public PartitionReader<InternalRow> createReader(InputPartition partition) {
            return new RangeReader((RangePartition) partition);
        }
    }

    /** Reads one range; yields the rows of its lines in seq order. */
    static final class RangeReader implements PartitionReader<InternalRow> {
        private final RangePartition p;
        private final ArrayDeque<InternalRow> rows = new ArrayDeque<>();
        private final List<InternalRow> scratch = new ArrayList<>();
        private SlipstreamClient.Subscription sub;
        /** Next seq expected; lines below it were read. */
        private long next;
        private InternalRow current;
        private boolean done;

        RangeReader(RangePartition p) {
            this.p = p;
            this.next = p.from();
        }

        private void open(long from) throws IOException {
            sub = new SlipstreamClient.Subscription(p.opts().endpoint, p.opts().stream, Long.toString(from), p.until(), p.epoch());
        }

        @Override
        public boolean next() throws IOException {
            // Bounded: every turn either yields a row, ends, or consumes one line of a finite range
            // (a reopen after data loss moves `next` forward or fails).
            while (rows.isEmpty() && !done) {
                if (sub == null) {
                    try {
                        open(next);
                    } catch (SlipstreamClient.ServerError e) {
                        handle(e);
                        continue;
                    }
                }
                String line = sub.next();
                if (line == null) {
                    if (next < p.until()) {
                        LOG.warn("slipstream: stream {} seqs {}..{} were never produced (lost before the hub: see the "
                                + "stream's subscriber_drops)", p.opts().stream, next, p.until() - 1);
                    }
                    done = true;
                    break;
                }
                var v = SlipstreamClient.JSON.readTree(line);
                if ("error".equals(v.path("type").asText())) {
                    sub.close();
                    sub = null;
                    handle(new SlipstreamClient.ServerError(v));
                    continue;
                }
                if (!v.has("seq")) {
                    continue;
                }
                long seq = v.path("seq").asLong();
                if (seq > next) {
                    LOG.warn("slipstream: stream {} seqs {}..{} were lost before the hub (subscriber_drops)",
                            p.opts().stream, next, seq - 1);
                }
                next = seq + 1;
                scratch.clear();
                p.type().toRows(v, scratch);
                rows.addAll(scratch);
            }
            current = rows.poll();
            return current != null;
        }

        private void handle(SlipstreamClient.ServerError e) throws IOException {
            if ("epoch".equals(e.code)) {
                LOG.warn("slipstream: {} restarted while batch seqs {}..{} of epoch {} were read; they are gone ({})",
                        p.opts().endpoint, next, p.until() - 1, p.epoch(), e.getMessage());
                done = true;
                return;
            }
            if ("data_loss".equals(e.code) && !p.opts().failOnDataLoss && e.firstSeq > next) {
                LOG.warn("slipstream: stream {} seqs {}..{} are no longer retained; skipping them (failOnDataLoss=false)",
                        p.opts().stream, next, e.firstSeq - 1);
                next = e.firstSeq;
                if (next >= p.until()) {
                    done = true;
                }
                return;
            }
            if ("data_loss".equals(e.code)) {
                throw new IllegalStateException("slipstream: results the query needs are gone: stream " + p.opts().stream
                        + " seqs " + next + ".." + (p.until() - 1) + " are no longer retained by Slipstream (first retained "
                        + e.firstSeq + "; retention is about 16 MiB per stream). The query fell too far behind. "
                        + "Set option failOnDataLoss=false to skip lost results instead of failing.", e);
            }
            throw e;
        }

        @Override
        public InternalRow get() {
            return current;
        }

        @Override
        public void close() throws IOException {
            if (sub != null) {
                sub.close();
            }
        }
    }
}
