// BlockMapsTest: an executor maps a (shuffle, block) once for all its reduce tasks, maps again
// when the daemon replaced the block's file (delete + create under the same id), and unmaps a
// shuffle's blocks when it is dropped — not while a task still uses one. Block files made here in
// a temporary directory, no daemon.
package io.slipstream.spark.shuffle;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotSame;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

class BlockMapsTest {
    static final int BLOCK_BYTES = 8192;

    static void makeBlock(Path dir, int id, byte fill) throws IOException {
        byte[] b = new byte[BLOCK_BYTES];
        java.util.Arrays.fill(b, fill);
        Path p = BlockFiles.path(dir, id);
        Files.deleteIfExists(p); // a new file (inode), as the daemon's pool does past free_keep
        Files.write(p, b);
    }

    @Test
    void oneMappingPerShuffleBlockUntilTheFileChangesOrTheShuffleGoes(@TempDir Path dir) throws IOException {
        makeBlock(dir, 3, (byte) 1);
        BlockMaps maps = new BlockMaps(dir, BLOCK_BYTES);
        ByteBuffer a = maps.acquire(0, 3);
        ByteBuffer b = maps.acquire(0, 3); // a second task of the same executor
        assertSame(a, b);
        maps.release(a);
        maps.release(b);
        ByteBuffer c = maps.acquire(0, 3); // a later task: still mapped
        assertSame(a, c);
        assertEquals(1, c.get(100));
        maps.release(c);
        assertEquals(1, maps.mappedCount());

        // The daemon freed the block and made a new file under the same id: never the stale map.
        makeBlock(dir, 3, (byte) 2);
        ByteBuffer d = maps.acquire(0, 3);
        assertNotSame(a, d);
        assertEquals(2, d.get(100));
        // Another shuffle's use of the same id is its own entry.
        ByteBuffer e = maps.acquire(1, 3);
        assertNotSame(d, e);
        assertEquals(2, maps.mappedCount());

        // Dropped while in use: stays readable until released, and is gone from the cache.
        maps.dropShuffle(0);
        assertEquals(1, maps.mappedCount());
        assertEquals(2, d.get(BLOCK_BYTES - 1));
        maps.release(d);
        maps.release(e);
        maps.dropAll();
        assertEquals(0, maps.mappedCount());
    }

    @Test
    void aMissingBlockFileIsAnIOException(@TempDir Path dir) {
        BlockMaps maps = new BlockMaps(dir, BLOCK_BYTES);
        assertThrows(IOException.class, () -> maps.acquire(0, 9));
        assertEquals(0, maps.mappedCount());
    }
}
