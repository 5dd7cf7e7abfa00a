package io.slipstream.hbase;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.hbase.ServerName;
import org.apache.hadoop.hbase.zookeeper.ZKConfig;
import org.apache.zookeeper.CreateMode;
import org.apache.zookeeper.KeeperException;
import org.apache.zookeeper.Watcher;
import org.apache.zookeeper.ZooDefs;
import org.apache.zookeeper.ZooKeeper;

/**
 * One region server's end of the networked notice path (a real cluster, where the sidecar runs in
 * another JVM): the {@link Invalidations} hub its {@link InvalidationObserver}s report to, a TCP
 * listener on which sidecars subscribe to it (the sidecar protocol's PING, SUBSCRIBE, NOTICE and
 * NOTICE_ACK), and an ephemeral znode {@code /slipstream/observers/<server name>} holding the
 * listener's {@code host:port}, so that {@link ObserverLinks} finds every region server's observer.
 *
 * <p>Used when hbase-site sets {@value #PORT_KEY} (0 = any free port); without it the observers
 * report to the JVM's own {@link Invalidations#HUB} (the mini cluster's default mode, region
 * servers inside the sidecar's JVM). Not for: deciding what to invalidate, or relaying (the
 * sidecar does both).
 *
 * <p>Why a znode per server with the server's own name: the sidecar must know, for every live
 * region server ({@code /hbase/rs}), where that very server's observer listens; a fixed port per
 * host would not tell two region servers on one host (or one JVM) apart, and the znode's ephemeral
 * session ends with the region server's JVM. The znode only finds the listener: whether a server
 * is covered is decided by the sidecar's live subscription to it, never by the znode.
 */
final class ObserverHub {
  /** hbase-site: the observer listener's port (0 = any); unset = in-JVM mode. */
  static final String PORT_KEY = "slipstream.observer.port";
  /** hbase-site: the address to bind (default: every interface). */
  static final String BIND_KEY = "slipstream.observer.bind";
  /** hbase-site: the host name written into the znode (default: the region server's host name). */
  static final String HOST_KEY = "slipstream.observer.host";
  /**
   * hbase-site: how long writes wait after the region server's first region opened. A sidecar
   * learns of a new region server from ZooKeeper up to {@link ObserverLinks#LISTING_AGE_MS_MAX}
   * late and its daemons may serve for their lease after that; until then the new server's
   * writes must not be acknowledged. Must be above the sidecars' --lease-ms-max plus that age
   * (2000 + 2000 by default).
   */
  static final String START_HOLD_KEY = "slipstream.observer.start.hold.ms";
  static final long START_HOLD_MS_DEFAULT = 5_000;
  /** Where the observers' znodes live. */
  static final String ZNODE_PARENT = "/slipstream/observers";
  /** How long the region server waits for ZooKeeper when it announces its observer. */
  private static final long ZK_CONNECT_WAIT_MS = 30_000;
  private static final int ZK_SESSION_TIMEOUT_MS = 30_000;

  private static final Map<String, ObserverHub> BY_SERVER = new ConcurrentHashMap<>();

  final Invalidations hub = new Invalidations();
  private final Sidecar listener;
  private final String connect;
  private final String znode;
  private final byte[] address;
  private final long startHoldMs;
  private final AtomicBoolean firstRegion = new AtomicBoolean();
  private volatile ZooKeeper zk;
  private volatile boolean closed;

  private ObserverHub(Configuration conf, ServerName sn) throws IOException {
    int port = conf.getInt(PORT_KEY, 0);
    String bind = conf.get(BIND_KEY, "0.0.0.0");
    String host = conf.get(HOST_KEY, sn.getHostname());
    startHoldMs = conf.getLong(START_HOLD_KEY, START_HOLD_MS_DEFAULT);
    hub.observerLoaded();
    listener = new Sidecar(null, hub, null, true, new InetSocketAddress(bind, port));
    listener.start();
    address = (host + ":" + listener.port()).getBytes(StandardCharsets.UTF_8);
    connect = ZKConfig.getZKQuorumServersString(conf);
    znode = ZNODE_PARENT + "/" + sn.getServerName();
    try {
      announce();
    } catch (IOException e) {
      listener.close();
      throw e;
    }
  }

  /** The hub a region's observer reports to: this server's in cluster mode, else the JVM's. */
  static Invalidations forRegion(Configuration conf, ServerName sn) throws IOException {
    if (conf.get(PORT_KEY) == null) return Invalidations.HUB;
    ObserverHub h = forServer(conf, sn);
    if (h.firstRegion.compareAndSet(false, true)) h.hub.hold(h.startHoldMs);
    return h.hub;
  }

  /** This region server's hub, started on first use. */
  static ObserverHub forServer(Configuration conf, ServerName sn) throws IOException {
    try {
      return BY_SERVER.computeIfAbsent(sn.getServerName(), k -> {
        try {
          return new ObserverHub(conf, sn);
        } catch (IOException e) {
          throw new UncheckedIOException(e);
        }
      });
    } catch (UncheckedIOException e) {
      throw e.getCause();
    }
  }

  /** The region server stops: the znode goes, the listener closes, subscribers are dropped. */
  static void stop(ServerName sn) {
    ObserverHub h = BY_SERVER.remove(sn.getServerName());
    if (h != null) h.close();
  }

  /** Connects to ZooKeeper and writes the ephemeral znode (again after a session expired). */
  private synchronized void announce() throws IOException {
    if (closed) return;
    CountDownLatch up = new CountDownLatch(1);
    Watcher w = ev -> {
      if (ev.getState() == Watcher.Event.KeeperState.SyncConnected) up.countDown();
      if (ev.getState() == Watcher.Event.KeeperState.Expired) reannounce();
    };
    ZooKeeper z = new ZooKeeper(connect, ZK_SESSION_TIMEOUT_MS, w);
    try {
      if (!up.await(ZK_CONNECT_WAIT_MS, TimeUnit.MILLISECONDS)) {
        throw new IOException("slipstream observer: ZooKeeper " + connect + " not reached");
      }
      ensureParents(z);
      try {
        z.create(znode, address, ZooDefs.Ids.OPEN_ACL_UNSAFE, CreateMode.EPHEMERAL);
      } catch (KeeperException.NodeExistsException e) {
        z.delete(znode, -1);
        z.create(znode, address, ZooDefs.Ids.OPEN_ACL_UNSAFE, CreateMode.EPHEMERAL);
      }
    } catch (KeeperException e) {
      closeQuietly(z);
      throw new IOException("slipstream observer: cannot write " + znode + ": " + e, e);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      closeQuietly(z);
      throw new IOException("interrupted while announcing the observer", e);
    }
    zk = z;
  }

  private void reannounce() {
    Thread t = new Thread(() -> {
      try {
        closeQuietly(zk);
        announce();
      } catch (IOException e) {
        System.err.println("slipstream observer: " + e.getMessage());
      }
    }, "observer-announce");
    t.setDaemon(true);
    t.start();
  }

  private static void ensureParents(ZooKeeper z) throws KeeperException, InterruptedException {
    StringBuilder p = new StringBuilder();
    for (String part : ZNODE_PARENT.substring(1).split("/")) {
      p.append('/').append(part);
      try {
        z.create(p.toString(), new byte[0], ZooDefs.Ids.OPEN_ACL_UNSAFE, CreateMode.PERSISTENT);
      } catch (KeeperException.NodeExistsException e) {
        // Another region server made it.
      }
    }
  }

  private static void closeQuietly(ZooKeeper z) {
    if (z == null) return;
    try {
      z.close();
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
  }

  private synchronized void close() {
    closed = true;
    closeQuietly(zk);
    try {
      listener.close();
    } catch (IOException e) {
      // Already closed.
    }
    hub.dropAll(false);
  }
}
