package io.slipstream.hbase;

import java.util.concurrent.CountDownLatch;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.hbase.HBaseConfiguration;
import org.apache.hadoop.hbase.regionserver.HRegionServer;
import org.apache.hadoop.hbase.util.DNS;

/**
 * One HBase region server alone in its JVM, joining a mini cluster started by {@link Main} with
 * {@code --advertise-host} (the {@code rs} mode): how the tests put a region server on another
 * "host" (a network namespace), so that its {@link InvalidationObserver}'s notices reach the
 * sidecar over a real network path. It shares the mini cluster's root directory (the same local
 * filesystem) and loads the observer as a real cluster's hbase-site would (README "On a real
 * cluster"). Not for production: a real cluster's region servers are started by HBase's scripts.
 */
final class RemoteRegionServer {
  /** The region server's advertised host name (also its RPC bind address). */
  static final String HOSTNAME_KEY = DNS.UNSAFE_RS_HOSTNAME_KEY;
  /** How long {@link #run} waits for the region server to report for duty. */
  private static final long ONLINE_WAIT_MS = 120_000;

  private RemoteRegionServer() {}

  /** Starts the region server, prints READY once it is online and runs until stdin closes or SIGTERM. */
  static void run(String zk, String rootDir, String walDir, String host, String observerPort,
      long observerHoldMs, long t0) throws Exception {
    HRegionServer rs = new HRegionServer(conf(zk, rootDir, walDir, host, observerPort, observerHoldMs));
    rs.start();
    long deadline = System.nanoTime() + ONLINE_WAIT_MS * 1_000_000L;
    while (!rs.isOnline()) {
      if (rs.isStopped() || System.nanoTime() > deadline) {
        System.err.println("region server did not come online: stopped=" + rs.isStopped());
        System.exit(1);
      }
      Thread.sleep(100);
    }
    System.out.println("READY sidecar=0 server=" + rs.getServerName().getServerName().replace(' ', '_')
        + " start_ms=" + (System.nanoTime() - t0) / 1_000_000 + " pid=" + ProcessHandle.current().pid());
    System.out.flush();
    CountDownLatch done = new CountDownLatch(1);
    Runtime.getRuntime().addShutdownHook(new Thread(() -> {
      rs.stop("shutdown");
      try {
        rs.join(30_000);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
      }
      done.countDown();
    }));
    StdinWatch.start(line -> { /* no commands in this mode */ });
    done.await();
  }

  private static Configuration conf(String zk, String rootDir, String walDir, String host,
      String observerPort, long observerHoldMs) {
    Configuration conf = HBaseConfiguration.create();
    int colon = zk.lastIndexOf(':');
    conf.set("hbase.zookeeper.quorum", colon < 0 ? zk : zk.substring(0, colon));
    if (colon >= 0) conf.set("hbase.zookeeper.property.clientPort", zk.substring(colon + 1));
    conf.setBoolean("hbase.cluster.distributed", true);
    conf.set("hbase.rootdir", rootDir);
    if (walDir != null) conf.set("hbase.wal.dir", walDir);
    // As in the mini cluster: the local filesystem has no hflush.
    conf.setBoolean("hbase.unsafe.stream.capability.enforce", false);
    conf.set(HOSTNAME_KEY, host);
    conf.setInt("hbase.regionserver.port", 0);
    conf.setInt("hbase.regionserver.info.port", -1);
    conf.setInt("hbase.regionserver.handler.count", 8);
    conf.set("hbase.coprocessor.region.classes", InvalidationObserver.class.getName());
    conf.set("hbase.coprocessor.regionserver.classes", InvalidationObserver.class.getName());
    conf.set(ObserverHub.PORT_KEY, observerPort);
    conf.set(ObserverHub.BIND_KEY, host);
    conf.set(ObserverHub.HOST_KEY, host);
    conf.setLong(ObserverHub.START_HOLD_KEY, observerHoldMs);
    return conf;
  }
}
