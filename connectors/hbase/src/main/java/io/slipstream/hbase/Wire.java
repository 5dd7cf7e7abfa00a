package io.slipstream.hbase;

import java.io.ByteArrayOutputStream;
import java.io.DataInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;

/**
 * The sidecar wire codec (docs/hbase-sidecar-protocol.md): frame reading with a size limit,
 * a bounds-checked payload reader and a payload writer. No HBase types here.
 */
public final class Wire {
  private Wire() {}

  /** Largest frame either side accepts (the spec's limit). */
  public static final int FRAME_BYTES_MAX = 64 << 20;

  // Operations.
  public static final int OP_PING = 0x01, OP_LIST_TABLES = 0x02, OP_DESCRIBE = 0x03,
      OP_CREATE_TABLE = 0x04, OP_DELETE_TABLE = 0x05, OP_ENABLE_TABLE = 0x06,
      OP_DISABLE_TABLE = 0x07, OP_IS_ENABLED = 0x08, OP_GET = 0x10, OP_SCAN = 0x11,
      OP_MUTATE = 0x12, OP_DELETE = 0x13, OP_INCREMENT = 0x14, OP_SUBSCRIBE = 0x20,
      OP_NOTICE_ACK = 0x21;
  // Statuses.
  public static final int ST_OK = 0x00, ST_IO_ERROR = 0x01, ST_ILLEGAL_ARGUMENT = 0x02,
      ST_ALREADY_EXISTS = 0x03, ST_PROTOCOL = 0x04;
  /** Sidecar-initiated invalidation notice (not an answer; the id is the notice's own). */
  public static final int ST_NOTICE = 0x10;
  public static final int NOTICE_BEGIN = 1, NOTICE_END = 2;
  /** Coverage changed (a sidecar in front of a real cluster; docs/hbase-sidecar-protocol.md). */
  public static final int NOTICE_SUSPEND = 3, NOTICE_RESUME = 4;

  /** A frame that breaks the spec; the connection is closed after answering it. */
  public static final class ProtocolException extends Exception {
    public ProtocolException(String m) { super(m); }
  }

  /** One decoded frame: id, code and the payload (not yet parsed). */
  public record Frame(int id, int code, ByteBuffer payload) {}

  /** Reads one frame; null on a clean end of stream before a frame starts. */
  public static Frame readFrame(DataInputStream in) throws IOException, ProtocolException {
    int b0 = in.read();
    if (b0 < 0) return null;
    int len = (b0 << 24) | (in.readUnsignedByte() << 16) | (in.readUnsignedByte() << 8)
        | in.readUnsignedByte();
    if (len < 5 || len > FRAME_BYTES_MAX) throw new ProtocolException("bad frame length " + len);
    byte[] body = new byte[len];
    in.readFully(body);
    ByteBuffer bb = ByteBuffer.wrap(body);
    int id = bb.getInt();
    int code = bb.get() & 0xff;
    return new Frame(id, code, bb.slice());
  }

  /** Bounds-checked reads from a payload; any overrun is a ProtocolException. */
  public static final class Reader {
    private final ByteBuffer b;
    public Reader(ByteBuffer b) { this.b = b; }

    private void need(long n) throws ProtocolException {
      if (n < 0 || n > b.remaining()) throw new ProtocolException("truncated payload");
    }
    public int u8() throws ProtocolException { need(1); return b.get() & 0xff; }
    public boolean bool() throws ProtocolException { return u8() != 0; }
    public int i32() throws ProtocolException { need(4); return b.getInt(); }
    public long i64() throws ProtocolException { need(8); return b.getLong(); }
    /** A list count: at most one element per remaining byte, so no huge allocations. */
    public int count() throws ProtocolException {
      int n = i32();
      need(Integer.toUnsignedLong(n));
      return n;
    }
    public byte[] bytes() throws ProtocolException {
      int n = i32();
      need(Integer.toUnsignedLong(n));
      byte[] out = new byte[n];
      b.get(out);
      return out;
    }
    public String str() throws ProtocolException { return new String(bytes(), StandardCharsets.UTF_8); }
    public void end() throws ProtocolException {
      if (b.hasRemaining()) throw new ProtocolException("trailing bytes in payload");
    }
  }

  /** Builds one response frame. */
  public static final class Writer {
    private final ByteArrayOutputStream out = new ByteArrayOutputStream(256);
    private final java.util.List<int[]> patches = new java.util.ArrayList<>();

    public Writer(int id, int status) { i32(0); i32(id); u8(status); }
    public Writer u8(int v) { out.write(v); return this; }
    public Writer bool(boolean v) { return u8(v ? 1 : 0); }
    public Writer i32(int v) {
      out.write(v >>> 24); out.write(v >>> 16); out.write(v >>> 8); out.write(v);
      return this;
    }
    public Writer i64(long v) { i32((int) (v >>> 32)); return i32((int) v); }
    public Writer bytes(byte[] v) { i32(v.length); out.write(v, 0, v.length); return this; }
    public Writer bytes(byte[] v, int off, int len) { i32(len); out.write(v, off, len); return this; }
    public Writer str(String s) { return bytes(s.getBytes(StandardCharsets.UTF_8)); }
    public int size() { return out.size(); }
    /** Overwrites the i32 at frame offset {@code at} (a count known only after the items). */
    public void patchI32(int at, int v) { patches.add(new int[] {at, v}); }
    /** The finished frame with its length filled in. */
    public byte[] finish() {
      byte[] f = out.toByteArray();
      ByteBuffer bb = ByteBuffer.wrap(f);
      bb.putInt(0, f.length - 4);
      for (int[] p : patches) bb.putInt(p[0], p[1]);
      return f;
    }
  }

  /** Reads exactly one frame's worth from a stream that may deliver it in pieces. */
  public static DataInputStream data(InputStream in) { return new DataInputStream(in); }
}
