//! Black-box test: the `memcache` crate (rust-memcache) talking to a real `slipstream serve`.
//!
//! For: proving an ordinary Rust client works unchanged over both the ASCII and the
//! binary protocol (set/get/add/replace/delete/incr/decr/cas/touch/append/prepend/flush).
//! Not for: byte-exact protocol checks (tests/test_differential.py does those).

use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const START_TIMEOUT: Duration = Duration::from_secs(10);
const IO_TIMEOUT_S: f64 = 3.0;

/// Kills the server when the test ends, whether it passed or panicked.
struct ServerGuard {
    child: Child,
    port: u16,
}

impl Drop for ServerGuard {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind port 0 on loopback");
    l.local_addr().expect("local addr").port()
}

fn start_server() -> ServerGuard {
    let mut last_err = String::new();
    // A probed port can be taken before the server binds it: retry a few times.
    for _ in 0..5 {
        let port = free_port();
        let port_s = port.to_string();
        let mut args = vec!["-p", &port_s, "-U", "0", "-l", "127.0.0.1", "-t", "2", "-m", "64"];
        // RUST_CLIENT_TEST_MEMCACHED=1 runs the same test against real memcached,
        // which checks the test itself.
        let program = if std::env::var_os("RUST_CLIENT_TEST_MEMCACHED").is_some() {
            args.extend(["-u", "root"]);
            "/usr/bin/memcached".to_string()
        } else {
            args.insert(0, "serve");
            env!("CARGO_BIN_EXE_slipstream").to_string()
        };
        let child = Command::new(program)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn slipstream");
        let mut guard = ServerGuard { child, port };
        let deadline = Instant::now() + START_TIMEOUT;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = guard.child.try_wait() {
                last_err = format!("slipstream exited early: {status}");
                break;
            }
            if TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(200)).is_ok() {
                return guard;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        if last_err.is_empty() {
            last_err = format!("slipstream not accepting on port {port} after {START_TIMEOUT:?}");
        }
        drop(guard); // kills this attempt's process before the next try
    }
    panic!("{last_err}");
}

fn client(port: u16, ascii: bool) -> memcache::Client {
    let proto = if ascii { "&protocol=ascii" } else { "" };
    let url = format!("memcache://127.0.0.1:{port}?timeout={IO_TIMEOUT_S}{proto}");
    memcache::Client::connect(url).expect("connect client")
}

fn normal_work(c: &memcache::Client, ascii: bool) {
    c.flush().expect("flush");

    // set / get
    c.set("greeting", "hello", 0).expect("set");
    let v: Option<String> = c.get("greeting").expect("get");
    assert_eq!(v.as_deref(), Some("hello"));
    let missing: Option<String> = c.get("nope").expect("get missing");
    assert_eq!(missing, None);

    // binary-safe values
    let blob: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    c.set("blob", &blob[..], 0).expect("set blob");
    let got: Option<Vec<u8>> = c.get("blob").expect("get blob");
    assert_eq!(got.as_deref(), Some(&blob[..]));

    // add: stores only when absent
    c.add("added", "first", 0).expect("add absent");
    let _ = c.add("added", "second", 0); // ascii: Ok (NOT_STORED); binary: Err(KeyExists)
    let v: Option<String> = c.get("added").expect("get added");
    assert_eq!(v.as_deref(), Some("first"));

    // replace: stores only when present
    let _ = c.replace("ghost", "x", 0);
    let v: Option<String> = c.get("ghost").expect("get ghost");
    assert_eq!(v, None);
    c.replace("added", "replaced", 0).expect("replace present");
    let v: Option<String> = c.get("added").expect("get replaced");
    assert_eq!(v.as_deref(), Some("replaced"));

    // append / prepend
    c.append("added", "!").expect("append");
    c.prepend("added", ">").expect("prepend");
    let v: Option<String> = c.get("added").expect("get appended");
    assert_eq!(v.as_deref(), Some(">replaced!"));

    // delete
    assert!(c.delete("added").expect("delete present"));
    assert!(!c.delete("added").expect("delete absent"));
    let v: Option<String> = c.get("added").expect("get deleted");
    assert_eq!(v, None);

    // incr / decr, including the floor at zero and the 64-bit wrap
    c.set("counter", "10", 0).expect("set counter");
    assert_eq!(c.increment("counter", 5).expect("incr"), 15);
    assert_eq!(c.decrement("counter", 3).expect("decr"), 12);
    assert_eq!(c.decrement("counter", 100).expect("decr floor"), 0);
    c.set("big", "18446744073709551615", 0).expect("set max");
    assert_eq!(c.increment("big", 1).expect("incr wrap"), 0);
    let missing_incr = c.increment("no-counter", 1);
    if ascii {
        assert!(missing_incr.is_err(), "ascii incr on a missing key must fail: {missing_incr:?}");
    } else {
        // the binary request carries an initial value (the crate sends 0): the item is created
        assert_eq!(missing_incr.expect("binary incr creates"), 0);
    }

    // cas: a fresh token wins once, then the stale token loses
    c.set("caskey", "v1", 0).expect("set casflag");
    let (val, _flags, cas): (String, u32, Option<u64>) = c.get("caskey").expect("gets").expect("casflag present");
    assert_eq!(val, "v1");
    let cas = cas.expect("server returned a CAS token");
    assert!(c.cas("caskey", "v2", 0, cas).expect("cas fresh"));
    assert!(!c.cas("caskey", "v3", 0, cas).expect("cas stale"));
    let v: Option<String> = c.get("caskey").expect("get after cas");
    assert_eq!(v.as_deref(), Some("v2"));
    let (_, _, cas2): (String, u32, Option<u64>) = c.get("caskey").expect("gets").expect("present");
    assert_ne!(cas2, Some(cas), "CAS must change on update");

    // multi-get
    let many: std::collections::HashMap<String, String> =
        c.gets(&["greeting", "casflag", "caskey", "nope"]).expect("multi get");
    assert_eq!(many.len(), 2);
    assert_eq!(many["greeting"], "hello");
    assert_eq!(many["caskey"], "v2");

    // touch, and expiry through it
    assert!(c.touch("greeting", 100).expect("touch present"));
    assert!(!c.touch("nope", 100).expect("touch absent"));
    c.set("short", "bye", 1).expect("set short-lived");
    std::thread::sleep(Duration::from_millis(2200));
    let v: Option<String> = c.get("short").expect("get expired");
    assert_eq!(v, None, "exptime 1 must have expired after 2.2 s");
    let v: Option<String> = c.get("greeting").expect("get touched");
    assert_eq!(v.as_deref(), Some("hello"));

    // version / stats answer
    let versions = c.version().expect("version");
    assert_eq!(versions.len(), 1);
    let stats = c.stats().expect("stats");
    assert_eq!(stats.len(), 1);
    if !ascii {
        // memcache 0.21's ASCII stats parser stops at the first line (client bug), so only
        // the binary reply can be checked for content
        assert!(stats[0].1.contains_key("curr_items"), "stats lacks curr_items");
    }

    // flush clears everything
    c.flush().expect("flush");
    let v: Option<String> = c.get("greeting").expect("get after flush");
    assert_eq!(v, None);
}

#[test]
fn rust_memcache_client_ascii() {
    let server = start_server();
    normal_work(&client(server.port, true), true);
}

#[test]
fn rust_memcache_client_binary() {
    let server = start_server();
    normal_work(&client(server.port, false), false);
}
