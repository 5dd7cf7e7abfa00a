// BlockFiles: where block N lives (<dir>/blk-N, the daemon's crates/shuffle/src/pool.rs names
// it the same way), mapping one for reading, and unmapping at once rather than at some later GC
// (a map task's blocks after its commit, BlockArena; an executor's read mappings when their
// shuffle ends, BlockMaps).
package io.slipstream.spark.shuffle;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.MappedByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;

final class BlockFiles {
    private BlockFiles() {}

    static Path path(Path dir, int block) {
        return dir.resolve("blk-" + block);
    }

    static MappedByteBuffer mapForRead(Path dir, int block, int blockBytes) throws IOException {
        try (FileChannel ch = FileChannel.open(path(dir, block), StandardOpenOption.READ)) {
            return ch.map(FileChannel.MapMode.READ_ONLY, 0, blockBytes);
        }
    }

    /** Only when nothing reads the buffer any more (touching it after this crashes the JVM). */
    static void unmap(ByteBuffer b) {
        org.apache.spark.storage.StorageUtils$.MODULE$.dispose(b);
    }
}
