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
 * (the mini cluster does) or per table. It never throws anything but IOException, so it cannot
 * abort the region server.
 */
public final class InvalidationObserver implements RegionCoprocessor, RegionObserver {
  /** BEGIN notices of mini-batches between pre and post (keyed by identity). */
  private final Map<Object, Invalidations.Notice> open = new ConcurrentHashMap<>();

  @Override
  public Optional<RegionObserver> getRegionObserver() { return Optional.of(this); }

  @Override
  public void start(CoprocessorEnvironment env) { Invalidations.HUB.observerLoaded(); }

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
    Invalidations.Notice n = Invalidations.HUB.begin(t.getName(), rows);
    if (n != null) open.put(batch, n);
  }

  @Override
  public void postBatchMutateIndispensably(ObserverContext<RegionCoprocessorEnvironment> ctx,
      MiniBatchOperationInProgress<Mutation> batch, boolean success) {
    Invalidations.HUB.end(open.remove(batch));
  }

  @Override
  public void preBulkLoadHFile(ObserverContext<RegionCoprocessorEnvironment> ctx,
      List<Pair<byte[], String>> familyPaths) throws IOException {
    TableName t = table(ctx);
    if (t.isSystemTable()) return;
    Invalidations.Notice n = Invalidations.HUB.begin(t.getName(), List.of());
    if (n != null) open.put(familyPaths, n);
  }

  @Override
  public void postBulkLoadHFile(ObserverContext<RegionCoprocessorEnvironment> ctx,
      List<Pair<byte[], String>> familyPaths, Map<byte[], List<Path>> finalPaths) {
    Invalidations.HUB.end(open.remove(familyPaths));
  }
}
