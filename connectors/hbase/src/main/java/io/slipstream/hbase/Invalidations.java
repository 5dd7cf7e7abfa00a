package io.slipstream.hbase;

import java.io.IOException;
import java.io.InterruptedIOException;
import java.util.ArrayList;
import java.util.List;
import java.util.Set;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * A hub between writes about to be applied and the subscribers that must invalidate first. Two
 * kinds: {@link #HUB}, the sidecar's hub, to which the Slipstream daemons subscribe (in the mini
 * cluster's default mode the {@link InvalidationObserver} of every region server in the same JVM
 * reports straight to it; in front of a real cluster {@link ObserverLinks} relays every region
 * server's notices into it); and one per region server ({@link ObserverHub}), to which the
 * sidecars subscribe over TCP. A write's BEGIN notice is sent to every subscriber
 * and the write waits for every ACK (Slipstream has invalidated the rows by then); END follows once
 * the write is visible. A subscriber that does not ACK within {@link #ackTimeoutMs} is dropped
 * (its connection closed) and every write then waits out its lease, after which that daemon serves
 * nothing from its cache until it has re-subscribed and flushed (docs/hbase-sidecar-protocol.md,
 * "Invalidation notices"). Not for: deciding what to invalidate (Slipstream's cache does that).
 */
public final class Invalidations {
  /** The one hub of this JVM. */
  public static final Invalidations HUB = new Invalidations();

  /** Longest lease a subscriber may ask for (bounds how long a write can be held). */
  static final int LEASE_MS_MAX = 60_000;

  /** A subscribed Slipstream connection. */
  public interface Subscriber {
    /** Writes one frame; false if the connection is gone. */
    boolean send(byte[] frame);
    /** Closes the connection (the daemon sees it end and flushes its cache). */
    void close();
    int leaseMs();
    /** Tells the subscriber whether its answers vouch for its cache now ({@code frame}: the notice). */
    default boolean coverage(boolean covered, byte[] frame) { return send(frame); }
  }

  /** A BEGIN in flight: who got it and who has not acknowledged it yet. */
  public static final class Notice {
    final int id;
    final List<Subscriber> sentTo = new ArrayList<>();
    final Set<Subscriber> pending = ConcurrentHashMap.newKeySet();
    Notice(int id) { this.id = id; }
  }

  private final CopyOnWriteArrayList<Subscriber> subs = new CopyOnWriteArrayList<>();
  private final ConcurrentHashMap<Integer, Notice> waiting = new ConcurrentHashMap<>();
  /** Writes between begin and end (whoever was subscribed when they began). */
  private final Set<Notice> active = ConcurrentHashMap.newKeySet();
  private final AtomicInteger nextId = new AtomicInteger(1);
  private final Object lock = new Object();
  /** Until then (System.nanoTime) writes wait: a dropped daemon's lease may still be running. */
  private volatile long quarantineUntilNs = System.nanoTime();
  private volatile boolean observerLoaded;
  volatile int ackTimeoutMs = 2000;

  Invalidations() {}

  void setAckTimeoutMs(int ms) { ackTimeoutMs = Math.max(1, ms); }

  /** Called by each observer instance as its region opens. */
  void observerLoaded() { observerLoaded = true; }

  /** Writes wait at least {@code ms} from now (a region server's start: see {@link ObserverHub}). */
  void hold(long ms) {
    long until = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(ms);
    synchronized (lock) {
      if (until - quarantineUntilNs > 0) quarantineUntilNs = until;
    }
  }

  /** SUSPEND or RESUME to every subscriber (a subscriber that cannot be written to is dropped). */
  void announceCoverage(boolean covered) {
    byte[] frame = new Wire.Writer(0, Wire.ST_NOTICE).u8(covered ? Wire.NOTICE_RESUME : Wire.NOTICE_SUSPEND)
        .bytes(new byte[0]).i32(0).finish();
    for (Subscriber s : subs) {
      if (!s.coverage(covered, frame)) drop(s, true);
    }
  }

  /** Drops every subscriber (their connections close; see {@link #drop}). */
  void dropAll(boolean holdWrites) {
    for (Subscriber s : subs) drop(s, holdWrites);
  }

  boolean isObserverLoaded() { return observerLoaded; }

  /**
   * Adds a subscriber, then waits (up to {@code waitMs}) until every write that began before it
   * was added has ended: those writes did not notify it, so a fill it makes from now on could
   * otherwise read a value they are about to replace. Returns false on timeout (the caller
   * refuses the subscription).
   */
  public boolean subscribe(Subscriber s, long waitMs) throws InterruptedIOException {
    subs.add(s);
    List<Notice> before = new ArrayList<>(active);
    long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(waitMs);
    synchronized (lock) {
      while (before.stream().anyMatch(active::contains)) {
        long left = deadline - System.nanoTime();
        if (left <= 0) {
          subs.remove(s);
          return false;
        }
        try {
          TimeUnit.NANOSECONDS.timedWait(lock, Math.min(left, TimeUnit.MILLISECONDS.toNanos(50)));
        } catch (InterruptedException e) {
          Thread.currentThread().interrupt();
          subs.remove(s);
          throw new InterruptedIOException("interrupted while subscribing");
        }
      }
    }
    return true;
  }

  /**
   * Forgets a subscriber. {@code holdWrites}: the sidecar gave up on it (no ACK, write failed)
   * while it may still be serving, so writes wait until its lease has run out. A connection the
   * daemon closed itself needs no wait: Slipstream ends its lease before its socket closes.
   */
  public void drop(Subscriber s, boolean holdWrites) {
    if (!subs.remove(s)) return;
    s.close();
    if (holdWrites) {
      long until = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(s.leaseMs());
      synchronized (lock) {
        if (until - quarantineUntilNs > 0) quarantineUntilNs = until;
      }
    }
    for (Notice n : waiting.values()) {
      if (n.pending.remove(s)) wake();
    }
  }

  /** Slipstream acknowledged notice {@code id}. */
  public void ack(Subscriber s, int id) {
    Notice n = waiting.get(id);
    if (n != null && n.pending.remove(s)) wake();
  }

  private void wake() {
    synchronized (lock) { lock.notifyAll(); }
  }

  private void waitQuarantine() throws InterruptedIOException {
    // Bounded: the quarantine ends at most LEASE_MS_MAX after the last drop.
    for (int i = 0; i < 10_000; i++) {
      long left = quarantineUntilNs - System.nanoTime();
      if (left <= 0) return;
      try {
        TimeUnit.NANOSECONDS.sleep(Math.min(left, TimeUnit.MILLISECONDS.toNanos(50)));
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        throw new InterruptedIOException("interrupted while a Slipstream lease runs out");
      }
    }
  }

  /**
   * Before a write to {@code rows} of {@code table} (empty = the whole table) is applied: every
   * subscriber has invalidated them when this returns (or has been dropped and its lease has run
   * out). Returns the notice to pass to {@link #end} (always, also when nobody is subscribed: a
   * subscriber that arrives meanwhile waits for it).
   */
  public Notice begin(byte[] table, List<byte[]> rows) throws IOException {
    waitQuarantine();
    int id = nextId.getAndIncrement();
    if (id == 0) id = nextId.getAndIncrement();
    Notice n = new Notice(id);
    // Active before the subscriber snapshot below: a subscriber added after the snapshot sees
    // this notice in `active` and waits for its end.
    active.add(n);
    if (subs.isEmpty()) return n;
    Wire.Writer w = new Wire.Writer(id, Wire.ST_NOTICE).u8(Wire.NOTICE_BEGIN).bytes(table).i32(rows.size());
    for (byte[] r : rows) w.bytes(r);
    byte[] frame = w.finish();
    waiting.put(id, n);
    try {
      for (Subscriber s : subs) {
        n.sentTo.add(s);
        n.pending.add(s);
      }
      for (Subscriber s : n.sentTo) {
        if (!s.send(frame)) drop(s, true);
      }
      long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(ackTimeoutMs);
      synchronized (lock) {
        while (!n.pending.isEmpty()) {
          long left = deadline - System.nanoTime();
          if (left <= 0) break;
          try {
            TimeUnit.NANOSECONDS.timedWait(lock, left);
          } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new InterruptedIOException("interrupted while Slipstream invalidates");
          }
        }
      }
      for (Subscriber s : new ArrayList<>(n.pending)) {
        System.err.println("slipstream invalidation: no ack within " + ackTimeoutMs
            + " ms; dropping the subscriber (its cache is flushed)");
        drop(s, true);
      }
    } finally {
      waiting.remove(id);
    }
    // A drop above (or a concurrent one) holds writes until that daemon's lease has run out.
    waitQuarantine();
    return n;
  }

  /** After the write is visible (or failed): lets the subscribers cache this table again. */
  public void end(Notice n) {
    if (n == null) return;
    active.remove(n);
    wake();
    byte[] frame = new Wire.Writer(n.id, Wire.ST_NOTICE).u8(Wire.NOTICE_END).bytes(new byte[0]).i32(0).finish();
    for (Subscriber s : n.sentTo) {
      if (subs.contains(s) && !s.send(frame)) drop(s, true);
    }
  }
}
