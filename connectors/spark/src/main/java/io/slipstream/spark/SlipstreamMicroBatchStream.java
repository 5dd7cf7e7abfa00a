// SlipstreamMicroBatchStream: micro-batch reading with replayable offsets, one position
// {epoch, seq} per endpoint (SlipstreamOffset).
//
// Each batch (start, end] is, per endpoint, one range read `SUBSCRIBE stream FROM start.seq
// UNTIL end.seq EPOCH end.epoch` served from that daemon's retention ring, in its own input
// partition, so re-running a batch after a failure (Spark replays uncommitted batches from its
// offset log) reads exactly the same lines: with an idempotent sink (file sink, foreachBatch
// keyed by batch id) results are exactly-once.
//
// Restart semantics, per endpoint:
// - Same epoch (the daemon kept running; the query restarted from its checkpoint): exact
//   replay from the last committed offset, as long as the lines are still retained (about
//   16 MiB per stream); older ones are a data loss (failOnDataLoss).
// - New epoch (the daemon restarted): its results between the last committed offset and the
//   restart are gone (the daemon keeps nothing across runs). This is logged as a warning and
//   reading continues from the start (seq 0) of the new epoch.
// - Unreachable when a trigger asks: that endpoint keeps its last position (its partition of
//   the batch is empty; the other endpoints' batches go on) for up to maxUnavailableMs, then the
//   query fails. Unreachable while a planned range is read: the reader retries for up to
//   maxUnavailableMs (RangeReader), since only the same run can serve that exact range.
// - Never reached yet (unreachable when the query started, or added to `endpoints` of a query
//   restarted from its checkpoint): when first reached it starts at its earliest retained line.
// Trigger.AvailableNow: reads up to each endpoint's next seq as of the trigger's start (an
// endpoint unreachable or restarted since then contributes nothing more in that run).
// Not for: continuous mode (SlipstreamContinuousStream).
package io.slipstream.spark;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.connector.read.streaming.Offset;
import org.apache.spark.sql.connector.read.streaming.ReadLimit;
import org.apache.spark.sql.connector.read.streaming.SupportsTriggerAvailableNow;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

import java.io.IOException;
import java.io.InterruptedIOException;
import java.io.Serializable;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;

public final class SlipstreamMicroBatchStream implements MicroBatchStream, SupportsTriggerAvailableNow {
    private static final Logger LOG = LoggerFactory.getLogger(SlipstreamMicroBatchStream.class);
    /** How long a reader waits between attempts to reach an unreachable endpoint. */
    static final int RETRY_MS = 100;

    private final SlipstreamOptions opts;
    private final ResultType type;
    /** Per endpoint key: when it first failed to answer in its current outage (absent: it answers). */
    private final Map<String, Long> unavailableSinceMs = new HashMap<>();
    /** Checkpointed endpoints no longer in the option, and epoch changes seen (each logged once). */
    private final Set<String> logged = new HashSet<>();
    /** Bound on `logged` (cleared when full: at worst a warning is repeated). */
    private static final int LOGGED_MAX = 4096;

    SlipstreamMicroBatchStream(SlipstreamOptions opts, ResultType type) {
        this.opts = opts;
        this.type = type;
    }

    /** INFO of every endpoint (in parallel when several): an Info or the IOException, per endpoint. */
    static List<Object> infoAll(List<SlipstreamClient.Endpoint> eps) {
        Object[] out = new Object[eps.size()];
        if (eps.size() == 1) {
            out[0] = infoOrError(eps.get(0));
            return List.of(out);
        }
        // One short-lived thread per endpoint: each INFO is bounded by the endpoint's connect and
        // read timeouts, so one slow node delays a trigger by its timeout, not by the sum.
        List<Thread> threads = new ArrayList<>();
        for (int i = 0; i < eps.size(); i++) {
            final int k = i;
            Thread t = new Thread(() -> out[k] = infoOrError(eps.get(k)), "slipstream-info-" + eps.get(k));
            t.setDaemon(true);
            t.start();
            threads.add(t);
        }
        for (Thread t : threads) {
            try {
                t.join();
            } catch (InterruptedException e) {
                // The query is stopping; Spark recognises this cause as a stop, not a failure.
                Thread.currentThread().interrupt();
                throw new java.io.UncheckedIOException(new InterruptedIOException("slipstream: stopped while asking the endpoints for INFO"));
            }
        }
        return List.of(out);
    }

    private static Object infoOrError(SlipstreamClient.Endpoint ep) {
        try {
            return SlipstreamClient.info(ep);
        } catch (IOException e) {
            return e;
        } catch (RuntimeException e) {
            return new IOException("Slipstream at " + ep + ": bad INFO answer: " + e.getMessage(), e);
        }
    }

    /** The stream's entry in `info`; a clear error if missing or of another operator than the query's. */
    private SlipstreamClient.StreamInfo checkedStream(SlipstreamClient.Endpoint ep, SlipstreamClient.Info info) {
        SlipstreamClient.StreamInfo s = opts.streamOf(ep, info);
        ResultType t = ResultType.ofOperator(s.operator());
        if (t != type) {
            throw new IllegalStateException("slipstream: stream \"" + opts.stream + "\" at " + ep + " runs operator "
                    + s.operator() + " (" + t.lineType + " results), but this query reads " + type.lineType
                    + " results: every endpoint must run the same operator for the stream");
        }
        return s;
    }

    /** Trigger.AvailableNow: each endpoint's end as of the trigger's start (null: not that trigger). */
    private Map<String, SlipstreamOffset.Position> availableNow;

    @Override
    public void prepareForTriggerAvailableNow() {
        List<Object> infos = infoAll(opts.endpoints);
        Map<String, SlipstreamOffset.Position> m = new HashMap<>();
        for (int i = 0; i < infos.size(); i++) {
            if (infos.get(i) instanceof SlipstreamClient.Info info) {
                SlipstreamClient.Endpoint ep = opts.endpoints.get(i);
                m.put(ep.toString(), new SlipstreamOffset.Position(info.epoch(), checkedStream(ep, info).nextSeq()));
            }
        }
        availableNow = m;
    }

    /** Computed once: Spark asks for it more than once and must get the same start each time. */
    private SlipstreamOffset initial;

    @Override
    public synchronized Offset initialOffset() {
        if (initial == null) {
            initial = computeInitialOffset();
        }
        return initial;
    }

    private SlipstreamOffset computeInitialOffset() {
        if (!opts.startingOffsets.equalsIgnoreCase("latest") && !opts.startingOffsets.equalsIgnoreCase("earliest")) {
            return SlipstreamOffset.fromJson(opts.startingOffsets, opts.keys());
        }
        boolean earliest = opts.startingOffsets.equalsIgnoreCase("earliest");
        List<Object> infos = infoAll(opts.endpoints);
        Map<String, SlipstreamOffset.Position> m = new TreeMap<>();
        IOException firstError = null;
        for (int i = 0; i < infos.size(); i++) {
            SlipstreamClient.Endpoint ep = opts.endpoints.get(i);
            if (infos.get(i) instanceof IOException e) {
                // Not reached yet: it starts at its earliest line when it answers (see the header).
                firstError = firstError == null ? e : firstError;
                unavailableSinceMs.putIfAbsent(ep.toString(), System.currentTimeMillis());
                LOG.warn("slipstream: {}; the query starts without it and reads it from its earliest retained line "
                        + "once it answers (within maxUnavailableMs = {} ms)", e.getMessage(), opts.maxUnavailableMs);
                continue;
            }
            SlipstreamClient.Info info = (SlipstreamClient.Info) infos.get(i);
            SlipstreamClient.StreamInfo s = checkedStream(ep, info);
            m.put(ep.toString(), new SlipstreamOffset.Position(info.epoch(), earliest ? s.firstSeq() : s.nextSeq()));
        }
        if (m.isEmpty()) {
            throw new IllegalStateException("slipstream: " + firstError.getMessage()
                    + (infos.size() > 1 ? " (no endpoint answered)" : ""), firstError);
        }
        return new SlipstreamOffset(m);
    }

    @Override
    public Offset latestOffset() {
        throw new UnsupportedOperationException("slipstream: latestOffset(Offset, ReadLimit) is called instead");
    }

    @Override
    public ReadLimit getDefaultReadLimit() {
        return ReadLimit.allAvailable();
    }

    /**
     * Per endpoint: its newest position if it answers, else its position in `start` (nothing new
     * from it), failing the query once it has been away longer than maxUnavailableMs.
     */
    @Override
    public Offset latestOffset(Offset startOffset, ReadLimit limit) {
        SlipstreamOffset start = (SlipstreamOffset) startOffset;
        for (String k : start.positions.keySet()) {
            if (!opts.keys().contains(k) && logged.add("dropped " + k)) {
                LOG.warn("slipstream: the checkpoint has a position for {}, which option endpoints no longer names; "
                        + "it is no longer read", k);
            }
        }
        if (logged.size() > LOGGED_MAX) {
            logged.clear();
        }
        List<Object> infos = infoAll(opts.endpoints);
        Map<String, SlipstreamOffset.Position> m = new TreeMap<>();
        long now = System.currentTimeMillis();
        for (int i = 0; i < infos.size(); i++) {
            SlipstreamClient.Endpoint ep = opts.endpoints.get(i);
            String key = ep.toString();
            SlipstreamOffset.Position had = start.get(key);
            if (infos.get(i) instanceof IOException e) {
                Long since = unavailableSinceMs.putIfAbsent(key, now);
                long awayMs = since == null ? 0 : now - since;
                if (awayMs > opts.maxUnavailableMs) {
                    throw new IllegalStateException("slipstream: " + e.getMessage() + " (unreachable for " + awayMs
                            + " ms; maxUnavailableMs = " + opts.maxUnavailableMs + ")", e);
                }
                if (since == null) {
                    LOG.warn("slipstream: {}; no new data from it until it answers (for up to maxUnavailableMs = {} ms)",
                            e.getMessage(), opts.maxUnavailableMs);
                }
                if (had != null) {
                    m.put(key, had);
                }
                continue;
            }
            if (unavailableSinceMs.remove(key) != null) {
                LOG.info("slipstream: {} reachable again", key);
            }
            SlipstreamClient.Info info = (SlipstreamClient.Info) infos.get(i);
            SlipstreamClient.StreamInfo s = checkedStream(ep, info);
            if (had == null) {
                // First contact: an empty step to its earliest line; the next batch reads from there.
                LOG.info("slipstream: {} reached for the first time: reading stream {} from its earliest retained seq {}",
                        key, opts.stream, s.firstSeq());
                m.put(key, new SlipstreamOffset.Position(info.epoch(), s.firstSeq()));
                continue;
            }
            m.put(key, capped(key, had, new SlipstreamOffset.Position(info.epoch(), s.nextSeq())));
        }
        return new SlipstreamOffset(m);
    }

    /** `now`, or under Trigger.AvailableNow no further than the end recorded when it started. */
    private SlipstreamOffset.Position capped(String key, SlipstreamOffset.Position had, SlipstreamOffset.Position now) {
        if (availableNow == null) {
            return now;
        }
        SlipstreamOffset.Position target = availableNow.get(key);
        if (target == null || !target.epoch().equals(now.epoch())) {
            return had; // unreachable at the start, or restarted since: nothing more in this run
        }
        if (had.epoch().equals(target.epoch()) && had.seq() >= target.seq()) {
            return had;
        }
        return now.seq() <= target.seq() ? now : target;
    }

    @Override
    public InputPartition[] planInputPartitions(Offset start, Offset end) {
        SlipstreamOffset so = (SlipstreamOffset) start;
        SlipstreamOffset eo = (SlipstreamOffset) end;
        List<InputPartition> parts = new ArrayList<>();
        for (SlipstreamClient.Endpoint ep : opts.endpoints) {
            String key = ep.toString();
            SlipstreamOffset.Position s = so.get(key);
            SlipstreamOffset.Position e = eo.get(key);
            if (s == null || e == null) {
                continue; // first contact (an empty step) or never reached
            }
            long from = s.seq();
            if (!s.epoch().equals(e.epoch())) {
                // Spark may plan one batch more than once: say it once.
                if (logged.add("epoch " + key + " " + s.epoch() + " " + e.epoch())) {
                    LOG.warn("slipstream: {} restarted (epoch {} -> {}): results of stream {} after seq {} of the old run "
                            + "are gone; reading the new run from seq 0", key, s.epoch(), e.epoch(), opts.stream, s.seq());
                }
                from = 0;
            }
            if (from < e.seq()) {
                parts.add(new RangePartition(opts, type, ep, e.epoch(), from, e.seq()));
            }
        }
        return parts.toArray(new InputPartition[0]);
    }

    @Override
    public PartitionReaderFactory createReaderFactory() {
        return new RangeReaderFactory();
    }

    @Override
    public Offset deserializeOffset(String json) {
        return SlipstreamOffset.fromJson(json, opts.keys());
    }

    @Override
    public void commit(Offset end) {
        // Nothing to release: the daemon's ring is bounded by bytes, not by readers' progress.
    }

    @Override
    public void stop() {}

    @Override
    public String toString() {
        return "Slipstream[" + opts.label() + "/" + opts.stream + "]";
    }

    /** Seqs [from, until) of one epoch of one endpoint. */
    record RangePartition(SlipstreamOptions opts, ResultType type, SlipstreamClient.Endpoint endpoint, String epoch,
                          long from, long until) implements InputPartition, Serializable {}

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
        /** `next` when the current subscription was opened (did it make progress?). */
        private long openedAt;
        /** When the endpoint first failed in the current outage (0: it answers). */
        private long unavailableSinceMs;
        private InternalRow current;
        private boolean done;

        RangeReader(RangePartition p) {
            this.p = p;
            this.next = p.from();
        }

        private void open(long from) throws IOException {
            sub = new SlipstreamClient.Subscription(p.endpoint(), p.opts().stream, Long.toString(from), p.until(), p.epoch());
            openedAt = from;
        }

        /** The endpoint did not answer (or the connection broke): wait and retry, up to maxUnavailableMs. */
        private void unavailable(IOException e) throws IOException {
            closeSub();
            long now = System.currentTimeMillis();
            if (unavailableSinceMs == 0) {
                unavailableSinceMs = now;
                LOG.warn("slipstream: {} while reading stream {} seqs {}..{}; retrying for up to maxUnavailableMs = {} ms",
                        e.getMessage(), p.opts().stream, next, p.until() - 1, p.opts().maxUnavailableMs);
            } else if (now - unavailableSinceMs > p.opts().maxUnavailableMs) {
                throw new IOException("slipstream: " + p.endpoint() + " unreachable for more than " + p.opts().maxUnavailableMs
                        + " ms while stream " + p.opts().stream + " seqs " + next + ".." + (p.until() - 1)
                        + " of its run " + p.epoch() + " were to be read: " + e.getMessage(), e);
            }
            try {
                Thread.sleep(RETRY_MS);
            } catch (InterruptedException ie) {
                Thread.currentThread().interrupt();
                throw new InterruptedIOException("slipstream: interrupted while waiting for " + p.endpoint());
            }
        }

        @Override
        public boolean next() throws IOException {
            // Bounded: every turn either yields a row, ends, consumes one line of a finite range,
            // reopens after progress (`next` grew), or waits RETRY_MS within maxUnavailableMs.
            while (rows.isEmpty() && !done) {
                String line;
                try {
                    if (sub == null) {
                        try {
                            open(next);
                        } catch (SlipstreamClient.ServerError e) {
                            handle(e);
                            continue;
                        }
                    }
                    line = sub.next();
                } catch (SlipstreamClient.ServerError e) {
                    throw e;
                } catch (InterruptedIOException e) {
                    if (!(e instanceof java.net.SocketTimeoutException)) {
                        throw e; // the task is being stopped
                    }
                    unavailable(e);
                    continue;
                } catch (IOException e) {
                    unavailable(e);
                    continue;
                }
                unavailableSinceMs = 0;
                if (line == null) {
                    closeSub();
                    if (next < p.until() && next > openedAt) {
                        continue; // the connection ended early after progress (daemon stopped?): reopen from `next`
                    }
                    if (next < p.until()) {
                        LOG.warn("slipstream: stream {} seqs {}..{} at {} were never produced (lost before the hub: see the "
                                + "stream's subscriber_drops)", p.opts().stream, next, p.until() - 1, p.endpoint());
                    }
                    done = true;
                    break;
                }
                var v = SlipstreamClient.JSON.readTree(line);
                if ("error".equals(v.path("type").asText())) {
                    closeSub();
                    handle(new SlipstreamClient.ServerError(v));
                    continue;
                }
                if (!v.has("seq")) {
                    continue;
                }
                long seq = v.path("seq").asLong();
                if (seq > next) {
                    LOG.warn("slipstream: stream {} seqs {}..{} at {} were lost before the hub (subscriber_drops)",
                            p.opts().stream, next, seq - 1, p.endpoint());
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
                        p.endpoint(), next, p.until() - 1, p.epoch(), e.getMessage());
                done = true;
                return;
            }
            if ("data_loss".equals(e.code) && !p.opts().failOnDataLoss && e.firstSeq > next) {
                LOG.warn("slipstream: stream {} seqs {}..{} at {} are no longer retained; skipping them (failOnDataLoss=false)",
                        p.opts().stream, next, e.firstSeq - 1, p.endpoint());
                next = e.firstSeq;
                if (next >= p.until()) {
                    done = true;
                }
                return;
            }
            if ("data_loss".equals(e.code)) {
                throw new IllegalStateException("slipstream: results the query needs are gone: stream " + p.opts().stream
                        + " seqs " + next + ".." + (p.until() - 1) + " are no longer retained by Slipstream at " + p.endpoint()
                        + " (first retained " + e.firstSeq + "; retention is about 16 MiB per stream). The query fell too far "
                        + "behind. Set option failOnDataLoss=false to skip lost results instead of failing.", e);
            }
            throw e;
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
        public void close() {
            closeSub();
        }
    }
}
