package io.slipstream.hbase;

import java.io.BufferedInputStream;
import java.io.DataInputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.zookeeper.KeeperException;
import org.apache.zookeeper.Watcher;
import org.apache.zookeeper.ZooKeeper;

/**
 * The sidecar's side of the networked notice path (in front of a real cluster): lists the live
 * region servers ({@code /hbase/rs} in ZooKeeper, after a sync) and their observers' listeners
 * ({@link ObserverHub}'s znodes), subscribes to every one, and relays each BEGIN into the sidecar's
 * own hub ({@link Invalidations#HUB}: the daemons invalidate and ACK) before it ACKs the region
 * server, and each END after. It is the sidecar's {@link Sidecar.Gate}: the daemons may serve from
 * their caches only while every listed region server has a live subscription whose lease (kept by
 * PINGs) outlasts a daemon's lease, and the listing is at most {@link #LISTING_AGE_MS_MAX} old.
 * Any change — a region server joining or leaving, a subscription lost or not yet made, ZooKeeper
 * unreachable — is announced to every daemon (SUSPEND: it flushes its cache, as for a lost
 * channel, and bypasses it; RESUME: it flushes what it filled meanwhile and uses it again).
 *
 * <p>A region moving between two subscribed region servers needs no flush: coverage is per
 * server, and the destination's observer reports the region's writes like any other.
 * Not for: deciding what to invalidate (Slipstream's cache does that).
 */
final class ObserverLinks implements Sidecar.Gate, AutoCloseable {
  /** How often ZooKeeper is listed (and the links PINGed when due). */
  static final long LIST_EVERY_MS = 100;
  /** A listing older than this (ZooKeeper slow or away) covers nothing. */
  static final long LISTING_AGE_MS_MAX = 2_000;
  /** Connecting to an observer's listener. */
  private static final int CONNECT_TIMEOUT_MS = 1_000;
  /** SUBSCRIBE's answer (the observer first waits up to 10 s for writes in progress). */
  private static final long SUBSCRIBE_ANSWER_MS = 12_000;
  /** ZooKeeper session of the sidecar. */
  private static final int ZK_SESSION_TIMEOUT_MS = 30_000;

  private final String rsPath;
  private final String connect;
  private final Invalidations hub;
  private final int leaseMsMax;
  /** The lease the sidecar asks of each observer: twice the daemons' longest. */
  private final int linkLeaseMs;
  private final Map<String, Link> links = new ConcurrentHashMap<>();
  private final ExecutorService relay = Executors.newCachedThreadPool(Sidecar.daemonThreads("observer-relay"));
  private final Object gateLock = new Object();
  private volatile boolean covered;
  private volatile long coveredUntilNs;
  private volatile ZooKeeper zk;
  private volatile boolean closed;
  /** Coverage changes so far. */
  private final AtomicLong changes = new AtomicLong();

  ObserverLinks(String zkConnect, String znodeParent, Invalidations hub, int leaseMsMax) {
    this.connect = zkConnect;
    this.rsPath = znodeParent + "/rs";
    this.hub = hub;
    this.leaseMsMax = leaseMsMax;
    this.linkLeaseMs = 2 * leaseMsMax;
  }

  /** Starts the listing loop on a daemon thread. */
  void start() {
    Thread t = new Thread(this::loop, "observer-links");
    t.setDaemon(true);
    t.start();
  }

  @Override
  public Object lock() { return gateLock; }

  /** Covered now; a lapse by time is announced first, so the flag is what every daemon was told. */
  @Override
  public boolean covered() {
    synchronized (gateLock) {
      if (covered && !stillCovered()) lapse();
      return covered;
    }
  }

  @Override
  public boolean stillCovered() { return covered && System.nanoTime() - coveredUntilNs < 0; }

  @Override
  public void lapse() { setCoverage(false, System.nanoTime()); }

  @Override
  public int leaseMsMax() { return leaseMsMax; }

  long changes() { return changes.get(); }

  /** Sets the coverage; a change is announced to every daemon (under the gate's lock). */
  private void setCoverage(boolean c, long untilNs) {
    boolean changed;
    synchronized (gateLock) {
      coveredUntilNs = untilNs;
      changed = c != covered;
      if (changed) {
        covered = c;
        hub.announceCoverage(c);
      }
    }
    if (changed) {
      long n = changes.incrementAndGet();
      System.err.println("slipstream sidecar: region servers " + (c ? "all subscribed" : "not all subscribed")
          + " (change " + n + ", " + links.size() + " links)");
    }
  }

  private void loop() {
    // Bounded by close(); each turn is bounded by ZooKeeper's and the sockets' timeouts.
    while (!closed) {
      long t0 = System.nanoTime();
      try {
        refresh(t0);
      } catch (IOException e) {
        // Slow (a sync past its deadline) or not reached: nothing is covered meanwhile.
        System.err.println("slipstream sidecar: listing region servers failed: " + e);
        setCoverage(false, t0);
      } catch (KeeperException e) {
        System.err.println("slipstream sidecar: listing region servers failed: " + e);
        setCoverage(false, t0);
        reconnectZk();
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        return;
      }
      try {
        Thread.sleep(LIST_EVERY_MS);
      } catch (InterruptedException e) {
        return;
      }
    }
  }

  private ZooKeeper zk() throws IOException, InterruptedException {
    ZooKeeper z = zk;
    if (z != null) return z;
    CountDownLatch up = new CountDownLatch(1);
    z = new ZooKeeper(connect, ZK_SESSION_TIMEOUT_MS, ev -> {
      if (ev.getState() == Watcher.Event.KeeperState.SyncConnected) up.countDown();
    });
    if (!up.await(LISTING_AGE_MS_MAX * 5, TimeUnit.MILLISECONDS)) {
      z.close();
      throw new IOException("ZooKeeper " + connect + " not reached");
    }
    zk = z;
    return z;
  }

  private void reconnectZk() {
    ZooKeeper z = zk;
    zk = null;
    if (z != null) {
      try {
        z.close();
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
      }
    }
  }

  /** One turn: list, connect what is missing, PING what is due, close links to gone servers. */
  private void refresh(long t0) throws IOException, KeeperException, InterruptedException {
    ZooKeeper z = zk();
    // sync: the listing below is at least as new as the moment this turn began.
    CountDownLatch synced = new CountDownLatch(1);
    z.sync(rsPath, (rc, path, ctx) -> synced.countDown(), null);
    if (!synced.await(LISTING_AGE_MS_MAX, TimeUnit.MILLISECONDS)) throw new IOException("ZooKeeper sync timed out");
    List<String> servers = z.getChildren(rsPath, false);
    boolean all = true;
    long until = t0 + TimeUnit.MILLISECONDS.toNanos(LISTING_AGE_MS_MAX);
    Set<String> listed = new HashSet<>(servers);
    // PINGs first: opening a link may wait (its observer finishes writes in progress first).
    for (Link l : links.values()) l.pingIfDue();
    for (String name : servers) {
      Link l = links.get(name);
      if (l == null || l.dead) {
        l = open(z, name);
        if (l == null) {
          all = false;
          continue;
        }
      }
      if (!l.pingIfDue()) {
        all = false;
        continue;
      }
      // A daemon answered now may serve for its lease: the observer must still count us then.
      until = Math.min(until, l.leaseUntilNs.get() - TimeUnit.MILLISECONDS.toNanos(leaseMsMax));
    }
    for (Map.Entry<String, Link> e : links.entrySet()) {
      if (!listed.contains(e.getKey())) e.getValue().close("region server left /hbase/rs");
    }
    setCoverage(all && System.nanoTime() - until < 0, until);
  }

  /** Finds the server's observer and subscribes; null if it cannot (yet). */
  private Link open(ZooKeeper z, String name) throws KeeperException, InterruptedException {
    byte[] data;
    try {
      data = z.getData(ObserverHub.ZNODE_PARENT + "/" + name, false, null);
    } catch (KeeperException.NoNodeException e) {
      return null; // No observer announced (yet): that server's writes are not covered.
    }
    String addr = new String(data, StandardCharsets.UTF_8);
    int colon = addr.lastIndexOf(':');
    if (colon < 0) return null;
    Link l = new Link(name);
    try {
      l.connect(addr.substring(0, colon), Integer.parseInt(addr.substring(colon + 1)));
    } catch (IOException | NumberFormatException e) {
      System.err.println("slipstream sidecar: observer of " + name + " at " + addr + ": " + e);
      l.close("subscribe failed");
      return null;
    }
    links.put(name, l);
    return l;
  }

  /** The subscription to one region server's observer. */
  private final class Link {
    final String server;
    volatile boolean dead;
    volatile boolean established;
    final AtomicLong leaseUntilNs = new AtomicLong(System.nanoTime());
    private Socket socket;
    private OutputStream out;
    private final AtomicInteger nextId = new AtomicInteger(2);
    /** PINGs in flight: id → send time. */
    private final Map<Integer, Long> pings = new ConcurrentHashMap<>();
    private volatile long lastPingNs = System.nanoTime();
    /** Relayed BEGINs whose END has not come: the observer's id → the sidecar hub's notice. */
    private final Map<Integer, Invalidations.Notice> open = new ConcurrentHashMap<>();
    private final CompletableFuture<Boolean> subscribed = new CompletableFuture<>();

    Link(String server) { this.server = server; }

    void connect(String host, int port) throws IOException {
      socket = new Socket();
      socket.connect(new InetSocketAddress(host, port), CONNECT_TIMEOUT_MS);
      socket.setTcpNoDelay(true);
      out = socket.getOutputStream();
      DataInputStream in = Wire.data(new BufferedInputStream(socket.getInputStream(), 1 << 16));
      Thread t = new Thread(() -> read(in), "observer-link-" + server);
      t.setDaemon(true);
      t.start();
      long sent = System.nanoTime();
      write(new Wire.Writer(1, Wire.OP_SUBSCRIBE).i32(linkLeaseMs).finish());
      try {
        if (!subscribed.get(SUBSCRIBE_ANSWER_MS, TimeUnit.MILLISECONDS)) throw new IOException("SUBSCRIBE refused");
      } catch (java.util.concurrent.ExecutionException | java.util.concurrent.TimeoutException e) {
        throw new IOException("SUBSCRIBE: " + e, e);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        throw new IOException("interrupted", e);
      }
      leaseUntilNs.accumulateAndGet(sent + TimeUnit.MILLISECONDS.toNanos(linkLeaseMs), Math::max);
      established = true;
    }

    private final Object writeLock = new Object();

    private void write(byte[] frame) throws IOException {
      synchronized (writeLock) {
        out.write(frame);
        out.flush();
      }
    }

    /** Sends a PING when one is due; false if the link is dead or its lease ran out. */
    boolean pingIfDue() {
      if (dead || !established) return false;
      long now = System.nanoTime();
      if (now - leaseUntilNs.get() >= 0) {
        close("no answer within the lease");
        return false;
      }
      if (pings.isEmpty() && now - lastPingNs >= TimeUnit.MILLISECONDS.toNanos(linkLeaseMs / 8)) {
        int id = nextId.getAndIncrement();
        if (id <= 1) id = nextId.getAndIncrement();
        pings.put(id, now);
        lastPingNs = now;
        try {
          write(new Wire.Writer(id, Wire.OP_PING).finish());
        } catch (IOException e) {
          close("PING failed: " + e);
          return false;
        }
      }
      return true;
    }

    private void read(DataInputStream in) {
      String why = "connection closed";
      try {
        while (!dead) {
          Wire.Frame f = Wire.readFrame(in);
          if (f == null) break;
          if (f.code() == Wire.ST_NOTICE) {
            notice(f);
          } else if (f.id() == 1) {
            // SUBSCRIBE's answer: OK, observer loaded, covered.
            subscribed.complete(f.code() == Wire.ST_OK);
          } else {
            Long sent = pings.remove(f.id());
            if (sent != null && f.code() == Wire.ST_OK) {
              leaseUntilNs.accumulateAndGet(sent + TimeUnit.MILLISECONDS.toNanos(linkLeaseMs), Math::max);
            }
          }
        }
      } catch (IOException | Wire.ProtocolException e) {
        why = e.toString();
      }
      subscribed.complete(false);
      close(why);
    }

    private void notice(Wire.Frame f) throws Wire.ProtocolException {
      Wire.Reader r = new Wire.Reader(f.payload());
      int kind = r.u8();
      byte[] table = r.bytes();
      int n = r.count();
      List<byte[]> rows = new ArrayList<>(n);
      for (int i = 0; i < n; i++) rows.add(r.bytes());
      r.end();
      int id = f.id();
      if (kind == Wire.NOTICE_BEGIN) {
        // On its own thread: the hub waits for the daemons' ACKs while more notices arrive.
        relay.execute(() -> {
          try {
            Invalidations.Notice mine = hub.begin(table, rows);
            open.put(id, mine);
            write(new Wire.Writer(id, Wire.OP_NOTICE_ACK).finish());
          } catch (IOException e) {
            // No ACK: the observer drops this link and holds its writes for our lease.
            close("relaying a notice failed: " + e);
          }
        });
      } else if (kind == Wire.NOTICE_END) {
        hub.end(open.remove(id));
      }
    }

    /** Ends the link; coverage is lost first, then the relayed notices without END are ended. */
    void close(String why) {
      synchronized (this) {
        if (dead) return;
        dead = true;
      }
      links.remove(server, this);
      if (established) {
        System.err.println("slipstream sidecar: subscription to " + server + " ended: " + why);
        setCoverage(false, System.nanoTime());
      }
      try {
        if (socket != null) socket.close();
      } catch (IOException e) {
        // Already closed.
      }
      // Their ENDs will not come; the daemons' connections are closed already (flush).
      for (Integer id : new ArrayList<>(open.keySet())) hub.end(open.remove(id));
    }
  }

  @Override
  public void close() {
    closed = true;
    // Daemons first: they must stop serving before the observers stop counting this sidecar.
    setCoverage(false, System.nanoTime());
    hub.dropAll(false);
    for (Link l : new ArrayList<>(links.values())) l.close("sidecar closing");
    relay.shutdownNow();
    reconnectZk();
  }
}
