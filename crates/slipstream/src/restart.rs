//! memcached's restartable cache (`-e PATH`): SIGUSR1 stops the daemon gracefully and saves
//! the store's live items to PATH and a metadata file PATH.meta; the next start with the same
//! `-e` loads them back (CAS values, flags, absolute expiry times; what expired meanwhile is
//! left out) and removes the metadata, so a later crash never reloads an old save.
//!
//! As memcached 1.6.18: no PATH.meta means a clean cache (said on stderr); a PATH.meta whose
//! first line is not this format's stops the start (`[restart] corrupt metadata file`); a save
//! that does not check out (data file missing, short, or not the items the metadata counts)
//! starts clean (`[restart] failed to validate metadata, starting with a clean cache`).
//! Unlike memcached (which maps PATH as its item memory), the items are written at the stop
//! and read at the start, so the file need not sit on a RAM disk and a changed `-m` or `-I`
//! keeps what still fits. Memory: the save holds one shard's items at a time; the load reads
//! the data file whole (at most the saved store's size).
//!
//! Not for: tenants' stores (replicated tenants have their own log and snapshots) or the
//! item byte layout (`slipstream_store::ItemExport::encode`).

use slipstream_store::{ItemExport, Store, StoreResult, ITEM_BYTES_MIN};
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// The first line of a metadata file this version writes.
const META_FIRST_LINE: &str = "slipstream_restart 1";
/// The first bytes of a data file.
const DATA_MAGIC: &[u8; 8] = b"SLRSTRT1";
/// Encoded items gathered before a write (one shard's usually fit).
const WRITE_CHUNK_BYTES: usize = 4 << 20;

/// What a metadata file records besides the items.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Meta {
    stop_unix_s: i64,
    cas_last: u64,
    items_peak: u64,
    items: u64,
    data_bytes: u64,
}

/// What a start with `-e` found.
#[derive(Debug, PartialEq, Eq)]
pub enum Loaded {
    /// No metadata file: a clean cache.
    Clean,
    /// The save did not check out: a clean cache, with the reason.
    Invalid(String),
    /// This many items loaded (of the saved ones, the rest had expired or no longer fit).
    Items { loaded: u64, saved: u64 },
}

fn meta_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".meta");
    PathBuf::from(p)
}

/// Load a save into `store` (empty, before anything is served). Err: the metadata file is
/// corrupt and the start must stop, as memcached's does.
pub fn load(path: &Path, store: &Store) -> Result<Loaded, String> {
    let meta_file = meta_path(path);
    let text = match fs::read(&meta_file) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Loaded::Clean),
        Err(e) => return Err(format!("[restart] cannot read {}: {e}", meta_file.display())),
    };
    let Some(meta) = parse_meta(&String::from_utf8_lossy(&text)) else {
        return Err(format!(
            "[restart] corrupt metadata file {} (remove it to start with a clean cache)",
            meta_file.display()
        ));
    };
    // Read once: a crash after this start must not bring back this save's items.
    let _ = fs::remove_file(&meta_file);
    let data = match fs::read(path) {
        Ok(d) => d,
        Err(e) => return Ok(Loaded::Invalid(format!("{}: {e}", path.display()))),
    };
    let _ = fs::remove_file(path);
    match decode_all(&meta, &data) {
        Ok(items) => Ok(import(&meta, &items, store)),
        Err(why) => Ok(Loaded::Invalid(why)),
    }
}

/// Every item of the data file, decoded whole before the store is touched (borrowing `data`).
fn decode_all<'a>(meta: &Meta, data: &'a [u8]) -> Result<Vec<ItemExport<'a>>, String> {
    if data.len() as u64 != meta.data_bytes || !data.starts_with(DATA_MAGIC) {
        return Err(format!("data file of {} bytes, the metadata says {}", data.len(), meta.data_bytes));
    }
    let mut at = DATA_MAGIC.len();
    // parse_meta bounded `items` by what `data_bytes` can hold.
    let mut items = Vec::with_capacity(meta.items as usize);
    for n in 0..meta.items {
        match ItemExport::decode(&data[at..]) {
            Ok((item, used)) => {
                at += used;
                items.push(item);
            }
            Err(e) => return Err(format!("item {n} of {}: {e:?}", meta.items)),
        }
    }
    if at != data.len() {
        return Err(format!("{} bytes after the {} items", data.len() - at, meta.items));
    }
    Ok(items)
}

/// Store the checked items; skip those expired by now (the daemon was stopped meanwhile).
fn import(meta: &Meta, items: &[ItemExport<'_>], store: &Store) -> Loaded {
    let now = store.clock().now_unix_s();
    let mut loaded = 0;
    for item in items {
        if item.exptime_unix_s != 0 && item.exptime_unix_s <= now {
            continue;
        }
        if matches!(store.import(item), StoreResult::Stored(_)) {
            loaded += 1;
        }
    }
    store.set_cas_last(store.cas_last().max(meta.cas_last));
    store.raise_items_peak(meta.items_peak);
    Loaded::Items { loaded, saved: meta.items }
}

/// Write the store's live items to `path`, then the metadata file (its presence marks a
/// complete save). Called once the workers have stopped.
pub fn save(path: &Path, store: &Store) -> io::Result<u64> {
    let tmp = tmp_path(path);
    let mut file = io::BufWriter::new(fs::File::create(&tmp)?);
    file.write_all(DATA_MAGIC)?;
    let (mut items, mut data_bytes) = (0u64, DATA_MAGIC.len() as u64);
    let mut buf = Vec::with_capacity(WRITE_CHUNK_BYTES);
    for shard in 0..store.shard_count() {
        store.export_shard(shard, |i| {
            i.encode(&mut buf);
            items += 1;
        });
        data_bytes += buf.len() as u64;
        file.write_all(&buf)?;
        buf.clear();
    }
    file.into_inner().map_err(io::IntoInnerError::into_error)?.sync_all()?;
    fs::rename(&tmp, path)?;
    let meta = Meta {
        stop_unix_s: store.clock().now_unix_s(),
        cas_last: store.cas_last(),
        items_peak: store.items_peak(),
        items,
        data_bytes,
    };
    let meta_file = meta_path(path);
    let meta_tmp = tmp_path(&meta_file);
    fs::write(&meta_tmp, render_meta(&meta))?;
    fs::rename(&meta_tmp, &meta_file)?;
    Ok(items)
}

fn tmp_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".tmp");
    PathBuf::from(p)
}

fn render_meta(m: &Meta) -> String {
    format!(
        "{META_FIRST_LINE}\nstop_unix_s {}\ncas_last {}\nitems_peak {}\nitems {}\ndata_bytes {}\n",
        m.stop_unix_s, m.cas_last, m.items_peak, m.items, m.data_bytes
    )
}

fn parse_meta(text: &str) -> Option<Meta> {
    let mut lines = text.lines();
    if lines.next()? != META_FIRST_LINE {
        return None;
    }
    let mut field = |name: &str| -> Option<i64> {
        let line = lines.next()?;
        let v = line.strip_prefix(name)?.strip_prefix(' ')?;
        v.parse().ok()
    };
    let stop_unix_s = field("stop_unix_s")?;
    let cas_last = u64::try_from(field("cas_last")?).ok()?;
    let items_peak = u64::try_from(field("items_peak")?).ok()?;
    let items = u64::try_from(field("items")?).ok()?;
    let data_bytes = u64::try_from(field("data_bytes")?).ok()?;
    // A count the data could not hold is corrupt.
    (items <= data_bytes / ITEM_BYTES_MIN as u64).then_some(Meta {
        stop_unix_s,
        cas_last,
        items_peak,
        items,
        data_bytes,
    })
}

/// The line for a start with `-e`, memcached's wording where it has one.
pub fn describe(loaded: &Loaded) -> String {
    match loaded {
        Loaded::Clean => "[restart] no metadata save file, starting with a clean cache".into(),
        Loaded::Invalid(why) => format!("[restart] failed to validate metadata, starting with a clean cache ({why})"),
        Loaded::Items { loaded, saved } => format!("[restart] {loaded} of {saved} saved items restored"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use slipstream_store::{Clock, SetMode, StoreConfig, StoreOpts};

    const START_UNIX_S: i64 = 1_700_000_000;

    fn store_at(started_unix_s: i64) -> Store {
        let c = StoreConfig { memory_bytes_max: 8 << 20, shards: 4, ..StoreConfig::default() };
        Store::with_clock(c, Clock::manual(started_unix_s))
    }

    fn store() -> Store {
        store_at(START_UNIX_S)
    }

    fn set(s: &Store, key: &str, value: &[u8], flags: u32, exptime: i64) {
        let r = s.store(SetMode::Set, key.as_bytes(), value, flags, exptime, StoreOpts::default());
        assert!(matches!(r, StoreResult::Stored(_)), "{key}: {r:?}");
    }

    fn get(s: &Store, key: &str) -> Option<(Vec<u8>, u32, u64)> {
        s.get(key.as_bytes(), Default::default(), |o| o.item.map(|i| (i.value.to_vec(), i.flags, i.cas)))
    }

    fn dir() -> PathBuf {
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let d = std::env::temp_dir().join(format!("slipstream-restart-{}-{n}", std::process::id()));
        fs::create_dir_all(&d).expect("temp dir");
        d
    }

    #[test]
    fn a_save_comes_back_with_values_flags_cas_and_expiry_and_is_used_once() {
        let d = dir();
        let path = d.join("mem");
        let a = store();
        for i in 0..500u32 {
            set(&a, &format!("k{i}"), &vec![b'v'; i as usize], i, if i % 2 == 0 { 0 } else { 100 });
        }
        let want: Vec<_> = (0..500u32).map(|i| get(&a, &format!("k{i}"))).collect();
        assert_eq!(save(&path, &a).expect("save"), 500);
        let b = store();
        assert_eq!(load(&path, &b).expect("load"), Loaded::Items { loaded: 500, saved: 500 });
        for (i, w) in want.iter().enumerate() {
            assert_eq!(&get(&b, &format!("k{i}")), w, "k{i}");
        }
        assert_eq!(b.cas_last(), a.cas_last());
        // The metadata was read once: the next start is clean.
        assert_eq!(load(&path, &store()).expect("second load"), Loaded::Clean);
        // Items that expired while the daemon was stopped stay out.
        save(&path, &a).expect("save again");
        let later = store_at(START_UNIX_S + 200);
        assert_eq!(load(&path, &later).expect("load later"), Loaded::Items { loaded: 250, saved: 500 });
        assert!(get(&later, "k1").is_none() && get(&later, "k2").is_some());
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn a_corrupt_metadata_file_stops_the_start_and_a_bad_data_file_starts_clean() {
        let d = dir();
        let path = d.join("mem");
        fs::write(meta_path(&path), b"").expect("empty meta");
        assert!(load(&path, &store()).unwrap_err().contains("corrupt metadata file"));
        let a = store();
        set(&a, "k", b"v", 0, 0);
        save(&path, &a).expect("save");
        let data = fs::read(&path).expect("data");
        for cut in [0, 4, data.len() - 1] {
            save(&path, &a).expect("save");
            fs::write(&path, &data[..cut]).expect("cut");
            let b = store();
            assert!(matches!(load(&path, &b).expect("load"), Loaded::Invalid(_)), "cut {cut}");
            assert!(get(&b, "k").is_none());
        }
        // The data file's length agrees but an item's key length is wrong.
        save(&path, &a).expect("save");
        let mut bad = data.clone();
        bad[DATA_MAGIC.len()] = 200;
        fs::write(&path, &bad).expect("bad");
        assert!(matches!(load(&path, &store()).expect("load"), Loaded::Invalid(_)));
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn the_item_peak_survives_a_restart() {
        let d = dir();
        let path = d.join("mem");
        let a = store();
        for i in 0..50 {
            set(&a, &format!("k{i}"), b"x", 0, 0);
        }
        let _ = a.stats();
        for i in 0..50 {
            assert!(a.unlink(format!("k{i}").as_bytes()));
        }
        save(&path, &a).expect("save");
        let b = store();
        assert_eq!(load(&path, &b).expect("load"), Loaded::Items { loaded: 0, saved: 0 });
        assert_eq!(b.items_peak(), 50);
        let _ = fs::remove_dir_all(&d);
    }
}
