//! The `Hbase` Thrift1 handler: maps each call to the cache and the sidecar with HBase's own
//! Thrift1 semantics (ThriftHBaseServiceHandler): empty rows are left out, getRow*Ts read cells
//! older than the timestamp (time range [0, ts)), map results keep the oldest of several versions
//! of a column, scanners are global ids, an unknown scanner id is IllegalArgument, and every HBase
//! failure is an IOError. Scanner batching splits whole rows into chunks of `batchSize` cells.

use crate::cache::{next_key, Answer, Cache, QueryKey};
use crate::gen::hbase1::{
    AlreadyExists, BatchMutation, ColumnDescriptor, HbaseSyncHandler, IOError, IllegalArgument, Mutation, ScannerID,
    TCell, TIncrement, TRowResult, TScan, Text,
};
use crate::reply::{to_result, CachedRow, Declared, RowSink};
use crate::sidecar::client::SidecarClient;
use crate::sidecar::codec::{
    self, op, Family, MutateOrder, Notice, NoticeKind, ReadSpec, Row, RowMutations, SidecarError, TS_LATEST,
};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// Most rows asked of the sidecar per scan page.
const SCAN_PAGE_ROWS: i32 = 1000;
/// Rows per page when the client gives no caching hint.
const SCAN_PAGE_ROWS_DEFAULT: usize = 100;
/// Bytes asked of the sidecar per scan page.
const SCAN_PAGE_BYTES: i32 = 4 << 20;
/// A bounded scan (with a stop row) is read and cached whole up to this many rows; past it, and
/// for open-ended scans past the first page, the rest is read page by page as the client asks.
const CACHED_SCAN_ROWS_MAX: usize = 10_000;
/// An open-ended scan's first page (read at open) is at most this many rows, whatever the
/// client's caching hint: happybase sends caching = batch_size (1000) even with `limit=100`, and
/// reading 1000 rows from HBase to hand out 100 made the miss path 4-6x slower than HBase direct.
const OPEN_SCAN_FIRST_PAGE_ROWS: usize = 100;
/// How far ahead of the row being sent a reply asks the CPU for a row's encoding
/// (`CachedRow::prefetch`): far enough to overlap a few rows' misses, near enough that they
/// are still in the cache when copied.
const PREFETCH_ROWS_AHEAD: usize = 4;
/// A scanner unused this long may be reclaimed when the scanner table is full.
const SCANNER_IDLE_MAX: Duration = Duration::from_secs(60);
/// Writes whose rows wait to be re-read (crate::service::RangeCache::refill); past it a write's
/// rows are simply left uncached until a read misses on them.
const REFILLS_QUEUED_MAX: usize = 1024;

/// Counters of the front end (the cache keeps its own per table).
#[derive(Default)]
pub struct FrontStats {
    pub requests: AtomicU64,
    pub errors: AtomicU64,
    pub scanners_opened: AtomicU64,
    pub sidecar_calls: AtomicU64,
    /// Rows re-read from HBase right after a write through Slipstream invalidated them.
    pub refills: AtomicU64,
}

/// A scanner's rows in hand, and where the query continues after them (None = done).
struct Source {
    rows: Answer,
    pos: usize,
    rest: Option<Vec<u8>>,
}

struct Scanner {
    table: Vec<u8>,
    key: QueryKey,
    page_rows: usize,
    source: Source,
    batch: usize,
    sort_columns: bool,
    /// A row being handed out in batches, and how many of its cells were already sent.
    partial: Option<(Arc<CachedRow>, usize)>,
    last_used: Instant,
}

/// Rows of a table to re-read after a write (RangeCache::refill).
type Refill = (Vec<u8>, Vec<Vec<u8>>);

/// Shared state of the service: one per daemon.
pub struct RangeCache {
    sidecar: Arc<SidecarClient>,
    cache: Mutex<Cache>,
    scanners: Mutex<HashMap<i32, Scanner>>,
    next_scanner: AtomicI32,
    scanners_max: usize,
    /// The sidecar connection generation the cache was filled under.
    sidecar_generation: AtomicU64,
    /// To the refill thread (started by `attach`): (table, rows) after a write.
    refill_queue: OnceLock<SyncSender<Refill>>,
    pub stats: FrontStats,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

// --- error mapping: which Thrift exceptions a call may raise is fixed by the IDL ---

fn io_error(message: String, can_retry: bool) -> thrift::Error {
    thrift::Error::User(Box::new(IOError::new(message, can_retry)))
}

/// For calls that declare only IOError: everything becomes IOError (as HBase does).
fn io_declared(e: SidecarError) -> Declared {
    Declared::Io(match e {
        SidecarError::Io { message, can_retry } => IOError::new(message, can_retry),
        SidecarError::Unavailable(_) => IOError::new(e.to_string(), true),
        other => IOError::new(other.to_string(), false),
    })
}

/// For calls that declare IOError and IllegalArgument.
fn io_ia_declared(e: SidecarError) -> Declared {
    match e {
        SidecarError::IllegalArgument(m) => Declared::Ia(IllegalArgument::new(m)),
        other => io_declared(other),
    }
}

fn io(e: SidecarError) -> thrift::Error {
    io_declared(e).into()
}

fn io_ia(e: SidecarError) -> thrift::Error {
    io_ia_declared(e).into()
}

fn illegal(m: &str) -> thrift::Error {
    thrift::Error::User(Box::new(IllegalArgument::new(m.to_string())))
}

fn spec(columns: Vec<Vec<u8>>, ts_max: i64, max_versions: i32) -> ReadSpec {
    ReadSpec { columns, ts_min: 0, ts_max, max_versions }
}

/// The first key after every key starting with `prefix` (empty = end of table).
fn prefix_stop(prefix: &[u8]) -> Vec<u8> {
    let mut p = prefix.to_vec();
    while let Some(last) = p.pop() {
        if last != 0xff {
            p.push(last + 1);
            return p;
        }
    }
    Vec::new()
}

impl RangeCache {
    pub fn new(sidecar: SidecarClient, cache: Cache, scanners_max: usize) -> RangeCache {
        RangeCache {
            sidecar: Arc::new(sidecar),
            cache: Mutex::new(cache),
            scanners: Mutex::new(HashMap::new()),
            next_scanner: AtomicI32::new(1),
            scanners_max,
            sidecar_generation: AtomicU64::new(0),
            refill_queue: OnceLock::new(),
            stats: FrontStats::default(),
        }
    }

    /// Routes the RegionObserver's write notices into the cache and keeps the lease alive.
    pub fn attach(self: &Arc<Self>) -> std::io::Result<()> {
        let weak = Arc::downgrade(self);
        self.sidecar.set_listener(Arc::new(move |n: &Notice| {
            if let Some(rc) = weak.upgrade() {
                let refill = {
                    let mut c = rc.cache();
                    match n.kind {
                        NoticeKind::Begin => {
                            c.notice_begin(&n.table, n.id, &n.rows);
                            None
                        }
                        NoticeKind::End => c.notice_end(n.id),
                        // The client moved the generation: `cache()` flushed already.
                        NoticeKind::Suspend | NoticeKind::Resume => None,
                    }
                };
                // A write by another client (or through another tenant's port) is refilled as
                // one through this front end is; the refill thread reads, never this one (it
                // delivers the notices).
                if let (Some(r), Some(q)) = (refill, rc.refill_queue.get()) {
                    let _ = q.try_send(r);
                }
            }
        }));
        let (tx, rx) = sync_channel::<Refill>(REFILLS_QUEUED_MAX);
        let weak = Arc::downgrade(self);
        // Ends when the service (the only sender) is dropped.
        std::thread::Builder::new().name("hbase-refill".into()).spawn(move || {
            while let Ok((table, rows)) = rx.recv() {
                let Some(rc) = weak.upgrade() else { return };
                rc.refill(&table, &rows);
            }
        })?;
        let _ = self.refill_queue.set(tx);
        self.sidecar.start_keepalive()
    }

    /// Re-reads rows a write took out of complete each-row intervals, once the write is
    /// acknowledged (a write through Slipstream) or visible (a RegionObserver notice's END: a
    /// write by any other client), so the next read of a written row is a hit, not a miss (with
    /// writes aimed at popular rows, those misses were most of the misses: docs/benchmarks.md,
    /// issue 16). Never stale for the same reason as any fill: the ticket is taken after the
    /// write ended, and a write or notice that starts before the fill is stored voids it (version
    /// check), so what is stored is at least as new as every acknowledged write. Best effort: any
    /// error leaves the rows uncached.
    fn refill(&self, table: &[u8], rows: &[Vec<u8>]) {
        if rows.is_empty() || !self.sidecar.lease_valid() {
            return;
        }
        let spec = ReadSpec::latest();
        let keys: Vec<QueryKey> = rows
            .iter()
            .map(|r| QueryKey { start: r.clone(), stop: next_key(r), spec: spec.clone(), filter: Vec::new() })
            .collect();
        let ticket = self.cache().fill_ticket(table, &keys[0]);
        if !ticket.whole_rows() {
            return;
        }
        let Ok(got) = self.side(|s| s.get(table, rows, &spec)) else {
            return;
        };
        self.stats.refills.fetch_add(rows.len() as u64, Ordering::Relaxed);
        let mut c = self.cache();
        for (k, r) in keys.iter().zip(got) {
            c.fill(table, k, served(r).into_iter().collect(), None, ticket);
        }
    }

    /// Is the notice channel up (subscribed and within the lease), and was a RegionObserver
    /// reported? (For metrics.)
    pub fn channel(&self) -> (bool, bool) {
        (self.sidecar.lease_valid(), self.sidecar.observer_loaded())
    }

    /// The cache, flushed first if the sidecar connection was lost or remade since the last
    /// look: HBase may have restarted or changed unseen meanwhile, so nothing cached before can
    /// be trusted (and fills in flight are voided).
    pub fn cache(&self) -> MutexGuard<'_, Cache> {
        let mut c = lock(&self.cache);
        let g = self.sidecar.generation();
        if self.sidecar_generation.swap(g, Ordering::SeqCst) != g {
            c.clear_all();
        }
        c
    }

    fn side<T>(&self, f: impl FnOnce(&SidecarClient) -> Result<T, SidecarError>) -> Result<T, SidecarError> {
        self.stats.sidecar_calls.fetch_add(1, Ordering::Relaxed);
        f(&self.sidecar)
    }

    /// Runs a write with invalidate-before-forward and the version bump after.
    fn write<T>(
        &self,
        table: &[u8],
        rows: Option<&[Vec<u8>]>,
        f: impl FnOnce(&SidecarClient) -> Result<T, SidecarError>,
    ) -> Result<T, SidecarError> {
        let refill = self.cache().begin_write(table, rows);
        let r = self.side(f);
        self.cache().end_write(table, rows);
        if !refill.is_empty() {
            if let Some(q) = self.refill_queue.get() {
                // A full queue drops the refill: those rows miss once instead.
                let _ = q.try_send((table.to_vec(), refill));
            }
        }
        r
    }

    /// May this query use the cache? Each-row entries hold whole rows, so a projection naming a
    /// family the table lacks would come back empty where HBase raises an error: such queries
    /// (and any when the families cannot be read) go to HBase uncached.
    /// Outside the lease (notices may be missed) the cache is not used at all: nothing is served
    /// from it and nothing is filled.
    fn cache_usable(&self, table: &[u8], spec: &ReadSpec, filter: &[u8]) -> bool {
        if !self.sidecar.lease_valid() {
            return false;
        }
        if spec.columns.is_empty() || !self.cache().may_use_each_row(spec, filter) {
            return true;
        }
        let known = self.cache().families(table);
        let families = match known {
            Some(f) => f,
            None => match self.side(|s| s.describe(table)) {
                Ok(f) => {
                    let names: Vec<Vec<u8>> = f.into_iter().map(|f| f.name).collect();
                    self.cache().set_families(table, names.clone());
                    names
                }
                Err(_) => return false,
            },
        };
        spec.columns.iter().all(|c| {
            let fam = c.split(|&b| b == b':').next().unwrap_or(&[]);
            families.iter().any(|f| f.as_slice() == fam)
        })
    }

    /// Reads rows (Get semantics), from the cache where possible; one entry per requested row,
    /// as a one-row answer (an each-row hit stays in its run's buffer: a Get copies the row's
    /// encoding from there, decoding nothing); None: no such row, or none of the columns asked
    /// for.
    pub fn read_rows(
        &self,
        table: &[u8],
        rows: &[Vec<u8>],
        spec: &ReadSpec,
    ) -> Result<Vec<Option<Answer>>, SidecarError> {
        let one = |r: Arc<CachedRow>| Answer::whole(Arc::new(vec![r]));
        if !self.cache_usable(table, spec, &[]) {
            let got = self.side(|s| s.get(table, rows, spec))?;
            return Ok(got.into_iter().map(|r| served(r).map(one)).collect());
        }
        let mut out: Vec<Option<Answer>> = vec![None; rows.len()];
        let mut missing = Vec::new();
        let keys: Vec<QueryKey> = rows
            .iter()
            .map(|r| QueryKey { start: r.clone(), stop: next_key(r), spec: spec.clone(), filter: Vec::new() })
            .collect();
        {
            let mut c = self.cache();
            for (i, k) in keys.iter().enumerate() {
                match c.lookup(table, k, 1) {
                    Some(h) => out[i] = Some(h.into_parts().0).filter(|a| !a.is_empty()),
                    None => missing.push(i),
                }
            }
        }
        if !missing.is_empty() {
            let ticket = self.cache().fill_ticket(table, &keys[missing[0]]);
            let whole = ticket.whole_rows();
            let fetch_spec = if whole { ReadSpec::latest() } else { spec.clone() };
            let want: Vec<Vec<u8>> = missing.iter().map(|&i| rows[i].clone()).collect();
            let got = self.side(|s| s.get(table, &want, &fetch_spec))?;
            let mut c = self.cache();
            for (&i, r) in missing.iter().zip(got) {
                let Some(r) = served(r) else {
                    c.fill(table, &keys[i], Vec::new(), None, ticket);
                    continue;
                };
                c.fill(table, &keys[i], vec![r.clone()], None, ticket);
                out[i] = if whole && !spec.columns.is_empty() {
                    served(crate::cache::project(&r.row, &spec.columns)).map(one)
                } else {
                    Some(one(r))
                };
            }
        }
        Ok(out)
    }

    /// Opens a scanner and reads its first page (from the cache or HBase), so a bad table or
    /// filter fails here, as with HBase.
    fn open_scan(
        &self,
        table: &[u8],
        key: QueryKey,
        batch: usize,
        sort_columns: bool,
        page_rows: usize,
    ) -> Result<ScannerID, SidecarError> {
        self.stats.scanners_opened.fetch_add(1, Ordering::Relaxed);
        let source = self.page(table, &key, &key.start, page_rows, true)?;
        let sc = Scanner {
            table: table.to_vec(),
            key,
            page_rows,
            source,
            batch,
            sort_columns,
            partial: None,
            last_used: Instant::now(),
        };
        self.add_scanner(sc)
    }

    /// The next rows of `key` from `start`: from the cache (all-row entries only for the first
    /// page; each-row entries for any page), else from HBase, filling the cache. A bounded
    /// query's first page reads up to CACHED_SCAN_ROWS_MAX rows so short ranges are cached whole.
    fn page(
        &self,
        table: &[u8],
        key: &QueryKey,
        start: &[u8],
        page_rows: usize,
        first: bool,
    ) -> Result<Source, SidecarError> {
        let at = QueryKey { start: start.to_vec(), ..key.clone() };
        let usable = self.cache_usable(table, &key.spec, &key.filter);
        let hit = {
            let mut c = self.cache();
            if !usable {
                None
            } else if first {
                c.lookup(table, &at, page_rows)
            } else {
                c.lookup_continuation(table, &at, page_rows)
            }
        };
        if let Some(h) = hit {
            let (rows, rest) = h.into_parts();
            return Ok(Source { rows, pos: 0, rest });
        }
        let (ticket, bytes_max) = {
            let mut c = self.cache();
            (c.fill_ticket(table, &at), c.result_bytes_max())
        };
        let whole = usable && ticket.whole_rows();
        let fetch_spec = if whole { ReadSpec::latest() } else { key.spec.clone() };
        let rows_max = match (first, key.stop.is_empty()) {
            (true, false) => CACHED_SCAN_ROWS_MAX,
            (true, true) => page_rows.min(OPEN_SCAN_FIRST_PAGE_ROWS),
            (false, _) => page_rows,
        };
        let mut rows = Vec::new();
        let mut bytes = 0usize;
        let mut next = start.to_vec();
        let mut rest = None;
        loop {
            let want = (rows_max - rows.len()).min(SCAN_PAGE_ROWS as usize) as i32;
            let (got, more) =
                self.side(|s| s.scan(table, &next, &key.stop, &fetch_spec, &key.filter, want, SCAN_PAGE_BYTES))?;
            if let Some(last) = got.last() {
                next = next_key(&last.row);
            }
            bytes += got.iter().map(Row::size_bytes).sum::<usize>();
            rows.extend(got);
            if !more {
                break;
            }
            if rows.len() >= rows_max || bytes >= bytes_max {
                rest = Some(next);
                break;
            }
        }
        // Encoded once here (outside the cache lock), then shared by the answer and the cache.
        let rows: Vec<Arc<CachedRow>> = rows.into_iter().map(|r| Arc::new(CachedRow::new(r))).collect();
        let answer: Vec<Arc<CachedRow>> = if whole && !key.spec.columns.is_empty() {
            rows.iter().filter_map(|r| served(crate::cache::project(&r.row, &key.spec.columns))).collect()
        } else {
            rows.clone()
        };
        if usable && (first || whole) {
            self.cache().fill(table, &at, rows, rest.clone(), ticket);
        }
        Ok(Source { rows: Answer::whole(Arc::new(answer)), pos: 0, rest })
    }

    fn add_scanner(&self, sc: Scanner) -> Result<ScannerID, SidecarError> {
        let mut t = lock(&self.scanners);
        if t.len() >= self.scanners_max {
            let now = Instant::now();
            t.retain(|_, s| now.duration_since(s.last_used) < SCANNER_IDLE_MAX);
            if t.len() >= self.scanners_max {
                return Err(SidecarError::Io {
                    message: format!("too many open scanners (limit {})", self.scanners_max),
                    can_retry: true,
                });
            }
        }
        loop {
            let id = self.next_scanner.fetch_add(1, Ordering::Relaxed);
            if id <= 0 {
                self.next_scanner.store(1, Ordering::Relaxed);
                continue;
            }
            if let std::collections::hash_map::Entry::Vacant(v) = t.entry(id) {
                v.insert(sc);
                return Ok(id);
            }
        }
    }

    /// Up to `n` results (rows, or batches of cells) from a scanner, into `out`: whole rows of
    /// an unsorted scanner as their cached encodings, batches and sorted rows built here.
    pub fn scanner_next(&self, id: ScannerID, n: i32, out: &mut dyn RowSink) -> Result<(), Declared> {
        let Some(mut sc) = lock(&self.scanners).remove(&id) else {
            return Err(Declared::Ia(IllegalArgument::new("scanner ID is invalid".to_string())));
        };
        let r = Self::send_rows(&mut sc, n.max(0) as usize, out, |sc, start| {
            self.page(&sc.table, &sc.key, &start, sc.page_rows, false)
        });
        sc.last_used = Instant::now();
        lock(&self.scanners).insert(id, sc);
        r.map_err(io_ia_declared)
    }

    /// Sends up to `n` results of `sc` into `out`, reading further pages with `page` (from the
    /// key to continue at) as the rows in hand run out. The rows in hand are read in place:
    /// no reference count is taken per row sent (an atomic read-modify-write per row, on rows
    /// that for a walk are mostly out of the CPU's cache, waits for each row's line in turn:
    /// docs/benchmarks.md, session 14).
    fn send_rows(
        sc: &mut Scanner,
        n: usize,
        out: &mut dyn RowSink,
        mut page: impl FnMut(&Scanner, Vec<u8>) -> Result<Source, SidecarError>,
    ) -> Result<(), SidecarError> {
        let mut sent = 0;
        // Bounded: each page either yields rows or moves `rest` forward, and pages are finite.
        let mut pages = 0;
        while sent < n {
            if let Some((r, off)) = sc.partial.take() {
                let end = (off + sc.batch).min(r.row.cells.len());
                out.built(to_result(&r.row, &r.row.cells[off..end], sc.sort_columns));
                sent += 1;
                if end < r.row.cells.len() {
                    sc.partial = Some((r, end));
                }
                continue;
            }
            if sc.source.pos >= sc.source.rows.len() {
                let Some(start) = sc.source.rest.take() else {
                    return Ok(());
                };
                pages += 1;
                if pages > 1000 {
                    return Err(SidecarError::Io { message: "scanner made no progress".into(), can_retry: true });
                }
                sc.source = page(sc, start)?;
                continue;
            }
            // Whole rows in a run's buffer (an each-row walk's), neither batched nor sorted:
            // their encodings lie back to back, so they go in one copy.
            if sc.batch == 0 && !sc.sort_columns {
                if let Some((bytes, k)) = sc.source.rows.encoded_at(sc.source.pos, n - sent) {
                    out.encoded(bytes, k);
                    sent += k;
                    sc.source.pos += k;
                    continue;
                }
            }
            let mut taken = 0;
            // Rows a few ahead are asked for before they are copied, so the cache misses of
            // rows spread over the table (a walk's) overlap instead of queuing one by one.
            let mut ahead = sc.source.rows.iter().skip(sc.source.pos + PREFETCH_ROWS_AHEAD);
            for r in sc.source.rows.iter().skip(sc.source.pos) {
                if sent == n {
                    break;
                }
                if let Some(a) = ahead.next() {
                    a.prefetch();
                }
                taken += 1;
                if sc.batch == 0 && !sc.sort_columns {
                    out.encoded(r.encoded(), 1);
                    sent += 1;
                    continue;
                }
                // Batched or sorted: the row's cells (decoded, for a row of a run's buffer).
                let Some(c) = r.to_cached() else { continue };
                if sc.batch > 0 && c.row.cells.len() > sc.batch {
                    sc.partial = Some((c, 0));
                    break;
                }
                if sc.sort_columns {
                    out.built(to_result(&c.row, &c.row.cells, true));
                } else {
                    out.cached(&c);
                }
                sent += 1;
            }
            sc.source.pos += taken;
        }
        Ok(())
    }

    /// getRow* (rows with data only, columns in map form) into `out`.
    pub fn get_rows(
        &self,
        table: &[u8],
        rows: &[Vec<u8>],
        columns: Vec<Vec<u8>>,
        ts: i64,
        out: &mut dyn RowSink,
    ) -> Result<(), Declared> {
        let s = spec(columns, ts, 1);
        for a in self.read_rows(table, rows, &s).map_err(io_declared)?.iter().flatten() {
            for r in a.iter() {
                out.encoded(r.encoded(), 1);
            }
        }
        Ok(())
    }

    fn get_cells(
        &self,
        table: &[u8],
        row: Vec<u8>,
        column: Vec<u8>,
        ts: i64,
        versions: i32,
    ) -> thrift::Result<Vec<TCell>> {
        if versions < 1 {
            return Err(io_error("numVersions must be positive".into(), false));
        }
        let s = spec(vec![column], ts, versions);
        let got = self.read_rows(table, &[row], &s).map_err(io)?;
        Ok(got
            .iter()
            .flatten()
            .flat_map(|a| a.to_cached())
            .flat_map(|r| r.row.cells.iter().map(|c| TCell::new(c.value.clone(), c.timestamp)).collect::<Vec<_>>())
            .collect())
    }

    fn mutate(&self, table: &[u8], batches: Vec<RowMutations>, ts: i64, order: MutateOrder) -> thrift::Result<()> {
        let rows: Vec<Vec<u8>> = batches.iter().map(|b| b.row.clone()).collect();
        self.write(table, Some(&rows), |s| s.mutate(table, &batches, ts, order)).map_err(io_ia)
    }

    fn delete(&self, table: &[u8], row: Vec<u8>, column: Vec<u8>, ts: i64) -> thrift::Result<()> {
        let rows = [row];
        self.write(table, Some(&rows), |s| s.delete(table, &rows[0], &column, ts)).map_err(io)
    }

    fn admin(&self, opcode: u8, table: &[u8]) -> thrift::Result<()> {
        self.write(table, None, |s| s.table_admin(opcode, table)).map_err(io)
    }

    fn get_rows_vec(
        &self,
        table: &[u8],
        rows: &[Vec<u8>],
        columns: Vec<Vec<u8>>,
        ts: i64,
    ) -> thrift::Result<Vec<TRowResult>> {
        let mut v = Vec::new();
        self.get_rows(table, rows, columns, ts, &mut v)?;
        Ok(v)
    }

    fn scan_open(
        &self,
        table: Vec<u8>,
        start: Vec<u8>,
        stop: Vec<u8>,
        columns: Vec<Vec<u8>>,
        ts: i64,
    ) -> thrift::Result<ScannerID> {
        let key = QueryKey { start, stop, spec: spec(columns, ts, 1), filter: Vec::new() };
        self.open_scan(&table, key, 0, false, SCAN_PAGE_ROWS_DEFAULT).map_err(io)
    }
}

/// A row as answered: None if it has no cells (HBase leaves empty rows out).
fn served(r: Row) -> Option<Arc<CachedRow>> {
    (!r.cells.is_empty()).then(|| Arc::new(CachedRow::new(r)))
}

fn mutations(ms: Vec<Mutation>) -> Vec<codec::Mutation> {
    ms.into_iter()
        .map(|m| codec::Mutation {
            is_delete: m.is_delete.unwrap_or(false),
            column: m.column.unwrap_or_default(),
            value: m.value.unwrap_or_default(),
            write_to_wal: m.write_to_w_a_l.unwrap_or(true),
        })
        .collect()
}

fn batches(bs: Vec<BatchMutation>) -> Vec<RowMutations> {
    bs.into_iter()
        .map(|b| RowMutations { row: b.row.unwrap_or_default(), mutations: mutations(b.mutations.unwrap_or_default()) })
        .collect()
}

fn family_name(mut name: Vec<u8>) -> Vec<u8> {
    name.push(b':');
    name
}

/// The Thrift handler: a thin adapter over [`RangeCache`], one per connection.
pub struct Handler(pub Arc<RangeCache>);

type Attrs = BTreeMap<Text, Text>;

impl HbaseSyncHandler for Handler {
    fn handle_enable_table(&self, t: Vec<u8>) -> thrift::Result<()> {
        self.0.admin(op::ENABLE_TABLE, &t)
    }
    fn handle_disable_table(&self, t: Vec<u8>) -> thrift::Result<()> {
        self.0.admin(op::DISABLE_TABLE, &t)
    }
    fn handle_is_table_enabled(&self, t: Vec<u8>) -> thrift::Result<bool> {
        self.0.side(|s| s.is_enabled(&t)).map_err(io)
    }
    fn handle_compact(&self, _t: Vec<u8>) -> thrift::Result<()> {
        Err(io_error("compact is not supported by Slipstream's HBase front end".into(), false))
    }
    fn handle_major_compact(&self, _t: Vec<u8>) -> thrift::Result<()> {
        Err(io_error("majorCompact is not supported by Slipstream's HBase front end".into(), false))
    }
    fn handle_get_table_names(&self) -> thrift::Result<Vec<Text>> {
        self.0.side(|s| s.list_tables()).map_err(io)
    }
    fn handle_get_column_descriptors(&self, t: Text) -> thrift::Result<BTreeMap<Text, ColumnDescriptor>> {
        let fams = self.0.side(|s| s.describe(&t)).map_err(io)?;
        Ok(fams
            .into_iter()
            .map(|f| {
                let name = family_name(f.name);
                let d = ColumnDescriptor::new(
                    name.clone(),
                    f.max_versions,
                    f.compression,
                    f.in_memory,
                    f.bloom_filter,
                    0,
                    0,
                    f.block_cache,
                    f.ttl_seconds,
                );
                (name, d)
            })
            .collect())
    }
    fn handle_create_table(&self, t: Text, cfs: Vec<ColumnDescriptor>) -> thrift::Result<()> {
        let fams: Vec<Family> = cfs
            .into_iter()
            .map(|c| Family {
                name: c.name.unwrap_or_default(),
                max_versions: c.max_versions.unwrap_or(3),
                ttl_seconds: c.time_to_live.unwrap_or(i32::MAX),
                in_memory: c.in_memory.unwrap_or(false),
                block_cache: c.block_cache_enabled.unwrap_or(false),
                compression: c.compression.unwrap_or_else(|| "NONE".into()),
                bloom_filter: c.bloom_filter_type.unwrap_or_else(|| "NONE".into()),
            })
            .collect();
        self.0.write(&t, None, |s| s.create_table(&t, &fams)).map_err(|e| match e {
            SidecarError::AlreadyExists(m) => thrift::Error::User(Box::new(AlreadyExists::new(m))),
            other => io_ia(other),
        })
    }
    fn handle_delete_table(&self, t: Text) -> thrift::Result<()> {
        self.0.admin(op::DELETE_TABLE, &t)
    }
    fn handle_get(&self, t: Text, row: Text, column: Text, _a: Attrs) -> thrift::Result<Vec<TCell>> {
        self.0.get_cells(&t, row, column, TS_LATEST, 1)
    }
    fn handle_get_ver(&self, t: Text, row: Text, column: Text, n: i32, _a: Attrs) -> thrift::Result<Vec<TCell>> {
        self.0.get_cells(&t, row, column, TS_LATEST, n)
    }
    fn handle_get_ver_ts(
        &self,
        t: Text,
        row: Text,
        column: Text,
        ts: i64,
        n: i32,
        _a: Attrs,
    ) -> thrift::Result<Vec<TCell>> {
        self.0.get_cells(&t, row, column, ts, n)
    }
    fn handle_get_row(&self, t: Text, row: Text, _a: Attrs) -> thrift::Result<Vec<TRowResult>> {
        self.0.get_rows_vec(&t, &[row], Vec::new(), TS_LATEST)
    }
    fn handle_get_row_with_columns(
        &self,
        t: Text,
        row: Text,
        cols: Vec<Text>,
        _a: Attrs,
    ) -> thrift::Result<Vec<TRowResult>> {
        self.0.get_rows_vec(&t, &[row], cols, TS_LATEST)
    }
    fn handle_get_row_ts(&self, t: Text, row: Text, ts: i64, _a: Attrs) -> thrift::Result<Vec<TRowResult>> {
        self.0.get_rows_vec(&t, &[row], Vec::new(), ts)
    }
    fn handle_get_row_with_columns_ts(
        &self,
        t: Text,
        row: Text,
        cols: Vec<Text>,
        ts: i64,
        _a: Attrs,
    ) -> thrift::Result<Vec<TRowResult>> {
        self.0.get_rows_vec(&t, &[row], cols, ts)
    }
    fn handle_get_rows(&self, t: Text, rows: Vec<Text>, _a: Attrs) -> thrift::Result<Vec<TRowResult>> {
        self.0.get_rows_vec(&t, &rows, Vec::new(), TS_LATEST)
    }
    fn handle_get_rows_with_columns(
        &self,
        t: Text,
        rows: Vec<Text>,
        cols: Vec<Text>,
        _a: Attrs,
    ) -> thrift::Result<Vec<TRowResult>> {
        self.0.get_rows_vec(&t, &rows, cols, TS_LATEST)
    }
    fn handle_get_rows_ts(&self, t: Text, rows: Vec<Text>, ts: i64, _a: Attrs) -> thrift::Result<Vec<TRowResult>> {
        self.0.get_rows_vec(&t, &rows, Vec::new(), ts)
    }
    fn handle_get_rows_with_columns_ts(
        &self,
        t: Text,
        rows: Vec<Text>,
        cols: Vec<Text>,
        ts: i64,
        _a: Attrs,
    ) -> thrift::Result<Vec<TRowResult>> {
        self.0.get_rows_vec(&t, &rows, cols, ts)
    }
    fn handle_mutate_row(&self, t: Text, row: Text, ms: Vec<Mutation>, _a: Attrs) -> thrift::Result<()> {
        let b = vec![RowMutations { row, mutations: mutations(ms) }];
        self.0.mutate(&t, b, TS_LATEST, MutateOrder::DeletesFirst)
    }
    fn handle_mutate_row_ts(&self, t: Text, row: Text, ms: Vec<Mutation>, ts: i64, _a: Attrs) -> thrift::Result<()> {
        let b = vec![RowMutations { row, mutations: mutations(ms) }];
        self.0.mutate(&t, b, ts, MutateOrder::DeletesFirst)
    }
    fn handle_mutate_rows(&self, t: Text, bs: Vec<BatchMutation>, _a: Attrs) -> thrift::Result<()> {
        self.0.mutate(&t, batches(bs), TS_LATEST, MutateOrder::PutsFirst)
    }
    fn handle_mutate_rows_ts(&self, t: Text, bs: Vec<BatchMutation>, ts: i64, _a: Attrs) -> thrift::Result<()> {
        self.0.mutate(&t, batches(bs), ts, MutateOrder::PutsFirst)
    }
    fn handle_atomic_increment(&self, t: Text, row: Text, column: Text, value: i64) -> thrift::Result<i64> {
        let rows = [row];
        self.0.write(&t, Some(&rows), |s| s.increment(&t, &rows[0], &column, value)).map_err(io_ia)
    }
    fn handle_delete_all(&self, t: Text, row: Text, column: Text, _a: Attrs) -> thrift::Result<()> {
        self.0.delete(&t, row, column, TS_LATEST)
    }
    fn handle_delete_all_ts(&self, t: Text, row: Text, column: Text, ts: i64, _a: Attrs) -> thrift::Result<()> {
        self.0.delete(&t, row, column, ts)
    }
    fn handle_delete_all_row(&self, t: Text, row: Text, _a: Attrs) -> thrift::Result<()> {
        self.0.delete(&t, row, Vec::new(), TS_LATEST)
    }
    fn handle_delete_all_row_ts(&self, t: Text, row: Text, ts: i64, _a: Attrs) -> thrift::Result<()> {
        self.0.delete(&t, row, Vec::new(), ts)
    }
    fn handle_increment(&self, inc: TIncrement) -> thrift::Result<()> {
        let t = inc.table.unwrap_or_default();
        let rows = [inc.row.unwrap_or_default()];
        let col = inc.column.unwrap_or_default();
        let amount = inc.ammount.unwrap_or(0);
        self.0.write(&t, Some(&rows), |s| s.increment(&t, &rows[0], &col, amount)).map(|_| ()).map_err(io)
    }
    fn handle_scanner_open_with_scan(&self, t: Text, scan: TScan, _a: Attrs) -> thrift::Result<ScannerID> {
        if scan.reversed == Some(true) {
            return Err(io_error("reversed scans are not supported by Slipstream's HBase front end yet".into(), false));
        }
        let batch = scan.batch_size.unwrap_or(0);
        if batch < 0 {
            return Err(io_error("batchSize must not be negative".into(), false));
        }
        let key = QueryKey {
            start: scan.start_row.unwrap_or_default(),
            stop: scan.stop_row.unwrap_or_default(),
            spec: spec(scan.columns.unwrap_or_default(), scan.timestamp.unwrap_or(TS_LATEST), 1),
            filter: scan.filter_string.unwrap_or_default(),
        };
        let sort = scan.sort_columns.unwrap_or(false);
        // The client's caching hint sizes pages (happybase sends min(batch_size, limit)).
        let page_rows = match scan.caching {
            Some(c) if c > 0 => (c as usize).min(SCAN_PAGE_ROWS as usize),
            _ => SCAN_PAGE_ROWS_DEFAULT,
        };
        self.0.open_scan(&t, key, batch as usize, sort, page_rows).map_err(io)
    }
    fn handle_scanner_open(&self, t: Text, start: Text, cols: Vec<Text>, _a: Attrs) -> thrift::Result<ScannerID> {
        self.0.scan_open(t, start, Vec::new(), cols, TS_LATEST)
    }
    fn handle_scanner_open_with_stop(
        &self,
        t: Text,
        start: Text,
        stop: Text,
        cols: Vec<Text>,
        _a: Attrs,
    ) -> thrift::Result<ScannerID> {
        self.0.scan_open(t, start, stop, cols, TS_LATEST)
    }
    fn handle_scanner_open_with_prefix(
        &self,
        t: Text,
        prefix: Text,
        cols: Vec<Text>,
        _a: Attrs,
    ) -> thrift::Result<ScannerID> {
        // Rows with the prefix are exactly [prefix, prefix_stop(prefix)) (HBase uses a PrefixFilter).
        let stop = prefix_stop(&prefix);
        self.0.scan_open(t, prefix, stop, cols, TS_LATEST)
    }
    fn handle_scanner_open_ts(
        &self,
        t: Text,
        start: Text,
        cols: Vec<Text>,
        ts: i64,
        _a: Attrs,
    ) -> thrift::Result<ScannerID> {
        self.0.scan_open(t, start, Vec::new(), cols, ts)
    }
    fn handle_scanner_open_with_stop_ts(
        &self,
        t: Text,
        start: Text,
        stop: Text,
        cols: Vec<Text>,
        ts: i64,
        _a: Attrs,
    ) -> thrift::Result<ScannerID> {
        self.0.scan_open(t, start, stop, cols, ts)
    }
    // scannerGet, scannerGetList and the getRow* calls without a timestamp are answered by
    // crate::hot before the processor; these are its equivalents (and the tests' reference).
    fn handle_scanner_get(&self, id: ScannerID) -> thrift::Result<Vec<TRowResult>> {
        let mut v = Vec::new();
        self.0.scanner_next(id, 1, &mut v)?;
        Ok(v)
    }
    fn handle_scanner_get_list(&self, id: ScannerID, n: i32) -> thrift::Result<Vec<TRowResult>> {
        let mut v = Vec::new();
        self.0.scanner_next(id, n, &mut v)?;
        Ok(v)
    }
    fn handle_scanner_close(&self, id: ScannerID) -> thrift::Result<()> {
        match lock(&self.0.scanners).remove(&id) {
            Some(_) => Ok(()),
            None => Err(illegal("scanner ID is invalid")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_stop_is_the_next_prefix() {
        assert_eq!(prefix_stop(b"ab"), b"ac");
        assert_eq!(prefix_stop(b"a\xff"), b"b");
        assert_eq!(prefix_stop(b"\xff\xff"), b"");
        assert_eq!(prefix_stop(b""), b"");
    }
}
