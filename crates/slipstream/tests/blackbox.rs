//! Black-box tests of the real `slipstream` binary: raw protocol bytes over loopback sockets,
//! process lifecycle (status line, signals, shutdown), admin metrics, bad command lines.
//! Every wait is bounded; every child is killed on drop.

// Test code: unwrap() in test set-up is the clearest failure.
#![allow(clippy::unwrap_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpStream, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Daemon {
    child: Child,
    status_line: String,
    port: u16,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_tcp_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind probe");
    l.local_addr().expect("probe addr").port()
}

/// Start the daemon on a free port and read its status line.
fn start(extra: &[&str]) -> Daemon {
    let port = free_tcp_port().to_string();
    let mut child = Command::new(env!("CARGO_BIN_EXE_slipstream"))
        .args(["serve", "-l", "127.0.0.1", "-p", &port, "-t", "2"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn slipstream");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let status_line = rx.recv_timeout(Duration::from_secs(10)).expect("status line within 10 s");
    let port = status_line
        .split("tcp 127.0.0.1:")
        .nth(1)
        .and_then(|s| s.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in status line: {status_line}"));
    Daemon { child, status_line, port }
}

fn connect(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s
}

/// Read until `want` bytes arrived or the deadline passes.
fn read_n(s: &mut TcpStream, want: usize) -> Vec<u8> {
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut buf = [0u8; 65536];
    while got.len() < want && Instant::now() < deadline {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(_) => break,
        }
    }
    got
}

fn wait_exit(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Ok(Some(st)) = child.try_wait() {
            return Some(st);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

#[test]
fn status_line_names_ports_threads_memory_and_fast_path() {
    let d = start(&[]);
    let l = &d.status_line;
    assert!(l.contains("2 threads"), "{l}");
    assert!(l.contains("64 MB memory"), "{l}");
    assert!(l.contains("udp off"), "{l}");
    assert!(l.contains("kernel fast path off"), "{l}");
}

#[test]
fn xdp_request_without_fast_path_says_why_and_serves_from_user_space() {
    let d = start(&["--xdp", "lo"]);
    assert!(d.status_line.contains("kernel fast path off"), "{}", d.status_line);
    assert!(d.status_line.contains("serving from user space"), "{}", d.status_line);
    let mut s = connect(d.port);
    s.write_all(b"set a 0 0 1\r\n1\r\nget a\r\n").unwrap();
    let want = b"STORED\r\nVALUE a 0 1\r\n1\r\nEND\r\n";
    assert_eq!(read_n(&mut s, want.len()), want);
}

#[test]
fn raw_set_get_over_tcp() {
    let d = start(&[]);
    let mut s = connect(d.port);
    s.write_all(b"set k 42 0 5\r\nhello\r\nget k\r\ndelete k\r\nget k\r\n").unwrap();
    let want = b"STORED\r\nVALUE k 42 5\r\nhello\r\nEND\r\nDELETED\r\nEND\r\n";
    assert_eq!(read_n(&mut s, want.len()), want);
}

#[test]
fn thousand_pipelined_requests_in_one_write_all_answered_in_order() {
    let d = start(&[]);
    let mut s = connect(d.port);
    let mut req = Vec::new();
    let mut want = Vec::new();
    for i in 0..1000 {
        req.extend_from_slice(format!("set key{i} 0 0 {}\r\n{i}\r\nget key{i}\r\n", i.to_string().len()).as_bytes());
        want.extend_from_slice(
            format!("STORED\r\nVALUE key{i} 0 {}\r\n{i}\r\nEND\r\n", i.to_string().len()).as_bytes(),
        );
    }
    s.write_all(&req).unwrap();
    let got = read_n(&mut s, want.len());
    assert_eq!(String::from_utf8_lossy(&got), String::from_utf8_lossy(&want));
}

#[test]
fn request_split_at_every_byte_across_writes() {
    let d = start(&[]);
    let mut s = connect(d.port);
    s.set_nodelay(true).unwrap();
    let req = b"set split 7 0 10\r\n0123456789\r\nget split\r\n";
    for b in req.iter() {
        s.write_all(&[*b]).unwrap();
        std::thread::sleep(Duration::from_millis(2));
    }
    let want = b"STORED\r\nVALUE split 7 10\r\n0123456789\r\nEND\r\n";
    assert_eq!(read_n(&mut s, want.len()), want);
}

#[test]
fn large_value_round_trip() {
    let d = start(&[]);
    let mut s = connect(d.port);
    let value: Vec<u8> = (0..500_000u32).map(|i| (i % 251) as u8).collect();
    let mut req = format!("set big 0 0 {}\r\n", value.len()).into_bytes();
    req.extend_from_slice(&value);
    req.extend_from_slice(b"\r\nget big\r\n");
    s.write_all(&req).unwrap();
    let mut want = b"STORED\r\n".to_vec();
    want.extend_from_slice(format!("VALUE big 0 {}\r\n", value.len()).as_bytes());
    want.extend_from_slice(&value);
    want.extend_from_slice(b"\r\nEND\r\n");
    let got = read_n(&mut s, want.len());
    assert!(got == want, "large value did not round-trip ({} of {} bytes)", got.len(), want.len());
}

#[test]
fn udp_get_with_frame_header() {
    let probe = UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = probe.local_addr().unwrap().port();
    drop(probe);
    let d = start(&["-U", &port.to_string()]);
    assert!(d.status_line.contains(&format!("udp 127.0.0.1:{port}")), "{}", d.status_line);
    let mut s = connect(d.port);
    s.write_all(b"set u 3 0 2\r\nhi\r\n").unwrap();
    assert_eq!(read_n(&mut s, 8), b"STORED\r\n");
    let c = UdpSocket::bind("127.0.0.1:0").unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut dgram = vec![0x12, 0x34, 0, 0, 0, 1, 0, 0];
    dgram.extend_from_slice(b"get u\r\n");
    c.send_to(&dgram, ("127.0.0.1", port)).unwrap();
    let mut buf = [0u8; 2048];
    let n = c.recv(&mut buf).expect("udp reply");
    assert_eq!(&buf[..8], &[0x12, 0x34, 0, 0, 0, 1, 0, 0]);
    assert_eq!(&buf[8..n], b"VALUE u 3 2\r\nhi\r\nEND\r\n");

    // A multi-get answers each key as its own message, as memcached 1.6 does: two hits, one
    // miss → VALUE u, VALUE u2, END.
    s.write_all(b"set u2 0 0 1\r\nx\r\n").unwrap();
    assert_eq!(read_n(&mut s, 8), b"STORED\r\n");
    let mut dgram = vec![0, 9, 0, 0, 0, 1, 0, 0];
    dgram.extend_from_slice(b"get u u2 missing\r\n");
    c.send_to(&dgram, ("127.0.0.1", port)).unwrap();
    let mut got = Vec::new();
    for _ in 0..3 {
        let n = c.recv(&mut buf).expect("udp reply message");
        assert_eq!(&buf[..8], &[0, 9, 0, 0, 0, 1, 0, 0]);
        got.push(buf[8..n].to_vec());
    }
    assert_eq!(got, vec![b"VALUE u 3 2\r\nhi\r\n".to_vec(), b"VALUE u2 0 1\r\nx\r\n".to_vec(), b"END\r\n".to_vec()]);

    // A reply larger than one datagram is split with sequence numbers and the total.
    let big = vec![b'z'; 5000];
    let mut req = b"set big 0 0 5000\r\n".to_vec();
    req.extend_from_slice(&big);
    req.extend_from_slice(b"\r\n");
    s.write_all(&req).unwrap();
    assert_eq!(read_n(&mut s, 8), b"STORED\r\n");
    let mut dgram = vec![0, 10, 0, 0, 0, 1, 0, 0];
    dgram.extend_from_slice(b"get big\r\n");
    c.send_to(&dgram, ("127.0.0.1", port)).unwrap();
    let mut parts: Vec<(u16, Vec<u8>)> = Vec::new();
    let mut total = 0u16;
    while parts.len() < 5 {
        let n = c.recv(&mut buf).expect("udp datagram");
        assert_eq!(&buf[..2], &[0, 10]);
        total = u16::from_be_bytes([buf[4], buf[5]]);
        parts.push((u16::from_be_bytes([buf[2], buf[3]]), buf[8..n].to_vec()));
        if parts.len() == total as usize {
            break;
        }
    }
    assert_eq!(total as usize, parts.len());
    parts.sort();
    let joined: Vec<u8> = parts.into_iter().flat_map(|(_, p)| p).collect();
    let mut want = b"VALUE big 0 5000\r\n".to_vec();
    want.extend_from_slice(&big);
    want.extend_from_slice(b"\r\nEND\r\n");
    assert_eq!(joined, want);
}

#[test]
fn sigterm_stops_cleanly() {
    let mut d = start(&[]);
    let _conn = connect(d.port);
    // SAFETY: kill(2) on our own child's pid with a valid signal number.
    let rc = unsafe { libc::kill(d.child.id() as i32, libc::SIGTERM) };
    assert_eq!(rc, 0);
    let st = wait_exit(&mut d.child, Duration::from_secs(5)).expect("exit within 5 s of SIGTERM");
    assert!(st.success(), "exit status {st:?}");
}

#[test]
fn shutdown_command_only_when_enabled() {
    let mut d = start(&["-A"]);
    let mut s = connect(d.port);
    s.write_all(b"shutdown\r\n").unwrap();
    let st = wait_exit(&mut d.child, Duration::from_secs(5)).expect("exit after shutdown");
    assert!(st.success());

    let mut d = start(&[]);
    let mut s = connect(d.port);
    s.write_all(b"shutdown\r\nversion\r\n").unwrap();
    let got = read_n(&mut s, 40);
    assert!(String::from_utf8_lossy(&got).contains("VERSION "), "{:?}", String::from_utf8_lossy(&got));
    assert!(d.child.try_wait().unwrap().is_none(), "server must keep running");
}

#[test]
fn admin_metrics_count_requests() {
    let aport = free_tcp_port();
    let d = start(&["--admin", &format!("127.0.0.1:{aport}")]);
    let mut s = connect(d.port);
    s.write_all(b"get nothing\r\n").unwrap();
    assert_eq!(read_n(&mut s, 5), b"END\r\n");
    let mut h = connect(aport);
    h.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut body = String::new();
    let _ = h.read_to_string(&mut body);
    assert!(body.starts_with("HTTP/1.1 200 OK"), "{body}");
    assert!(body.contains("slipstream_cmd_get_total 1\n"), "{body}");
    assert!(body.contains("slipstream_get_misses_total 1\n"), "{body}");
    assert!(body.contains("slipstream_limit_maxbytes 67108864\n"), "{body}");
}

#[test]
fn bad_command_line_is_a_clear_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_slipstream")).args(["serve", "-t", "zero"]).output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad value `zero` for --threads"), "{err}");
}

#[test]
fn connection_limit_answers_like_memcached() {
    let d = start(&["-c", "2"]);
    let _a = connect(d.port);
    let _b = connect(d.port);
    std::thread::sleep(Duration::from_millis(100));
    let mut c = connect(d.port);
    let got = read_n(&mut c, 64);
    assert_eq!(got, b"ERROR Too many open connections\r\n");
}
