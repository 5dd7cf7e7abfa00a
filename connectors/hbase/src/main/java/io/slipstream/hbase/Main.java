package io.slipstream.hbase;

import java.io.File;
import java.lang.management.ManagementFactory;
import java.util.concurrent.CountDownLatch;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.hbase.HBaseConfiguration;
import org.apache.hadoop.hbase.HBaseTestingUtility;
import org.apache.hadoop.hbase.StartMiniClusterOption;
import org.apache.hadoop.hbase.client.Connection;
import org.apache.hadoop.hbase.client.ConnectionFactory;

/**
 * Entry point. Two modes:
 * <ul>
 *   <li>{@code mini [--sidecar-port N] [--dir D] [--notify-timeout-ms MS]}: an in-process HBase
 *       mini cluster (ZooKeeper + master + one region server on the local filesystem, with
 *       {@link InvalidationObserver} on every table) and the sidecar in the same JVM, for tests,
 *       examples and {@code make hbase-run}; MS (default 2000) is how long a write waits for
 *       Slipstream's invalidation ACK;</li>
 *   <li>{@code sidecar --zk host:port [--port N]}: the sidecar alone, in front of a real cluster.</li>
 * </ul>
 * When ready it prints one line on stdout: {@code READY sidecar=PORT zk=HOST:PORT start_ms=T
 * heap_used_mb=M}. It runs until its standard input closes or it gets SIGTERM.
 */
public final class Main {
  private Main() {}

  public static void main(String[] args) throws Exception {
    if (args.length == 0) usage();
    String mode = args[0];
    int sidecarPort = 9091;
    String zk = null, dir = null;
    for (int i = 1; i < args.length; i++) {
      String a = args[i];
      if (i + 1 >= args.length) usage();
      switch (a) {
        case "--sidecar-port", "--port" -> sidecarPort = Integer.parseInt(args[++i]);
        case "--zk" -> zk = args[++i];
        case "--dir" -> dir = args[++i];
        case "--notify-timeout-ms" -> Invalidations.HUB.setAckTimeoutMs(Integer.parseInt(args[++i]));
        default -> usage();
      }
    }
    long t0 = System.nanoTime();
    HBaseTestingUtility util = null;
    Configuration conf;
    if (mode.equals("mini")) {
      util = startMini(dir);
      conf = util.getConfiguration();
      zk = "127.0.0.1:" + util.getZkCluster().getClientPort();
    } else if (mode.equals("sidecar") && zk != null) {
      conf = HBaseConfiguration.create();
      int colon = zk.lastIndexOf(':');
      conf.set("hbase.zookeeper.quorum", colon < 0 ? zk : zk.substring(0, colon));
      if (colon >= 0) conf.set("hbase.zookeeper.property.clientPort", zk.substring(colon + 1));
    } else {
      usage();
      return;
    }
    // Fail a request within seconds when HBase is away (Slipstream then answers IOError).
    conf.setInt("hbase.client.retries.number", 3);
    conf.setInt("hbase.client.operation.timeout", 10_000);
    conf.setInt("hbase.rpc.timeout", 5_000);
    Connection conn = ConnectionFactory.createConnection(conf);
    Sidecar sidecar = new Sidecar(conn, sidecarPort);
    sidecar.start();
    long startMs = (System.nanoTime() - t0) / 1_000_000;
    Runtime rt = Runtime.getRuntime();
    System.gc();
    long heapMb = (rt.totalMemory() - rt.freeMemory()) >> 20;
    System.out.println("READY sidecar=" + sidecar.port() + " zk=" + zk + " start_ms=" + startMs
        + " heap_used_mb=" + heapMb + " pid=" + ProcessHandle.current().pid());
    System.out.flush();

    CountDownLatch done = new CountDownLatch(1);
    final HBaseTestingUtility u = util;
    Runtime.getRuntime().addShutdownHook(new Thread(() -> {
      try {
        sidecar.close();
        conn.close();
        if (u != null) u.shutdownMiniCluster();
      } catch (Exception e) {
        System.err.println("shutdown: " + e);
      }
      done.countDown();
    }));
    // Stdin closing (the parent went away) ends the process too.
    Thread stdin = new Thread(() -> {
      try {
        while (System.in.read() >= 0) { /* discard */ }
      } catch (java.io.IOException e) { /* closed */ }
      System.exit(0);
    }, "stdin-watch");
    stdin.setDaemon(true);
    stdin.start();
    done.await();
  }

  private static HBaseTestingUtility startMini(String dir) throws Exception {
    Configuration conf = HBaseConfiguration.create();
    if (dir != null) {
      File d = new File(dir).getAbsoluteFile();
      d.mkdirs();
      System.setProperty("test.build.data.basedirectory", d.getPath());
    }
    // The local filesystem has no hflush; HBase must not insist on it for its WAL.
    conf.setBoolean("hbase.unsafe.stream.capability.enforce", false);
    conf.setInt("hbase.master.info.port", -1);
    conf.setInt("hbase.regionserver.info.port", -1);
    conf.setInt("hbase.regionserver.handler.count", 8);
    // Every table's regions report writes to Slipstream before they are acknowledged (also
    // writes from other HBase clients): see InvalidationObserver.
    conf.set("hbase.coprocessor.region.classes", InvalidationObserver.class.getName());
    HBaseTestingUtility util = new HBaseTestingUtility(conf);
    util.startMiniZKCluster();
    util.startMiniHBaseCluster(StartMiniClusterOption.builder()
        .numMasters(1).numRegionServers(1).numDataNodes(0).build());
    return util;
  }

  private static void usage() {
    System.err.println("usage: Main mini [--sidecar-port N] [--dir D] [--notify-timeout-ms MS]\n"
        + "       Main sidecar --zk host:port [--port N]");
    System.exit(2);
  }

  static String pid() { return ManagementFactory.getRuntimeMXBean().getName(); }
}
