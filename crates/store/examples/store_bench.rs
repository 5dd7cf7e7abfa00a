//! Rough single-process throughput check of the store (not a protocol benchmark):
//! `cargo run --release -p slipstream-store --example store_bench [threads] [keys]`.

use slipstream_store::{GetOpts, SetMode, Store, StoreConfig, StoreOpts};
use std::sync::Arc;
use std::time::Instant;

fn main() {
    let mut args = std::env::args().skip(1);
    let threads: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1);
    let keys: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(1_000_000);
    let ops_per_thread: u64 = 5_000_000;
    let store = Arc::new(Store::new(StoreConfig { memory_bytes_max: 1 << 30, ..StoreConfig::default() }));
    let value = vec![b'v'; 100];
    let t0 = Instant::now();
    for k in 0..keys {
        store.store(SetMode::Set, format!("key:{k:010}").as_bytes(), &value, 0, 0, StoreOpts::default());
    }
    let fill = t0.elapsed();
    println!("fill {keys} keys: {:.0} ns/op", fill.as_nanos() as f64 / keys as f64);
    let t0 = Instant::now();
    let hs: Vec<_> = (0..threads)
        .map(|t| {
            let store = store.clone();
            let value = value.clone();
            std::thread::spawn(move || {
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ t as u64;
                let mut key = *b"key:0000000000";
                let mut hits = 0u64;
                let mut out = Vec::with_capacity(256);
                for i in 0..ops_per_thread {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let mut k = x % keys;
                    for d in (4..14).rev() {
                        key[d] = b'0' + (k % 10) as u8;
                        k /= 10;
                    }
                    if i % 10 == 0 {
                        store.store(SetMode::Set, &key, &value, 0, 0, StoreOpts::default());
                    } else {
                        let opts = GetOpts { bump: true, ..GetOpts::default() };
                        hits += store.get(&key, opts, |o| match o.item {
                            Some(it) => {
                                out.clear();
                                out.extend_from_slice(it.value);
                                1
                            }
                            None => 0,
                        });
                    }
                }
                hits
            })
        })
        .collect();
    let hits: u64 = hs.into_iter().map(|h| h.join().unwrap_or(0)).sum();
    let el = t0.elapsed();
    let total = ops_per_thread * threads as u64;
    println!(
        "{threads} threads, 90% get / 10% set: {:.1} Mops/s total, {:.0} ns/op per thread, hits {hits}",
        total as f64 / el.as_secs_f64() / 1e6,
        el.as_nanos() as f64 * threads as f64 / total as f64
    );
}
