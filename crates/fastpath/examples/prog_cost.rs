//! Per-packet cost of the XDP program, measured in the kernel with BPF_PROG_TEST_RUN (no
//! interface needed; loads the program with fresh maps). Prints one line per case: mean ns per
//! packet as the kernel timed it, and the verdict. Needs root.
//!
//! Usage: `prog_cost [RUNS]` (default 20000). Hits are timed as separate single runs (a hit
//! rewrites the packet into a reply, so a repeated run would time the reply, which passes);
//! passes are timed with the kernel's own repeat loop.
//!
//! Not for: end-to-end figures (bench/xdp_bench.sh measures those across a veth pair).

use slipstream_fastpath::fixtures::{memcached_frame, memcached_frame_to, udp_frame, PORT, PORT_B, PORT_NONE};
use slipstream_fastpath::{FastPathConfig, Kernel};

fn main() {
    let runs: u32 = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(20_000).clamp(1, 1_000_000);
    let k = match Kernel::load(FastPathConfig { udp_port: PORT, entries_max: 1024 }) {
        Ok(k) => k,
        Err(e) => {
            eprintln!("prog_cost: cannot load the XDP program: {e}");
            std::process::exit(1);
        }
    };
    let value = vec![b'v'; 32];
    for i in 0..8 {
        let key = format!("key:{i:08}");
        if let Err(e) = k.fill(key.as_bytes(), 0, 100 + i, &value, 0) {
            eprintln!("prog_cost: fill: {e}");
            std::process::exit(1);
        }
    }
    // A second, shaped tenant with an allowance that never runs out, and a third with none.
    let shaped = k
        .add_tenant(1, PORT_B, true)
        .and_then(|()| k.add_tenant(2, PORT_NONE, true))
        .and_then(|()| k.fill_slot(1, b"key:00000001", 0, 101, &value, 0))
        .and_then(|_| k.fill_slot(2, b"key:00000001", 0, 101, &value, 0));
    if let Err(e) = shaped {
        eprintln!("prog_cost: tenants: {e}");
        std::process::exit(1);
    }
    k.set_allowance(1, u64::MAX, u64::MAX);
    let eight: Vec<String> = (0..8).map(|i| format!("key:{i:08}")).collect();
    let get8 = format!("get {}\r\n", eight.join(" "));
    let cases: Vec<(&str, Vec<u8>, bool)> = vec![
        ("get, 1 key, hit, IPv4 (32-byte value)", memcached_frame(false, 0, 1, b"get key:00000001\r\n"), true),
        ("get, 1 key, hit, IPv6", memcached_frame(true, 0, 1, b"get key:00000001\r\n"), true),
        ("gets, 1 key, hit", memcached_frame(false, 0, 1, b"gets key:00000001\r\n"), true),
        ("mg <key> v f, hit", memcached_frame(false, 0, 1, b"mg key:00000001 v f\r\n"), true),
        ("get, 8 keys, all hit", memcached_frame(false, 0, 1, get8.as_bytes()), true),
        ("get, 1 key, hit, shaped tenant", memcached_frame_to(false, PORT_B, 0, 1, b"get key:00000001\r\n"), true),
        (
            "get, shaped tenant, no allowance (passed up)",
            memcached_frame_to(false, PORT_NONE, 0, 1, b"get key:00000001\r\n"),
            false,
        ),
        ("get, 1 key, miss (passed up)", memcached_frame(false, 0, 1, b"get key:99999999\r\n"), false),
        ("set (not a get: passed up)", memcached_frame(false, 0, 1, b"set k 0 0 1\r\nx\r\n"), false),
        ("other UDP port (passed up)", udp_frame(false, 53, b"\x12\x34\x00\x00\x00\x01\x00\x00get k\r\n"), false),
    ];
    println!("XDP program cost, {runs} runs per case (kernel-timed, ns per packet):");
    for (name, packet, hit) in cases {
        let r = if hit {
            k.mean_ns(&packet, runs)
        } else {
            k.test_run(&packet, runs).map(|r| (u64::from(r.mean_ns), r.verdict))
        };
        match r {
            Ok((ns, v)) => println!("  {name:<42} {ns:>6} ns  {v:?}"),
            Err(e) => println!("  {name:<42} error: {e}"),
        }
    }
}
