//! Rows as they are served, and the hand-written hot reply path.
//!
//! A [`CachedRow`] is a row together with its Thrift-binary encoding as a `TRowResult` (the
//! `columns` map form that getRow* and unsorted scanners return). The encoding is made once, by
//! the `thrift` crate's generated code, when the row is read from HBase (and so when it is
//! cached); it is dropped with the row when a write invalidates it.
//!
//! [`ListReply`] writes a `list<TRowResult>` reply (getRow*, scannerGet, scannerGetList) by
//! hand: message header, result-struct field 0, list header, then the rows' cached bytes one
//! after another (a Thrift binary list is its element type and count followed by the elements,
//! so concatenating per-row encodings is a valid list). Why by hand: a profile of cached 100-row
//! scans (docs/benchmarks.md, issue 16) found every hit cloning each row, converting its cells
//! into a `TRowResult` map and writing it field by field through the `thrift` crate: more of the
//! daemon's time than the cache lookup itself. Only this envelope is hand-written; rows built on
//! the spot (scanner batches, sorted columns) and the exception replies are written by the
//! `thrift` crate. Tests check the bytes equal the crate's encoding of the same reply.
//!
//! No I/O here: replies are appended to a buffer the transport owns.

use crate::gen::hbase1::{IOError, IllegalArgument, TCell, TColumn, TRowResult};
use crate::sidecar::codec::{Cell, Row};
use std::collections::BTreeMap;
use thrift::protocol::{
    TBinaryInputProtocol, TBinaryOutputProtocol, TFieldIdentifier, TMessageIdentifier, TMessageType, TOutputProtocol,
    TSerializable, TStructIdentifier, TType,
};

/// Strict binary protocol, version 1, message type Reply (2).
const REPLY_HEADER: u32 = 0x8001_0000 | 2;
/// Type ids of the binary protocol.
const T_STOP: u8 = 0;
const T_BINARY: u8 = 11;
const T_STRUCT: u8 = 12;
const T_LIST: u8 = 15;

/// A row as served, with its reply encoding (built once, when the row was read).
#[derive(Debug, PartialEq, Eq)]
pub struct CachedRow {
    pub row: Row,
    encoded: Box<[u8]>,
}

impl CachedRow {
    pub fn new(row: Row) -> CachedRow {
        let encoded = encode(&to_result(&row, &row.cells, false));
        CachedRow { row, encoded }
    }

    /// The Thrift-binary `TRowResult` of the whole row (columns map form).
    pub fn encoded(&self) -> &[u8] {
        &self.encoded
    }

    /// Asks the CPU to start loading this row's reply encoding (its first lines) into its
    /// cache: a reply copying rows spread over the table issues this a few rows ahead, so the
    /// rows' cache misses overlap instead of coming one after another. A hint only.
    #[inline]
    pub fn prefetch(&self) {
        prefetch_bytes(&self.encoded);
    }

    /// Bytes held (row and encoding), for memory accounting.
    pub fn size_bytes(&self) -> usize {
        self.row.size_bytes() + self.encoded.len()
    }

    /// The row back from its reply encoding (an each-row row is kept only as its encoding, in
    /// its run's buffer: crate::cache). Exact for the rows each-row holds — one version per
    /// column, cells in HBase's (family, qualifier) order, which the columns map loses and this
    /// restores (a family holds no `:`, so the name splits at its first). None if `enc` is not
    /// one `TRowResult` in map form.
    pub fn from_encoded(enc: &[u8]) -> Option<CachedRow> {
        let mut p = TBinaryInputProtocol::new(enc, true);
        let r = TRowResult::read_from_in_protocol(&mut p).ok()?;
        let mut cells: Vec<Cell> = r
            .columns?
            .into_iter()
            .map(|(name, c)| {
                let at = name.iter().position(|&b| b == b':').unwrap_or(name.len());
                Cell {
                    family: name[..at].to_vec(),
                    qualifier: name.get(at + 1..).unwrap_or_default().to_vec(),
                    timestamp: c.timestamp.unwrap_or_default(),
                    value: c.value.unwrap_or_default(),
                }
            })
            .collect();
        cells.sort_by(|a, b| (&a.family, &a.qualifier).cmp(&(&b.family, &b.qualifier)));
        Some(CachedRow { row: Row { row: r.row?, cells }, encoded: enc.into() })
    }
}

/// The row key of a `TRowResult` encoding made by [`CachedRow::new`]: the struct starts with
/// field 1 (`row`, a binary: type byte, field id, length), so the key is read in place, with
/// no decoding and no copy. Empty if `enc` does not start that way (never for our encodings).
#[inline]
pub fn encoded_key(enc: &[u8]) -> &[u8] {
    match enc {
        [T_BINARY, 0, 1, a, b, c, d, rest @ ..] => {
            let n = u32::from_be_bytes([*a, *b, *c, *d]) as usize;
            rest.get(..n).unwrap_or_default()
        }
        _ => &[],
    }
}

/// Asks the CPU to start loading `bytes` into its cache (a hint only, never faults).
#[inline]
pub fn prefetch_bytes(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let p = bytes.as_ptr() as *const i8;
        let mut off = 0;
        while off < bytes.len() {
            // SAFETY: prefetch is a hint and never faults; the address is inside `bytes`.
            unsafe { _mm_prefetch(p.add(off), _MM_HINT_T0) };
            off += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

fn column_name(c: &Cell) -> Vec<u8> {
    let mut n = Vec::with_capacity(c.family.len() + 1 + c.qualifier.len());
    n.extend_from_slice(&c.family);
    n.push(b':');
    n.extend_from_slice(&c.qualifier);
    n
}

/// HBase's Thrift1 result for `cells` of `row`: a map by column (several versions of a column:
/// the oldest wins, as HBase's TreeMap.put leaves it) or, for sorted scanners, the list.
pub fn to_result(row: &Row, cells: &[Cell], sort_columns: bool) -> TRowResult {
    if sort_columns {
        let cols = cells
            .iter()
            .map(|c| TColumn::new(column_name(c), TCell::new(c.value.clone(), c.timestamp)))
            .collect::<Vec<_>>();
        TRowResult::new(row.row.clone(), None, cols)
    } else {
        let mut map = BTreeMap::new();
        for c in cells {
            // Later cells of the same column are older versions and replace earlier ones.
            map.insert(column_name(c), TCell::new(c.value.clone(), c.timestamp));
        }
        TRowResult::new(row.row.clone(), map, None)
    }
}

fn encode(r: &TRowResult) -> Box<[u8]> {
    let mut buf = Vec::with_capacity(64);
    write_result(&mut buf, r);
    buf.into_boxed_slice()
}

/// Appends `r` encoded by the `thrift` crate.
fn write_result(out: &mut Vec<u8>, r: &TRowResult) {
    let mut p = TBinaryOutputProtocol::new(out, true);
    // Writing into a Vec cannot fail.
    let _ = r.write_to_out_protocol(&mut p);
}

/// Receives the rows of a `list<TRowResult>` answer.
pub trait RowSink {
    /// A whole row in map form: its cached encoding.
    fn cached(&mut self, r: &CachedRow);
    /// A result made for this answer (a batch of cells, sorted columns).
    fn built(&mut self, r: TRowResult);
    /// `rows` whole rows in map form, one after another: their encodings as an each-row run
    /// holds them (crate::cache), copied at once.
    fn encoded(&mut self, bytes: &[u8], rows: usize);
}

/// The generated processor's path: plain results.
impl RowSink for Vec<TRowResult> {
    fn cached(&mut self, r: &CachedRow) {
        self.push(to_result(&r.row, &r.row.cells, false));
    }
    fn built(&mut self, r: TRowResult) {
        self.push(r);
    }
    fn encoded(&mut self, bytes: &[u8], rows: usize) {
        let mut p = TBinaryInputProtocol::new(bytes, true);
        for _ in 0..rows {
            // Our own encodings: they decode.
            if let Ok(r) = TRowResult::read_from_in_protocol(&mut p) {
                self.push(r);
            }
        }
    }
}

/// One `list<TRowResult>` reply being written into the connection's output buffer.
pub struct ListReply<'a> {
    out: &'a mut Vec<u8>,
    /// Where this reply's message header starts.
    start: usize,
    count_at: usize,
    count: u32,
    method: &'a str,
    seq: i32,
}

impl<'a> ListReply<'a> {
    /// Writes the message header and the list header (count patched by [`ListReply::finish`]).
    pub fn begin(out: &'a mut Vec<u8>, method: &'a str, seq: i32) -> ListReply<'a> {
        let start = out.len();
        out.extend_from_slice(&REPLY_HEADER.to_be_bytes());
        out.extend_from_slice(&(method.len() as u32).to_be_bytes());
        out.extend_from_slice(method.as_bytes());
        out.extend_from_slice(&seq.to_be_bytes());
        // Field 0 (the result), a list of structs.
        out.extend_from_slice(&[T_LIST, 0, 0, T_STRUCT]);
        let count_at = out.len();
        out.extend_from_slice(&[0; 4]);
        ListReply { out, start, count_at, count: 0, method, seq }
    }

    /// Ends the list and the result struct.
    pub fn finish(self) {
        self.out[self.count_at..self.count_at + 4].copy_from_slice(&self.count.to_be_bytes());
        self.out.push(T_STOP);
    }

    /// Replaces the reply with an exception declared by the call: IOError is result field 1,
    /// IllegalArgument field 2 (written by the `thrift` crate; not a hot path).
    pub fn fail(self, e: Declared) {
        self.out.truncate(self.start);
        let mut p = TBinaryOutputProtocol::new(&mut *self.out, true);
        // Writing into a Vec cannot fail.
        let _ = (|| -> thrift::Result<()> {
            p.write_message_begin(&TMessageIdentifier::new(self.method, TMessageType::Reply, self.seq))?;
            p.write_struct_begin(&TStructIdentifier::new("result"))?;
            match &e {
                Declared::Io(io) => {
                    p.write_field_begin(&TFieldIdentifier::new("io", TType::Struct, 1))?;
                    io.write_to_out_protocol(&mut p)?;
                }
                Declared::Ia(ia) => {
                    p.write_field_begin(&TFieldIdentifier::new("ia", TType::Struct, 2))?;
                    ia.write_to_out_protocol(&mut p)?;
                }
            }
            p.write_field_end()?;
            p.write_field_stop()?;
            p.write_struct_end()?;
            p.write_message_end()
        })();
    }
}

impl RowSink for ListReply<'_> {
    fn cached(&mut self, r: &CachedRow) {
        self.out.extend_from_slice(r.encoded());
        self.count += 1;
    }
    fn built(&mut self, r: TRowResult) {
        write_result(self.out, &r);
        self.count += 1;
    }
    fn encoded(&mut self, bytes: &[u8], rows: usize) {
        self.out.extend_from_slice(bytes);
        self.count += rows as u32;
    }
}

/// The exceptions list-returning calls declare (getRow* only IOError).
#[derive(Debug)]
pub enum Declared {
    Io(IOError),
    Ia(IllegalArgument),
}

impl From<Declared> for thrift::Error {
    fn from(e: Declared) -> thrift::Error {
        match e {
            Declared::Io(e) => thrift::Error::User(Box::new(e)),
            Declared::Ia(e) => thrift::Error::User(Box::new(e)),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use thrift::protocol::TListIdentifier;
    use thrift::transport::{TBufferedWriteTransport, TFramedWriteTransport};

    /// xorshift64*, seeded (the seed is printed by the tests that use it).
    pub(crate) struct Rng(pub u64);
    impl Rng {
        pub(crate) fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        pub(crate) fn below(&mut self, n: usize) -> usize {
            (self.next() % n.max(1) as u64) as usize
        }
        pub(crate) fn bytes(&mut self, len_max: usize) -> Vec<u8> {
            let n = self.below(len_max + 1);
            (0..n).map(|_| self.next() as u8).collect()
        }
    }

    pub(crate) fn seed() -> u64 {
        std::env::var("SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
        }) | 1
    }

    /// A seeded generator for a randomized test, its seed printed (to repeat a run: SEED=).
    pub(crate) fn seeded() -> (u64, Rng) {
        let seed = seed();
        println!("seed {seed} (SEED={seed} to repeat)");
        (seed, Rng(seed))
    }

    /// A random row: random key, families, qualifiers (repeated ones = several versions),
    /// timestamps (negative too) and values, empty ones included.
    pub(crate) fn random_row(r: &mut Rng) -> Row {
        let cells = (0..r.below(6))
            .map(|_| Cell {
                family: if r.below(2) == 0 { b"cf".to_vec() } else { r.bytes(3) },
                qualifier: if r.below(3) == 0 { b"q".to_vec() } else { r.bytes(4) },
                timestamp: r.next() as i64,
                value: r.bytes(40),
            })
            .collect();
        Row { row: r.bytes(12), cells }
    }

    /// The reply as the generated processor writes it, through the `thrift` crate.
    fn crate_reply(method: &str, seq: i32, rows: &[TRowResult], framed: bool) -> Vec<u8> {
        fn write(p: &mut dyn TOutputProtocol, method: &str, seq: i32, rows: &[TRowResult]) -> thrift::Result<()> {
            p.write_message_begin(&TMessageIdentifier::new(method, TMessageType::Reply, seq))?;
            p.write_struct_begin(&TStructIdentifier::new("result"))?;
            p.write_field_begin(&TFieldIdentifier::new("result_value", TType::List, 0))?;
            p.write_list_begin(&TListIdentifier::new(TType::Struct, rows.len() as i32))?;
            for r in rows {
                r.write_to_out_protocol(p)?;
            }
            p.write_list_end()?;
            p.write_field_end()?;
            p.write_field_stop()?;
            p.write_struct_end()?;
            p.write_message_end()?;
            p.flush()
        }
        let mut out = Vec::new();
        if framed {
            let mut p = TBinaryOutputProtocol::new(TFramedWriteTransport::new(&mut out), true);
            write(&mut p, method, seq, rows).unwrap();
        } else {
            let mut p = TBinaryOutputProtocol::new(TBufferedWriteTransport::new(&mut out), true);
            write(&mut p, method, seq, rows).unwrap();
        }
        out
    }

    /// Frames a reply the way the transport does (crate::transport::frame_reply).
    fn ours(method: &str, seq: i32, rows: &[CachedRow], framed: bool) -> Vec<u8> {
        let mut out = Vec::new();
        let at = crate::transport::frame_begin(&mut out, framed);
        let mut w = ListReply::begin(&mut out, method, seq);
        for r in rows {
            w.cached(r);
        }
        w.finish();
        crate::transport::frame_end(&mut out, at, framed);
        out
    }

    #[test]
    fn pre_encoded_replies_equal_the_thrift_crates_encoding() {
        let seed = seed();
        println!("seed {seed} (SEED={seed} to repeat)");
        let mut rng = Rng(seed);
        for case in 0..500 {
            let n = rng.below(if case % 10 == 0 { 300 } else { 8 });
            let rows: Vec<CachedRow> = (0..n).map(|_| CachedRow::new(random_row(&mut rng))).collect();
            let results: Vec<TRowResult> = rows.iter().map(|r| to_result(&r.row, &r.row.cells, false)).collect();
            let method = ["getRow", "getRowsWithColumns", "scannerGetList", "scannerGet"][rng.below(4)];
            let seq = rng.next() as i32;
            for framed in [false, true] {
                assert_eq!(
                    ours(method, seq, &rows, framed),
                    crate_reply(method, seq, &results, framed),
                    "seed {seed} case {case} framed {framed}"
                );
            }
        }
    }

    #[test]
    fn built_rows_and_exceptions_match_the_crate_too() {
        let seed = seed();
        println!("seed {seed} (SEED={seed} to repeat)");
        let mut rng = Rng(seed);
        let rows: Vec<Row> = (0..5).map(|_| random_row(&mut rng)).collect();
        // Mixed cached and built (sorted) rows, as a sorted scanner with batching answers.
        let results: Vec<TRowResult> =
            rows.iter().enumerate().map(|(i, r)| to_result(r, &r.cells, i % 2 == 1)).collect();
        let mut out = Vec::new();
        let mut w = ListReply::begin(&mut out, "scannerGetList", 9);
        for (i, r) in rows.iter().enumerate() {
            if i % 2 == 1 {
                w.built(to_result(r, &r.cells, true));
            } else {
                w.cached(&CachedRow::new(r.clone()));
            }
        }
        w.finish();
        assert_eq!(out, crate_reply("scannerGetList", 9, &results, false), "seed {seed}");
        // An exception replaces whatever rows were written, after earlier replies in the buffer.
        for (e, id) in [
            (Declared::Io(IOError::new("boom".to_string(), true)), 1),
            (Declared::Ia(IllegalArgument::new("scanner ID is invalid".to_string())), 2),
        ] {
            let mut out = b"earlier".to_vec();
            let mut w = ListReply::begin(&mut out, "scannerGet", -3);
            w.cached(&CachedRow::new(rows[0].clone()));
            let mut want = b"earlier".to_vec();
            {
                let mut p = TBinaryOutputProtocol::new(&mut want, true);
                p.write_message_begin(&TMessageIdentifier::new("scannerGet", TMessageType::Reply, -3)).unwrap();
                p.write_field_begin(&TFieldIdentifier::new("e", TType::Struct, id)).unwrap();
                match &e {
                    Declared::Io(x) => x.write_to_out_protocol(&mut p).unwrap(),
                    Declared::Ia(x) => x.write_to_out_protocol(&mut p).unwrap(),
                }
                p.write_field_stop().unwrap();
            }
            w.fail(e);
            assert_eq!(out, want);
        }
    }

    #[test]
    fn map_results_keep_the_oldest_of_several_versions() {
        let c =
            |ts: i64, v: &str| Cell { family: b"f".to_vec(), qualifier: b"q".to_vec(), timestamp: ts, value: v.into() };
        let r = Row { row: b"r".to_vec(), cells: vec![c(2, "new"), c(1, "old")] };
        let t = to_result(&r, &r.cells, false);
        assert_eq!(t.columns.unwrap()[&b"f:q".to_vec()].value.as_deref(), Some(&b"old"[..]));
        let s = to_result(&r, &r.cells, true);
        assert_eq!(s.sorted_columns.unwrap().len(), 2);
    }

    #[test]
    fn whole_rows_decode_from_their_encoding() {
        let (seed, mut rng) = seeded();
        for case in 0..2000 {
            let mut row = random_row(&mut rng);
            // As each-row holds them: one version per column, HBase's cell order; a family
            // holds no `:` (HBase refuses such names).
            for c in &mut row.cells {
                c.family.retain(|&b| b != b':');
            }
            row.cells.sort_by(|a, b| (&a.family, &a.qualifier).cmp(&(&b.family, &b.qualifier)));
            row.cells.dedup_by(|a, b| (&a.family, &a.qualifier) == (&b.family, &b.qualifier));
            let r = CachedRow::new(row.clone());
            assert_eq!(encoded_key(r.encoded()), &row.row[..], "seed {seed} case {case}");
            let back = CachedRow::from_encoded(r.encoded()).expect("decodes");
            assert_eq!(back, r, "seed {seed} case {case}");
            // Several rows' encodings back to back decode one by one into a plain sink.
            let mut sink: Vec<TRowResult> = Vec::new();
            let two = [r.encoded(), r.encoded()].concat();
            sink.encoded(&two, 2);
            assert_eq!(sink, vec![to_result(&row, &row.cells, false); 2], "seed {seed} case {case}");
        }
        assert_eq!(encoded_key(b"\x0c\x00\x01"), b"");
        assert!(CachedRow::from_encoded(b"\x0b\x00").is_none());
    }
}
