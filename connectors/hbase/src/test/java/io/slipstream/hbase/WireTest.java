package io.slipstream.hbase;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.io.ByteArrayInputStream;
import java.io.DataInputStream;
import java.nio.ByteBuffer;
import org.junit.jupiter.api.Test;

/** The sidecar codec without HBase: framing, bounds checks, count patching. */
class WireTest {
  private static DataInputStream in(byte[] b) { return new DataInputStream(new ByteArrayInputStream(b)); }

  @Test
  void frameRoundTrip() throws Exception {
    Wire.Writer w = new Wire.Writer(42, Wire.ST_OK);
    w.bytes("row".getBytes()).i64(7).bool(true);
    Wire.Frame f = Wire.readFrame(in(w.finish()));
    assertEquals(42, f.id());
    assertEquals(Wire.ST_OK, f.code());
    Wire.Reader r = new Wire.Reader(f.payload());
    assertArrayEquals("row".getBytes(), r.bytes());
    assertEquals(7, r.i64());
    assertEquals(true, r.bool());
    r.end();
    assertNull(Wire.readFrame(in(new byte[0])));
  }

  @Test
  void patchedCountIsWritten() throws Exception {
    Wire.Writer w = new Wire.Writer(1, Wire.ST_OK);
    int at = w.size();
    w.i32(0).bytes(new byte[] {1}).bytes(new byte[] {2});
    w.patchI32(at, 2);
    Wire.Reader r = new Wire.Reader(Wire.readFrame(in(w.finish())).payload());
    assertEquals(2, r.count());
  }

  @Test
  void hostileLengthsAreProtocolErrors() {
    // Frame length over the limit, and under the header size.
    assertThrows(Wire.ProtocolException.class, () -> Wire.readFrame(in(new byte[] {0x7f, -1, -1, -1})));
    assertThrows(Wire.ProtocolException.class, () -> Wire.readFrame(in(new byte[] {0, 0, 0, 2, 0, 0})));
    // A byte string or list claiming more than the payload holds.
    ByteBuffer huge = ByteBuffer.wrap(new byte[] {0x7f, -1, -1, -1});
    assertThrows(Wire.ProtocolException.class, () -> new Wire.Reader(huge.duplicate()).bytes());
    assertThrows(Wire.ProtocolException.class, () -> new Wire.Reader(huge.duplicate()).count());
    ByteBuffer negative = ByteBuffer.wrap(new byte[] {-1, -1, -1, -1});
    assertThrows(Wire.ProtocolException.class, () -> new Wire.Reader(negative).bytes());
  }
}
