// BlockArena: a map task's pool blocks, mapped read-write from the daemon's block files, carved
// into chunks for the partitions' output streams with a bump pointer. Blocks come from the
// daemon (ALLOC) one at a time, as the previous one fills. Not for: which partition a chunk
// belongs to (PartitionOutput) or the commit (SlipstreamShuffleWriter).
package io.slipstream.spark.shuffle;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.MappedByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.List;

final class BlockArena implements AutoCloseable {
    /** A block's tail shorter than this is left unused rather than handed out as a chunk. */
    static final int CHUNK_BYTES_MIN = 4096;

    /** A run of bytes in one block that a partition writes into. */
    record Chunk(int block, int offset, ByteBuffer buf) {}

    private final ShuffleClient client;
    private final String app;
    private final int shuffle;
    private final Path dir;
    private final int blockBytes;
    private final List<MappedByteBuffer> mapped = new ArrayList<>();
    private MappedByteBuffer cur;
    private int curBlock = -1;
    private int curPos;

    BlockArena(ShuffleClient client, String app, int shuffle, Path dir, int blockBytes) {
        this.client = client;
        this.app = app;
        this.shuffle = shuffle;
        this.dir = dir;
        this.blockBytes = blockBytes;
    }

    /** Up to `want` bytes (at least CHUNK_BYTES_MIN unless `want` is smaller). */
    Chunk take(int want) throws IOException {
        if (cur == null || blockBytes - curPos < Math.min(want, CHUNK_BYTES_MIN)) {
            nextBlock();
        }
        int len = Math.min(want, blockBytes - curPos);
        Chunk c = new Chunk(curBlock, curPos, cur.slice(curPos, len));
        curPos += len;
        return c;
    }

    private void nextBlock() throws IOException {
        int id = client.alloc(app, shuffle);
        try (FileChannel ch = FileChannel.open(BlockFiles.path(dir, id), StandardOpenOption.READ, StandardOpenOption.WRITE)) {
            cur = ch.map(FileChannel.MapMode.READ_WRITE, 0, blockBytes);
        }
        mapped.add(cur);
        curBlock = id;
        curPos = 0;
    }

    /** Unmaps every block (after the commit: the data stays in the daemon's files). */
    @Override
    public void close() {
        for (MappedByteBuffer m : mapped) {
            BlockFiles.unmap(m);
        }
        mapped.clear();
        cur = null;
    }
}
