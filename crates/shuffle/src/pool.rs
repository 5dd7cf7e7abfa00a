//! The block pool: fixed-size block files `blk-<id>` in one directory (tmpfs, so a block is
//! shared memory the JVM maps), at most `blocks_max` of them. A freed block's file is kept for
//! reuse (its pages are already faulted in) up to `free_keep` files; beyond that it is deleted
//! so an idle daemon gives memory back. The directory is locked (flock) so two daemons never
//! share one. Each file created gets a file id, never given to another file (LOOKUP names it, so
//! a reader that keeps a block mapped across tasks knows whether the id's file is still the one
//! it mapped without a stat per block).
//!
//! Not for: who owns a block (crate::registry).

use crate::ShuffleError;
use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The file of block `id` in a pool directory `dir`: `<dir>/blk-<id>` (the one home of the name
/// in the daemon; the JVM's `BlockFiles` mirrors it).
pub fn block_path(dir: &Path, id: u32) -> PathBuf {
    dir.join(format!("blk-{id}"))
}

pub struct BlockPool {
    dir: PathBuf,
    block_bytes: usize,
    blocks_max: usize,
    free_keep: usize,
    /// Ids whose file exists and is free, reused last-freed first (warmest pages).
    free: Vec<u32>,
    /// Ids with no file (deleted beyond `free_keep`), taken before minting a new id.
    unused: Vec<u32>,
    next_id: u32,
    in_use: usize,
    /// The file id of each block id's current file (0: no file made yet).
    file_ids: Vec<u64>,
    /// The next file id: the wall clock in ns when the pool opened, then one up per file made.
    /// A daemon started later begins above every id an earlier one gave (it cannot have made
    /// more than one file per ns of its life), so ids are not reused across restarts either.
    next_file_id: u64,
    /// Held for the pool's life: the directory's lock.
    _lock: File,
}

impl BlockPool {
    /// Creates (mode 0700) and locks `dir`, removing block files a previous run left.
    pub fn open(
        dir: &Path,
        block_bytes: usize,
        blocks_max: usize,
        free_keep: usize,
    ) -> Result<BlockPool, ShuffleError> {
        let io = |what: &str, e: std::io::Error| ShuffleError::Io(format!("{what} {}: {e}", dir.display()));
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(|e| io("create", e))?;
        let lock = File::create(dir.join(".lock")).map_err(|e| io("lock file in", e))?;
        // SAFETY: flock on a descriptor we own; no memory is involved.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return Err(ShuffleError::Io(format!("{} is in use by another slipstream daemon", dir.display())));
        }
        for entry in std::fs::read_dir(dir).map_err(|e| io("read", e))?.flatten() {
            if entry.file_name().to_string_lossy().starts_with("blk-") {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        Ok(BlockPool {
            dir: dir.to_path_buf(),
            block_bytes,
            blocks_max,
            free_keep,
            free: Vec::new(),
            unused: Vec::new(),
            next_id: 0,
            in_use: 0,
            file_ids: Vec::new(),
            next_file_id: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX / 2))
                .max(1),
            _lock: lock,
        })
    }

    /// The file of block `id` (the JVM computes the same name from the directory).
    pub fn path(&self, id: u32) -> PathBuf {
        block_path(&self.dir, id)
    }

    /// A block of `block_bytes` (zero pages when new, stale data when reused: the writer
    /// records its own lengths), or `PoolFull` at the memory limit.
    pub fn alloc(&mut self) -> Result<u32, ShuffleError> {
        if self.in_use >= self.blocks_max {
            return Err(ShuffleError::PoolFull { blocks_max: self.blocks_max, block_bytes: self.block_bytes });
        }
        if let Some(id) = self.free.pop() {
            self.in_use += 1;
            return Ok(id);
        }
        let id = match self.unused.pop() {
            Some(id) => id,
            None => {
                let id = self.next_id;
                self.next_id = self
                    .next_id
                    .checked_add(1)
                    .ok_or(ShuffleError::Limit { what: "block ids", max: u32::MAX as usize })?;
                id
            }
        };
        let made = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(self.path(id))
            .and_then(|f| f.set_len(self.block_bytes as u64));
        if let Err(e) = made {
            self.unused.push(id);
            return Err(ShuffleError::Io(format!("{}: {e}", self.path(id).display())));
        }
        let slot = id as usize;
        if self.file_ids.len() <= slot {
            self.file_ids.resize(slot + 1, 0);
        }
        self.file_ids[slot] = self.next_file_id;
        self.next_file_id = self.next_file_id.wrapping_add(1).max(1);
        self.in_use += 1;
        Ok(id)
    }

    /// The file id of block `id`'s current file (0 for an id with no file made yet).
    pub fn file_id(&self, id: u32) -> u64 {
        self.file_ids.get(id as usize).copied().unwrap_or(0)
    }

    /// Gives block `id` back: kept for reuse, or deleted past `free_keep`.
    pub fn free(&mut self, id: u32) {
        self.in_use = self.in_use.saturating_sub(1);
        if self.free.len() < self.free_keep {
            self.free.push(id);
        } else {
            let _ = std::fs::remove_file(self.path(id));
            self.unused.push(id);
        }
    }

    pub fn in_use(&self) -> usize {
        self.in_use
    }

    pub fn free_count(&self) -> usize {
        self.free.len()
    }

    pub fn block_bytes(&self) -> usize {
        self.block_bytes
    }

    pub fn blocks_max(&self) -> usize {
        self.blocks_max
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for BlockPool {
    fn drop(&mut self) {
        for id in 0..self.next_id {
            let _ = std::fs::remove_file(self.path(id));
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    fn inode(pool: &BlockPool, id: u32) -> u64 {
        std::fs::metadata(pool.path(id)).unwrap().ino()
    }

    #[test]
    fn a_file_id_names_one_file_kept_across_reuse_and_new_after_a_delete() {
        let dir = std::env::temp_dir().join(format!("slipstream-pool-test-{}", std::process::id()));
        let mut pool = BlockPool::open(&dir, 4096, 4, 1).unwrap();
        assert_eq!(pool.file_id(0), 0);
        let a = pool.alloc().unwrap();
        let b = pool.alloc().unwrap();
        let (fa, fb) = (pool.file_id(a), pool.file_id(b));
        assert!(fa != 0 && fb != 0 && fa != fb);
        // Freed and kept (free_keep 1): the same file comes back, under the same file id.
        let ino_a = inode(&pool, a);
        pool.free(a);
        assert_eq!(pool.alloc().unwrap(), a);
        assert_eq!((pool.file_id(a), inode(&pool, a)), (fa, ino_a));
        // Past free_keep the file is deleted; the id's next file has a new file id.
        pool.free(a);
        pool.free(b);
        assert!(!pool.path(b).exists());
        assert_eq!(pool.alloc().unwrap(), a);
        assert_eq!(pool.alloc().unwrap(), b);
        assert_eq!(pool.file_id(a), fa);
        let fb2 = pool.file_id(b);
        assert!(fb2 != fb && fb2 != fa && fb2 != 0);
        // A later daemon on the same directory starts above every file id this one gave.
        drop(pool);
        let mut again = BlockPool::open(&dir, 4096, 4, 1).unwrap();
        let c = again.alloc().unwrap();
        assert!(again.file_id(c) > fb2);
        drop(again);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
