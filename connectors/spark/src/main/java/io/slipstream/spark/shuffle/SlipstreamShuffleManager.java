// SlipstreamShuffleManager: Spark's ShuffleManager over the Slipstream daemon's shuffle service
// (crates/shuffle). Enabled with no change to the job:
//   --conf spark.shuffle.manager=io.slipstream.spark.shuffle.SlipstreamShuffleManager
//   --conf spark.slipstream.shuffle.endpoint=127.0.0.1:7300
//   --conf spark.slipstream.shuffle.tenant=<name>   (a daemon with [[tenant]] entries: the tenant
//                                                   whose shuffle_mb share and buckets it uses)
// Map tasks serialize into the daemon's pool blocks (shared memory files that this JVM maps),
// reducers deserialize from the same memory in place. This is the local path: executors and the
// daemon on one host. A daemon that cannot be reached when the manager starts is a clear error
// (the SparkContext, or the executor, fails to start with the reason); no silent fallback.
//   --conf spark.slipstream.shuffle.mergeAggregation=false   (default true: shuffles with an
//      aggregator and a relocatable serializer, e.g. Kryo, are aggregated by merging the map
//      outputs in key-hash order, HashOrder; false keeps Spark's ExternalAppendOnlyMap)
package io.slipstream.spark.shuffle;

import java.io.IOException;
import java.nio.file.Path;
import org.apache.spark.ShuffleDependency;
import org.apache.spark.SparkConf;
import org.apache.spark.SparkEnv;
import org.apache.spark.TaskContext;
import org.apache.spark.shuffle.BaseShuffleHandle;
import org.apache.spark.shuffle.ShuffleBlockResolver;
import org.apache.spark.shuffle.ShuffleHandle;
import org.apache.spark.shuffle.ShuffleManager;
import org.apache.spark.shuffle.ShuffleReadMetricsReporter;
import org.apache.spark.shuffle.ShuffleReader;
import org.apache.spark.shuffle.ShuffleWriteMetricsReporter;
import org.apache.spark.shuffle.ShuffleWriter;

public final class SlipstreamShuffleManager implements ShuffleManager {
    public static final String ENDPOINT = "spark.slipstream.shuffle.endpoint";
    public static final String TENANT = "spark.slipstream.shuffle.tenant";
    public static final String MERGE_AGGREGATION = "spark.slipstream.shuffle.mergeAggregation";
    static final int CONNECT_TIMEOUT_MS = 5_000;
    static final int READ_TIMEOUT_MS = 120_000;

    private final String endpoint;
    /** The tenant this application is charged to; null on a daemon without tenants. */
    private final String tenant;
    private final boolean isDriver;
    private final boolean mergeAggregation;
    private final int blockBytes;
    private final Path blockDir;
    /** This JVM's read mappings of pool blocks, shared by its reduce tasks. */
    private final BlockMaps blockMaps;
    private final SlipstreamBlockResolver resolver = new SlipstreamBlockResolver();
    /** Spark's conf of this JVM: the driver's gets spark.app.id after the manager is made. */
    private final SparkConf conf;
    private volatile String appId;
    /** The driver's DRIVER connection, from its first registerShuffle until stop(). */
    private DriverLink driverLink;
    private boolean stopped;

    public SlipstreamShuffleManager(SparkConf conf, boolean isDriver) {
        this.conf = conf;
        this.endpoint = conf.get(ENDPOINT, "127.0.0.1:7300");
        String t = conf.get(TENANT, "").trim();
        this.tenant = t.isEmpty() ? null : t;
        this.isDriver = isDriver;
        this.mergeAggregation = conf.getBoolean(MERGE_AGGREGATION, true);
        // HELLO names the tenant, so an unknown one fails the SparkContext (or executor) at start.
        try (ShuffleClient c = connect()) {
            ShuffleClient.Hello h = c.hello(tenant);
            blockBytes = h.blockBytes();
            blockDir = Path.of(h.dir());
        } catch (IOException e) {
            throw new IllegalStateException(e.getMessage(), e);
        }
        blockMaps = new BlockMaps(blockDir, blockBytes);
    }

    public SlipstreamShuffleManager(SparkConf conf) {
        this(conf, false);
    }

    ShuffleClient connect() throws IOException {
        return new ShuffleClient(endpoint, CONNECT_TIMEOUT_MS, READ_TIMEOUT_MS);
    }

    /** MERGE_AGGREGATION: the same on every executor (one SparkConf), so writers and readers agree. */
    boolean mergeAggregation() {
        return mergeAggregation;
    }

    String tenant() {
        return tenant;
    }

    int blockBytes() {
        return blockBytes;
    }

    Path blockDir() {
        return blockDir;
    }

    BlockMaps blockMaps() {
        return blockMaps;
    }

    /** The daemon's name for this application: spark.app.id in its alphabet. */
    String appId() {
        String a = appId;
        if (a == null) {
            a = daemonAppId(SparkEnv.get().conf().get("spark.app.id", "spark-app"));
            appId = a;
        }
        return a;
    }

    /** A Spark application id as the daemon names it: one word of the control protocol, at most 64 characters. */
    static String daemonAppId(String sparkAppId) {
        String a = sparkAppId.replaceAll("[^A-Za-z0-9._-]", "_");
        return a.length() > 64 ? a.substring(a.length() - 64) : a;
    }

    @Override
    public <K, V, C> ShuffleHandle registerShuffle(int shuffleId, ShuffleDependency<K, V, C> dependency) {
        // Writers register with the daemon themselves (idempotent), so a restarted daemon learns
        // the shuffle again from the recomputed map tasks.
        if (isDriver) {
            holdDriverLink();
        }
        return new BaseShuffleHandle<>(shuffleId, dependency);
    }

    @Override
    @SuppressWarnings("unchecked")
    public <K, V> ShuffleWriter<K, V> getWriter(ShuffleHandle handle, long mapId, TaskContext context,
            ShuffleWriteMetricsReporter metrics) {
        return new SlipstreamShuffleWriter<>(this, (BaseShuffleHandle<K, V, ?>) handle, mapId, context, metrics);
    }

    @Override
    @SuppressWarnings("unchecked")
    public <K, C> ShuffleReader<K, C> getReader(ShuffleHandle handle, int startMapIndex, int endMapIndex,
            int startPartition, int endPartition, TaskContext context, ShuffleReadMetricsReporter metrics) {
        return new SlipstreamShuffleReader<>(this, (BaseShuffleHandle<K, ?, C>) handle, startMapIndex, endMapIndex,
                startPartition, endPartition, context, metrics);
    }

    @Override
    public boolean unregisterShuffle(int shuffleId) {
        blockMaps.dropShuffle(shuffleId);
        try (ShuffleClient c = connect()) {
            c.unregister(appId(), shuffleId);
        } catch (IOException | RuntimeException e) {
            // Best effort: the blocks go when the application is unregistered.
        }
        return true;
    }

    @Override
    public ShuffleBlockResolver shuffleBlockResolver() {
        return resolver;
    }

    /**
     * Opens the driver's link (DriverLink) once: an application that crashes after this frees
     * its blocks in the daemon. From the first registerShuffle, not the constructor: Spark sets
     * spark.app.id on the driver's conf after it makes the manager, and before a shuffle there
     * are no blocks to free.
     */
    private synchronized void holdDriverLink() {
        if (driverLink != null || stopped) {
            return;
        }
        String app = endedAppId();
        if (app != null) {
            driverLink = new DriverLink(app, this::connect);
        }
    }

    /** The driver's link, null before the first registerShuffle and after stop() (tests). */
    synchronized DriverLink driverLink() {
        return driverLink;
    }

    @Override
    public void stop() {
        blockMaps.dropAll();
        String app = isDriver ? endedAppId() : null;
        if (app != null) {
            try (ShuffleClient c = connect()) {
                c.unregisterApp(app);
            } catch (IOException | RuntimeException e) {
                // The daemon is gone: nothing of ours is left in it.
            }
        }
        synchronized (this) {
            stopped = true;
            if (driverLink != null) {
                driverLink.close();
                driverLink = null;
            }
        }
    }

    /**
     * The application the driver ends, as the daemon names it (null: it never got an id). Not
     * appId() alone: on a cluster the driver's manager writes and reads nothing, so appId() may
     * never have been asked there, and an application whose shuffles the ContextCleaner never
     * dropped then left every block it had in the daemon's pool until the daemon restarted.
     */
    private String endedAppId() {
        String a = appId;
        if (a != null) {
            return a;
        }
        scala.Option<String> id = conf.getOption("spark.app.id");
        return id.isDefined() ? daemonAppId(id.get()) : null;
    }
}
