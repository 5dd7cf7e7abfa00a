// BlockMaps: one executor's read-only mappings of the daemon's pool blocks, shared by its reduce
// tasks. A reduce task that mapped every block it reads afresh paid, per block, an mmap, an
// munmap (a TLB shootdown across the JVM's threads) and a page fault on every page it touched
// (a fresh mapping has no page table entries): at 200x200 each reducer maps every map output's
// blocks, so the same block was mapped and faulted in once per reducer. Here a block is mapped
// once per (shuffle, block) per executor and its page table is reused by later reducers.
//
// A mapping stays until its shuffle is unregistered (Spark's RemoveShuffle reaches every
// executor's ShuffleManager) or the manager stops, and is not unmapped while a task uses it
// (users count). The daemon may delete a freed block's file and make a new one under the same
// id (crates/shuffle/src/pool.rs); a mapping of the old file would read stale bytes, so every
// acquire compares the file's identity (inode: BasicFileAttributes.fileKey) with the mapped one
// and maps again when it changed. The check is sound because the caller holds the daemon's pin
// on the block (LOOKUP pins it until the task ends), so the file cannot change while it is used.
// Not for: releasing the daemon's pin (SlipstreamShuffleReader) or the writer's mappings
// (BlockArena).
package io.slipstream.spark.shuffle;

import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.MappedByteBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.BasicFileAttributes;
import java.util.HashMap;
import java.util.IdentityHashMap;
import java.util.Iterator;
import java.util.Map;
import java.util.Objects;

final class BlockMaps {
    private record Key(int shuffle, int block) {}

    private static final class Entry {
        final MappedByteBuffer buf;
        final Object fileKey;
        int users;
        /** Its shuffle is gone (or the file changed): unmap when the last user lets go. */
        boolean dead;

        Entry(MappedByteBuffer buf, Object fileKey) {
            this.buf = buf;
            this.fileKey = fileKey;
        }
    }

    private final Path dir;
    private final int blockBytes;
    private final Map<Key, Entry> maps = new HashMap<>();
    /** Entries in use, by the buffer handed out (release() finds dead ones no longer in `maps`). */
    private final Map<ByteBuffer, Entry> pinned = new IdentityHashMap<>();

    BlockMaps(Path dir, int blockBytes) {
        this.dir = dir;
        this.blockBytes = blockBytes;
    }

    /** Block `block` of `shuffle`, mapped read-only; the caller must hold the daemon's pin on it and release() it once. */
    synchronized ByteBuffer acquire(int shuffle, int block) throws IOException {
        Key k = new Key(shuffle, block);
        Object fileKey = Files.readAttributes(BlockFiles.path(dir, block), BasicFileAttributes.class).fileKey();
        Entry e = maps.get(k);
        if (e != null && (fileKey == null || !Objects.equals(e.fileKey, fileKey))) {
            // Another file under the same id (or no identity to compare): never reuse the mapping.
            maps.remove(k);
            retire(e);
            e = null;
        }
        if (e == null) {
            e = new Entry(BlockFiles.mapForRead(dir, block, blockBytes), fileKey);
            if (fileKey != null) {
                maps.put(k, e);
            } else {
                e.dead = true; // used by this task only
            }
        }
        e.users++;
        pinned.put(e.buf, e);
        return e.buf;
    }

    /** The caller no longer reads `buf` (from acquire). */
    synchronized void release(ByteBuffer buf) {
        Entry e = pinned.get(buf);
        if (e == null) {
            return;
        }
        if (--e.users == 0) {
            pinned.remove(buf);
            if (e.dead) {
                BlockFiles.unmap(e.buf);
            }
        }
    }

    /** Unmaps `shuffle`'s blocks (those in use when their last user lets go). */
    synchronized void dropShuffle(int shuffle) {
        Iterator<Map.Entry<Key, Entry>> it = maps.entrySet().iterator();
        while (it.hasNext()) {
            Map.Entry<Key, Entry> m = it.next();
            if (m.getKey().shuffle() == shuffle) {
                it.remove();
                retire(m.getValue());
            }
        }
    }

    /** Unmaps every block not in use. */
    synchronized void dropAll() {
        for (Entry e : maps.values()) {
            retire(e);
        }
        maps.clear();
    }

    synchronized int mappedCount() {
        return maps.size();
    }

    private void retire(Entry e) {
        e.dead = true;
        if (e.users == 0) {
            BlockFiles.unmap(e.buf);
        }
    }
}
