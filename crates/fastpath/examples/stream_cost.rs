//! Per-datagram cost of the XDP stream engine (word count, change point), measured in the
//! kernel with BPF_PROG_TEST_RUN's repeat loop (no interface needed; fresh maps). Prints one
//! line per case: kernel-timed mean ns per datagram and per record, and the verdict. Needs root.
//!
//! Usage: `stream_cost [RUNS]` (default 20000). The word-count datagrams are what
//! `slipstream send --kind words` writes (words `w<rank>`, one space apart); repeated runs
//! count the same words into the same window, so every lookup after the first hits, as in a
//! steady stream over a small vocabulary.
//!
//! Not for: end-to-end figures (bench/stream_cpu.sh measures those across a veth pair).

use slipstream_fastpath::fixtures::udp_frame;
use slipstream_fastpath::stream::{self as ks, StreamCfg};
use slipstream_fastpath::Kernel;

const WC_PORT: u16 = 7100;
const CP_PORT: u16 = 7101;

fn words(n: usize) -> Vec<u8> {
    // Zipf-like ranks: mostly short words, some up to four digits.
    let ranks = [0, 1, 12, 3, 0, 145, 2, 7, 0, 31, 1, 999, 4, 0, 58, 2];
    let v: Vec<String> = (0..n).map(|i| format!("w{}", ranks[i % ranks.len()])).collect();
    v.join(" ").into_bytes()
}

fn numbers(n: usize) -> Vec<u8> {
    let v: Vec<String> = (0..n).map(|i| format!("{:.6}", 10.0 + (i as f64 * 0.37).sin())).collect();
    v.join("\n").into_bytes()
}

fn main() {
    let runs: u32 = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(20_000).clamp(1, 1_000_000);
    let k = match Kernel::load_multi(16) {
        Ok(k) => k,
        Err(e) => {
            eprintln!("stream_cost: cannot load the XDP program: {e}");
            std::process::exit(1);
        }
    };
    let s = k.streams();
    let wc = StreamCfg {
        op: ks::OP_WORDCOUNT,
        window_ns: 1_000_000_000,
        word_bytes_max: 32,
        records_max: 65_536,
        ..Default::default()
    };
    let cp = StreamCfg {
        op: ks::OP_CHANGEPOINT,
        window_ns: 10_000_000,
        reference_windows: 4,
        history: 64,
        threshold_n: ks::threshold_n(7.0).unwrap_or(0),
        records_max: 65_536,
        ..Default::default()
    };
    if let Err(e) = s.add_stream(0, WC_PORT, wc).and_then(|()| s.add_stream(1, CP_PORT, cp)) {
        eprintln!("stream_cost: add stream: {e}");
        std::process::exit(1);
    }
    let cases: Vec<(&str, u16, Vec<u8>, usize)> = vec![
        ("wordcount, 16 words (the benchmark's datagram)", WC_PORT, words(16), 16),
        ("wordcount, 64 words", WC_PORT, words(64), 64),
        ("wordcount, 1 word", WC_PORT, words(1), 1),
        ("changepoint, 16 values (6 decimals)", CP_PORT, numbers(16), 16),
        ("changepoint, 1 value", CP_PORT, numbers(1), 1),
    ];
    println!("XDP stream engine cost, {runs} runs per case (kernel-timed):");
    for (name, port, payload, records) in cases {
        match s.test_run_ns(&udp_frame(false, port, &payload), runs) {
            Ok((verdict, ns)) => println!(
                "  {name:<48} {:>6} ns/datagram {:>6.1} ns/record  verdict {}",
                ns,
                f64::from(ns) / records as f64,
                match verdict {
                    1 => "DROP (consumed)",
                    2 => "PASS",
                    _ => "other",
                }
            ),
            Err(e) => println!("  {name:<48} error: {e}"),
        }
    }
}
