//! In-process each-row walk timing (issue 16, session 15): is the first walk's cost fixed per
//! process start without the network, the sidecar or the Thrift layer? Fills a 20,000-row table
//! (4 cells x 32 B, the benchmark's rows) with random 100-row fills from `--fillers` threads (as
//! connection threads fill the daemon's cache), then `--threads` threads walk random 100-row
//! ranges (the bench's `--starts 0`) under the cache's mutex and copy each answer's encodings into
//! a reply buffer outside it, for `--secs`; prints ns of CPU per walk. `--all-row` times all-row
//! hits on 64 fixed ranges instead. The copy is the reply's (session 16): a walk's slice of a
//! run's buffer in one copy, an all-row entry's rows one by one. Not a test and not the benchmark (bench/hbase_walk_regimes.py
//! is): a probe for what sets the per-start regime.
use slipstream_rangecache::cache::{Answer, Cache, QueryKey, Strategy};
use slipstream_rangecache::reply::CachedRow;
use slipstream_rangecache::sidecar::codec::{Cell, ReadSpec, Row};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const PREFETCH_ROWS: usize = 4;

fn key(i: usize) -> Vec<u8> {
    format!("row{i:07}").into_bytes()
}

fn xorshift(s: &mut u64) -> u64 {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    *s
}

fn rows(start: usize, n: usize, keys: usize) -> Vec<Arc<CachedRow>> {
    (start..(start + n).min(keys))
        .map(|i| {
            let cells = (0..4)
                .map(|j| Cell {
                    family: b"cf".to_vec(),
                    qualifier: format!("c{j}").into_bytes(),
                    timestamp: 1,
                    value: format!("{:032}", i * 4 + j).into_bytes(),
                })
                .collect();
            Arc::new(CachedRow::new(Row { row: key(i), cells }))
        })
        .collect()
}

/// Copies an answer's encodings into `buf` as the reply does (send_rows): a run slice's rows
/// in one copy, other rows (an all-row entry's) one by one, prefetched a few ahead if asked.
fn copy_answer(a: &Answer, buf: &mut Vec<u8>, prefetch: bool) {
    let mut pos = 0;
    while let Some((bytes, k)) = a.encoded_at(pos, a.len() - pos) {
        buf.extend_from_slice(bytes);
        pos += k;
    }
    if pos > 0 {
        return;
    }
    let mut ahead = a.iter().skip(PREFETCH_ROWS);
    for row in a.iter() {
        if let Some(r) = ahead.next().filter(|_| prefetch) {
            r.prefetch();
        }
        buf.extend_from_slice(row.encoded());
    }
}

fn query(start: usize) -> QueryKey {
    QueryKey { start: key(start), stop: key(start + 100), spec: ReadSpec::latest(), filter: Vec::new() }
}

fn thread_cpu_ns() -> u64 {
    let mut t = Timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec into `t`, which lives for the call.
    unsafe { clock_gettime(3, &mut t) }; // CLOCK_THREAD_CPUTIME_ID
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

#[repr(C)]
struct Timespec {
    tv_sec: i64,
    tv_nsec: i64,
}

extern "C" {
    fn clock_gettime(clk: i32, tp: *mut Timespec) -> i32;
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let arg = |n: &str, d: usize| {
        args.iter().position(|a| a == n).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok()).unwrap_or(d)
    };
    let all_row = args.iter().any(|a| a == "--all-row");
    let prefetch = args.iter().any(|a| a == "--prefetch");
    let (keys, fillers, threads, secs) =
        (arg("--keys", 20_000), arg("--fillers", 4), arg("--threads", 4), arg("--secs", 3));
    let seed = arg("--seed", std::process::id() as usize) as u64 | 1;
    let strategy = if all_row { Strategy::AllRow } else { Strategy::EachRow };
    let cache = Arc::new(Mutex::new(Cache::new(strategy, 512 << 20)));
    let table = b"t".to_vec();
    // Fill: each-row random ranges until every start walks; all-row the 64 fixed ranges.
    let fill = |c: &Mutex<Cache>, start: usize| {
        let q = query(start);
        let r = rows(start, 100, keys);
        let t = c.lock().expect("lock").fill_ticket(&table, &q);
        c.lock().expect("lock").fill(&table, &q, r, None, t);
    };
    if all_row {
        for i in 0..64 {
            fill(&cache, i * (keys / 64));
        }
    } else {
        std::thread::scope(|s| {
            for f in 0..fillers {
                let (cache, fill) = (&cache, &fill);
                s.spawn(move || {
                    let mut r = seed.wrapping_add(f as u64 * 7919) | 1;
                    for _ in 0..(3 * keys / 100 / fillers) {
                        fill(cache, xorshift(&mut r) as usize % keys);
                    }
                });
            }
        });
        for start in (0..keys).step_by(50) {
            let q = query(start);
            if cache.lock().expect("lock").lookup(&table, &q, 100).is_none() {
                fill(&cache, start);
            }
        }
    }
    let deadline = Instant::now() + Duration::from_secs(secs as u64);
    let out: Vec<(u64, u64, u64)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let cache = &cache;
                let table = &table;
                s.spawn(move || {
                    let mut r = seed.wrapping_mul(31).wrapping_add(t as u64) | 1;
                    let mut buf = Vec::with_capacity(64 << 10);
                    let (mut n, mut miss) = (0u64, 0u64);
                    let c0 = thread_cpu_ns();
                    while Instant::now() < deadline {
                        for _ in 0..64 {
                            let start = if all_row {
                                (xorshift(&mut r) as usize % 64) * (keys / 64)
                            } else {
                                xorshift(&mut r) as usize % (keys - 100)
                            };
                            let hit = cache.lock().expect("lock").lookup(table, &query(start), 100);
                            buf.clear();
                            match hit {
                                Some(h) => copy_answer(&h.into_parts().0, &mut buf, prefetch),
                                None => miss += 1,
                            }
                            std::hint::black_box(&buf);
                            n += 1;
                        }
                    }
                    (n, miss, thread_cpu_ns() - c0)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("walker")).collect()
    });
    let (n, miss, cpu) = out.iter().fold((0, 0, 0), |a, b| (a.0 + b.0, a.1 + b.1, a.2 + b.2));
    println!(
        "{} walks={} misses={} cpu_ns_per_walk={:.0}",
        if all_row { "all-row" } else { "each-row" },
        n,
        miss,
        cpu as f64 / n as f64
    );
}
