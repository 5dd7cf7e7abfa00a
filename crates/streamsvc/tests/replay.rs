//! End-to-end tests of the hub's replay protocol (seq, epoch, INFO, `SUBSCRIBE … FROM … UNTIL`)
//! over real loopback sockets with kernel-chosen ports. Not for the live fan-out (loopback.rs).

// Test code: unwrap() in test set-up is the clearest failure.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Write};
use std::net::{TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use serde_json::Value;
use slipstream_stream::config::ResultsConfig;
use slipstream_stream::StreamConfig;
use slipstream_streamsvc::{ServiceConfig, StreamService};

fn start() -> StreamService {
    let filter = StreamConfig {
        name: "f".into(),
        udp_port: 0,
        operator: "filter".into(),
        filter: Some("ge".into()),
        filter_value: Some(0.0),
        ..Default::default()
    };
    let wc = StreamConfig { name: "w".into(), udp_port: 0, operator: "wordcount".into(), ..Default::default() };
    StreamService::start(ServiceConfig {
        results: ResultsConfig { tcp_port: 0 },
        streams: vec![filter, wc],
        stats_interval_ms: 100,
        ..Default::default()
    })
    .expect("service starts")
}

/// Sends `line`, reads lines until EOF or 5 s; returns them parsed.
fn request(svc: &StreamService, line: &str, want: Option<usize>) -> Vec<Value> {
    let mut s = TcpStream::connect(svc.results_addr()).unwrap();
    s.write_all(line.as_bytes()).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
    let mut r = BufReader::new(s);
    let end = Instant::now() + Duration::from_secs(5);
    let mut got = Vec::new();
    let mut partial = String::new();
    while Instant::now() < end && !matches!(want, Some(n) if got.len() >= n) {
        match r.read_line(&mut partial) {
            Ok(0) => break,
            Ok(_) => {
                got.push(serde_json::from_str(&partial).unwrap_or_else(|e| panic!("{partial:?}: {e}")));
                partial.clear();
            }
            Err(_) => {}
        }
    }
    got
}

fn info(svc: &StreamService) -> Value {
    let v = request(svc, "INFO\n", None);
    assert_eq!(v.len(), 1, "{v:?}");
    assert_eq!(v[0]["type"], "info");
    v[0].clone()
}

fn next_seq(info: &Value, stream: &str) -> u64 {
    info["streams"].as_array().unwrap().iter().find(|s| s["name"] == stream).unwrap()["next_seq"].as_u64().unwrap()
}

#[test]
fn seqs_ranges_epochs_and_errors() {
    let svc = start();
    let i0 = info(&svc);
    let epoch = i0["epoch"].as_str().unwrap().to_string();
    assert_eq!(epoch.len(), 16);
    let streams = i0["streams"].as_array().unwrap();
    assert_eq!(streams[0]["operator"], "filter");
    assert_eq!(streams[1]["operator"], "wordcount");
    assert_eq!((streams[0]["first_seq"].as_u64(), streams[0]["next_seq"].as_u64()), (Some(0), Some(0)));

    // A live subscriber sees seq on every result line (not on stats lines).
    let mut live = TcpStream::connect(svc.results_addr()).unwrap();
    live.write_all(b"SUBSCRIBE f\n").unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    let faddr = svc.stream_addrs()[0].1;
    for i in 0..50 {
        udp.send_to(format!("{i}\n").as_bytes(), faddr).unwrap();
    }
    let end = Instant::now() + Duration::from_secs(5);
    while next_seq(&info(&svc), "f") < 50 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
    }
    live.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let mut r = BufReader::new(live);
    let mut seqs = Vec::new();
    let mut l = String::new();
    while seqs.len() < 50 && Instant::now() < end {
        l.clear();
        if r.read_line(&mut l).unwrap_or(0) == 0 {
            continue;
        }
        let v: Value = serde_json::from_str(&l).unwrap();
        if v["type"] == "filtered" {
            assert!(l.starts_with("{\"seq\":"), "{l}");
            seqs.push(v["seq"].as_u64().unwrap());
        } else {
            assert!(v.get("seq").is_none(), "{l}");
        }
    }
    assert_eq!(seqs, (0..50).collect::<Vec<_>>());

    // A range read: hello, exactly seqs 10..20 with their values, then EOF.
    let got = request(&svc, &format!("SUBSCRIBE f FROM 10 UNTIL 20 EPOCH {epoch}\n"), None);
    assert_eq!(got[0]["type"], "hello");
    assert_eq!(got[0]["epoch"], epoch.as_str());
    let body: Vec<(u64, f64)> =
        got[1..].iter().map(|v| (v["seq"].as_u64().unwrap(), v["value"].as_f64().unwrap())).collect();
    assert_eq!(body, (10..20).map(|i| (i, i as f64)).collect::<Vec<_>>());

    // FROM then live: the retained tail, then a new line as it is produced.
    let mut s = TcpStream::connect(svc.results_addr()).unwrap();
    s.write_all(b"SUBSCRIBE f FROM 48\n").unwrap();
    s.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let mut r = BufReader::new(s);
    let mut lines = Vec::new();
    let end = Instant::now() + Duration::from_secs(5);
    let mut sent = false;
    while lines.len() < 4 && Instant::now() < end {
        l.clear();
        if r.read_line(&mut l).unwrap_or(0) > 0 {
            lines.push(serde_json::from_str::<Value>(&l).unwrap());
        }
        if lines.len() == 3 && !sent {
            udp.send_to(b"77\n", faddr).unwrap();
            sent = true;
        }
    }
    assert_eq!(lines.len(), 4, "{lines:?}");
    assert_eq!(lines[0]["type"], "hello");
    assert_eq!(lines[1]["seq"], 48);
    assert_eq!(lines[2]["seq"], 49);
    assert_eq!((lines[3]["seq"].as_u64(), lines[3]["value"].as_f64()), (Some(50), Some(77.0)));

    // Errors: wrong epoch, beyond the end, unknown stream, malformed.
    let e = request(&svc, "SUBSCRIBE f FROM 0 UNTIL 5 EPOCH 0123456789abcdef\n", None);
    assert_eq!((e.len(), e[0]["type"].as_str(), e[0]["code"].as_str()), (1, Some("error"), Some("epoch")), "{e:?}");
    assert_eq!(e[0]["epoch"], epoch.as_str());
    let e = request(&svc, "SUBSCRIBE f FROM 1000\n", None);
    assert_eq!(e[0]["code"], "out_of_range", "{e:?}");
    assert_eq!(e[0]["next_seq"], 51);
    let e = request(&svc, "SUBSCRIBE nope FROM 0\n", None);
    assert_eq!(e[0]["code"], "unknown_stream", "{e:?}");
    let e = request(&svc, "SUBSCRIBE f FROM zero\n", None);
    assert_eq!(e[0]["code"], "bad_request", "{e:?}");
    // An empty range is just the hello line.
    let e = request(&svc, "SUBSCRIBE f FROM 5 UNTIL 5\n", None);
    assert_eq!(e.len(), 1);
    assert_eq!(e[0]["type"], "hello");
}

#[test]
fn evicted_range_is_a_data_loss_error_and_each_run_has_its_own_epoch() {
    let svc = start();
    let epoch = info(&svc)["epoch"].as_str().unwrap().to_string();
    // Wordcount lines with many distinct long words: each 100 ms window yields one large line.
    // ~20 MiB in all overflows the 16 MiB ring.
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    let waddr = svc.stream_addrs()[1].1;
    let mut payload = String::new();
    for k in 0..400 {
        payload.push_str(&format!("word{k:04}{}\n", "x".repeat(40)));
    }
    let end = Instant::now() + Duration::from_secs(30);
    let mut first = 0;
    while first == 0 && Instant::now() < end {
        // 400 distinct words per datagram; one window collects them once per 100 ms, so vary
        // the words over time to keep each line large.
        for j in 0..40 {
            let p = payload.replace("word", &format!("w{j}_"));
            udp.send_to(p.as_bytes(), waddr).unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
        let i = info(&svc);
        first = i["streams"][1]["first_seq"].as_u64().unwrap();
    }
    assert!(first > 0, "ring never evicted");
    let e = request(&svc, &format!("SUBSCRIBE w FROM 0 UNTIL {first} EPOCH {epoch}\n"), None);
    assert_eq!(e.len(), 1, "{e:?}");
    assert_eq!(e[0]["code"], "data_loss");
    assert_eq!(e[0]["first_seq"].as_u64(), Some(first));
    assert!(e[0]["error"].as_str().unwrap().contains("no longer retained"));
    // Another run of the service: another epoch, seqs from 0 again.
    let other = start();
    let i2 = info(&other);
    assert_ne!(i2["epoch"].as_str().unwrap(), epoch);
    assert_eq!(next_seq(&i2, "w"), 0);
}
