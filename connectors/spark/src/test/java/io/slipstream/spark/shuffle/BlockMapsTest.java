// BlockMapsTest: an executor maps a (shuffle, block) once for all its reduce tasks, maps again
// when the daemon replaced the block's file (delete + create under the same id) — told by the
// file's inode when the daemon names no file identity, by the identity when it does (then the
// file is not looked at) — and unmaps a shuffle's blocks when it is dropped, not while a task
// still uses one. Block files made here in a temporary directory, no daemon.
package io.slipstream.spark.shuffle;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotSame;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.io.IOException;
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
        BlockMaps.Entry a = maps.acquire(0, 3, 0);
        BlockMaps.Entry b = maps.acquire(0, 3, 0); // a second task of the same executor
        assertSame(a, b);
        maps.release(a);
        maps.release(b);
        BlockMaps.Entry c = maps.acquire(0, 3, 0); // a later task: still mapped
        assertSame(a, c);
        assertEquals(1, c.buf.get(100));
        maps.release(c);
        assertEquals(1, maps.mappedCount());

        // The daemon freed the block and made a new file under the same id: never the stale map.
        makeBlock(dir, 3, (byte) 2);
        BlockMaps.Entry d = maps.acquire(0, 3, 0);
        assertNotSame(a, d);
        assertEquals(2, d.buf.get(100));
        // Another shuffle's use of the same id is its own entry.
        BlockMaps.Entry e = maps.acquire(1, 3, 0);
        assertNotSame(d, e);
        assertEquals(2, maps.mappedCount());

        // Dropped while in use: stays readable until released, and is gone from the cache.
        maps.dropShuffle(0);
        assertEquals(1, maps.mappedCount());
        assertEquals(2, d.buf.get(BLOCK_BYTES - 1));
        maps.release(d);
        maps.release(e);
        maps.dropAll();
        assertEquals(0, maps.mappedCount());
    }

    @Test
    void theDaemonsFileIdentityDecidesWithoutLookingAtTheFile(@TempDir Path dir) throws IOException {
        makeBlock(dir, 4, (byte) 1);
        BlockMaps maps = new BlockMaps(dir, BLOCK_BYTES);
        BlockMaps.Entry a = maps.acquire(0, 4, 77);
        maps.release(a);
        // The same identity: the mapping is reused, and the file is not looked at (gone here).
        Files.delete(BlockFiles.path(dir, 4));
        BlockMaps.Entry b = maps.acquire(0, 4, 77);
        assertSame(a, b);
        assertEquals(1, b.buf.get(100));
        maps.release(b);
        // Another identity: a new file under the same id, mapped again.
        makeBlock(dir, 4, (byte) 2);
        BlockMaps.Entry c = maps.acquire(0, 4, 78);
        assertNotSame(a, c);
        assertEquals(2, c.buf.get(100));
        maps.release(c);
        // A mapping made by identity is not trusted for a daemon that names none: the inode decides.
        BlockMaps.Entry d = maps.acquire(0, 4, 0);
        assertNotSame(c, d);
        assertEquals(2, d.buf.get(100));
        maps.release(d);
        assertEquals(1, maps.mappedCount());
        maps.dropAll();
        assertEquals(0, maps.mappedCount());
    }

    @Test
    void aMissingBlockFileIsAnIOException(@TempDir Path dir) {
        BlockMaps maps = new BlockMaps(dir, BLOCK_BYTES);
        assertThrows(IOException.class, () -> maps.acquire(0, 9, 0));
        assertEquals(0, maps.mappedCount());
    }
}
