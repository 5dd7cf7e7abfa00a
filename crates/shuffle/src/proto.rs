//! The shuffle control protocol: text lines ending in `\r\n` (a bare `\n` is accepted), parsed
//! and composed here without I/O. Requests:
//!
//! ```text
//! HELLO [<tenant>]                        -> OK <version> <block_bytes> <dir>
//! REGISTER <app> <shuffle> <partitions> [<tenant>]
//!                                         -> OK
//! ALLOC <app> <shuffle>                   -> BLOCK <id>            (file <dir>/blk-<id>)
//! COMMIT <app> <shuffle> <map> <attempt> <n>
//!   then n lines: <partition> <block> <offset> <length>
//!                                         -> COMMITTED <winning attempt> <n>, n segment lines, END
//! LOOKUP <app> <shuffle> <reduce>         -> SEGMENTS <n>, n lines <map> <attempt> <block> <offset> <length> <file>, END
//!                                            (<file>: the block's file id, crate::pool; a reader
//!                                            keeps a block mapped while it is the same)
//! RELEASE <block> [<block> ...]           -> OK  (CLIENT_ERROR names the first block not pinned;
//!                                            the others are released all the same)
//! LOST <app> <shuffle> <map> <attempt>    -> OK
//! UNREGISTER <app> <shuffle> [PEER]       -> OK
//! UNREGISTER_APP <app> [PEER]             -> OK  (both also passed on to every `[shuffle] peers`
//!                                            daemon, marked PEER: a PEER line is applied, not
//!                                            passed on again; crate::forward)
//! DRIVER <app>                            -> OK  (this connection is the application's driver:
//!                                            when it ends without UNREGISTER_APP, the daemon
//!                                            unregisters the application, here and on the
//!                                            peers; no idle timeout, TCP keepalive instead)
//! QUIT                                    -> (closes)
//! FETCH <app> <shuffle> <reduce>          -> DATA <n>, n times: a line <map> <attempt> <length>
//!                                            then <length> raw bytes; END   (daemon to daemon)
//! ```
//! FETCH is what a reducer's daemon asks the daemons of the other hosts (`[shuffle] peers`) when
//! it answers a LOOKUP: the bytes travel by sendfile/splice (crate::peer), the reader still
//! sees only blocks of its own daemon.
//! `<tenant>` (crate::tenants): the tenant the application is charged to, required on a daemon
//! with tenants and refused on one without; HELLO with it checks the name at start.
//! Errors are memcached's lines: `CLIENT_ERROR <why>` (bad input; after a bad COMMIT segment
//! line the connection is closed, since the rest of the request cannot be framed) and
//! `SERVER_ERROR <why>` (a limit of this daemon, e.g. the pool is full).

use crate::registry::{Found, Segment};
use crate::ShuffleError;
use std::fmt::Write;

pub const VERSION: u32 = 1;
/// Longest request line, `\r\n` included.
pub const LINE_BYTES_MAX: usize = 256;

/// One request. `from_peer` (UNREGISTER, UNREGISTER_APP): marked PEER, passed on by another
/// daemon, so not to be passed on again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request<'a> {
    Hello { tenant: Option<&'a str> },
    Register { app: &'a str, shuffle: u32, partitions: u32, tenant: Option<&'a str> },
    Alloc { app: &'a str, shuffle: u32 },
    Commit { app: &'a str, shuffle: u32, map: u32, attempt: u64, segments: usize },
    Lookup { app: &'a str, shuffle: u32, reduce: u32 },
    Release { blocks: Vec<u32> },
    Lost { app: &'a str, shuffle: u32, map: u32, attempt: u64 },
    Unregister { app: &'a str, shuffle: u32, from_peer: bool },
    UnregisterApp { app: &'a str, from_peer: bool },
    Driver { app: &'a str },
    Fetch { app: &'a str, shuffle: u32, reduce: u32 },
    Quit,
}

fn words(line: &[u8]) -> Result<Vec<&str>, ShuffleError> {
    let text = std::str::from_utf8(line).map_err(|_| ShuffleError::Syntax("request is not UTF-8".into()))?;
    Ok(text.trim_end_matches(['\r', '\n']).split(' ').filter(|w| !w.is_empty()).collect())
}

fn num<T: std::str::FromStr>(w: &str, what: &str) -> Result<T, ShuffleError> {
    w.parse().map_err(|_| ShuffleError::Syntax(format!("bad {what} {w:?}")))
}

/// One request line (without the segment lines a COMMIT announces).
pub fn parse_request(line: &[u8]) -> Result<Request<'_>, ShuffleError> {
    let w = words(line)?;
    let arity = |n: usize| {
        if w.len() == n {
            Ok(())
        } else {
            Err(ShuffleError::Syntax(format!("{} takes {} arguments", w[0], n - 1)))
        }
    };
    let Some(&cmd) = w.first() else { return Err(ShuffleError::Syntax("empty request".into())) };
    match cmd {
        "HELLO" => {
            if w.len() > 2 {
                return Err(ShuffleError::Syntax("HELLO takes at most 1 argument".into()));
            }
            Ok(Request::Hello { tenant: w.get(1).copied() })
        }
        "QUIT" => arity(1).map(|_| Request::Quit),
        "REGISTER" => {
            if w.len() != 5 {
                arity(4)?;
            }
            Ok(Request::Register {
                app: w[1],
                shuffle: num(w[2], "shuffle")?,
                partitions: num(w[3], "partitions")?,
                tenant: w.get(4).copied(),
            })
        }
        "ALLOC" => {
            arity(3)?;
            Ok(Request::Alloc { app: w[1], shuffle: num(w[2], "shuffle")? })
        }
        "COMMIT" => {
            arity(6)?;
            Ok(Request::Commit {
                app: w[1],
                shuffle: num(w[2], "shuffle")?,
                map: num(w[3], "map")?,
                attempt: num(w[4], "attempt")?,
                segments: num(w[5], "segment count")?,
            })
        }
        "LOOKUP" => {
            arity(4)?;
            Ok(Request::Lookup { app: w[1], shuffle: num(w[2], "shuffle")?, reduce: num(w[3], "partition")? })
        }
        "FETCH" => {
            arity(4)?;
            Ok(Request::Fetch { app: w[1], shuffle: num(w[2], "shuffle")?, reduce: num(w[3], "partition")? })
        }
        "RELEASE" => {
            if w.len() < 2 {
                arity(2)?;
            }
            Ok(Request::Release { blocks: w[1..].iter().map(|b| num(b, "block")).collect::<Result<_, _>>()? })
        }
        "LOST" => {
            arity(5)?;
            Ok(Request::Lost {
                app: w[1],
                shuffle: num(w[2], "shuffle")?,
                map: num(w[3], "map")?,
                attempt: num(w[4], "attempt")?,
            })
        }
        "UNREGISTER" => {
            let from_peer = peer_mark(&w, 3)?;
            Ok(Request::Unregister { app: w[1], shuffle: num(w[2], "shuffle")?, from_peer })
        }
        "UNREGISTER_APP" => {
            let from_peer = peer_mark(&w, 2)?;
            Ok(Request::UnregisterApp { app: w[1], from_peer })
        }
        "DRIVER" => {
            arity(2)?;
            Ok(Request::Driver { app: w[1] })
        }
        _ => Err(ShuffleError::Syntax(format!("unknown command {cmd:?}"))),
    }
}

/// The word that marks a request another daemon passed on (crate::forward).
pub const PEER_MARK: &str = "PEER";

/// Whether `w` (a command of `n` words, or `n + 1` with PEER_MARK last) is marked PEER.
fn peer_mark(w: &[&str], n: usize) -> Result<bool, ShuffleError> {
    match w.len() {
        len if len == n => Ok(false),
        len if len == n + 1 && w[n] == PEER_MARK => Ok(true),
        _ => Err(ShuffleError::Syntax(format!("{} takes {} arguments, then optionally {PEER_MARK}", w[0], n - 1))),
    }
}

/// A PEER-marked UNREGISTER for a peer (crate::forward).
pub fn unregister_for_peer(app: &str, shuffle: u32) -> String {
    format!("UNREGISTER {app} {shuffle} {PEER_MARK}\r\n")
}

/// A PEER-marked UNREGISTER_APP for a peer (crate::forward).
pub fn unregister_app_for_peer(app: &str) -> String {
    format!("UNREGISTER_APP {app} {PEER_MARK}\r\n")
}

/// One segment line of a COMMIT: `<partition> <block> <offset> <length>`.
pub fn parse_segment(line: &[u8]) -> Result<Segment, ShuffleError> {
    let w = words(line)?;
    if w.len() != 4 {
        return Err(ShuffleError::Syntax("a segment line is <partition> <block> <offset> <length>".into()));
    }
    Ok(Segment {
        partition: num(w[0], "partition")?,
        block: num(w[1], "block")?,
        offset: num(w[2], "offset")?,
        length: num(w[3], "length")?,
    })
}

/// One segment of a FETCH answer as its header line announces it; `length` raw bytes follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    pub map: u32,
    pub attempt: u64,
    pub length: u32,
}

/// `DATA <n>`: how many records a FETCH answer holds. An error line is returned as its text.
pub fn parse_data_head(line: &[u8]) -> Result<usize, ShuffleError> {
    let w = words(line)?;
    match w.as_slice() {
        ["DATA", n] => num(n, "record count"),
        _ => Err(ShuffleError::Syntax(format!("peer answered {:?}", w.join(" ")))),
    }
}

/// A record's header line `<map> <attempt> <length>`.
pub fn parse_record(line: &[u8]) -> Result<Record, ShuffleError> {
    let w = words(line)?;
    if w.len() != 3 {
        return Err(ShuffleError::Syntax("a record line is <map> <attempt> <length>".into()));
    }
    Ok(Record { map: num(w[0], "map")?, attempt: num(w[1], "attempt")?, length: num(w[2], "length")? })
}

pub fn data_head(out: &mut String, records: usize) {
    let _ = write!(out, "DATA {records}\r\n");
}

pub fn record(out: &mut String, r: &Record) {
    let _ = write!(out, "{} {} {}\r\n", r.map, r.attempt, r.length);
}

/// The line after a FETCH answer's last record.
pub const END: &[u8] = b"END\r\n";

/// The answer of a request that succeeded with nothing to say (also what crate::forward expects).
pub const OK: &str = "OK\r\n";

pub fn ok(out: &mut String) {
    out.push_str(OK);
}

pub fn hello(out: &mut String, block_bytes: usize, dir: &str) {
    let _ = write!(out, "OK {VERSION} {block_bytes} {dir}\r\n");
}

pub fn block(out: &mut String, id: u32) {
    let _ = write!(out, "BLOCK {id}\r\n");
}

pub fn committed(out: &mut String, attempt: u64, segments: &[Segment]) {
    let _ = write!(out, "COMMITTED {attempt} {}\r\n", segments.len());
    for s in segments {
        let _ = write!(out, "{} {} {} {}\r\n", s.partition, s.block, s.offset, s.length);
    }
    out.push_str("END\r\n");
}

pub fn segments(out: &mut String, found: &[Found]) {
    let _ = write!(out, "SEGMENTS {}\r\n", found.len());
    for f in found {
        let _ = write!(out, "{} {} {} {} {} {}\r\n", f.map, f.attempt, f.block, f.offset, f.length, f.file);
    }
    out.push_str("END\r\n");
}

pub fn error(out: &mut String, e: &ShuffleError) {
    let kind = if e.is_client() { "CLIENT_ERROR" } else { "SERVER_ERROR" };
    let _ = write!(out, "{kind} {e}\r\n");
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse() {
        assert_eq!(parse_request(b"HELLO\r\n").unwrap(), Request::Hello { tenant: None });
        assert_eq!(parse_request(b"HELLO etl\r\n").unwrap(), Request::Hello { tenant: Some("etl") });
        assert!(parse_request(b"HELLO a b\r\n").is_err());
        assert_eq!(parse_request(b"DRIVER app-1\r\n").unwrap(), Request::Driver { app: "app-1" });
        assert!(parse_request(b"DRIVER\r\n").is_err());
        assert_eq!(
            parse_request(b"UNREGISTER a 3\r\n").unwrap(),
            Request::Unregister { app: "a", shuffle: 3, from_peer: false }
        );
        assert_eq!(
            parse_request(unregister_for_peer("a", 3).as_bytes()).unwrap(),
            Request::Unregister { app: "a", shuffle: 3, from_peer: true }
        );
        assert_eq!(
            parse_request(b"UNREGISTER_APP a\r\n").unwrap(),
            Request::UnregisterApp { app: "a", from_peer: false }
        );
        assert_eq!(
            parse_request(unregister_app_for_peer("a").as_bytes()).unwrap(),
            Request::UnregisterApp { app: "a", from_peer: true }
        );
        for bad in
            [&b"UNREGISTER a 3 peer\r\n"[..], b"UNREGISTER a\r\n", b"UNREGISTER_APP a X\r\n", b"UNREGISTER_APP\r\n"]
        {
            assert!(parse_request(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            parse_request(b"REGISTER a 1 8 etl\r\n").unwrap(),
            Request::Register { app: "a", shuffle: 1, partitions: 8, tenant: Some("etl") }
        );
        assert_eq!(
            parse_request(b"REGISTER a 1 8\r\n").unwrap(),
            Request::Register { app: "a", shuffle: 1, partitions: 8, tenant: None }
        );
        assert!(parse_request(b"REGISTER a 1 8 etl x\r\n").is_err());
        assert_eq!(
            parse_request(b"COMMIT app-1 3 7 1099511627776 2\r\n").unwrap(),
            Request::Commit { app: "app-1", shuffle: 3, map: 7, attempt: 1 << 40, segments: 2 }
        );
        assert_eq!(parse_request(b"LOOKUP a 1 2\n").unwrap(), Request::Lookup { app: "a", shuffle: 1, reduce: 2 });
        assert_eq!(parse_segment(b"1 2 3 4\r\n").unwrap(), Segment { partition: 1, block: 2, offset: 3, length: 4 });
        assert_eq!(parse_request(b"FETCH a 1 2\r\n").unwrap(), Request::Fetch { app: "a", shuffle: 1, reduce: 2 });
        assert_eq!(parse_request(b"RELEASE 7\r\n").unwrap(), Request::Release { blocks: vec![7] });
        assert_eq!(
            parse_request(b"RELEASE 7 0 4294967295\r\n").unwrap(),
            Request::Release { blocks: vec![7, 0, u32::MAX] }
        );
        assert!(parse_request(b"RELEASE\r\n").is_err());
        assert!(parse_request(b"RELEASE 1 x\r\n").is_err());
    }

    #[test]
    fn fetch_answer_heads_round_trip() {
        let r = Record { map: 4, attempt: 1 << 33, length: 2 << 20 };
        let mut out = String::new();
        data_head(&mut out, 3);
        assert_eq!(parse_data_head(out.as_bytes()).unwrap(), 3);
        out.clear();
        record(&mut out, &r);
        assert_eq!(parse_record(out.as_bytes()).unwrap(), r);
        assert!(parse_data_head(b"CLIENT_ERROR unknown shuffle\r\n").unwrap_err().to_string().contains("unknown"));
        assert!(parse_record(b"1 2\r\n").is_err());
        assert!(parse_record(b"1 2 -3\r\n").is_err());
    }

    #[test]
    fn bad_input_is_a_client_error_line() {
        for bad in
            [&b""[..], b"\r\n", b"NOPE\r\n", b"ALLOC a\r\n", b"ALLOC a -1\r\n", b"REGISTER a 1 x\r\n", b"\xff\r\n"]
        {
            let e = parse_request(bad).unwrap_err();
            let mut out = String::new();
            error(&mut out, &e);
            assert!(out.starts_with("CLIENT_ERROR ") && out.ends_with("\r\n"), "{out:?}");
        }
        assert!(parse_segment(b"1 2 3\r\n").is_err());
        assert!(parse_segment(b"1 2 3 99999999999\r\n").is_err());
    }

    #[test]
    fn answers_compose() {
        let mut out = String::new();
        committed(&mut out, 9, &[Segment { partition: 0, block: 1, offset: 2, length: 3 }]);
        assert_eq!(out, "COMMITTED 9 1\r\n0 1 2 3\r\nEND\r\n");
        out.clear();
        segments(&mut out, &[]);
        assert_eq!(out, "SEGMENTS 0\r\nEND\r\n");
        out.clear();
        segments(&mut out, &[Found { map: 4, attempt: 1 << 33, block: 5, offset: 6, length: 7, file: 1 << 60 }]);
        assert_eq!(out, "SEGMENTS 1\r\n4 8589934592 5 6 7 1152921504606846976\r\nEND\r\n");
        out.clear();
        error(&mut out, &ShuffleError::PoolFull { blocks_max: 1, block_bytes: 2 });
        assert!(out.starts_with("SERVER_ERROR shuffle pool full"));
    }
}
