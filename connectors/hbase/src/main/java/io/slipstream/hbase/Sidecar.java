package io.slipstream.hbase;

import java.io.BufferedOutputStream;
import java.io.DataInputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.Socket;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.hadoop.hbase.Cell;
import org.apache.hadoop.hbase.CellUtil;
import org.apache.hadoop.hbase.DoNotRetryIOException;
import org.apache.hadoop.hbase.HConstants;
import org.apache.hadoop.hbase.TableExistsException;
import org.apache.hadoop.hbase.TableName;
import org.apache.hadoop.hbase.client.Admin;
import org.apache.hadoop.hbase.client.ColumnFamilyDescriptor;
import org.apache.hadoop.hbase.client.ColumnFamilyDescriptorBuilder;
import org.apache.hadoop.hbase.client.Connection;
import org.apache.hadoop.hbase.client.Delete;
import org.apache.hadoop.hbase.client.Durability;
import org.apache.hadoop.hbase.client.Get;
import org.apache.hadoop.hbase.client.Put;
import org.apache.hadoop.hbase.client.Result;
import org.apache.hadoop.hbase.client.ResultScanner;
import org.apache.hadoop.hbase.client.Scan;
import org.apache.hadoop.hbase.client.Table;
import org.apache.hadoop.hbase.client.TableDescriptorBuilder;
import org.apache.hadoop.hbase.filter.ParseFilter;
import org.apache.hadoop.hbase.io.compress.Compression;
import org.apache.hadoop.hbase.regionserver.BloomType;

/**
 * The sidecar server: accepts Slipstream's connections on loopback and carries each request of
 * docs/hbase-sidecar-protocol.md to HBase through one shared native client {@link Connection}.
 * Requests run on a bounded pool and are answered as they finish (multiplexed by request id).
 * Column and timestamp semantics mirror HBase's own Thrift1 server (ThriftHBaseServiceHandler).
 *
 * <p>The same server without an HBase connection is a region server's observer listener
 * ({@link ObserverHub}): it answers only PING, SUBSCRIBE and NOTICE_ACK, for the sidecars.
 */
public final class Sidecar implements AutoCloseable {
  /** Requests served at once; more wait in the pool's queue. */
  private static final int WORKERS = 16;
  /** How long SUBSCRIBE waits for writes that began before it to end. */
  private static final long SUBSCRIBE_WAIT_MS = 10_000;

  private final Connection hbase;
  private final Invalidations hub;
  private final Gate gate;
  /** The peer's end of a subscribed connection holds writes for its lease (see {@link #serve}). */
  private final boolean holdOnClose;
  private final ServerSocket listener;
  private final ExecutorService pool = Executors.newFixedThreadPool(WORKERS, daemonThreads("sidecar-worker"));
  private volatile boolean closed;

  /** The sidecar of the mini cluster's default mode: loopback, the JVM's hub, always covered. */
  public Sidecar(Connection hbase, int port) throws IOException {
    this(hbase, Invalidations.HUB, null, false, new InetSocketAddress(InetAddress.getLoopbackAddress(), port));
  }

  /**
   * {@code hbase} null = a region server's observer listener. {@code gate} null = always covered.
   * {@code holdOnClose}: a subscriber whose connection ends holds writes for its lease (a sidecar
   * going away may leave daemons serving until their own leases run out).
   */
  Sidecar(Connection hbase, Invalidations hub, Gate gate, boolean holdOnClose, InetSocketAddress bind)
      throws IOException {
    this.hbase = hbase;
    this.hub = hub;
    this.gate = gate;
    this.holdOnClose = holdOnClose;
    this.listener = new ServerSocket();
    listener.setReuseAddress(true);
    listener.bind(bind);
  }

  public int port() { return listener.getLocalPort(); }

  /** Starts the accept loop on a daemon thread. */
  public void start() {
    Thread t = new Thread(this::acceptLoop, "sidecar-accept");
    t.setDaemon(true);
    t.start();
  }

  private void acceptLoop() {
    while (!closed) {
      try {
        Socket s = listener.accept();
        s.setTcpNoDelay(true);
        Thread t = new Thread(() -> serve(s), "sidecar-conn-" + s.getPort());
        t.setDaemon(true);
        t.start();
      } catch (IOException e) {
        if (!closed) System.err.println("sidecar: accept failed: " + e);
      }
    }
  }

  /** One connection's writer side: answers are written under the stream's lock. */
  private final class Out {
    final OutputStream out;
    final AtomicInteger inFlight = new AtomicInteger();
    /** Set once the connection has subscribed. */
    volatile Sub sub;

    Out(OutputStream out) { this.out = out; }
  }

  /** One connection: read frames, run each on the pool, write answers under the stream's lock. */
  private void serve(Socket s) {
    Sub sub = null;
    try (s) {
      DataInputStream in = Wire.data(new java.io.BufferedInputStream(s.getInputStream(), 1 << 16));
      Out out = new Out(new BufferedOutputStream(s.getOutputStream(), 1 << 16));
      AtomicInteger inFlight = out.inFlight;
      while (true) {
        Wire.Frame f;
        try {
          f = Wire.readFrame(in);
        } catch (Wire.ProtocolException e) {
          send(out, new Wire.Writer(0, Wire.ST_PROTOCOL).str(e.getMessage()).finish());
          return;
        }
        if (f == null) return;
        // PING, SUBSCRIBE and NOTICE_ACK are answered here, never queued behind HBase calls: a
        // write in the region server may be waiting for exactly this ACK, and PINGs keep the
        // daemon's lease (its permission to serve from its cache) alive.
        if (f.code() == Wire.OP_NOTICE_ACK) {
          if (sub != null) hub.ack(sub, f.id());
          continue;
        }
        inFlight.incrementAndGet();
        if (f.code() == Wire.OP_PING) {
          send(out, answer(f));
        } else if (f.code() == Wire.OP_SUBSCRIBE) {
          Wire.Reader r = new Wire.Reader(f.payload());
          try {
            int leaseMs = r.i32();
            r.end();
            if (leaseMs < 1 || leaseMs > Invalidations.LEASE_MS_MAX) {
              throw new Wire.ProtocolException("lease_ms out of range: " + leaseMs);
            }
            if (gate != null && leaseMs > gate.leaseMsMax()) {
              send(out, new Wire.Writer(f.id(), Wire.ST_IO_ERROR).str("lease_ms " + leaseMs
                  + " is above this sidecar's --lease-ms-max " + gate.leaseMsMax()).bool(false).finish());
              continue;
            }
            if (sub == null) {
              Sub candidate = new Sub(s, out.out, leaseMs);
              if (!hub.subscribe(candidate, SUBSCRIBE_WAIT_MS)) {
                send(out, new Wire.Writer(f.id(), Wire.ST_IO_ERROR)
                    .str("writes in progress did not finish; subscribe again").bool(true).finish());
                continue;
              }
              sub = candidate;
            }
            if (gate == null) {
              sub.covered = true;
              out.sub = sub;
              send(out, new Wire.Writer(f.id(), Wire.ST_OK).bool(hub.isObserverLoaded()).bool(true).finish());
            } else {
              // Read and answered under the gate's lock, after joining the hub: every later
              // change reaches this connection as a notice after this answer.
              synchronized (gate.lock()) {
                boolean covered = gate.covered();
                sub.covered = covered;
                out.sub = sub;
                send(out, new Wire.Writer(f.id(), Wire.ST_OK).bool(covered).bool(covered).finish());
              }
            }
          } catch (Wire.ProtocolException e) {
            send(out, new Wire.Writer(f.id(), Wire.ST_PROTOCOL).str(e.getMessage()).finish());
            return;
          }
        } else {
          pool.execute(() -> send(out, answer(f)));
        }
      }
    } catch (IOException e) {
      // The peer went away; nothing to answer.
    } finally {
      // The daemon closed the connection (or it broke after the hub closed it). A sidecar
      // subscribed to a region server's observer may leave daemons serving behind it
      // (holdOnClose); a daemon ends its own lease before it closes.
      if (sub != null) hub.drop(sub, holdOnClose);
    }
  }

  /**
   * Whether the subscribers of this sidecar may serve from their caches: in front of a real
   * cluster only while every live region server's observer is subscribed ({@link ObserverLinks}).
   * SUBSCRIBE answers {@code covered}; every change is announced to every subscriber (SUSPEND /
   * RESUME notices, {@link Invalidations#announceCoverage}) under {@link #lock}, under which
   * SUBSCRIBE also reads and answers, so a connection's stream always ends on its current state.
   */
  interface Gate {
    Object lock();
    /** Covered now (read under {@link #lock}). */
    boolean covered();
    /** Still covered by time too (checked before every answer on a covered connection). */
    boolean stillCovered();
    /** Coverage ran out by time: announce SUSPEND (returns once announced). */
    void lapse();
    /** Longest lease a daemon may ask for (the region servers hold writes on that basis). */
    int leaseMsMax();
  }

  /** A subscribed Slipstream connection: notices are written under the stream's lock. */
  private static final class Sub implements Invalidations.Subscriber {
    private final Socket socket;
    private final OutputStream out;
    private final int leaseMs;
    /** Answers vouch for the daemon's cache (see {@link Gate}); written with its notice. */
    volatile boolean covered;

    Sub(Socket socket, OutputStream out, int leaseMs) {
      this.socket = socket;
      this.out = out;
      this.leaseMs = leaseMs;
    }

    @Override
    public boolean send(byte[] frame) {
      synchronized (out) {
        try {
          out.write(frame);
          out.flush();
          return true;
        } catch (IOException e) {
          return false;
        }
      }
    }

    @Override
    public void close() {
      try {
        socket.shutdownInput();
        socket.shutdownOutput();
      } catch (IOException e) {
        // Already closed.
      }
      try {
        socket.close();
      } catch (IOException e) {
        // Already closed.
      }
    }

    @Override
    public int leaseMs() { return leaseMs; }

    @Override
    public boolean coverage(boolean c, byte[] frame) {
      synchronized (out) {
        covered = c;
        return send(frame);
      }
    }
  }

  private void send(Out o, byte[] frame) {
    Sub sub = o.sub;
    if (gate != null && sub != null && sub.covered && !gate.stillCovered()) {
      // This answer would extend the daemon's lease, but coverage ran out: SUSPEND goes first.
      gate.lapse();
    }
    synchronized (o.out) {
      try {
        o.out.write(frame);
        // Flush when nothing else is about to be written, so pipelined answers share writes.
        if (o.inFlight.decrementAndGet() <= 0) o.out.flush();
      } catch (IOException e) {
        // Connection gone; the reader side ends the connection.
      }
    }
  }

  /** Runs one request and encodes its answer (OK or a typed error). */
  byte[] answer(Wire.Frame f) {
    Wire.Reader r = new Wire.Reader(f.payload());
    try {
      Wire.Writer w = new Wire.Writer(f.id(), Wire.ST_OK);
      dispatch(f.code(), r, w);
      return w.finish();
    } catch (Wire.ProtocolException e) {
      return new Wire.Writer(f.id(), Wire.ST_PROTOCOL).str(e.getMessage()).finish();
    } catch (TableExistsException e) {
      return new Wire.Writer(f.id(), Wire.ST_ALREADY_EXISTS).str(message(e)).finish();
    } catch (IllegalArgumentException e) {
      return new Wire.Writer(f.id(), Wire.ST_ILLEGAL_ARGUMENT).str(message(e)).finish();
    } catch (IOException e) {
      boolean retry = !(e instanceof DoNotRetryIOException);
      return new Wire.Writer(f.id(), Wire.ST_IO_ERROR).str(message(e)).bool(retry).finish();
    } catch (RuntimeException e) {
      return new Wire.Writer(f.id(), Wire.ST_IO_ERROR).str(message(e)).bool(false).finish();
    }
  }

  private static String message(Throwable e) {
    String m = e.getMessage();
    return e.getClass().getName() + (m == null ? "" : ": " + firstLine(m));
  }

  private static String firstLine(String m) {
    int nl = m.indexOf('\n');
    return nl < 0 ? m : m.substring(0, nl);
  }

  private void dispatch(int op, Wire.Reader r, Wire.Writer w) throws IOException, Wire.ProtocolException {
    if (hbase == null && op != Wire.OP_PING) {
      throw new Wire.ProtocolException("a region server's observer answers only PING, SUBSCRIBE and NOTICE_ACK");
    }
    switch (op) {
      case Wire.OP_PING -> r.end();
      case Wire.OP_LIST_TABLES -> {
        r.end();
        try (Admin a = hbase.getAdmin()) {
          TableName[] names = a.listTableNames();
          w.i32(names.length);
          for (TableName n : names) w.bytes(n.getName());
        }
      }
      case Wire.OP_DESCRIBE -> describe(table(r), r, w);
      case Wire.OP_CREATE_TABLE -> createTable(table(r), r);
      case Wire.OP_DELETE_TABLE -> {
        TableName t = table(r);
        r.end();
        try (Admin a = hbase.getAdmin()) {
          if (!a.tableExists(t)) throw new IOException("table does not exist");
          a.deleteTable(t);
        }
      }
      case Wire.OP_ENABLE_TABLE, Wire.OP_DISABLE_TABLE -> {
        TableName t = table(r);
        r.end();
        try (Admin a = hbase.getAdmin()) {
          if (op == Wire.OP_ENABLE_TABLE) a.enableTable(t); else a.disableTable(t);
        }
      }
      case Wire.OP_IS_ENABLED -> {
        TableName t = table(r);
        r.end();
        try (Admin a = hbase.getAdmin()) { w.bool(a.isTableEnabled(t)); }
      }
      case Wire.OP_GET -> get(table(r), r, w);
      case Wire.OP_SCAN -> scan(table(r), r, w);
      case Wire.OP_MUTATE -> mutate(table(r), r);
      case Wire.OP_DELETE -> delete(table(r), r);
      case Wire.OP_INCREMENT -> {
        TableName t = table(r);
        byte[] row = r.bytes();
        byte[][] fq = CellUtil.parseColumn(r.bytes());
        long amount = r.i64();
        r.end();
        byte[] q = fq.length > 1 ? fq[1] : HConstants.EMPTY_BYTE_ARRAY;
        try (Table tb = hbase.getTable(t)) { w.i64(tb.incrementColumnValue(row, fq[0], q, amount)); }
      }
      default -> throw new Wire.ProtocolException("unknown operation " + op);
    }
  }

  private static TableName table(Wire.Reader r) throws Wire.ProtocolException {
    byte[] name = r.bytes();
    try {
      return TableName.valueOf(name);
    } catch (IllegalArgumentException e) {
      throw new IllegalArgumentException("invalid table name: " + e.getMessage(), e);
    }
  }

  private void describe(TableName t, Wire.Reader r, Wire.Writer w) throws IOException, Wire.ProtocolException {
    r.end();
    try (Admin a = hbase.getAdmin()) {
      ColumnFamilyDescriptor[] fams = a.getDescriptor(t).getColumnFamilies();
      w.i32(fams.length);
      for (ColumnFamilyDescriptor f : fams) {
        w.bytes(f.getName()).i32(f.getMaxVersions()).i32(f.getTimeToLive())
            .bool(f.isInMemory()).bool(f.isBlockCacheEnabled())
            .str(f.getCompressionType().toString()).str(f.getBloomFilterType().toString());
      }
    }
  }

  private void createTable(TableName t, Wire.Reader r) throws IOException, Wire.ProtocolException {
    int n = r.count();
    TableDescriptorBuilder td = TableDescriptorBuilder.newBuilder(t);
    for (int i = 0; i < n; i++) {
      byte[] name = r.bytes();
      int maxVersions = r.i32(), ttl = r.i32();
      boolean inMemory = r.bool(), blockCache = r.bool();
      String compression = r.str(), bloom = r.str();
      if (name.length == 0) throw new IllegalArgumentException("column name is empty");
      Compression.Algorithm comp =
          Compression.getCompressionAlgorithmByName(compression.toLowerCase(java.util.Locale.ROOT));
      td.setColumnFamily(ColumnFamilyDescriptorBuilder.newBuilder(CellUtil.parseColumn(name)[0])
          .setMaxVersions(maxVersions).setCompressionType(comp).setInMemory(inMemory)
          .setBlockCacheEnabled(blockCache).setTimeToLive(ttl > 0 ? ttl : Integer.MAX_VALUE)
          .setBloomFilterType(BloomType.valueOf(bloom)).build());
    }
    r.end();
    try (Admin a = hbase.getAdmin()) {
      if (a.tableExists(t)) throw new TableExistsException("table name already in use");
      a.createTable(td.build());
    }
  }

  /** The Read spec: columns, time range, versions (applies to Get and Scan alike). */
  private record ReadSpec(List<byte[][]> columns, long tsMin, long tsMax, int maxVersions) {}

  private static ReadSpec readSpec(Wire.Reader r) throws Wire.ProtocolException {
    int n = r.count();
    List<byte[][]> cols = new ArrayList<>(n);
    for (int i = 0; i < n; i++) cols.add(CellUtil.parseColumn(r.bytes()));
    long min = r.i64(), max = r.i64();
    int versions = r.i32();
    if (versions < 1) throw new IllegalArgumentException("max versions must be >= 1");
    return new ReadSpec(cols, min, max, versions);
  }

  private static void apply(ReadSpec s, Get g) throws IOException {
    for (byte[][] fq : s.columns()) {
      if (fq.length == 1) g.addFamily(fq[0]); else g.addColumn(fq[0], fq[1]);
    }
    g.setTimeRange(s.tsMin(), s.tsMax());
    g.readVersions(s.maxVersions());
  }

  private static void apply(ReadSpec s, Scan sc) throws IOException {
    for (byte[][] fq : s.columns()) {
      if (fq.length == 1) sc.addFamily(fq[0]); else sc.addColumn(fq[0], fq[1]);
    }
    sc.setTimeRange(s.tsMin(), s.tsMax());
    sc.readVersions(s.maxVersions());
  }

  private void get(TableName t, Wire.Reader r, Wire.Writer w) throws IOException, Wire.ProtocolException {
    int n = r.count();
    List<byte[]> rows = new ArrayList<>(n);
    for (int i = 0; i < n; i++) rows.add(r.bytes());
    ReadSpec spec = readSpec(r);
    r.end();
    List<Get> gets = new ArrayList<>(n);
    for (byte[] row : rows) {
      Get g = new Get(row);
      apply(spec, g);
      gets.add(g);
    }
    try (Table tb = hbase.getTable(t)) {
      Result[] res = tb.get(gets);
      w.i32(res.length);
      for (int i = 0; i < res.length; i++) writeRow(w, rows.get(i), res[i]);
    }
  }

  private void scan(TableName t, Wire.Reader r, Wire.Writer w) throws IOException, Wire.ProtocolException {
    byte[] start = r.bytes(), stop = r.bytes();
    ReadSpec spec = readSpec(r);
    String filter = r.str();
    int rowsMax = r.i32(), bytesMax = r.i32();
    r.end();
    if (rowsMax < 1 || bytesMax < 1) throw new IllegalArgumentException("scan limits must be >= 1");
    Scan sc = new Scan().withStartRow(start).withStopRow(stop);
    apply(spec, sc);
    if (!filter.isEmpty()) {
      try {
        sc.setFilter(new ParseFilter().parseFilterString(filter));
      } catch (java.nio.charset.CharacterCodingException e) {
        throw new IllegalArgumentException("bad filter string: " + e.getMessage());
      }
    }
    sc.setLimit(rowsMax);
    sc.setCaching(Math.min(rowsMax, 1000));
    int countAt = w.size();
    w.i32(0);
    int count = 0;
    boolean more = false;
    try (Table tb = hbase.getTable(t); ResultScanner rs = tb.getScanner(sc)) {
      for (Result res = rs.next(); res != null; res = rs.next()) {
        if (res.isEmpty()) continue;
        writeRow(w, res.getRow(), res);
        count++;
        if (count >= rowsMax || w.size() >= bytesMax) { more = true; break; }
      }
    }
    w.bool(more);
    w.patchI32(countAt, count);
  }

  private static void writeRow(Wire.Writer w, byte[] row, Result res) {
    w.bytes(row);
    Cell[] cells = res.rawCells();
    if (cells == null) { w.i32(0); return; }
    w.i32(cells.length);
    for (Cell c : cells) {
      w.bytes(c.getFamilyArray(), c.getFamilyOffset(), c.getFamilyLength());
      w.bytes(c.getQualifierArray(), c.getQualifierOffset(), c.getQualifierLength());
      w.i64(c.getTimestamp());
      w.bytes(c.getValueArray(), c.getValueOffset(), c.getValueLength());
    }
  }

  private void mutate(TableName t, Wire.Reader r) throws IOException, Wire.ProtocolException {
    int nRows = r.count();
    List<byte[]> rows = new ArrayList<>(nRows);
    List<List<Object[]>> muts = new ArrayList<>(nRows);
    for (int i = 0; i < nRows; i++) {
      rows.add(r.bytes());
      int n = r.count();
      List<Object[]> ms = new ArrayList<>(n);
      for (int j = 0; j < n; j++) {
        int kind = r.u8();
        byte[] col = r.bytes(), value = r.bytes();
        boolean wal = r.bool();
        if (kind > 1) throw new Wire.ProtocolException("bad mutation kind " + kind);
        ms.add(new Object[] {kind, col, value, wal});
      }
      muts.add(ms);
    }
    long ts = r.i64();
    int order = r.u8();
    r.end();
    List<Put> puts = new ArrayList<>();
    List<Delete> deletes = new ArrayList<>();
    try (Table tb = hbase.getTable(t)) {
      for (int i = 0; i < nRows; i++) {
        Delete d = new Delete(rows.get(i));
        Put p = new Put(rows.get(i), ts);
        for (Object[] m : muts.get(i)) {
          byte[][] fq = CellUtil.parseColumn((byte[]) m[1]);
          Durability dur = (Boolean) m[3] ? Durability.USE_DEFAULT : Durability.SKIP_WAL;
          if ((Integer) m[0] == 1) {
            if (fq.length == 1) d.addFamily(fq[0], ts); else d.addColumns(fq[0], fq[1], ts);
            d.setDurability(dur);
          } else if (fq.length > 1) {
            p.addColumn(fq[0], fq[1], ts, (byte[]) m[2]);
            p.setDurability(dur);
          }
          // A put without a qualifier is ignored, as HBase's Thrift1 server does.
        }
        if (order == 0) {
          if (!d.isEmpty()) tb.delete(d);
          if (!p.isEmpty()) tb.put(p);
        } else {
          if (!p.isEmpty()) puts.add(p);
          if (!d.isEmpty()) deletes.add(d);
        }
      }
      if (!puts.isEmpty()) tb.put(puts);
      if (!deletes.isEmpty()) tb.delete(deletes);
    }
  }

  private void delete(TableName t, Wire.Reader r) throws IOException, Wire.ProtocolException {
    byte[] row = r.bytes(), col = r.bytes();
    long ts = r.i64();
    r.end();
    Delete d;
    if (col.length == 0) {
      d = new Delete(row, ts);
    } else {
      d = new Delete(row);
      byte[][] fq = CellUtil.parseColumn(col);
      if (fq.length == 1) d.addFamily(fq[0], ts); else d.addColumns(fq[0], fq[1], ts);
    }
    try (Table tb = hbase.getTable(t)) { tb.delete(d); }
  }

  @Override
  public void close() throws IOException {
    closed = true;
    listener.close();
    pool.shutdownNow();
  }

  static java.util.concurrent.ThreadFactory daemonThreads(String prefix) {
    AtomicInteger n = new AtomicInteger();
    return r -> {
      Thread t = new Thread(r, prefix + "-" + n.incrementAndGet());
      t.setDaemon(true);
      return t;
    };
  }
}
