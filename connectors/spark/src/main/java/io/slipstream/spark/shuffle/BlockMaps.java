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
// acquire compares the file's identity with the mapped one and maps again when it changed: the
// identity the daemon's LOOKUP names (a number it gives each file it creates, never reused), or,
// from a daemon that names none (0), the file's inode (BasicFileAttributes.fileKey: a stat per
// block per task, ~2 µs each, 200-400 per 200x200 reduce task). The check is sound because the
// caller holds the daemon's pin on the block (LOOKUP pins it until the task ends), so the file
// cannot change while it is used. A task holds an Entry per block and gives that back.
// Not for: releasing the daemon's pin (SlipstreamShuffleReader) or the writer's mappings
// (BlockArena).
package io.slipstream.spark.shuffle;

import java.io.IOException;
import java.nio.MappedByteBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.attribute.BasicFileAttributes;
import java.util.HashMap;
import java.util.Iterator;
import java.util.Map;
import java.util.Objects;

final class BlockMaps {
    private record Key(int shuffle, int block) {}

    /** A mapped block; a task reads `buf` between acquire and release. */
    static final class Entry {
        final MappedByteBuffer buf;
        /** The daemon's identity of the file (0: none named), or else its inode (null: none). */
        private final long file;
        private final Object fileKey;
        private int users;
        /** Its shuffle is gone (or the file changed): unmap when the last user lets go. */
        private boolean dead;

        Entry(MappedByteBuffer buf, long file, Object fileKey) {
            this.buf = buf;
            this.file = file;
            this.fileKey = fileKey;
        }

        /** Whether this maps the file `file` names (or, with 0, the file whose inode is `fileKey`). */
        private boolean maps(long file, Object fileKey) {
            return file != 0 ? this.file == file : fileKey != null && Objects.equals(this.fileKey, fileKey);
        }
    }

    private final Path dir;
    private final int blockBytes;
    private final Map<Key, Entry> maps = new HashMap<>();

    BlockMaps(Path dir, int blockBytes) {
        this.dir = dir;
        this.blockBytes = blockBytes;
    }

    /**
     * Block `block` of `shuffle`, mapped read-only; `file` is the daemon's identity of its file
     * (LOOKUP's, or 0 when it names none). The caller must hold the daemon's pin on the block and
     * release() the entry once.
     */
    synchronized Entry acquire(int shuffle, int block, long file) throws IOException {
        Key k = new Key(shuffle, block);
        Object fileKey = file != 0 ? null : Files.readAttributes(BlockFiles.path(dir, block), BasicFileAttributes.class).fileKey();
        Entry e = maps.get(k);
        if (e != null && !e.maps(file, fileKey)) {
            // Another file under the same id (or no identity to compare): never reuse the mapping.
            maps.remove(k);
            retire(e);
            e = null;
        }
        if (e == null) {
            e = new Entry(BlockFiles.mapForRead(dir, block, blockBytes), file, fileKey);
            if (file != 0 || fileKey != null) {
                maps.put(k, e);
            } else {
                e.dead = true; // used by this task only
            }
        }
        e.users++;
        return e;
    }

    /** The caller no longer reads `e`'s buffer (from acquire). */
    synchronized void release(Entry e) {
        if (--e.users == 0 && e.dead) {
            BlockFiles.unmap(e.buf);
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
