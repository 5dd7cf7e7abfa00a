//! The sidecar wire codec (docs/hbase-sidecar-protocol.md): request encoders and response
//! decoders over byte slices. No I/O here; `sidecar::client` moves the frames.

use std::fmt;

/// Largest frame either side accepts (the spec's limit).
pub const FRAME_BYTES_MAX: usize = 64 << 20;
/// Frame header after the length field: request id + code.
pub const HEADER_BYTES: usize = 5;

/// Operation codes.
pub mod op {
    pub const PING: u8 = 0x01;
    pub const LIST_TABLES: u8 = 0x02;
    pub const DESCRIBE: u8 = 0x03;
    pub const CREATE_TABLE: u8 = 0x04;
    pub const DELETE_TABLE: u8 = 0x05;
    pub const ENABLE_TABLE: u8 = 0x06;
    pub const DISABLE_TABLE: u8 = 0x07;
    pub const IS_ENABLED: u8 = 0x08;
    pub const GET: u8 = 0x10;
    pub const SCAN: u8 = 0x11;
    pub const MUTATE: u8 = 0x12;
    pub const DELETE: u8 = 0x13;
    pub const INCREMENT: u8 = 0x14;
    /// Asks for invalidation notices on this connection (payload: i32 lease_ms).
    pub const SUBSCRIBE: u8 = 0x20;
    /// Acknowledges a BEGIN notice (id = the notice's id); no answer.
    pub const NOTICE_ACK: u8 = 0x21;

    /// Operations that change nothing (safe to send again after a lost connection).
    pub fn is_read(op: u8) -> bool {
        matches!(op, PING | LIST_TABLES | DESCRIBE | IS_ENABLED | GET | SCAN)
    }
}

/// Response status codes.
pub mod status {
    pub const OK: u8 = 0x00;
    pub const IO_ERROR: u8 = 0x01;
    pub const ILLEGAL_ARGUMENT: u8 = 0x02;
    pub const ALREADY_EXISTS: u8 = 0x03;
    pub const PROTOCOL: u8 = 0x04;
    /// Not an answer: an invalidation notice started by the sidecar (id = the notice's id).
    pub const NOTICE: u8 = 0x10;
}

/// What a notice announces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoticeKind {
    /// A write to `rows` (empty = the whole table) is about to be applied; ACK once invalidated.
    Begin,
    /// The write announced by the BEGIN with this id is visible (or failed).
    End,
    /// Not every region server's observer is subscribed any more (a sidecar in front of a real
    /// cluster): flush, stop serving from the cache; answers no longer extend the lease.
    Suspend,
    /// Every region server's observer is subscribed again: flush what was filled meanwhile,
    /// then answers extend the lease again.
    Resume,
}

/// An invalidation notice from the RegionObserver, relayed by the sidecar.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notice {
    pub id: u32,
    pub kind: NoticeKind,
    pub table: Vec<u8>,
    pub rows: Vec<Vec<u8>>,
}

/// Decodes a NOTICE frame's payload: `u8 kind`, `bytes table`, `list<bytes> rows`.
pub fn parse_notice(id: u32, payload: &[u8]) -> Result<Notice, SidecarError> {
    let mut d = Decoder::new(payload);
    let kind = match d.u8()? {
        1 => NoticeKind::Begin,
        2 => NoticeKind::End,
        3 => NoticeKind::Suspend,
        4 => NoticeKind::Resume,
        k => return Err(SidecarError::Protocol(format!("unknown notice kind {k}"))),
    };
    let table = d.bytes()?;
    let rows = d.bytes_list()?;
    d.end()?;
    Ok(Notice { id, kind, table, rows })
}

/// "No timestamp given": HBase's LATEST_TIMESTAMP.
pub const TS_LATEST: i64 = i64::MAX;

/// One cell as HBase stores it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cell {
    pub family: Vec<u8>,
    pub qualifier: Vec<u8>,
    pub timestamp: i64,
    pub value: Vec<u8>,
}

impl Cell {
    /// Bytes this cell holds (for memory accounting).
    pub fn size_bytes(&self) -> usize {
        self.family.len() + self.qualifier.len() + self.value.len() + 8
    }
}

/// A row and its cells, in HBase's order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    pub row: Vec<u8>,
    pub cells: Vec<Cell>,
}

impl Row {
    pub fn size_bytes(&self) -> usize {
        self.row.len() + self.cells.iter().map(Cell::size_bytes).sum::<usize>()
    }
}

/// What to read: columns (`family` or `family:qualifier`; empty = all), time range, versions.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ReadSpec {
    pub columns: Vec<Vec<u8>>,
    pub ts_min: i64,
    pub ts_max: i64,
    pub max_versions: i32,
}

impl ReadSpec {
    /// Every column, newest version, any time: what getRow and a plain scan read.
    pub fn latest() -> ReadSpec {
        ReadSpec { columns: Vec::new(), ts_min: 0, ts_max: TS_LATEST, max_versions: 1 }
    }
}

/// A column family's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Family {
    pub name: Vec<u8>,
    pub max_versions: i32,
    pub ttl_seconds: i32,
    pub in_memory: bool,
    pub block_cache: bool,
    pub compression: String,
    pub bloom_filter: String,
}

/// One put or delete within a row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mutation {
    pub is_delete: bool,
    pub column: Vec<u8>,
    pub value: Vec<u8>,
    pub write_to_wal: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowMutations {
    pub row: Vec<u8>,
    pub mutations: Vec<Mutation>,
}

/// Order in which MUTATE applies puts and deletes (HBase's two Thrift1 behaviours).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MutateOrder {
    /// Each row's deletes, then its puts (mutateRow).
    DeletesFirst = 0,
    /// All puts, then all deletes (mutateRows).
    PutsFirst = 1,
}

/// A sidecar or transport failure, typed so the front end can raise the matching Thrift error.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SidecarError {
    Io {
        message: String,
        can_retry: bool,
    },
    IllegalArgument(String),
    AlreadyExists(String),
    /// A frame broke the protocol (either side); the connection is dropped.
    Protocol(String),
    /// The sidecar could not be reached, went away or did not answer in time.
    Unavailable(String),
}

impl fmt::Display for SidecarError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SidecarError::Io { message, .. } => write!(f, "{message}"),
            SidecarError::IllegalArgument(m) | SidecarError::AlreadyExists(m) => write!(f, "{m}"),
            SidecarError::Protocol(m) => write!(f, "sidecar protocol error: {m}"),
            SidecarError::Unavailable(m) => write!(f, "HBase sidecar unavailable: {m}"),
        }
    }
}

impl std::error::Error for SidecarError {}

/// Builds one request frame: length, id, op, then the payload written through it.
pub struct Encoder {
    buf: Vec<u8>,
}

impl Encoder {
    pub fn new(id: u32, op: u8) -> Encoder {
        let mut buf = Vec::with_capacity(64);
        buf.extend_from_slice(&[0, 0, 0, 0]);
        buf.extend_from_slice(&id.to_be_bytes());
        buf.push(op);
        Encoder { buf }
    }
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.buf.push(v);
        self
    }
    pub fn bool(&mut self, v: bool) -> &mut Self {
        self.u8(v as u8)
    }
    pub fn i32(&mut self, v: i32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }
    pub fn i64(&mut self, v: i64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_be_bytes());
        self
    }
    fn len(&mut self, n: usize) -> &mut Self {
        // Lengths and counts are u32 on the wire; callers stay far below (frames are ≤ 64 MiB).
        self.buf.extend_from_slice(&(n as u32).to_be_bytes());
        self
    }
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.len(v.len());
        self.buf.extend_from_slice(v);
        self
    }
    pub fn bytes_list(&mut self, v: &[Vec<u8>]) -> &mut Self {
        self.len(v.len());
        for b in v {
            self.bytes(b);
        }
        self
    }
    pub fn read_spec(&mut self, s: &ReadSpec) -> &mut Self {
        self.bytes_list(&s.columns).i64(s.ts_min).i64(s.ts_max).i32(s.max_versions)
    }
    pub fn family(&mut self, f: &Family) -> &mut Self {
        self.bytes(&f.name).i32(f.max_versions).i32(f.ttl_seconds).bool(f.in_memory);
        self.bool(f.block_cache).bytes(f.compression.as_bytes()).bytes(f.bloom_filter.as_bytes())
    }
    pub fn row_mutations(&mut self, rows: &[RowMutations]) -> &mut Self {
        self.len(rows.len());
        for r in rows {
            self.bytes(&r.row).len(r.mutations.len());
            for m in &r.mutations {
                self.u8(m.is_delete as u8).bytes(&m.column).bytes(&m.value).bool(m.write_to_wal);
            }
        }
        self
    }
    /// The finished frame, or an error if it would break the frame size limit.
    pub fn finish(mut self) -> Result<Vec<u8>, SidecarError> {
        let body = self.buf.len() - 4;
        if body > FRAME_BYTES_MAX {
            return Err(SidecarError::IllegalArgument(format!(
                "request of {body} bytes exceeds the sidecar frame limit of {FRAME_BYTES_MAX}"
            )));
        }
        self.buf[..4].copy_from_slice(&(body as u32).to_be_bytes());
        Ok(self.buf)
    }
}

/// Bounds-checked reads from a response payload; an overrun is a protocol error.
pub struct Decoder<'a> {
    b: &'a [u8],
}

fn short() -> SidecarError {
    SidecarError::Protocol("truncated sidecar payload".into())
}

impl<'a> Decoder<'a> {
    pub fn new(b: &'a [u8]) -> Decoder<'a> {
        Decoder { b }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], SidecarError> {
        if n > self.b.len() {
            return Err(short());
        }
        let (h, t) = self.b.split_at(n);
        self.b = t;
        Ok(h)
    }
    pub fn u8(&mut self) -> Result<u8, SidecarError> {
        Ok(self.take(1)?[0])
    }
    pub fn bool(&mut self) -> Result<bool, SidecarError> {
        Ok(self.u8()? != 0)
    }
    pub fn i32(&mut self) -> Result<i32, SidecarError> {
        let s = self.take(4)?;
        Ok(i32::from_be_bytes([s[0], s[1], s[2], s[3]]))
    }
    pub fn u32(&mut self) -> Result<u32, SidecarError> {
        Ok(self.i32()? as u32)
    }
    pub fn i64(&mut self) -> Result<i64, SidecarError> {
        let s = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Ok(i64::from_be_bytes(a))
    }
    /// A list count, at most one element per remaining byte (no huge allocations).
    pub fn count(&mut self) -> Result<usize, SidecarError> {
        let n = self.u32()? as usize;
        if n > self.b.len() {
            return Err(short());
        }
        Ok(n)
    }
    pub fn bytes(&mut self) -> Result<Vec<u8>, SidecarError> {
        let n = self.u32()? as usize;
        Ok(self.take(n)?.to_vec())
    }
    pub fn string(&mut self) -> Result<String, SidecarError> {
        Ok(String::from_utf8_lossy(&self.bytes()?).into_owned())
    }
    pub fn bytes_list(&mut self) -> Result<Vec<Vec<u8>>, SidecarError> {
        let n = self.count()?;
        (0..n).map(|_| self.bytes()).collect()
    }
    pub fn cell(&mut self) -> Result<Cell, SidecarError> {
        Ok(Cell { family: self.bytes()?, qualifier: self.bytes()?, timestamp: self.i64()?, value: self.bytes()? })
    }
    pub fn row(&mut self) -> Result<Row, SidecarError> {
        let row = self.bytes()?;
        let n = self.count()?;
        let cells = (0..n).map(|_| self.cell()).collect::<Result<Vec<_>, _>>()?;
        Ok(Row { row, cells })
    }
    pub fn rows(&mut self) -> Result<Vec<Row>, SidecarError> {
        let n = self.count()?;
        (0..n).map(|_| self.row()).collect()
    }
    pub fn family(&mut self) -> Result<Family, SidecarError> {
        Ok(Family {
            name: self.bytes()?,
            max_versions: self.i32()?,
            ttl_seconds: self.i32()?,
            in_memory: self.bool()?,
            block_cache: self.bool()?,
            compression: self.string()?,
            bloom_filter: self.string()?,
        })
    }
    pub fn families(&mut self) -> Result<Vec<Family>, SidecarError> {
        let n = self.count()?;
        (0..n).map(|_| self.family()).collect()
    }
    pub fn end(&self) -> Result<(), SidecarError> {
        if self.b.is_empty() {
            Ok(())
        } else {
            Err(SidecarError::Protocol("trailing bytes in sidecar payload".into()))
        }
    }
}

/// A decoded response frame body (after the length): id, status, payload.
pub struct Response<'a> {
    pub id: u32,
    pub status: u8,
    pub payload: &'a [u8],
}

/// Splits a frame body (the bytes after the length field) into id, status and payload.
pub fn parse_response(body: &[u8]) -> Result<Response<'_>, SidecarError> {
    if body.len() < HEADER_BYTES {
        return Err(SidecarError::Protocol("short sidecar frame".into()));
    }
    let id = u32::from_be_bytes([body[0], body[1], body[2], body[3]]);
    Ok(Response { id, status: body[4], payload: &body[HEADER_BYTES..] })
}

/// Turns a non-OK status and its payload into the typed error.
pub fn status_error(status: u8, payload: &[u8]) -> SidecarError {
    let mut d = Decoder::new(payload);
    let msg = d.string().unwrap_or_else(|_| "(no message)".into());
    match status {
        status::IO_ERROR => SidecarError::Io { message: msg, can_retry: d.bool().unwrap_or(false) },
        status::ILLEGAL_ARGUMENT => SidecarError::IllegalArgument(msg),
        status::ALREADY_EXISTS => SidecarError::AlreadyExists(msg),
        status::PROTOCOL => SidecarError::Protocol(msg),
        other => SidecarError::Protocol(format!("unknown sidecar status {other}: {msg}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notices_decode_and_reject_unknown_kinds() {
        let mut e = Encoder::new(9, status::NOTICE);
        e.u8(1).bytes(b"t").bytes_list(&[b"r1".to_vec(), b"r2".to_vec()]);
        let f = e.finish().unwrap();
        let resp = parse_response(&f[4..]).unwrap();
        assert_eq!(resp.status, status::NOTICE);
        let n = parse_notice(resp.id, resp.payload).unwrap();
        assert_eq!((n.id, n.kind, n.rows.len()), (9, NoticeKind::Begin, 2));
        let mut e = Encoder::new(9, status::NOTICE);
        e.u8(7).bytes(b"t").bytes_list(&[]);
        let f = e.finish().unwrap();
        assert!(parse_notice(9, &f[9..]).is_err());
    }

    #[test]
    fn frame_header_and_length() {
        let mut e = Encoder::new(7, op::GET);
        e.bytes(b"t").bytes_list(&[b"r1".to_vec()]).read_spec(&ReadSpec::latest());
        let f = e.finish().unwrap();
        let len = u32::from_be_bytes([f[0], f[1], f[2], f[3]]) as usize;
        assert_eq!(len, f.len() - 4);
        assert_eq!(&f[4..8], &7u32.to_be_bytes());
        assert_eq!(f[8], op::GET);
    }

    #[test]
    fn rows_round_trip() {
        // Encode rows the way the sidecar does, decode them back.
        let rows = vec![Row {
            row: b"r".to_vec(),
            cells: vec![Cell { family: b"f".to_vec(), qualifier: b"q".to_vec(), timestamp: 5, value: b"v".to_vec() }],
        }];
        let mut e = Encoder::new(1, 0);
        e.i32(1).bytes(&rows[0].row).i32(1);
        let c = &rows[0].cells[0];
        e.bytes(&c.family).bytes(&c.qualifier).i64(c.timestamp).bytes(&c.value);
        let f = e.finish().unwrap();
        let r = parse_response(&f[4..]).unwrap();
        let mut d = Decoder::new(r.payload);
        assert_eq!(d.rows().unwrap(), rows);
        d.end().unwrap();
    }

    #[test]
    fn hostile_counts_are_protocol_errors() {
        // A count or length larger than what remains must fail without allocating it.
        let huge = [0xffu8, 0xff, 0xff, 0xff];
        assert!(matches!(Decoder::new(&huge).rows(), Err(SidecarError::Protocol(_))));
        assert!(matches!(Decoder::new(&huge).bytes(), Err(SidecarError::Protocol(_))));
        assert!(matches!(Decoder::new(&[0, 0]).i32(), Err(SidecarError::Protocol(_))));
        assert!(parse_response(&[0, 0, 0]).is_err());
    }

    #[test]
    fn error_statuses_are_typed() {
        let mut e = Encoder::new(0, 0);
        e.bytes(b"boom").bool(true);
        let f = e.finish().unwrap();
        let p = &f[4 + HEADER_BYTES..];
        assert_eq!(status_error(status::IO_ERROR, p), SidecarError::Io { message: "boom".into(), can_retry: true });
        assert_eq!(status_error(status::ILLEGAL_ARGUMENT, p), SidecarError::IllegalArgument("boom".into()));
        assert_eq!(status_error(status::ALREADY_EXISTS, p), SidecarError::AlreadyExists("boom".into()));
    }
}
