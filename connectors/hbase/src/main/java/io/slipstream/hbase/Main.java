package io.slipstream.hbase;

import java.io.File;
import java.lang.management.ManagementFactory;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CountDownLatch;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.hbase.HBaseConfiguration;
import org.apache.hadoop.hbase.HBaseTestingUtility;
import org.apache.hadoop.hbase.HConstants;
import org.apache.hadoop.hbase.MiniHBaseCluster;
import org.apache.hadoop.hbase.ServerName;
import org.apache.hadoop.hbase.util.JVMClusterUtil;
import org.apache.hadoop.hbase.zookeeper.ZKConfig;
import org.apache.hadoop.hbase.StartMiniClusterOption;
import org.apache.hadoop.hbase.HRegionLocation;
import org.apache.hadoop.hbase.TableName;
import org.apache.hadoop.hbase.client.Admin;
import org.apache.hadoop.hbase.client.Connection;
import org.apache.hadoop.hbase.client.RegionLocator;
import org.apache.hadoop.hbase.util.Bytes;
import org.apache.hadoop.hbase.util.CommonFSUtils;
import org.apache.hadoop.hbase.client.ConnectionFactory;

/**
 * Entry point. Two modes:
 * <ul>
 *   <li>{@code mini [--sidecar-port N] [--dir D] [--notify-timeout-ms MS] [--region-servers K]
 *       [--observer-port P [--observer-hold-ms H]] [--observer false] [--advertise-host A]}: an in-process HBase mini cluster (ZooKeeper +
 *       master + K region servers, default 1, on the local filesystem, with
 *       {@link InvalidationObserver} on every table) and the sidecar in the same JVM, for tests,
 *       examples and {@code make hbase-run}; MS (default 2000) is how long a write waits for
 *       Slipstream's invalidation ACK. With {@code --observer-port} the observers report over
 *       TCP as on a real cluster ({@link ObserverHub}, listeners on 127.0.0.1, P = 0: any port;
 *       H: {@code slipstream.observer.start.hold.ms}) and the sidecar subscribes to them
 *       ({@link ObserverLinks}), as any other sidecar pointed at this ZooKeeper would. Lines on
 *       standard input: {@code rs-start} starts one more region server, {@code rs-stop} stops the
 *       newest; each answers {@code OK <command> <server name>} on stdout; {@code move <table>}
 *       moves every region of the table to another region server, {@code split <table> <row>}
 *       splits the table at a row (both wait until the regions are open, and answer
 *       {@code OK <command> ...}). {@code --observer false}
 *       loads no observer (benchmarks: the write path without it);</li>
 *   <li>{@code rs --zk host:port --rootdir R [--waldir W] --advertise-host H --observer-port P}:
 *       one region server alone in this JVM ({@link RemoteRegionServer}) that joins the mini
 *       cluster of that ZooKeeper (started with {@code --advertise-host}, whose READY line gives
 *       R and W), named by and listening on H, its observer over TCP on H:P; prints
 *       {@code READY sidecar=0 server=NAME pid=N} once it is online;</li>
 *   <li>{@code sidecar --zk host:port [--port N] [--lease-ms-max MS] [--notify-timeout-ms MS]}:
 *       the sidecar alone, in front of a real cluster whose region servers run
 *       {@link InvalidationObserver} with {@code slipstream.observer.port} set; MS-max (default
 *       2000) is the longest lease a daemon may ask for.</li>
 * </ul>
 * When ready it prints one line on stdout: {@code READY sidecar=PORT zk=HOST:PORT start_ms=T
 * heap_used_mb=M}. It runs until its standard input closes or it gets SIGTERM.
 */
public final class Main {
  private Main() {}

  public static void main(String[] args) throws Exception {
    if (args.length == 0) usage();
    String mode = args[0];
    int sidecarPort = 9091, regionServers = 1, leaseMsMax = 2_000;
    String zk = null, dir = null, observerPort = null, advertiseHost = null, rootDir = null, walDir = null;
    long observerHoldMs = ObserverHub.START_HOLD_MS_DEFAULT;
    boolean observer = true;
    for (int i = 1; i < args.length; i++) {
      String a = args[i];
      if (i + 1 >= args.length) usage();
      switch (a) {
        case "--sidecar-port", "--port" -> sidecarPort = Integer.parseInt(args[++i]);
        case "--zk" -> zk = args[++i];
        case "--dir" -> dir = args[++i];
        case "--notify-timeout-ms" -> Invalidations.HUB.setAckTimeoutMs(Integer.parseInt(args[++i]));
        case "--region-servers" -> regionServers = Integer.parseInt(args[++i]);
        case "--observer-port" -> observerPort = Integer.toString(Integer.parseInt(args[++i]));
        case "--observer-hold-ms" -> observerHoldMs = Long.parseLong(args[++i]);
        case "--lease-ms-max" -> leaseMsMax = Integer.parseInt(args[++i]);
        case "--observer" -> observer = Boolean.parseBoolean(args[++i]);
        case "--advertise-host" -> advertiseHost = args[++i];
        case "--rootdir" -> rootDir = args[++i];
        case "--waldir" -> walDir = args[++i];
        default -> usage();
      }
    }
    long t0 = System.nanoTime();
    if (mode.equals("rs")) {
      if (zk == null || rootDir == null || advertiseHost == null || observerPort == null) usage();
      RemoteRegionServer.run(zk, rootDir, walDir, advertiseHost, observerPort, observerHoldMs, t0);
      return;
    }
    HBaseTestingUtility util = null;
    Configuration conf;
    boolean cluster = mode.equals("sidecar") || observerPort != null;
    if (mode.equals("mini")) {
      util = startMini(dir, regionServers, observer, observerPort, observerHoldMs, advertiseHost);
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
    ObserverLinks links = null;
    Sidecar sidecar;
    if (cluster) {
      if (leaseMsMax < 1 || leaseMsMax > Invalidations.LEASE_MS_MAX / 2) usage();
      links = new ObserverLinks(ZKConfig.getZKQuorumServersString(conf),
          conf.get(HConstants.ZOOKEEPER_ZNODE_PARENT, HConstants.DEFAULT_ZOOKEEPER_ZNODE_PARENT),
          Invalidations.HUB, leaseMsMax);
      links.start();
      sidecar = new Sidecar(conn, Invalidations.HUB, links, false,
          new InetSocketAddress(InetAddress.getLoopbackAddress(), sidecarPort));
    } else {
      sidecar = new Sidecar(conn, sidecarPort);
    }
    sidecar.start();
    long startMs = (System.nanoTime() - t0) / 1_000_000;
    Runtime rt = Runtime.getRuntime();
    System.gc();
    long heapMb = (rt.totalMemory() - rt.freeMemory()) >> 20;
    String dirs = util == null ? "" : " rootdir=" + CommonFSUtils.getRootDir(conf)
        + " waldir=" + CommonFSUtils.getWALRootDir(conf);
    System.out.println("READY sidecar=" + sidecar.port() + " zk=" + zk + " start_ms=" + startMs
        + " heap_used_mb=" + heapMb + " pid=" + ProcessHandle.current().pid() + dirs);
    System.out.flush();

    CountDownLatch done = new CountDownLatch(1);
    final HBaseTestingUtility u = util;
    final ObserverLinks l = links;
    Runtime.getRuntime().addShutdownHook(new Thread(() -> {
      try {
        if (l != null) l.close();
        sidecar.close();
        conn.close();
        if (u != null) u.shutdownMiniCluster();
      } catch (Exception e) {
        System.err.println("shutdown: " + e);
      }
      done.countDown();
    }));
    // Stdin closing (the parent went away) ends the process too; its lines are commands.
    StdinWatch.start(line -> {
      if (u != null) command(u, line);
    });
    done.await();
  }

  /** A test's command on standard input (see the class comment). */
  private static void command(HBaseTestingUtility u, String cmd) {
    MiniHBaseCluster c = u.getMiniHBaseCluster();
    String answer;
    try {
      if (cmd.equals("rs-start")) {
        JVMClusterUtil.RegionServerThread t = c.startRegionServer();
        t.waitForServerOnline();
        answer = "OK rs-start " + t.getRegionServer().getServerName();
      } else if (cmd.equals("rs-stop")) {
        List<JVMClusterUtil.RegionServerThread> live = c.getLiveRegionServerThreads();
        ServerName sn = live.get(live.size() - 1).getRegionServer().getServerName();
        c.stopRegionServer(sn);
        c.waitForRegionServerToStop(sn, 60_000);
        answer = "OK rs-stop " + sn;
      } else if (cmd.startsWith("move ")) {
        answer = "OK move " + moveRegions(u, TableName.valueOf(cmd.substring(5).trim()));
      } else if (cmd.startsWith("split ")) {
        String[] a = cmd.split(" ");
        if (a.length != 3) throw new IllegalArgumentException("split <table> <row>");
        answer = "OK split " + split(u, TableName.valueOf(a[1]), Bytes.toBytes(a[2]));
      } else {
        answer = "ERROR unknown command " + cmd;
      }
    } catch (Exception e) {
      answer = "ERROR " + cmd + " " + e;
    }
    System.out.println(answer);
    System.out.flush();
  }

  /**
   * Moves every region of {@code table} to the next live region server (in listing order) and
   * waits until each is open there; answers {@code region->server} for every move. A region
   * server never receives a region it already has.
   */
  private static String moveRegions(HBaseTestingUtility u, TableName table) throws Exception {
    // Every live region server, also those in other JVMs (see RemoteRegionServer).
    List<ServerName> servers = new ArrayList<>(u.getAdmin().getRegionServers());
    servers.sort(null);
    if (servers.size() < 2) throw new IllegalStateException("needs 2 region servers, has " + servers.size());
    StringBuilder moved = new StringBuilder();
    try (RegionLocator loc = u.getConnection().getRegionLocator(table)) {
      for (HRegionLocation l : loc.getAllRegionLocations()) {
        int at = Math.max(0, servers.indexOf(l.getServerName()));
        ServerName to = servers.get((at + 1) % servers.size());
        u.moveRegionAndWait(l.getRegion(), to);
        moved.append(' ').append(l.getRegion().getEncodedName()).append("->").append(to);
      }
    }
    return table + moved.toString();
  }

  /** Splits the region of {@code table} holding {@code row} at {@code row}; answers the region count. */
  private static String split(HBaseTestingUtility u, TableName table, byte[] row) throws Exception {
    Admin admin = u.getAdmin();
    int before = admin.getRegions(table).size();
    admin.split(table, row);
    long deadline = System.nanoTime() + SPLIT_WAIT_MS * 1_000_000L;
    while (admin.getRegions(table).size() <= before) {
      if (System.nanoTime() > deadline) throw new IllegalStateException("split not done in " + SPLIT_WAIT_MS + " ms");
      Thread.sleep(100);
    }
    u.waitUntilNoRegionsInTransition(SPLIT_WAIT_MS);
    return table + " regions=" + admin.getRegions(table).size();
  }

  /** How long {@code split} waits for the daughters to be open. */
  private static final long SPLIT_WAIT_MS = 60_000;

  private static HBaseTestingUtility startMini(String dir, int regionServers, boolean observer,
      String observerPort, long observerHoldMs, String advertiseHost) throws Exception {
    Configuration conf = HBaseConfiguration.create();
    if (advertiseHost != null) {
      // Region servers on other hosts (a network namespace in the tests) join this cluster:
      // ZooKeeper listens on every address, the master and region servers on (and named by)
      // an address those hosts reach.
      conf.set("hbase.zookeeper.property.clientPortAddress", "0.0.0.0");
      conf.set("hbase.master.hostname", advertiseHost);
      conf.set(RemoteRegionServer.HOSTNAME_KEY, advertiseHost);
    }
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
    if (observer) conf.set("hbase.coprocessor.region.classes", InvalidationObserver.class.getName());
    if (observer && observerPort != null) {
      // As on a real cluster: notices over TCP (loopback here), the listener closed with its
      // region server.
      conf.set(ObserverHub.PORT_KEY, observerPort);
      conf.set(ObserverHub.BIND_KEY, "127.0.0.1");
      conf.set(ObserverHub.HOST_KEY, "127.0.0.1");
      conf.setLong(ObserverHub.START_HOLD_KEY, observerHoldMs);
      conf.set("hbase.coprocessor.regionserver.classes", InvalidationObserver.class.getName());
    }
    HBaseTestingUtility util = new HBaseTestingUtility(conf);
    util.startMiniZKCluster();
    util.startMiniHBaseCluster(StartMiniClusterOption.builder()
        .numMasters(1).numRegionServers(regionServers).numDataNodes(0).build());
    return util;
  }

  private static void usage() {
    System.err.println("usage: Main mini [--sidecar-port N] [--dir D] [--notify-timeout-ms MS] [--region-servers K]\n"
        + "                 [--observer-port P [--observer-hold-ms H]] [--observer false]\n"
        + "                 [--advertise-host A]\n"
        + "       Main rs --zk host:port --rootdir R [--waldir W] --advertise-host H --observer-port P [--observer-hold-ms H]\n"
        + "       Main sidecar --zk host:port [--port N] [--lease-ms-max MS] [--notify-timeout-ms MS]");
    System.exit(2);
  }

  static String pid() { return ManagementFactory.getRuntimeMXBean().getName(); }
}
