// SegmentInput: an InputStream over one map output's segments of one partition, read in place
// from the mapped blocks (the deserializer reads the pool's memory; nothing is copied first).
// The current buffer is kept in a field: Java's serializer reads object headers a byte at a
// time, so the one-byte path must be short.
package io.slipstream.spark.shuffle;

import java.io.InputStream;
import java.nio.ByteBuffer;
import java.util.List;

final class SegmentInput extends InputStream {
    private final List<ByteBuffer> parts;
    private int next;
    private ByteBuffer cur;

    SegmentInput(List<ByteBuffer> parts) {
        this.parts = parts;
    }

    /** The buffer with bytes left, or null at the end. */
    private ByteBuffer advance() {
        while (next < parts.size()) {
            cur = parts.get(next++);
            if (cur.hasRemaining()) {
                return cur;
            }
        }
        cur = null;
        return null;
    }

    @Override
    public int read() {
        ByteBuffer b = cur;
        if (b == null || !b.hasRemaining()) {
            b = advance();
            if (b == null) {
                return -1;
            }
        }
        return b.get() & 0xff;
    }

    @Override
    public int read(byte[] dst, int off, int len) {
        if (len == 0) {
            return 0;
        }
        ByteBuffer b = cur;
        if (b == null || !b.hasRemaining()) {
            b = advance();
            if (b == null) {
                return -1;
            }
        }
        int n = Math.min(len, b.remaining());
        b.get(dst, off, n);
        return n;
    }

    @Override
    public int available() {
        return cur == null ? 0 : cur.remaining();
    }
}
