package io.slipstream.hbase;

import java.io.IOException;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.hbase.CoprocessorEnvironment;
import org.apache.hadoop.hbase.TableName;
import org.apache.hadoop.hbase.client.Mutation;
import org.apache.hadoop.hbase.coprocessor.ObserverContext;
import org.apache.hadoop.hbase.coprocessor.RegionCoprocessor;
import org.apache.hadoop.hbase.coprocessor.RegionCoprocessorEnvironment;
import org.apache.hadoop.hbase.coprocessor.RegionObserver;
import org.apache.hadoop.hbase.coprocessor.RegionServerCoprocessor;
import org.apache.hadoop.hbase.coprocessor.RegionServerCoprocessorEnvironment;
import org.apache.hadoop.hbase.regionserver.MiniBatchOperationInProgress;
import org.apache.hadoop.hbase.util.Pair;

/**
 * Keeps Slipstream's range cache fresh for writes that do not pass through Slipstream (any HBase
 * client). {@code preBatchMutate} runs for every mutation kind — Put, Delete, Increment, Append,
 * checkAndMutate, RowMutations and multi-row batches all go through HRegion's mini-batch path —
 * with the row locks held, before the WAL write, the memstore update and the client's answer; it
 * blocks until every subscribed Slipstream has invalidated the rows ({@link Invalidations#begin}).
 * {@code postBatchMutateIndispensably} runs after the edits are visible (MVCC completed), also on
 * failure, and sends END so Slipstream caches the table again; a fill that overlapped the write is
 * discarded by Slipstream's version check. Bulk loads invalidate the whole table the same way.
 * System tables (hbase:meta, ...) are not reported.
 *
 * <p>Load it with {@code hbase.coprocessor.region.classes=io.slipstream.hbase.InvalidationObserver}
 * (the mini cluster does) or per table. Where the notices go: with hbase-site
 * {@code slipstream.observer.port} set, to this region server's {@link ObserverHub} (a TCP listener
 * the sidecars subscribe to; a real cluster); without it, to the JVM's {@link Invalidations#HUB}
 * (the mini cluster's default: region servers inside the sidecar's JVM). Also listed in
 * {@code hbase.coprocessor.regionserver.classes}, it closes the region server's listener and znode
 * when the region server stops (else they live as long as the JVM). It never throws anything but
 * IOException, so it cannot abort the region server.
 */
public final class InvalidationObserver implements RegionCoprocessor, RegionObserver, RegionServerCoprocessor {
  /** BEGIN notices of mini-batches between pre and post (keyed by identity). */
  private final Map<Object, Invalidations.Notice> open = new ConcurrentHashMap<>();
  /** Where this region's notices go (set in start). */
  private volatile Invalidations hub = Invalidations.HUB;

  @Override
  public Optional<RegionObserver> getRegionObserver() { return Optional.of(this); }

  @Override
  public void start(CoprocessorEnvironment env) throws IOException {
    if (env instanceof RegionCoprocessorEnvironment r) {
      hub = ObserverHub.forRegion(env.getConfiguration(), r.getServerName());
      hub.observerLoaded();
    } else if (env instanceof RegionServerCoprocessorEnvironment rs
        && env.getConfiguration().get(ObserverHub.PORT_KEY) != null) {
      ObserverHub.forServer(env.getConfiguration(), rs.getServerName());
    }
  }

  @Override
  public void stop(CoprocessorEnvironment env) {
    if (env instanceof RegionServerCoprocessorEnvironment rs) ObserverHub.stop(rs.getServerName());
  }

  private static TableName table(ObserverContext<RegionCoprocessorEnvironment> ctx) {
    return ctx.getEnvironment().getRegionInfo().getTable();
  }

  @Override
  public void preBatchMutate(ObserverContext<RegionCoprocessorEnvironment> ctx,
      MiniBatchOperationInProgress<Mutation> batch) throws IOException {
    TableName t = table(ctx);
    if (t.isSystemTable()) return;
    List<byte[]> rows = new ArrayList<>(batch.size());
    for (int i = 0; i < batch.size(); i++) rows.add(batch.getOperation(i).getRow());
    if (rows.isEmpty()) return;
    Invalidations.Notice n = hub.begin(t.getName(), rows);
    if (n != null) open.put(batch, n);
  }

  @Override
  public void postBatchMutateIndispensably(ObserverContext<RegionCoprocessorEnvironment> ctx,
      MiniBatchOperationInProgress<Mutation> batch, boolean success) {
    hub.end(open.remove(batch));
  }

  @Override
  public void preBulkLoadHFile(ObserverContext<RegionCoprocessorEnvironment> ctx,
      List<Pair<byte[], String>> familyPaths) throws IOException {
    TableName t = table(ctx);
    if (t.isSystemTable()) return;
    Invalidations.Notice n = hub.begin(t.getName(), List.of());
    if (n != null) open.put(familyPaths, n);
  }

  @Override
  public void postBulkLoadHFile(ObserverContext<RegionCoprocessorEnvironment> ctx,
      List<Pair<byte[], String>> familyPaths, Map<byte[], List<Path>> finalPaths) {
    hub.end(open.remove(familyPaths));
  }
}
