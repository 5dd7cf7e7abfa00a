//! Durable Raft storage of one replication group: log entries, hard state, conf state and the
//! latest snapshot, in one append-only file `<dir>/raft.log` of CRC'd records.
//!
//! Not for: deciding when to compact (the node does) or what a snapshot holds (the state
//! machine does). This is raft-rs's [`Storage`] over a file, nothing more.
//!
//! Record: `len: u32 LE` (of kind + payload), `crc32: u32 LE` (of kind + payload), `kind: u8`,
//! payload (protobuf). Writes only append; a snapshot (received, or made locally to compact)
//! rewrites the file as snapshot + hard state + conf state + the entries after it into
//! `raft.log.tmp`, then renames it over `raft.log` (one atomic step, so a crash leaves either
//! the old or the new file). Opening replays the records in order; an entry record at index
//! `i` drops any entries at `i` and above first (Raft's conflict truncation is replayed
//! exactly as it happened). The first record that is short, too long or fails its CRC ends
//! the replay and the file is truncated there: a torn tail from a crash mid-write. Records
//! before it were complete, and with `fsync = always` also on disk before Raft saw them.
//!
//! Memory: the entries after the last snapshot and the snapshot itself are also held in memory
//! (the node compacts after `log_entries_max` entries once the log is twice the snapshot and
//! at least `compact_log_bytes_min` or `compact_interval_ms` past the last compaction: the log
//! stays within about the larger of the store's size and that floor, plus `log_entries_max`
//! entries). After a restart they are slices of
//! the file, read whole at open (no copy per record); that buffer is freed once compaction
//! has dropped everything replayed from it. Buffers: records are encoded straight into the
//! thread's append buffer ([`APPEND_REUSE_BYTES_MAX`]); a compaction's snapshot is built in
//! the previous snapshot's buffer ([`GroupStorage::compact_with`]) and streamed to the new
//! file, so compacting allocates no store-sized buffer (with the daemon's jemalloc returning
//! freed pages at once, each such buffer was faulted in anew).

use protobuf::Message as PbMessage;
use raft::eraftpb::{ConfState, Entry, HardState, Snapshot};
use raft::{GetEntriesContext, RaftState, Storage, StorageError};
use std::cell::RefCell;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Seek, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Largest record accepted on replay (a snapshot of a large tenant is one record).
pub const RECORD_BYTES_MAX: usize = 1 << 30;
const RECORD_HEADER_BYTES: usize = 9;

/// A write's records are encoded straight into one buffer (no buffer per record) and reach the
/// file with one `write`. The buffer is the thread's (a node drives all its groups from one
/// thread: one buffer per node, not per group) and keeps its capacity from write to write (the
/// allocator returns freed large blocks to the kernel at once, so a fresh buffer per turn
/// costs page faults), but bounded: it is written out whenever it holds this much, and a
/// larger capacity (one record bigger than this) is shrunk back to it once written.
pub const APPEND_REUSE_BYTES_MAX: usize = 1 << 20;

thread_local! {
    /// See [`APPEND_REUSE_BYTES_MAX`]; empty between writes.
    static APPEND_BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// A compaction writes its snapshot into the previous snapshot's buffer when nothing else
/// holds it (no fresh pages to fault in, a store's size each time), unless that buffer has
/// more than this spare beyond twice what it holds (a slice of something larger, e.g. of a
/// log file read whole at open): such a buffer is freed, not kept.
const SNAPSHOT_REUSE_SPARE_BYTES_MAX: usize = 1 << 20;

const KIND_SNAPSHOT: u8 = 1;
const KIND_HARD_STATE: u8 = 2;
const KIND_CONF_STATE: u8 = 3;
const KIND_ENTRY: u8 = 4;

const LOG_FILE: &str = "raft.log";
const TMP_FILE: &str = "raft.log.tmp";

/// When a group's writes reach the disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FsyncMode {
    /// fsync after every write, before Raft is told it is persisted.
    Always,
    /// Group commit: writes of all groups in one node turn are fsynced together by
    /// [`GroupStorage::sync`], still before any message or acknowledgement depends on them.
    Batch,
    /// Never fsync: survives a process crash (the page cache has it), not a machine crash.
    Never,
}

impl FsyncMode {
    /// Parse the config spelling (`always` / `batch` / `never`).
    pub fn parse(s: &str) -> Option<FsyncMode> {
        match s {
            "always" => Some(FsyncMode::Always),
            "batch" => Some(FsyncMode::Batch),
            "never" => Some(FsyncMode::Never),
            _ => None,
        }
    }
}

/// What went wrong opening or writing a group's storage.
#[derive(Debug)]
pub enum StorageFault {
    Io(io::Error),
    /// A record decoded but breaks the log's invariants (a gap in indexes, a bad protobuf).
    Corrupt(String),
}

impl std::fmt::Display for StorageFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StorageFault::Io(e) => write!(f, "raft storage I/O: {e}"),
            StorageFault::Corrupt(s) => write!(f, "raft storage corrupt: {s}"),
        }
    }
}

impl std::error::Error for StorageFault {}

impl From<io::Error> for StorageFault {
    fn from(e: io::Error) -> Self {
        StorageFault::Io(e)
    }
}

/// One group's durable Raft state (see the module doc).
pub struct GroupStorage {
    dir: PathBuf,
    file: File,
    fsync: FsyncMode,
    /// Bytes written since the last fsync (Batch mode).
    unsynced: bool,
    hard: HardState,
    conf: ConfState,
    /// Latest snapshot (metadata and data); index 0 = none yet.
    snap: Snapshot,
    /// Entries after `snap`'s index, contiguous.
    entries: Vec<Entry>,
    log_bytes: u64,
    /// Tail bytes dropped on open (a torn record), for logs and tests.
    pub torn_bytes_dropped: u64,
}

impl GroupStorage {
    /// Open the group in `dir` (created if missing). A new group starts with `voters` as its
    /// configuration; an existing one keeps what its file says and ignores `voters`.
    pub fn open(dir: &Path, fsync: FsyncMode, voters: &[u64]) -> Result<GroupStorage, StorageFault> {
        fs::create_dir_all(dir)?;
        let path = dir.join(LOG_FILE);
        let _ = fs::remove_file(dir.join(TMP_FILE));
        let fresh = !path.exists();
        let mut s = GroupStorage {
            dir: dir.to_path_buf(),
            file: OpenOptions::new().create(true).append(true).open(&path)?,
            fsync,
            unsynced: false,
            hard: HardState::default(),
            conf: ConfState::default(),
            snap: Snapshot::default(),
            entries: Vec::new(),
            log_bytes: 0,
            torn_bytes_dropped: 0,
        };
        if fresh {
            s.set_conf_state(ConfState { voters: voters.to_vec(), ..ConfState::default() })?;
            s.sync_now()?;
            sync_dir(dir)?;
        } else {
            s.replay(&path)?;
        }
        Ok(s)
    }

    fn replay(&mut self, path: &Path) -> Result<(), StorageFault> {
        // One read of the whole file; each record is parsed in place (an entry's data is a
        // slice of this buffer, not a copy): a restarting node replays its log on the cores
        // the running nodes serve from, so the replay's CPU is kept to the parse itself.
        let buf = bytes::Bytes::from(fs::read(path)?);
        let mut good = 0;
        while let Some((kind, payload)) = record_at(&buf, good) {
            self.replay_one(kind, &payload)?;
            good += RECORD_HEADER_BYTES + payload.len();
        }
        let (good, len) = (good as u64, buf.len() as u64);
        if len > good {
            self.torn_bytes_dropped = len - good;
            let f = OpenOptions::new().write(true).open(path)?;
            f.set_len(good)?;
            f.sync_all()?;
        }
        self.log_bytes = good;
        Ok(())
    }

    fn replay_one(&mut self, kind: u8, payload: &bytes::Bytes) -> Result<(), StorageFault> {
        let bad = |e: protobuf::ProtobufError| StorageFault::Corrupt(e.to_string());
        match kind {
            KIND_SNAPSHOT => {
                let s = Snapshot::parse_from_carllerche_bytes(payload).map_err(bad)?;
                self.install_snapshot_in_memory(s, true);
            }
            KIND_HARD_STATE => self.hard = HardState::parse_from_carllerche_bytes(payload).map_err(bad)?,
            KIND_CONF_STATE => self.conf = ConfState::parse_from_carllerche_bytes(payload).map_err(bad)?,
            KIND_ENTRY => {
                let e = Entry::parse_from_carllerche_bytes(payload).map_err(bad)?;
                self.append_entry(e)?;
            }
            k => return Err(StorageFault::Corrupt(format!("unknown record kind {k}"))),
        }
        Ok(())
    }

    /// The index of the snapshot the log starts after.
    pub fn snapshot_index(&self) -> u64 {
        self.snap.get_metadata().index
    }

    fn first(&self) -> u64 {
        self.snapshot_index() + 1
    }

    fn last(&self) -> u64 {
        self.snapshot_index() + self.entries.len() as u64
    }

    pub fn hard_state(&self) -> &HardState {
        &self.hard
    }

    pub fn conf_state(&self) -> &ConfState {
        &self.conf
    }

    /// Bytes in the log file (what `log bytes` metrics report).
    pub fn log_bytes(&self) -> u64 {
        self.log_bytes
    }

    /// Entries held after the last snapshot.
    pub fn entries_len(&self) -> usize {
        self.entries.len()
    }

    /// Append entries from a Ready (may overwrite a conflicting suffix).
    pub fn append(&mut self, ents: &[Entry]) -> Result<(), StorageFault> {
        if ents.is_empty() {
            return Ok(());
        }
        self.append_in_memory(ents)?;
        self.write_records(|r| ents.iter().try_for_each(|e| r.put(KIND_ENTRY, e)))?;
        self.after_write()
    }

    fn append_in_memory(&mut self, ents: &[Entry]) -> Result<(), StorageFault> {
        for e in ents {
            self.append_entry(e.clone())?;
        }
        Ok(())
    }

    /// Append one entry (dropping a conflicting suffix from its index on).
    fn append_entry(&mut self, e: Entry) -> Result<(), StorageFault> {
        if e.index <= self.snapshot_index() {
            return Ok(()); // already inside the snapshot
        }
        if e.index > self.last() + 1 {
            return Err(StorageFault::Corrupt(format!("gap: entry {} after last {}", e.index, self.last())));
        }
        let keep = (e.index - self.first()) as usize;
        self.entries.truncate(keep);
        self.entries.push(e);
        Ok(())
    }

    pub fn set_hard_state(&mut self, hs: &HardState) -> Result<(), StorageFault> {
        self.hard = hs.clone();
        self.write_records(|r| r.put(KIND_HARD_STATE, hs))?;
        self.after_write()
    }

    /// Record a new commit index (from a LightReady).
    pub fn set_commit(&mut self, commit: u64) -> Result<(), StorageFault> {
        let mut hs = self.hard.clone();
        hs.commit = commit;
        self.set_hard_state(&hs)
    }

    pub fn set_conf_state(&mut self, cs: ConfState) -> Result<(), StorageFault> {
        self.write_records(|r| r.put(KIND_CONF_STATE, &cs))?;
        self.conf = cs;
        self.after_write()
    }

    /// A snapshot received from the leader: it replaces the whole log.
    pub fn apply_snapshot(&mut self, snap: Snapshot) -> Result<(), StorageFault> {
        self.install_snapshot_in_memory(snap, false);
        self.rewrite()
    }

    /// A snapshot made here at an applied index: the entries up to it are dropped, the rest
    /// kept. Ignored if not newer than the current one or beyond the log.
    pub fn compact_to(&mut self, snap: Snapshot) -> Result<(), StorageFault> {
        let idx = snap.get_metadata().index;
        if idx <= self.snapshot_index() || idx > self.last() {
            return Ok(());
        }
        self.install_snapshot_in_memory(snap, true);
        self.rewrite()
    }

    /// [`GroupStorage::compact_to`] a snapshot at `index` (of `term`, with the current
    /// configuration) whose data `fill` writes into the buffer it is given: the previous
    /// snapshot's, cleared, when nothing else holds it (see [`SNAPSHOT_REUSE_SPARE_BYTES_MAX`]),
    /// else a new one. `fill` is not called when the compaction would be ignored.
    pub fn compact_with(&mut self, index: u64, term: u64, fill: impl FnOnce(&mut Vec<u8>)) -> Result<(), StorageFault> {
        if index <= self.snapshot_index() || index > self.last() {
            return Ok(());
        }
        let mut data = self.take_snapshot_buffer();
        fill(&mut data);
        let mut snap = Snapshot { data: data.into(), ..Snapshot::default() };
        let m = snap.mut_metadata();
        m.index = index;
        m.term = term;
        m.set_conf_state(self.conf.clone());
        self.compact_to(snap)
    }

    /// The current snapshot's data buffer for reuse (empty), leaving the snapshot without
    /// data; or a new empty buffer, leaving it alone, when something else still holds the
    /// data (a message on its way to a follower) or the buffer is mostly spare. Only for a
    /// caller about to install a new snapshot.
    fn take_snapshot_buffer(&mut self) -> Vec<u8> {
        let data = std::mem::take(&mut self.snap.data);
        match data.try_into_mut() {
            Ok(m) => {
                let mut v = Vec::from(m);
                let spare_max = v.len().saturating_mul(2).saturating_add(SNAPSHOT_REUSE_SPARE_BYTES_MAX);
                if v.capacity() > spare_max {
                    return Vec::new();
                }
                v.clear();
                v
            }
            Err(shared) => {
                self.snap.data = shared;
                Vec::new()
            }
        }
    }

    fn install_snapshot_in_memory(&mut self, snap: Snapshot, keep_later: bool) {
        let m = snap.get_metadata();
        let (idx, term) = (m.index, m.term);
        let first = self.first();
        let drop = if keep_later && idx >= first { ((idx - first + 1) as usize).min(self.entries.len()) } else { 0 };
        if keep_later && drop > 0 && self.entries[drop - 1].term == term {
            self.entries.drain(..drop);
        } else {
            self.entries.clear();
        }
        self.conf = m.get_conf_state().clone();
        self.hard.commit = self.hard.commit.max(idx);
        self.hard.term = self.hard.term.max(term);
        self.snap = snap;
    }

    /// Write snapshot + state + remaining entries to a new file and rename it into place.
    fn rewrite(&mut self) -> Result<(), StorageFault> {
        let tmp = self.dir.join(TMP_FILE);
        let (f, bytes) = self.write_tmp(&tmp)?;
        if self.fsync != FsyncMode::Never {
            f.sync_all()?;
        }
        drop(f);
        let path = self.dir.join(LOG_FILE);
        fs::rename(&tmp, &path)?;
        if self.fsync != FsyncMode::Never {
            sync_dir(&self.dir)?;
        }
        self.file = OpenOptions::new().append(true).open(&path)?;
        self.log_bytes = bytes;
        self.unsynced = false;
        Ok(())
    }

    /// The rewritten log in `tmp`: the snapshot streamed from its buffer (not copied into a
    /// record buffer: it is a store's size), then the rest through the append buffer.
    fn write_tmp(&mut self, tmp: &Path) -> Result<(File, u64), StorageFault> {
        let mut f = File::create(tmp)?;
        let snap_bytes = write_streamed_record(&mut f, KIND_SNAPSHOT, &self.snap)?;
        let rest = with_records(&mut f, |r| {
            r.put(KIND_HARD_STATE, &self.hard)?;
            r.put(KIND_CONF_STATE, &self.conf)?;
            self.entries.iter().try_for_each(|e| r.put(KIND_ENTRY, e))
        })?;
        Ok((f, snap_bytes + rest))
    }

    /// Append the records `put` makes to the log file (the page cache; no fsync).
    fn write_records(
        &mut self,
        put: impl FnOnce(&mut Records<'_>) -> Result<(), StorageFault>,
    ) -> Result<(), StorageFault> {
        // Set first: a failed write may have written part of them.
        self.unsynced = true;
        self.log_bytes += with_records(&mut self.file, put)?;
        Ok(())
    }

    fn after_write(&mut self) -> Result<(), StorageFault> {
        match self.fsync {
            FsyncMode::Always => self.sync_now(),
            // Batch: the node calls sync() once per turn; Never: the bytes are in the page
            // cache already (written before this), so a process crash does not lose them.
            FsyncMode::Batch | FsyncMode::Never => Ok(()),
        }
    }

    /// Make every write so far durable per the fsync mode (Batch: the group commit point).
    pub fn sync(&mut self) -> Result<(), StorageFault> {
        match self.fsync {
            FsyncMode::Never => Ok(()),
            FsyncMode::Always | FsyncMode::Batch => self.sync_now(),
        }
    }

    fn sync_now(&mut self) -> Result<(), StorageFault> {
        if self.unsynced {
            self.file.sync_data()?;
            self.unsynced = false;
        }
        Ok(())
    }

    /// The latest snapshot (to send to a lagging follower or restore on open).
    pub fn latest_snapshot(&self) -> &Snapshot {
        &self.snap
    }
}

/// Append record `kind` of `m` to `out` (header, kind, protobuf encoded in place); the
/// record's bytes.
fn encode_record<M: PbMessage>(out: &mut Vec<u8>, kind: u8, m: &M) -> Result<u64, StorageFault> {
    let at = out.len();
    out.extend_from_slice(&[0u8; RECORD_HEADER_BYTES - 1]);
    out.push(kind);
    if let Err(e) = m.write_to_vec(out) {
        out.truncate(at);
        return Err(StorageFault::Corrupt(e.to_string()));
    }
    let len = out.len() - at - (RECORD_HEADER_BYTES - 1);
    if let Err(e) = check_record_len(len) {
        out.truncate(at);
        return Err(e);
    }
    let crc = crc32fast::hash(&out[at + RECORD_HEADER_BYTES - 1..]);
    out[at..at + RECORD_HEADER_BYTES - 1].copy_from_slice(&record_head(len, crc));
    Ok((out.len() - at) as u64)
}

/// A record's length (kind byte + payload) within [`RECORD_BYTES_MAX`], or why not.
fn check_record_len(len: usize) -> Result<(), StorageFault> {
    if len > RECORD_BYTES_MAX {
        return Err(StorageFault::Corrupt(format!("record of {len} bytes over RECORD_BYTES_MAX")));
    }
    Ok(())
}

/// The header before a record's kind byte: its length (kind + payload) and the CRC of kind +
/// payload, both u32 LE (what `record_at` reads back).
fn record_head(len: usize, crc: u32) -> [u8; RECORD_HEADER_BYTES - 1] {
    let mut head = [0u8; RECORD_HEADER_BYTES - 1];
    head[..4].copy_from_slice(&(len as u32).to_le_bytes());
    head[4..].copy_from_slice(&crc.to_le_bytes());
    head
}

/// Records on their way to a file through the thread's append buffer (see
/// [`APPEND_REUSE_BYTES_MAX`]).
struct Records<'a> {
    file: &'a mut File,
    buf: &'a mut Vec<u8>,
    bytes: u64,
}

impl Records<'_> {
    fn put<M: PbMessage>(&mut self, kind: u8, m: &M) -> Result<(), StorageFault> {
        self.bytes += encode_record(self.buf, kind, m)?;
        if self.buf.len() >= APPEND_REUSE_BYTES_MAX {
            self.file.write_all(self.buf)?;
            self.buf.clear();
        }
        Ok(())
    }
}

/// Write the records `put` makes to `file`, encoded in the thread's append buffer; their
/// bytes. The buffer is empty afterwards, failed or not (nothing of one file's write is left
/// for the next), and its capacity at most [`APPEND_REUSE_BYTES_MAX`].
fn with_records(
    file: &mut File,
    put: impl FnOnce(&mut Records<'_>) -> Result<(), StorageFault>,
) -> Result<u64, StorageFault> {
    APPEND_BUF.with(|cell| {
        // Not re-entered (no write runs inside another); if it were, a buffer of its own.
        let mut own = Vec::new();
        let mut borrowed = cell.try_borrow_mut();
        let buf = match borrowed.as_mut() {
            Ok(b) => &mut **b,
            Err(_) => &mut own,
        };
        let mut r = Records { file, buf, bytes: 0 };
        let written = put(&mut r).and_then(|()| Ok(r.file.write_all(r.buf)?));
        let bytes = r.bytes;
        buf.clear();
        if buf.capacity() > APPEND_REUSE_BYTES_MAX {
            buf.shrink_to(APPEND_REUSE_BYTES_MAX);
        }
        written.map(|()| bytes)
    })
}

/// The calling thread's append buffer's capacity (tests of its bound).
#[cfg(test)]
fn append_buf_capacity() -> usize {
    APPEND_BUF.with(|cell| cell.borrow().capacity())
}

/// Write record `kind` of `m` at `f`'s position, its protobuf streamed to the file (for a
/// snapshot: no copy of its data in memory); the header is written after the payload, once
/// its CRC is known. The record's bytes.
fn write_streamed_record<M: PbMessage>(f: &mut File, kind: u8, m: &M) -> Result<u64, StorageFault> {
    let at = f.stream_position()?;
    let len = m.compute_size() as usize + 1;
    check_record_len(len)?;
    let mut w = CrcWriter { inner: BufWriter::new(&mut *f), crc: crc32fast::Hasher::new(), bytes: 0 };
    w.inner.write_all(&[0u8; RECORD_HEADER_BYTES - 1])?;
    w.write_all(&[kind])?;
    m.write_to_writer(&mut w).map_err(|e| StorageFault::Corrupt(e.to_string()))?;
    let CrcWriter { inner, crc, bytes } = w;
    let f = inner.into_inner().map_err(|e| e.into_error())?;
    if bytes != len {
        return Err(StorageFault::Corrupt(format!("record streamed {bytes} bytes, sized {len}")));
    }
    f.write_all_at(&record_head(len, crc.finalize()), at)?;
    Ok((RECORD_HEADER_BYTES - 1 + len) as u64)
}

/// A writer that passes bytes on and keeps their CRC and count.
struct CrcWriter<W: Write> {
    inner: W,
    crc: crc32fast::Hasher,
    bytes: usize,
}

impl<W: Write> Write for CrcWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.crc.update(&buf[..n]);
        self.bytes += n;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// The next whole, CRC-valid record; None at the end or at a torn/corrupt tail.
/// The record at `at` of `buf` (its kind and payload, a slice of `buf`); None at the end or
/// at a record that is short, too long or fails its CRC (a torn tail).
fn record_at(buf: &bytes::Bytes, at: usize) -> Option<(u8, bytes::Bytes)> {
    let head = buf.get(at..at.checked_add(8)?)?;
    let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
    let crc = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
    if len == 0 || len > RECORD_BYTES_MAX {
        return None;
    }
    let body_at = at + 8;
    let body = buf.get(body_at..body_at.checked_add(len)?)?;
    if crc32fast::hash(body) != crc {
        return None;
    }
    Some((body[0], buf.slice(body_at + 1..body_at + len)))
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

impl Storage for GroupStorage {
    fn initial_state(&self) -> raft::Result<RaftState> {
        Ok(RaftState::new(self.hard.clone(), self.conf.clone()))
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        if low < self.first() {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if high > self.last() + 1 || low > high {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        let lo = (low - self.first()) as usize;
        let hi = (high - self.first()) as usize;
        let mut ents = self.entries[lo..hi].to_vec();
        raft::util::limit_size(&mut ents, max_size.into());
        Ok(ents)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        if idx == self.snapshot_index() {
            return Ok(self.snap.get_metadata().term);
        }
        if idx < self.first() {
            return Err(raft::Error::Store(StorageError::Compacted));
        }
        if idx > self.last() {
            return Err(raft::Error::Store(StorageError::Unavailable));
        }
        Ok(self.entries[(idx - self.first()) as usize].term)
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.first())
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(self.last())
    }

    fn snapshot(&self, request_index: u64, _to: u64) -> raft::Result<Snapshot> {
        // Snapshots are made when the log is compacted, so the latest one always covers
        // every entry a follower can no longer get from the log.
        if self.snapshot_index() < request_index {
            return Err(raft::Error::Store(StorageError::SnapshotTemporarilyUnavailable));
        }
        Ok(self.snap.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u64, term: u64, data: &[u8]) -> Entry {
        Entry { index, term, data: data.to_vec().into(), ..Entry::default() }
    }

    fn tmpdir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("slipstream-repl-{}-{}", name, std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    fn snapshot(index: u64, term: u64, voters: &[u64], data: &[u8]) -> Snapshot {
        let mut s = Snapshot { data: data.to_vec().into(), ..Snapshot::default() };
        let m = s.mut_metadata();
        m.index = index;
        m.term = term;
        m.mut_conf_state().voters = voters.to_vec();
        s
    }

    #[test]
    fn reopen_restores_entries_hard_state_and_conflict_truncation() {
        let d = tmpdir("reopen");
        {
            let mut s = GroupStorage::open(&d, FsyncMode::Always, &[1, 2, 3]).unwrap();
            s.append(&[entry(1, 1, b"a"), entry(2, 1, b"b"), entry(3, 1, b"c")]).unwrap();
            // A new leader overwrites 3.. with its own term.
            s.append(&[entry(3, 2, b"C"), entry(4, 2, b"d")]).unwrap();
            let hs = HardState { term: 2, vote: 3, commit: 3, ..HardState::default() };
            s.set_hard_state(&hs).unwrap();
        }
        let s = GroupStorage::open(&d, FsyncMode::Always, &[9]).unwrap();
        assert_eq!(s.conf_state().voters, vec![1, 2, 3]);
        assert_eq!((s.hard_state().term, s.hard_state().vote, s.hard_state().commit), (2, 3, 3));
        let got = s.entries(1, 5, None, GetEntriesContext::empty(false)).unwrap();
        let got: Vec<(u64, u64, Vec<u8>)> = got.iter().map(|e| (e.index, e.term, e.data.to_vec())).collect();
        assert_eq!(
            got,
            vec![(1, 1, b"a".to_vec()), (2, 1, b"b".to_vec()), (3, 2, b"C".to_vec()), (4, 2, b"d".to_vec())]
        );
        assert_eq!(s.torn_bytes_dropped, 0);
        fs::remove_dir_all(&d).unwrap();
    }

    /// A crash mid-write leaves a partial record: every cut of the last record is dropped on
    /// open, the records before it survive, and the file is usable (appends after it replay).
    #[test]
    fn torn_tail_is_dropped_at_every_cut_and_log_stays_appendable() {
        let d = tmpdir("torn");
        let path = d.join(LOG_FILE);
        {
            let mut s = GroupStorage::open(&d, FsyncMode::Batch, &[1]).unwrap();
            s.append(&[entry(1, 1, b"one"), entry(2, 1, b"two")]).unwrap();
            s.sync().unwrap();
        }
        let whole = fs::read(&path).unwrap();
        {
            let mut s = GroupStorage::open(&d, FsyncMode::Batch, &[1]).unwrap();
            s.append(&[entry(3, 1, b"three-is-longer")]).unwrap();
            s.sync().unwrap();
        }
        let longer = fs::read(&path).unwrap();
        for cut in whole.len()..longer.len() {
            fs::write(&path, &longer[..cut]).unwrap();
            let mut s = GroupStorage::open(&d, FsyncMode::Batch, &[1]).unwrap();
            assert_eq!(s.last_index().unwrap(), 2, "cut at {cut}");
            assert_eq!(s.torn_bytes_dropped, (cut - whole.len()) as u64);
            s.append(&[entry(3, 1, b"again")]).unwrap();
            s.sync().unwrap();
            drop(s);
            let s = GroupStorage::open(&d, FsyncMode::Batch, &[1]).unwrap();
            assert_eq!(s.last_index().unwrap(), 3);
            assert_eq!(&s.entries(3, 4, None, GetEntriesContext::empty(false)).unwrap()[0].data[..], b"again");
        }
        // A flipped byte inside the last record fails its CRC: dropped too.
        let mut bad = longer.clone();
        let n = bad.len();
        bad[n - 2] ^= 0xff;
        fs::write(&path, &bad).unwrap();
        let s = GroupStorage::open(&d, FsyncMode::Never, &[1]).unwrap();
        assert_eq!(s.last_index().unwrap(), 2);
        fs::remove_dir_all(&d).unwrap();
    }

    /// One turn far over APPEND_REUSE_BYTES_MAX (a 3 MiB entry and many small ones): the
    /// append buffer is written out in pieces and shrunk back under the limit, small turns
    /// after it keep it there (and keep it), and a reopen reads exactly the entries written.
    #[test]
    fn append_buffer_falls_back_under_its_limit_after_a_huge_turn() {
        let d = tmpdir("append-reuse");
        let big = vec![7u8; 3 << 20];
        let mut want = Vec::new();
        {
            let mut s = GroupStorage::open(&d, FsyncMode::Batch, &[1]).unwrap();
            let mut turn = vec![entry(1, 1, &big)];
            turn.extend((2..=2000).map(|i| entry(i, 1, format!("small-{i}").as_bytes())));
            s.append(&turn).unwrap();
            s.sync().unwrap();
            assert!(append_buf_capacity() <= APPEND_REUSE_BYTES_MAX, "capacity {}", append_buf_capacity());
            want.extend(turn);
            for i in 2001..=2100 {
                let e = entry(i, 1, b"after");
                s.append(std::slice::from_ref(&e)).unwrap();
                s.sync().unwrap();
                assert!(append_buf_capacity() <= APPEND_REUSE_BYTES_MAX);
                want.push(e);
            }
            // Kept between writes (not freed and allocated again each time).
            assert!(append_buf_capacity() > 0);
            assert_eq!(s.log_bytes(), fs::metadata(d.join(LOG_FILE)).unwrap().len());
        }
        let s = GroupStorage::open(&d, FsyncMode::Batch, &[1]).unwrap();
        assert_eq!(s.torn_bytes_dropped, 0);
        let got = s.entries(1, 2101, None, GetEntriesContext::empty(false)).unwrap();
        assert_eq!(got, want);
        fs::remove_dir_all(&d).unwrap();
    }

    /// A compaction writes its snapshot into the previous snapshot's buffer when nothing else
    /// holds it, a new one when something does (the held snapshot is left intact), and either
    /// way the log reopens to the snapshot and the entries after it.
    #[test]
    fn compaction_reuses_an_unshared_snapshot_buffer_and_reopens_exactly() {
        let d = tmpdir("snap-reuse");
        let ents: Vec<Entry> = (1..=30).map(|i| entry(i, 1, format!("e{i}").as_bytes())).collect();
        let state = |n: u8| vec![n; 64 << 10];
        {
            let mut s = GroupStorage::open(&d, FsyncMode::Always, &[1, 2]).unwrap();
            s.append(&ents).unwrap();
            s.compact_with(10, 1, |b| b.extend_from_slice(&state(1))).unwrap();
            let first = s.latest_snapshot().data.as_ptr();
            let mut given = (std::ptr::null(), 0);
            s.compact_with(20, 1, |b| {
                given = (b.as_ptr(), b.capacity());
                assert!(b.is_empty());
                b.extend_from_slice(&state(2));
            })
            .unwrap();
            assert_eq!(given, (first, state(1).len()), "the previous snapshot's buffer, emptied");
            // Held elsewhere (a snapshot message on its way): a new buffer, the held one intact.
            let held = s.latest_snapshot().clone();
            s.compact_with(25, 1, |b| {
                assert_eq!(b.capacity(), 0);
                b.extend_from_slice(&state(3));
            })
            .unwrap();
            assert_eq!(&held.data[..], &state(2)[..]);
            // Not newer than the snapshot: ignored, `fill` not called.
            s.compact_with(25, 1, |_| panic!("fill called for an ignored compaction")).unwrap();
        }
        let s = GroupStorage::open(&d, FsyncMode::Always, &[]).unwrap();
        assert_eq!(s.torn_bytes_dropped, 0);
        assert_eq!((s.first_index().unwrap(), s.last_index().unwrap()), (26, 30));
        assert_eq!(s.term(25).unwrap(), 1);
        assert_eq!(&s.latest_snapshot().data[..], &state(3)[..]);
        assert_eq!(s.latest_snapshot().get_metadata().get_conf_state().voters, vec![1, 2]);
        assert_eq!(s.entries(26, 31, None, GetEntriesContext::empty(false)).unwrap(), ents[25..].to_vec());
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn compaction_and_received_snapshot_survive_reopen() {
        let d = tmpdir("snap");
        {
            let mut s = GroupStorage::open(&d, FsyncMode::Always, &[1, 2]).unwrap();
            let ents: Vec<Entry> = (1..=10).map(|i| entry(i, 1, format!("e{i}").as_bytes())).collect();
            s.append(&ents).unwrap();
            s.compact_to(snapshot(6, 1, &[1, 2], b"state@6")).unwrap();
            assert_eq!((s.first_index().unwrap(), s.last_index().unwrap()), (7, 10));
            assert!(matches!(
                s.entries(5, 7, None, GetEntriesContext::empty(false)),
                Err(raft::Error::Store(StorageError::Compacted))
            ));
            s.append(&[entry(11, 2, b"e11")]).unwrap();
        }
        {
            let mut s = GroupStorage::open(&d, FsyncMode::Always, &[]).unwrap();
            assert_eq!((s.first_index().unwrap(), s.last_index().unwrap()), (7, 11));
            assert_eq!(s.term(6).unwrap(), 1);
            assert_eq!(&s.snapshot(0, 2).unwrap().data[..], b"state@6");
            // The leader sends a newer snapshot: the whole log is replaced.
            s.apply_snapshot(snapshot(20, 3, &[1, 2, 3], b"state@20")).unwrap();
        }
        let s = GroupStorage::open(&d, FsyncMode::Always, &[]).unwrap();
        assert_eq!((s.first_index().unwrap(), s.last_index().unwrap()), (21, 20));
        assert_eq!(s.conf_state().voters, vec![1, 2, 3]);
        assert_eq!(s.hard_state().commit, 20);
        assert_eq!(&s.latest_snapshot().data[..], b"state@20");
        fs::remove_dir_all(&d).unwrap();
    }
}
