//! Test/diagnostic driver for the fast path: attaches to an interface and then takes line
//! commands on stdin, answering one line each on stdout, so scripts (tests/netns/) can drive it.
//!
//! Usage: `attach IFACE PORT [ENTRIES]` or `attach --pass IFACE` (attach the XDP_PASS program,
//! for the client side of a veth pair). Commands:
//!   fill KEY VALUE [FLAGS [CAS [TTL_MS]]]   → `ok Cached` / `ok NotCacheable(..)` / ...
//!   fillsize KEY BYTES                       → fill a value of BYTES 'x' characters
//!   invalidate KEY | flush | counters | quit
//! Not for production: the server wires `FastPath` in itself.

use slipstream_fastpath::{clock_monotonic_ns, FastPath, FastPathConfig, PassProgram};
use std::io::{BufRead, Write};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mut out = std::io::stdout();
    if args.get(1).map(String::as_str) == Some("--pass") {
        let Some(iface) = args.get(2) else { return usage() };
        let _p = match PassProgram::attach(iface) {
            Ok(p) => p,
            Err(e) => {
                println!("error {e}");
                std::process::exit(1);
            }
        };
        println!("ready pass");
        let _ = out.flush();
        // Hold the program until stdin closes.
        for _ in std::io::stdin().lock().lines() {}
        return;
    }
    let (Some(iface), Some(port)) = (args.get(1), args.get(2).and_then(|p| p.parse().ok())) else { return usage() };
    let entries_max = args.get(3).and_then(|e| e.parse().ok()).unwrap_or(FastPathConfig::default().entries_max);
    let fp = match FastPath::attach(iface, FastPathConfig { udp_port: port, entries_max }) {
        Ok(fp) => fp,
        Err(e) => {
            println!("error {e}");
            std::process::exit(1);
        }
    };
    println!("ready {}", fp.mode());
    let _ = out.flush();
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else { break };
        let w: Vec<&str> = line.split_whitespace().collect();
        let num = |i: usize| w.get(i).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0);
        let reply = match w.as_slice() {
            ["fill", key, value, ..] => {
                let ttl_ms = num(5);
                let expiry = if ttl_ms == 0 { 0 } else { clock_monotonic_ns() + ttl_ms * 1_000_000 };
                fp.fill(key.as_bytes(), num(3) as u32, num(4), value.as_bytes(), expiry).map(|f| format!("ok {f:?}"))
            }
            ["fillsize", key, n] => {
                let v = vec![b'x'; n.parse().unwrap_or(0)];
                fp.fill(key.as_bytes(), 0, 1, &v, 0).map(|f| format!("ok {f:?}"))
            }
            ["invalidate", key] => fp.invalidate(key.as_bytes()).map(|_| "ok".to_string()),
            ["flush"] => fp.flush_all().map(|_| "ok".to_string()),
            ["counters"] => fp.counters().map(|c| {
                format!(
                    "ok hits={} misses={} invalidations={}",
                    c.fastpath_hits, c.fastpath_misses, c.fastpath_invalidations
                )
            }),
            ["quit"] => break,
            _ => Ok("error unknown command".to_string()),
        };
        match reply {
            Ok(r) => println!("{r}"),
            Err(e) => println!("error {e}"),
        }
        let _ = out.flush();
    }
}

fn usage() {
    eprintln!("usage: attach IFACE PORT [ENTRIES] | attach --pass IFACE");
    std::process::exit(2);
}
