// PartitionOutput: the OutputStream a partition's serialization stream writes into: bytes go
// straight into chunks of mapped pool blocks (no heap buffer of ours in between). Chunks start
// at 4 KiB and double up to 256 KiB, so a map task with many small partitions wastes little
// and a large partition takes few segments; adjacent chunks of one partition are merged into
// one segment. Segments are appended to the task's list in write order. Writing after close()
// goes on in new chunks (the writer appends a HashOrder index after the serializer's stream is
// closed, so nothing the serializer writes at close can land after the index's trailer).
package io.slipstream.spark.shuffle;

import java.io.IOException;
import java.io.OutputStream;
import java.util.List;

final class PartitionOutput extends OutputStream {
    static final int CHUNK_BYTES_MAX = 256 * 1024;

    private final int partition;
    private final BlockArena arena;
    private final List<int[]> segments;
    private BlockArena.Chunk chunk;
    private int chunkBytes = BlockArena.CHUNK_BYTES_MIN;
    /** This partition's last segment {partition, block, offset, length}, to extend in place. */
    private int[] last;
    private long written;

    PartitionOutput(int partition, BlockArena arena, List<int[]> segments) {
        this.partition = partition;
        this.arena = arena;
        this.segments = segments;
    }

    long written() {
        return written;
    }

    private void ensure() throws IOException {
        if (chunk == null || !chunk.buf().hasRemaining()) {
            finishChunk();
            chunk = arena.take(chunkBytes);
            chunkBytes = Math.min(chunkBytes * 2, CHUNK_BYTES_MAX);
        }
    }

    private void finishChunk() {
        if (chunk == null) {
            return;
        }
        int used = chunk.buf().position();
        if (used > 0) {
            if (last != null && last[1] == chunk.block() && last[2] + last[3] == chunk.offset()) {
                last[3] += used;
            } else {
                last = new int[] {partition, chunk.block(), chunk.offset(), used};
                segments.add(last);
            }
        }
        chunk = null;
    }

    @Override
    public void write(int b) throws IOException {
        ensure();
        chunk.buf().put((byte) b);
        written++;
    }

    @Override
    public void write(byte[] b, int off, int len) throws IOException {
        while (len > 0) {
            ensure();
            int n = Math.min(len, chunk.buf().remaining());
            chunk.buf().put(b, off, n);
            off += n;
            len -= n;
            written += n;
        }
    }

    @Override
    public void close() {
        finishChunk();
    }
}
