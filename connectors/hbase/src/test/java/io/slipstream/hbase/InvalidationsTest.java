package io.slipstream.hbase;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

/** The invalidation hub without HBase: ACK waits, timeouts with the lease hold, subscribe waits. */
class InvalidationsTest {
  static class FakeSub implements Invalidations.Subscriber {
    final List<byte[]> frames = new CopyOnWriteArrayList<>();
    volatile boolean closed;
    public boolean send(byte[] frame) { frames.add(frame); return true; }
    public void close() { closed = true; }
    public int leaseMs() { return 300; }
  }

  private static List<byte[]> rows(String... r) {
    return java.util.Arrays.stream(r).map(s -> s.getBytes(StandardCharsets.UTF_8)).toList();
  }

  @Test
  void ackReleasesTheWrite() throws Exception {
    Invalidations hub = new Invalidations();
    FakeSub s = new FakeSub();
    assertTrue(hub.subscribe(s, 1000));
    Thread acker = new Thread(() -> {
      for (int i = 0; i < 200 && s.frames.isEmpty(); i++) {
        try { Thread.sleep(5); } catch (InterruptedException e) { return; }
      }
      ByteBuffer f = ByteBuffer.wrap(s.frames.get(0));
      assertEquals(Wire.ST_NOTICE, f.get(8) & 0xff);
      hub.ack(s, f.getInt(4));
    });
    acker.start();
    long t0 = System.nanoTime();
    Invalidations.Notice n = hub.begin("t".getBytes(StandardCharsets.UTF_8), rows("a", "b"));
    assertTrue(System.nanoTime() - t0 < TimeUnit.MILLISECONDS.toNanos(1500), "released by the ACK");
    acker.join();
    hub.end(n);
    assertEquals(2, s.frames.size(), "BEGIN then END");
    assertFalse(s.closed);
  }

  @Test
  void silentSubscriberIsDroppedAndWritesWaitOutItsLease() throws Exception {
    Invalidations hub = new Invalidations();
    hub.setAckTimeoutMs(200);
    FakeSub s = new FakeSub();
    assertTrue(hub.subscribe(s, 1000));
    long t0 = System.nanoTime();
    hub.end(hub.begin("t".getBytes(StandardCharsets.UTF_8), rows("a")));
    long ms = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - t0);
    assertTrue(ms >= 200 + 300 - 20, "ACK timeout + lease, was " + ms);
    assertTrue(s.closed);
    // Dropped: the next write is not held for it any more (after the quarantine ended).
    long t1 = System.nanoTime();
    hub.end(hub.begin("t".getBytes(StandardCharsets.UTF_8), rows("a")));
    assertTrue(System.nanoTime() - t1 < TimeUnit.MILLISECONDS.toNanos(150));
  }

  @Test
  void aNewSubscriberWaitsForWritesThatBeganBeforeIt() throws Exception {
    Invalidations hub = new Invalidations();
    Invalidations.Notice n = hub.begin("t".getBytes(StandardCharsets.UTF_8), rows("a"));
    FakeSub s = new FakeSub();
    CompletableFuture<Boolean> done = new CompletableFuture<>();
    new Thread(() -> {
      try {
        done.complete(hub.subscribe(s, 5000));
      } catch (Exception e) {
        done.completeExceptionally(e);
      }
    }).start();
    Thread.sleep(200);
    assertFalse(done.isDone(), "must wait for the write that did not notify it");
    hub.end(n);
    assertTrue(done.get(2, TimeUnit.SECONDS));
    assertTrue(s.frames.isEmpty(), "no END for a BEGIN it never got");
  }

  /** A region server's first region: its writes wait out the start hold (ObserverHub). */
  @Test
  void aStartHoldDelaysWrites() throws Exception {
    Invalidations hub = new Invalidations();
    hub.hold(300);
    long t0 = System.nanoTime();
    hub.end(hub.begin("t".getBytes(StandardCharsets.UTF_8), rows("a")));
    long ms = TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - t0);
    assertTrue(ms >= 280, "held, was " + ms);
  }

  /** SUSPEND / RESUME reach every subscriber as notices; one that cannot be written is dropped. */
  @Test
  void coverageIsAnnouncedToEverySubscriber() throws Exception {
    Invalidations hub = new Invalidations();
    FakeSub a = new FakeSub();
    FakeSub broken = new FakeSub() {
      @Override
      public boolean send(byte[] frame) { return false; }
    };
    assertTrue(hub.subscribe(a, 1000));
    assertTrue(hub.subscribe(broken, 1000));
    hub.announceCoverage(false);
    hub.announceCoverage(true);
    assertEquals(2, a.frames.size());
    for (int i = 0; i < 2; i++) {
      ByteBuffer f = ByteBuffer.wrap(a.frames.get(i));
      assertEquals(Wire.ST_NOTICE, f.get(8) & 0xff);
      assertEquals(i == 0 ? Wire.NOTICE_SUSPEND : Wire.NOTICE_RESUME, f.get(9) & 0xff);
    }
    assertTrue(broken.closed, "dropped");
    assertFalse(a.closed);
  }
}
