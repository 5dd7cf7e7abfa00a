//! End-to-end tests of the stream service over real loopback sockets (kernel-chosen ports).

// Test code: unwrap() in test set-up is the clearest failure.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use serde_json::Value;
use slipstream_stream::config::ResultsConfig;
use slipstream_stream::StreamConfig;
use slipstream_streamsvc::{clock_monotonic_ns, ServiceConfig, ServiceError, StreamService};

/// The project's one RNG (fastrand), seeded so a printed seed replays.
struct Rng(fastrand::Rng);
impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(fastrand::Rng::with_seed(seed))
    }
    fn next(&mut self) -> u64 {
        self.0.u64(..)
    }
    fn unit(&mut self) -> f64 {
        self.0.f64()
    }
    /// Standard normal (Box-Muller).
    fn gauss(&mut self) -> f64 {
        let u = self.unit().max(1e-300);
        let v = self.unit();
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }
}

fn seed(default: u64) -> u64 {
    let s = std::env::var("STREAMSVC_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(default);
    eprintln!("seed = {s} (set STREAMSVC_SEED to replay)");
    s
}

fn stream(name: &str, op: &str) -> StreamConfig {
    StreamConfig { name: name.into(), udp_port: 0, operator: op.into(), ..Default::default() }
}

fn start(streams: Vec<StreamConfig>, buf: usize, stats_ms: u64) -> StreamService {
    StreamService::start(ServiceConfig {
        results: ResultsConfig { tcp_port: 0 },
        streams,
        subscriber_buffer_bytes_max: buf,
        stats_interval_ms: stats_ms,
        ..Default::default()
    })
    .expect("service starts")
}

fn addr_of(svc: &StreamService, name: &str) -> SocketAddr {
    svc.stream_addrs().into_iter().find(|(n, _)| n == name).map(|(_, a)| a).expect("stream exists")
}

struct Client {
    r: BufReader<TcpStream>,
}

impl Client {
    fn connect(svc: &StreamService, line: Option<&str>) -> Client {
        let mut s = TcpStream::connect(svc.results_addr()).unwrap();
        if let Some(l) = line {
            s.write_all(l.as_bytes()).unwrap();
        }
        s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        Client { r: BufReader::new(s) }
    }

    /// One line, or None on timeout / EOF.
    fn line(&mut self) -> Option<String> {
        let mut l = String::new();
        match self.r.read_line(&mut l) {
            Ok(0) => None,
            Ok(_) => Some(l),
            Err(_) => {
                // A timeout may have left a partial line in `l`; keep reading it.
                if l.is_empty() {
                    None
                } else {
                    let mut rest = String::new();
                    let _ = self.r.read_line(&mut rest);
                    Some(l + &rest)
                }
            }
        }
    }

    /// Reads JSON lines until `stop` says so or `within` passes; returns them all.
    fn until(&mut self, within: Duration, mut stop: impl FnMut(&Value) -> bool) -> Vec<Value> {
        let end = Instant::now() + within;
        let mut got = Vec::new();
        while Instant::now() < end {
            if let Some(l) = self.line() {
                let v: Value = serde_json::from_str(&l).unwrap_or_else(|e| panic!("bad JSON line {l:?}: {e}"));
                let done = stop(&v);
                got.push(v);
                if done {
                    return got;
                }
            }
        }
        got
    }

    /// Waits for a stats line of `stream` (proves the subscription is active).
    fn wait_stats(&mut self, stream: &str) -> Value {
        let got = self.until(Duration::from_secs(5), |v| v["type"] == "stats" && v["stream"] == stream);
        got.last().filter(|v| v["type"] == "stats").cloned().expect("stats line")
    }
}

fn metric(svc: &StreamService, name: &str, stream: &str) -> u64 {
    let mut m = String::new();
    svc.render_metrics(&mut m);
    let key = format!("{name}{{stream=\"{stream}\"}} ");
    m.lines()
        .find_map(|l| l.strip_prefix(&key))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("metric {key} missing in\n{m}"))
}

fn wait_metric(svc: &StreamService, name: &str, stream: &str, want: u64) {
    let end = Instant::now() + Duration::from_secs(5);
    while metric(svc, name, stream) != want {
        assert!(Instant::now() < end, "{name}{{{stream}}} never reached {want}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn exact_word_counts_over_a_known_multiset() {
    let mut rng = Rng::new(seed(0x5eed_0001));
    let svc = start(vec![StreamConfig { window_ms: 50, ..stream("w", "wordcount") }], 4 << 20, 50);
    let to = addr_of(&svc, "w");
    let mut c = Client::connect(&svc, Some("SUBSCRIBE w\n"));
    c.wait_stats("w");
    let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
    let (datagrams, per) = (400u64, 50);
    let mut expect: BTreeMap<String, u64> = BTreeMap::new();
    for d in 0..datagrams {
        let mut p = String::new();
        for _ in 0..per {
            // Skewed (roughly Zipf-like) choice over 300 words.
            let w = format!("w{}", (300.0 * rng.unit().powi(3)) as u32);
            p.push_str(&w);
            p.push(if rng.next() % 5 == 1 { '\n' } else { ' ' });
            *expect.entry(w).or_default() += 1;
        }
        tx.send_to(p.as_bytes(), to).unwrap();
        if d % 50 == 49 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let want_total = datagrams * per;
    let mut got: BTreeMap<String, u64> = BTreeMap::new();
    let mut total = 0;
    let lines = c.until(Duration::from_secs(5), |v| {
        if v["type"] == "wordcount" {
            total += v["total"].as_u64().unwrap();
            assert_eq!(v["overflow"], 0);
        }
        total >= want_total
    });
    for v in lines.iter().filter(|v| v["type"] == "wordcount") {
        for (w, n) in v["counts"].as_object().unwrap() {
            *got.entry(w.clone()).or_default() += n.as_u64().unwrap();
        }
    }
    assert_eq!(total, want_total);
    assert_eq!(got, expect, "sum of window counts == the multiset sent");
    let st = c.until(Duration::from_secs(5), |v| v["type"] == "stats" && v["datagrams"] == datagrams);
    let st = st.last().unwrap();
    assert_eq!(st["datagrams"], datagrams);
    assert_eq!(st["records"], want_total);
    assert_eq!((st["malformed"].as_u64(), st["socket_drops"].as_u64()), (Some(0), Some(0)));
    assert_eq!(metric(&svc, "slipstream_stream_records_total", "w"), want_total);
    assert_eq!(metric(&svc, "slipstream_stream_subscribers", "w"), 1);
    let t = Instant::now();
    svc.stop();
    let took = t.elapsed();
    eprintln!("stop took {took:?}");
    assert!(took < Duration::from_millis(200));
}

#[test]
fn changepoint_alerts_on_steps_only() {
    let mut rng = Rng::new(seed(0x5eed_0002));
    let cfg = StreamConfig {
        window_ms: 20,
        reference_windows: 4,
        threshold: 5.0,
        history: 32,
        ..stream("sensor", "changepoint")
    };
    let svc = start(vec![cfg], 4 << 20, 50);
    let to = addr_of(&svc, "sensor");
    let mut c = Client::connect(&svc, Some("SUBSCRIBE sensor\n"));
    c.wait_stats("sensor");
    let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
    let send_level = |rng: &mut Rng, level: f64, n: usize| {
        for _ in 0..n {
            let p: String = (0..4).map(|_| format!("{}\n", level + 0.5 * rng.gauss())).collect();
            tx.send_to(p.as_bytes(), to).unwrap();
            std::thread::sleep(Duration::from_millis(2));
        }
    };
    // Stationary: ~300 ms at 10 ± 0.5 (N(0, 0.5) never strays 5.0 = 10 sigma). No alert.
    send_level(&mut rng, 10.0, 150);
    let lines = c.until(Duration::from_secs(5), |v| v["type"] == "stats" && v["datagrams"] == 150);
    assert!(lines.iter().all(|v| v["type"] != "changepoint"), "false alarm: {lines:?}");
    assert_eq!(lines.last().unwrap()["datagrams"], 150);

    // Steps, alternating +20 / -20, each after the detector re-armed (4 windows of 20 ms).
    let mut level = 10.0;
    let mut lat_us = Vec::new();
    for trial in 0..20 {
        let next = if trial % 2 == 0 { 30.0 } else { 10.0 };
        let p = format!("{next}\n");
        let t_send = clock_monotonic_ns();
        tx.send_to(p.as_bytes(), to).unwrap();
        let got = c.until(Duration::from_secs(5), |v| v["type"] == "changepoint");
        let t_recv = clock_monotonic_ns();
        let alerts: Vec<&Value> = got.iter().filter(|v| v["type"] == "changepoint").collect();
        assert_eq!(alerts.len(), 1, "trial {trial}: {got:?}");
        let a = alerts[0];
        assert_eq!(a["value"].as_f64(), Some(next));
        assert!((a["reference"].as_f64().unwrap() - level).abs() < 1.0, "{a}");
        let t_alert = a["t_ns"].as_u64().unwrap();
        assert!(t_alert >= t_send && t_alert <= t_recv, "alert t_ns uses CLOCK_MONOTONIC");
        let hist = a["history"].as_array().unwrap();
        assert_eq!(hist.len(), 32);
        assert_eq!(hist.last().unwrap().as_f64(), Some(next));
        lat_us.push((t_recv - t_send) as f64 / 1000.0);
        level = next;
        // Re-arm at the new level (6 windows) and check it stays quiet.
        send_level(&mut rng, level, 60);
        let quiet = c.until(Duration::from_millis(30), |_| false);
        assert!(quiet.iter().all(|v| v["type"] != "changepoint"), "false alarm: {quiet:?}");
    }
    lat_us.sort_by(f64::total_cmp);
    let mean = lat_us.iter().sum::<f64>() / lat_us.len() as f64;
    eprintln!(
        "alert latency send->subscriber ({} trials): mean {mean:.0} us, p50 {:.0} us, max {:.0} us",
        lat_us.len(),
        lat_us[lat_us.len() / 2],
        lat_us[lat_us.len() - 1]
    );
    svc.stop();
}

#[test]
fn malformed_records_are_counted_and_skipped() {
    let svc = start(vec![StreamConfig { window_ms: 20, ..stream("agg", "aggregate") }], 4 << 20, 30);
    let to = addr_of(&svc, "agg");
    let mut c = Client::connect(&svc, Some("SUBSCRIBE agg\r\n"));
    c.wait_stats("agg");
    let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
    tx.send_to(b"1\nabc\n2\nnan\n  3 \n\n", to).unwrap(); // 3 good, 2 bad
    let mut bad_bin = b"SSF1".to_vec();
    bad_bin.extend_from_slice(&[0u8; 5]); // length 9: text, one malformed line
    tx.send_to(&bad_bin, to).unwrap();
    let mut bin = b"SSF1".to_vec();
    for v in [4.0f64, f64::NAN, 5.0] {
        bin.extend_from_slice(&v.to_le_bytes());
    }
    tx.send_to(&bin, to).unwrap(); // 2 good, 1 bad
    tx.send_to(b"", to).unwrap(); // empty datagram: nothing
    let lines = c.until(Duration::from_secs(5), |v| v["type"] == "stats" && v["datagrams"] == 4);
    let (mut count, mut sum) = (0, 0.0);
    for v in lines.iter().filter(|v| v["type"] == "window") {
        count += v["count"].as_u64().unwrap();
        sum += v["sum"].as_f64().unwrap();
    }
    let st = lines.last().unwrap();
    assert_eq!(
        (st["datagrams"].as_u64(), st["records"].as_u64(), st["malformed"].as_u64()),
        (Some(4), Some(5), Some(4)),
        "{st}"
    );
    // The stats line can overtake the last window's close; wait for it if needed.
    if count < 5 {
        for v in c.until(Duration::from_secs(2), |v| v["type"] == "window").iter().filter(|v| v["type"] == "window") {
            count += v["count"].as_u64().unwrap();
            sum += v["sum"].as_f64().unwrap();
        }
    }
    assert_eq!((count, sum), (5, 15.0));
    assert_eq!(metric(&svc, "slipstream_stream_malformed_total", "agg"), 4);
    svc.stop();
}

#[test]
fn slow_subscriber_does_not_stall_ingest_or_others() {
    let f = StreamConfig { filter: Some("ge".into()), filter_value: Some(-1e300), ..stream("f", "filter") };
    // No periodic stats here, so every line of stream f is a `filtered` line and the books
    // (received + announced drops == sent) balance exactly per subscriber.
    let svc = start(vec![f], 256 << 10, 3_600_000);
    let to = addr_of(&svc, "f");
    let slow = {
        use socket2::{Domain, Socket, Type};
        let s = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        s.set_recv_buffer_size(4096).unwrap();
        s.connect(&svc.results_addr().into()).unwrap();
        let mut s: TcpStream = s.into();
        s.write_all(b"SUBSCRIBE f\n").unwrap();
        s
    };
    let fast = Client::connect(&svc, Some("SUBSCRIBE *\n"));
    wait_metric(&svc, "slipstream_stream_subscribers", "f", 2);
    const FINAL: &str = "123456789";
    let count_lines = |mut c: Client| {
        std::thread::spawn(move || {
            let (mut filtered, mut dropped) = (0u64, 0u64);
            let end = Instant::now() + Duration::from_secs(20);
            while Instant::now() < end {
                let Some(l) = c.line() else { continue };
                if l.contains("\"type\":\"filtered\"") {
                    if l.contains(FINAL) {
                        return (filtered, dropped);
                    }
                    filtered += 1;
                } else {
                    let v: Value = serde_json::from_str(&l).unwrap();
                    assert_eq!(v["type"], "dropped", "{l}");
                    assert_eq!(v["stream"], "f");
                    dropped += v["lines"].as_u64().unwrap();
                }
            }
            panic!("final line never came");
        })
    };
    let fast_reader = count_lines(fast);
    let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
    let (datagrams, per) = (2000u64, 100u64);
    let payload: String = (0..per).map(|i| format!("{}.5\n", i)).collect();
    let t = Instant::now();
    for d in 0..datagrams {
        tx.send_to(payload.as_bytes(), to).unwrap();
        if d % 10 == 9 {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let sent = datagrams * per;
    wait_metric(&svc, "slipstream_stream_records_total", "f", sent);
    eprintln!("ingest of {sent} records took {:?} with a stuck subscriber", t.elapsed());
    assert_eq!(metric(&svc, "slipstream_stream_socket_drops_total", "f"), 0);
    let drops_while_stuck = metric(&svc, "slipstream_stream_subscriber_drops_total", "f");
    assert!(drops_while_stuck > 0, "the stuck subscriber must have lost lines");
    // Now the slow one reads; once drained, one more line carries the announcements.
    slow.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let slow_reader = count_lines(Client { r: BufReader::new(slow) });
    std::thread::sleep(Duration::from_millis(500));
    tx.send_to(format!("{FINAL}\n").as_bytes(), to).unwrap();
    let (sf, sd) = slow_reader.join().unwrap();
    let (ff, fd) = fast_reader.join().unwrap();
    eprintln!("slow: {sf} lines + {sd} dropped; fast: {ff} lines + {fd} dropped");
    assert_eq!(sf + sd, sent, "slow subscriber: every line delivered or announced");
    assert_eq!(ff + fd, sent, "fast subscriber: every line delivered or announced");
    assert!(sd > 0 && ff > 0);
    assert_eq!(metric(&svc, "slipstream_stream_subscriber_drops_total", "f"), sd + fd);
    svc.stop();
}

#[test]
fn subscribe_filters_by_stream() {
    let svc = start(
        vec![
            StreamConfig { window_ms: 10, ..stream("a", "aggregate") },
            StreamConfig { window_ms: 10, ..stream("b", "aggregate") },
        ],
        1 << 20,
        3_600_000,
    );
    let mut only_a = Client::connect(&svc, Some("SUBSCRIBE a\n"));
    let mut all = Client::connect(&svc, None);
    let mut star = Client::connect(&svc, Some("SUBSCRIBE *\n"));
    let mut bad = Client::connect(&svc, Some("HELLO\n"));
    let mut unknown = Client::connect(&svc, Some("SUBSCRIBE a,zzz\n"));
    let mut long = Client::connect(&svc, Some(&"x".repeat(5000)));
    for c in [&mut bad, &mut unknown, &mut long] {
        let l = c.until(Duration::from_secs(2), |_| true);
        assert_eq!(l.len(), 1);
        assert_eq!((l[0]["stream"].as_str(), l[0]["type"].as_str()), (Some("*"), Some("error")), "{l:?}");
        assert!(c.line().is_none(), "closed after the error");
    }
    // `all` is settled after the 100 ms grace period.
    wait_metric(&svc, "slipstream_stream_subscribers", "a", 3);
    wait_metric(&svc, "slipstream_stream_subscribers", "b", 2);
    let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
    tx.send_to(b"1\n2\n", addr_of(&svc, "a")).unwrap();
    tx.send_to(b"5\n", addr_of(&svc, "b")).unwrap();
    let windows = |c: &mut Client, n: usize| {
        let mut seen = Vec::new();
        c.until(Duration::from_secs(3), |v| {
            if v["type"] == "window" {
                seen.push((v["stream"].as_str().unwrap().to_string(), v["count"].as_u64().unwrap()));
            }
            seen.len() == n
        });
        seen.sort();
        seen
    };
    assert_eq!(windows(&mut all, 2), vec![("a".to_string(), 2), ("b".to_string(), 1)]);
    assert_eq!(windows(&mut star, 2), vec![("a".to_string(), 2), ("b".to_string(), 1)]);
    assert_eq!(windows(&mut only_a, 1), vec![("a".to_string(), 2)]);
    assert!(only_a.until(Duration::from_millis(100), |_| false).is_empty(), "nothing from b");
    drop(all);
    // A closed read side alone keeps a subscriber (clients like `nc` half-close at once); it is
    // removed when a write to it fails, so keep results flowing until then.
    let end = Instant::now() + Duration::from_secs(5);
    while metric(&svc, "slipstream_stream_subscribers", "b") != 1 {
        assert!(Instant::now() < end, "closed subscriber never removed");
        tx.send_to(b"5\n", addr_of(&svc, "b")).unwrap();
        std::thread::sleep(Duration::from_millis(20));
    }
    svc.stop();
}

#[test]
fn typed_start_errors() {
    let taken = UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let cfg = |streams| ServiceConfig { results: ResultsConfig { tcp_port: 0 }, streams, ..Default::default() };
    let e = StreamService::start(cfg(vec![StreamConfig { udp_port: port, ..stream("s", "wordcount") }])).err().unwrap();
    let msg = e.to_string();
    assert!(matches!(e, ServiceError::BindUdp { .. }), "{msg}");
    assert_eq!(msg, format!("stream \"s\": failed to listen on UDP port {port}: Address already in use"));
    let e = StreamService::start(cfg(vec![stream("s", "join")])).err().unwrap();
    assert!(matches!(e, ServiceError::Config { .. }) && e.to_string().contains("join"), "{e}");
    let e = StreamService::start(cfg(vec![stream("s", "wordcount"), stream("s", "wordcount")])).err().unwrap();
    assert!(e.to_string().contains("two streams are named"), "{e}");
    let e = StreamService::start(ServiceConfig { subscriber_buffer_bytes_max: 0, ..cfg(vec![]) }).err().unwrap();
    assert!(matches!(e, ServiceError::Limit { key: "subscriber_buffer_bytes_max", .. }), "{e}");
    // No streams at all: only the results listener.
    let svc = StreamService::start(cfg(vec![])).unwrap();
    assert!(svc.stream_addrs().is_empty() && svc.results_addr().port() != 0);
    svc.stop();
}

/// Quick throughput probe (not a benchmark): one sender thread sends as fast as it can;
/// reports the send rate and how many datagrams the stream received vs the kernel dropped.
/// Run: cargo test --release -p slipstream-streamsvc -- --ignored --nocapture
#[test]
#[ignore]
fn ingest_rate_probe() {
    for (per, n) in [(16usize, 200_000u64), (100, 100_000)] {
        let svc = start(vec![StreamConfig { window_ms: 100, ..stream("w", "wordcount") }], 4 << 20, 1000);
        let to = addr_of(&svc, "w");
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let payload: String = (0..per).map(|i| format!("word{} ", i % 50)).collect();
        let t = Instant::now();
        for _ in 0..n {
            tx.send_to(payload.as_bytes(), to).unwrap();
        }
        let send_s = t.elapsed().as_secs_f64();
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            let got = metric(&svc, "slipstream_stream_datagrams_total", "w");
            let drops = metric(&svc, "slipstream_stream_socket_drops_total", "w");
            if got + drops >= n || Instant::now() > end {
                let all_s = t.elapsed().as_secs_f64();
                eprintln!(
                    "{per} words/datagram, {} bytes: sent {n} at {:.0}/s; received {got} ({:.0}/s over {all_s:.3}s, records {}), socket drops {drops}",
                    payload.len(),
                    n as f64 / send_s,
                    got as f64 / all_s,
                    metric(&svc, "slipstream_stream_records_total", "w")
                );
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        svc.stop();
    }
}
