// SegmentInput: an InputStream over one map output's segments of one partition, read in place
// from the mapped blocks (the deserializer reads the pool's memory; nothing is copied first).
package io.slipstream.spark.shuffle;

import java.io.InputStream;
import java.nio.ByteBuffer;
import java.util.List;

final class SegmentInput extends InputStream {
    private final List<ByteBuffer> parts;
    private int i;

    SegmentInput(List<ByteBuffer> parts) {
        this.parts = parts;
    }

    private ByteBuffer current() {
        while (i < parts.size() && !parts.get(i).hasRemaining()) {
            i++;
        }
        return i < parts.size() ? parts.get(i) : null;
    }

    @Override
    public int read() {
        ByteBuffer b = current();
        return b == null ? -1 : b.get() & 0xff;
    }

    @Override
    public int read(byte[] dst, int off, int len) {
        if (len == 0) {
            return 0;
        }
        ByteBuffer b = current();
        if (b == null) {
            return -1;
        }
        int n = Math.min(len, b.remaining());
        b.get(dst, off, n);
        return n;
    }

    @Override
    public int available() {
        ByteBuffer b = current();
        return b == null ? 0 : b.remaining();
    }
}
