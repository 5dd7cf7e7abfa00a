//! Thrift1 connection handling: detects the transport from the first byte (a strict binary
//! message starts with 0x80; a framed one with a big-endian length), bounds every message, and
//! answers it: the hot calls through [`HotCalls`] (crate::hot, replies from cached encodings),
//! everything else through the generated processor. Replies go into one reused buffer per
//! connection (framed: with their 4-byte length) and out with one write per batch: the buffer is
//! written only when the next request is not already read, so pipelined requests read together
//! are answered with one write. The `thrift` crate's binary protocol trusts lengths and counts
//! from the wire (a negative or huge one would allocate or abort), so [`BoundedInput`] checks
//! each against the bytes the message may still use before the crate sees it.
//!
//! On a tenant's Thrift port the loop is shaped by the tenant's own buckets (crates/tenancy,
//! the same [`TenantShaper`] its KV ports use): before each message it waits while the ingress
//! bucket is in debt or the egress bucket / `max_outstanding` says wait (nothing more is read
//! meanwhile: TCP back-pressure), then charges the message's bytes to ingress and its reply's
//! to egress.

use slipstream_tenancy::{Admit, TenantShaper};
use std::cell::Cell;
use std::io::{self, BufReader, Read, Write};
use std::net::TcpStream;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use thrift::protocol::{
    TBinaryInputProtocol, TBinaryOutputProtocol, TFieldIdentifier, TInputProtocol, TListIdentifier, TMapIdentifier,
    TMessageIdentifier, TMessageType, TSetIdentifier, TStructIdentifier, TType,
};
use thrift::server::TProcessor;
use thrift::{ProtocolError, ProtocolErrorKind};

/// A reader that fails once a message has used its byte budget.
pub struct Budgeted<R> {
    inner: R,
    left: Rc<Cell<usize>>,
}

impl<R: Read> Read for Budgeted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.left.get();
        if left == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "thrift message exceeds size limit"));
        }
        let n = buf.len().min(left);
        let got = self.inner.read(&mut buf[..n])?;
        self.left.set(left - got);
        Ok(got)
    }
}

fn too_big(what: &str, n: i32) -> thrift::Error {
    thrift::Error::Protocol(ProtocolError::new(
        ProtocolErrorKind::SizeLimit,
        format!("{what} of {n} exceeds the message"),
    ))
}

/// The strict binary protocol with every length and count checked against the message budget.
/// It also remembers whether anything was read after the message header, so the caller can skip
/// the arguments of a call the processor rejected without reading them (UNKNOWN_METHOD).
pub struct BoundedInput<R: Read> {
    inner: TBinaryInputProtocol<Budgeted<R>>,
    left: Rc<Cell<usize>>,
    pub read_after_begin: bool,
    /// A read failed inside this message: the stream is out of step and must be closed.
    pub failed: bool,
}

impl<R: Read> BoundedInput<R> {
    /// The reader under the protocol.
    fn source(&mut self) -> &mut R {
        &mut self.inner.transport.inner
    }

    pub fn new(r: R) -> BoundedInput<R> {
        let left = Rc::new(Cell::new(0));
        let b = Budgeted { inner: r, left: left.clone() };
        BoundedInput { inner: TBinaryInputProtocol::new(b, true), left, read_after_begin: false, failed: false }
    }

    /// Bytes the current message has used of the `bytes_max` it was started with.
    fn used(&self, bytes_max: usize) -> usize {
        bytes_max - self.left.get()
    }

    /// Starts a new message that may use at most `bytes_max` bytes.
    pub fn reset(&mut self, bytes_max: usize) {
        self.left.set(bytes_max);
        self.read_after_begin = false;
        self.failed = false;
    }

    fn len(&mut self, what: &str) -> thrift::Result<usize> {
        let n = self.inner.read_i32()?;
        if n < 0 || n as usize > self.left.get() {
            return Err(too_big(what, n));
        }
        Ok(n as usize)
    }

    fn count(&mut self, n: i32, what: &str) -> thrift::Result<i32> {
        // Every element takes at least one byte, so a count above the budget is a lie.
        if n < 0 || n as usize > self.left.get() {
            return Err(too_big(what, n));
        }
        Ok(n)
    }
}

impl<R: Read> TInputProtocol for BoundedInput<R> {
    fn read_message_begin(&mut self) -> thrift::Result<TMessageIdentifier> {
        let mut first = [0u8; 4];
        self.inner.transport.read_exact(&mut first)?;
        if first[0] != 0x80 || first[1] != 0x01 {
            return Err(thrift::Error::Protocol(ProtocolError::new(
                ProtocolErrorKind::BadVersion,
                "expected a strict binary protocol message (0x80 0x01)",
            )));
        }
        let kind = TMessageType::try_from(first[3])?;
        let name = self.read_string()?;
        let seq = self.inner.read_i32()?;
        self.read_after_begin = false;
        Ok(TMessageIdentifier::new(name, kind, seq))
    }
    fn read_message_end(&mut self) -> thrift::Result<()> {
        Ok(())
    }
    fn read_struct_begin(&mut self) -> thrift::Result<Option<TStructIdentifier>> {
        self.read_after_begin = true;
        self.inner.read_struct_begin()
    }
    fn read_struct_end(&mut self) -> thrift::Result<()> {
        self.inner.read_struct_end()
    }
    fn read_field_begin(&mut self) -> thrift::Result<TFieldIdentifier> {
        self.read_after_begin = true;
        self.inner.read_field_begin()
    }
    fn read_field_end(&mut self) -> thrift::Result<()> {
        self.inner.read_field_end()
    }
    fn read_bool(&mut self) -> thrift::Result<bool> {
        self.inner.read_bool()
    }
    fn read_bytes(&mut self) -> thrift::Result<Vec<u8>> {
        let n = self.len("binary length")?;
        let mut buf = vec![0u8; n];
        self.inner.transport.read_exact(&mut buf)?;
        Ok(buf)
    }
    fn read_i8(&mut self) -> thrift::Result<i8> {
        self.inner.read_i8()
    }
    fn read_i16(&mut self) -> thrift::Result<i16> {
        self.inner.read_i16()
    }
    fn read_i32(&mut self) -> thrift::Result<i32> {
        self.inner.read_i32()
    }
    fn read_i64(&mut self) -> thrift::Result<i64> {
        self.inner.read_i64()
    }
    fn read_double(&mut self) -> thrift::Result<f64> {
        self.inner.read_double()
    }
    fn read_string(&mut self) -> thrift::Result<String> {
        let b = self.read_bytes()?;
        String::from_utf8(b)
            .map_err(|e| thrift::Error::Protocol(ProtocolError::new(ProtocolErrorKind::InvalidData, e.to_string())))
    }
    fn read_list_begin(&mut self) -> thrift::Result<TListIdentifier> {
        let id = self.inner.read_list_begin()?;
        self.count(id.size, "list size")?;
        Ok(id)
    }
    fn read_list_end(&mut self) -> thrift::Result<()> {
        Ok(())
    }
    fn read_set_begin(&mut self) -> thrift::Result<TSetIdentifier> {
        let id = self.inner.read_set_begin()?;
        self.count(id.size, "set size")?;
        Ok(id)
    }
    fn read_set_end(&mut self) -> thrift::Result<()> {
        Ok(())
    }
    fn read_map_begin(&mut self) -> thrift::Result<TMapIdentifier> {
        let id = self.inner.read_map_begin()?;
        self.count(id.size, "map size")?;
        Ok(id)
    }
    fn read_map_end(&mut self) -> thrift::Result<()> {
        Ok(())
    }
    fn read_byte(&mut self) -> thrift::Result<u8> {
        self.inner.read_byte()
    }
}

/// Replays an already-read message header once, then reads through, noting any failed read
/// (the processor answers a bad argument with an exception and carries on; the connection must
/// not, since the rest of the message is unknown).
struct Replay<'a, R: Read> {
    inner: &'a mut BoundedInput<R>,
    header: Option<TMessageIdentifier>,
}

macro_rules! through {
    ($($name:ident -> $t:ty),* $(,)?) => {
        $(fn $name(&mut self) -> thrift::Result<$t> {
            let r = self.inner.$name();
            if r.is_err() {
                self.inner.failed = true;
            }
            r
        })*
    };
}

impl<R: Read> TInputProtocol for Replay<'_, R> {
    fn read_message_begin(&mut self) -> thrift::Result<TMessageIdentifier> {
        match self.header.take() {
            Some(h) => Ok(h),
            None => self.inner.read_message_begin(),
        }
    }
    through!(read_message_end -> (), read_struct_begin -> Option<TStructIdentifier>, read_struct_end -> (),
        read_field_begin -> TFieldIdentifier, read_field_end -> (), read_bool -> bool, read_bytes -> Vec<u8>,
        read_i8 -> i8, read_i16 -> i16, read_i32 -> i32, read_i64 -> i64, read_double -> f64,
        read_string -> String, read_list_begin -> TListIdentifier, read_list_end -> (),
        read_set_begin -> TSetIdentifier, read_set_end -> (), read_map_begin -> TMapIdentifier,
        read_map_end -> (), read_byte -> u8);
}

/// Which Thrift transport a connection speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    Buffered,
    Framed,
}

/// Calls answered before the generated processor (crate::hot, from cached encodings).
pub trait HotCalls {
    /// `Some` if `name` is such a call: its arguments were read from `input` and its reply
    /// appended to `out`; `None` (nothing read) otherwise.
    fn answer(
        &self,
        name: &str,
        seq: i32,
        input: &mut dyn TInputProtocol,
        out: &mut Vec<u8>,
    ) -> Option<thrift::Result<()>>;
}

/// A connection's output buffer is shrunk back to this after a larger reply.
const OUT_KEEP_BYTES: usize = 1 << 20;
const OUT_INITIAL_BYTES: usize = 16 << 10;
/// Replies gathered for pipelined requests are written once they reach this, even if more
/// requests are already buffered.
const OUT_FLUSH_BYTES: usize = 256 << 10;
const IN_BUFFER_BYTES: usize = 64 << 10;

/// Starts a reply in `out`: a framed one with room for its 4-byte length. Returns where.
pub fn frame_begin(out: &mut Vec<u8>, framed: bool) -> usize {
    let at = out.len();
    if framed {
        out.extend_from_slice(&[0; 4]);
    }
    at
}

/// Ends a reply started at `at`: a framed one gets its length (or is removed if empty).
pub fn frame_end(out: &mut Vec<u8>, at: usize, framed: bool) {
    if !framed {
        return;
    }
    let body = out.len() - at - 4;
    if body == 0 {
        out.truncate(at);
    } else {
        out[at..at + 4].copy_from_slice(&(body as u32).to_be_bytes());
    }
}

/// The connection's input: buffered reads, limited to the current frame for framed transport
/// (so a frame is parsed straight from the read buffer, without a copy or an allocation).
pub struct Frames<R> {
    inner: BufReader<R>,
    /// Bytes left in the current frame (None: buffered transport, or between frames).
    left: Option<usize>,
}

impl<R: Read> Read for Frames<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self.left {
            None => self.inner.read(buf),
            Some(left) => {
                let n = buf.len().min(left);
                let got = self.inner.read(&mut buf[..n])?;
                self.left = Some(left - got);
                Ok(got)
            }
        }
    }
}

impl<R: Read> Frames<R> {
    /// Is the next message (framed: its whole frame) already in the read buffer, so answering
    /// it needs no read from the socket?
    fn next_message_buffered(&self, framed: bool) -> bool {
        let b = self.inner.buffer();
        if !framed {
            return !b.is_empty();
        }
        b.len() >= 4 && b.len() - 4 >= u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize
    }

    /// Reads a frame's length; Ok(None) at a clean end of stream.
    fn next_frame(&mut self, message_bytes_max: usize) -> io::Result<Option<usize>> {
        self.left = None;
        let mut len = [0u8; 4];
        if let Err(e) = self.inner.read_exact(&mut len) {
            return if e.kind() == io::ErrorKind::UnexpectedEof { Ok(None) } else { Err(e) };
        }
        let n = i32::from_be_bytes(len);
        if n <= 0 || n as usize > message_bytes_max {
            return Err(io::Error::new(io::ErrorKind::InvalidData, format!("bad frame size {n}")));
        }
        self.left = Some(n as usize);
        Ok(Some(n as usize))
    }

    /// Skips what the message left unread of its frame (bounded by the frame size).
    fn skip_rest_of_frame(&mut self) -> io::Result<()> {
        let mut sink = [0u8; 512];
        while self.left.is_some_and(|l| l > 0) {
            if self.read(&mut sink)? == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
        }
        self.left = None;
        Ok(())
    }
}

/// Runs one message: a hot call answered from cached encodings, or the generated processor
/// (header replayed; arguments of a call it rejected skipped so the stream stays in step).
fn one_message<R: Read>(
    processor: &dyn TProcessor,
    hot: &dyn HotCalls,
    input: &mut BoundedInput<R>,
    out: &mut Vec<u8>,
) -> thrift::Result<()> {
    let header = input.read_message_begin()?;
    if let Some(r) = hot.answer(&header.name, header.sequence_number, input, out) {
        return r;
    }
    let mut output = TBinaryOutputProtocol::new(&mut *out, true);
    let mut replay = Replay { inner: input, header: Some(header) };
    processor.process(&mut replay, &mut output)?;
    if input.failed {
        return Err(thrift::Error::Protocol(ProtocolError::new(ProtocolErrorKind::InvalidData, "malformed arguments")));
    }
    if !input.read_after_begin {
        input.skip(TType::Struct)?;
        input.read_message_end()?;
    }
    Ok(())
}

/// Longest single sleep of a held-back connection before it looks at its buckets again (a rate
/// raised by the admin API is seen within it).
const PACE_SLEEP_NS_MAX: u64 = 50_000_000;

/// A tenant connection's side of the shaping (none on the `[hbase]` port of the single-store
/// mode): the tenant's buckets and the replies charged but not yet written.
struct Pacer<'a> {
    shaper: &'a TenantShaper,
    unwritten: u32,
    /// Requests and bytes run since the last write, added to the tenant's counters just before
    /// it (one set of shared atomics per write, not per message).
    uncounted: (u64, u64, u64),
}

impl Pacer<'_> {
    /// Waits until the tenant may run its next message. Replies already gathered go out first:
    /// they count against `max_outstanding` until written, so holding them while waiting for a
    /// slot would wait forever.
    fn wait_turn<W: Write>(&mut self, w: &mut W, out: &mut Vec<u8>) -> io::Result<()> {
        loop {
            let now = slipstream_tenancy::since_start_ns();
            let wait_ns = match self.shaper.ingress_budget(now) {
                Err(ns) => ns,
                Ok(_) => match self.shaper.admit(now) {
                    Admit::Go { .. } => return Ok(()),
                    Admit::Wait { ns } => ns,
                },
            };
            if !out.is_empty() {
                self.count();
                w.write_all(out)?;
                out.clear();
                self.written();
            }
            std::thread::sleep(std::time::Duration::from_nanos(wait_ns.clamp(1, PACE_SLEEP_NS_MAX)));
        }
    }

    /// One message ran: `bytes_in` read, `bytes_out` of reply.
    fn charge(&mut self, bytes_in: usize, bytes_out: usize) {
        self.shaper.charge_ingress(bytes_in as u64);
        self.shaper.charge_egress(1, bytes_out as u64);
        self.unwritten += 1;
        let u = &mut self.uncounted;
        *u = (u.0 + 1, u.1 + bytes_in as u64, u.2 + bytes_out as u64);
    }

    fn written(&mut self) {
        self.shaper.complete(std::mem::take(&mut self.unwritten));
    }

    /// Adds the messages run since the last call to the tenant's counters; called before their
    /// replies are written, so a client that has its reply sees it counted.
    fn count(&mut self) {
        let (requests, bytes_in, bytes_out) = std::mem::take(&mut self.uncounted);
        if requests > 0 {
            let c = &self.shaper.counters;
            c.port_requests.fetch_add(requests, Ordering::Relaxed);
            c.port_bytes_in.fetch_add(bytes_in, Ordering::Relaxed);
            c.port_bytes_out.fetch_add(bytes_out, Ordering::Relaxed);
        }
    }
}

impl Drop for Pacer<'_> {
    /// A connection ending with replies unwritten frees their outstanding slots.
    fn drop(&mut self) {
        self.count();
        self.written();
    }
}

/// Serves one client connection until it closes or breaks the protocol (then it is closed);
/// `shaper`: the tenant owning the port, if any.
pub fn serve_connection(
    stream: TcpStream,
    processor: &dyn TProcessor,
    hot: &dyn HotCalls,
    message_bytes_max: usize,
    shaper: Option<&TenantShaper>,
) -> io::Result<()> {
    stream.set_nodelay(true)?;
    let mut peek = [0u8; 1];
    if stream.peek(&mut peek)? == 0 {
        return Ok(());
    }
    let transport = if peek[0] == 0x80 { Transport::Buffered } else { Transport::Framed };
    let mut w = stream.try_clone()?;
    serve(stream, &mut w, transport, processor, hot, message_bytes_max, shaper)
}

/// The message loop: replies are gathered in one reused buffer and written with one write call
/// when the next request is not already in the read buffer (before the loop would wait on the
/// socket), so a batch of pipelined requests read together is answered with one write; the
/// input is read in 64 KiB chunks, so a request costs no allocation here. (Buffered transport
/// cannot tell a whole next message from part of one: a partial one in the buffer delays the
/// earlier replies until its rest arrives, which the client sends without waiting for them.)
pub fn serve<R: Read, W: Write>(
    r: R,
    w: &mut W,
    transport: Transport,
    processor: &dyn TProcessor,
    hot: &dyn HotCalls,
    message_bytes_max: usize,
    shaper: Option<&TenantShaper>,
) -> io::Result<()> {
    let framed = transport == Transport::Framed;
    let mut input = BoundedInput::new(Frames { inner: BufReader::with_capacity(IN_BUFFER_BYTES, r), left: None });
    let mut out = Vec::with_capacity(OUT_INITIAL_BYTES);
    let mut pacer = shaper.map(|shaper| Pacer { shaper, unwritten: 0, uncounted: (0, 0, 0) });
    loop {
        if let Some(p) = pacer.as_mut() {
            p.wait_turn(w, &mut out)?;
        }
        let budget = if framed {
            match input.source().next_frame(message_bytes_max)? {
                Some(n) => n,
                None => return Ok(()),
            }
        } else {
            message_bytes_max
        };
        input.reset(budget);
        let at = frame_begin(&mut out, framed);
        let res = one_message(processor, hot, &mut input, &mut out);
        frame_end(&mut out, at, framed);
        if let Some(p) = pacer.as_mut() {
            // Framed: the whole frame and its 4-byte length were read (a rest the message left
            // is skipped below); buffered: what the message used (none: the connection ended
            // between messages, which is no request).
            let bytes_in = if framed { budget + 4 } else { input.used(budget) };
            if bytes_in > 0 {
                p.charge(bytes_in, out.len() - at);
            }
        }
        if let Err(e) = res {
            // Whatever the failed message produced (an exception reply) goes out before closing.
            if let Some(p) = pacer.as_mut() {
                p.count();
            }
            let _ = w.write_all(&out);
            return end_of(e);
        }
        if framed {
            input.source().skip_rest_of_frame()?;
        }
        if input.source().next_message_buffered(framed) && out.len() < OUT_FLUSH_BYTES {
            continue;
        }
        if let Some(p) = pacer.as_mut() {
            p.count();
        }
        w.write_all(&out)?;
        out.clear();
        if let Some(p) = pacer.as_mut() {
            p.written();
        }
        if out.capacity() > OUT_KEEP_BYTES {
            out.shrink_to(OUT_INITIAL_BYTES);
        }
    }
}

/// A clean EOF between messages ends the connection quietly; anything else is an error.
fn end_of(e: thrift::Error) -> io::Result<()> {
    match e {
        thrift::Error::Transport(t) if t.kind == thrift::TransportErrorKind::EndOfFile => Ok(()),
        other => Err(io::Error::new(io::ErrorKind::InvalidData, other.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gen::hbase1::HbaseSyncProcessor;
    use crate::service::{Handler, RangeCache};
    use std::sync::Arc;
    use std::time::Duration;
    use thrift::protocol::{TFieldIdentifier, TListIdentifier, TMessageIdentifier, TOutputProtocol, TStructIdentifier};

    /// Sends every call to the generated processor (the reference for the hot path).
    struct NoHot;
    impl HotCalls for NoHot {
        fn answer(&self, _: &str, _: i32, _: &mut dyn TInputProtocol, _: &mut Vec<u8>) -> Option<thrift::Result<()>> {
            None
        }
    }

    /// A call message; `args` writes the argument fields.
    fn call(name: &str, seq: i32, args: impl FnOnce(&mut dyn TOutputProtocol)) -> Vec<u8> {
        let mut v = Vec::new();
        let mut p = TBinaryOutputProtocol::new(&mut v, true);
        p.write_message_begin(&TMessageIdentifier::new(name, TMessageType::Call, seq)).unwrap();
        p.write_struct_begin(&TStructIdentifier::new("args")).unwrap();
        args(&mut p);
        p.write_field_stop().unwrap();
        v
    }

    fn bytes_field(p: &mut dyn TOutputProtocol, id: i16, b: &[u8]) {
        p.write_field_begin(&TFieldIdentifier::new("f", TType::String, id)).unwrap();
        p.write_bytes(b).unwrap();
    }

    fn i32_field(p: &mut dyn TOutputProtocol, id: i16, v: i32) {
        p.write_field_begin(&TFieldIdentifier::new("f", TType::I32, id)).unwrap();
        p.write_i32(v).unwrap();
    }

    /// The processor and hot calls of a service whose sidecar is unreachable: nothing listens
    /// on port 1, so every sidecar call fails at once (IOError).
    fn unreachable_hbase() -> (HbaseSyncProcessor<Handler>, Handler) {
        let sidecar = crate::sidecar::client::SidecarClient::new(
            "127.0.0.1:1".parse().unwrap(),
            Duration::from_secs(1),
            Duration::from_secs(1),
        );
        let rc =
            Arc::new(RangeCache::new(sidecar, crate::cache::Cache::new(crate::cache::Strategy::AllRow, 1 << 20), 10));
        (HbaseSyncProcessor::new(Handler(rc.clone())), Handler(rc))
    }

    /// The hot calls' replies (here: exceptions, the sidecar being unreachable and the
    /// scanners unknown) are byte for byte the generated processor's, for both transports,
    /// interleaved with calls only the processor answers.
    #[test]
    fn hot_calls_answer_exactly_as_the_generated_processor() {
        let (processor, hot) = unreachable_hbase();
        let msgs = [
            call("getRow", 1, |p| {
                bytes_field(p, 1, b"t");
                bytes_field(p, 2, b"r");
            }),
            call("isTableEnabled", 2, |p| bytes_field(p, 1, b"t")),
            call("getRowWithColumns", 3, |p| {
                bytes_field(p, 1, b"t");
                bytes_field(p, 2, b"r");
                p.write_field_begin(&TFieldIdentifier::new("c", TType::List, 3)).unwrap();
                p.write_list_begin(&TListIdentifier::new(TType::String, 1)).unwrap();
                p.write_bytes(b"cf:a").unwrap();
            }),
            call("getRows", 4, |p| bytes_field(p, 1, b"t")),
            call("scannerGet", 5, |p| i32_field(p, 1, 77)),
            call("scannerGetList", 6, |p| {
                i32_field(p, 1, 78);
                i32_field(p, 2, 100);
            }),
            call("getRegionInfo", 7, |p| bytes_field(p, 1, b"x")),
            // Last: a row claiming 2 GiB (exception reply, then the connection is closed).
            call("getRow", 8, |p| {
                bytes_field(p, 1, b"t");
                p.write_field_begin(&TFieldIdentifier::new("f", TType::String, 2)).unwrap();
                p.write_i32(i32::MAX).unwrap();
            }),
        ];
        for framed in [false, true] {
            let mut input = Vec::new();
            for m in &msgs {
                if framed {
                    input.extend_from_slice(&(m.len() as u32).to_be_bytes());
                }
                input.extend_from_slice(m);
            }
            let t = if framed { Transport::Framed } else { Transport::Buffered };
            let (mut ours, mut theirs) = (Vec::new(), Vec::new());
            let r1 = serve(&input[..], &mut ours, t, &processor, &hot, 1 << 20, None);
            let r2 = serve(&input[..], &mut theirs, t, &processor, &NoHot, 1 << 20, None);
            assert!(r1.is_err() && r2.is_err(), "the hostile last message closes the connection");
            assert!(ours.len() > 200, "framed {framed}: {} bytes", ours.len());
            assert_eq!(ours, theirs, "framed {framed}");
        }
    }

    /// Counts write calls.
    struct Counting {
        writes: usize,
        bytes: Vec<u8>,
    }
    impl Write for Counting {
        fn write(&mut self, b: &[u8]) -> io::Result<usize> {
            self.writes += 1;
            self.bytes.extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// Pipelined requests read together are answered with one write (both transports), and the
    /// replies are those of one write per request.
    #[test]
    fn pipelined_requests_are_answered_with_one_write() {
        let (processor, hot) = unreachable_hbase();
        for framed in [false, true] {
            let mut input = Vec::new();
            let mut one_by_one = Vec::new();
            for seq in 0..5 {
                let m = if seq % 2 == 0 {
                    call("scannerGet", seq, |p| i32_field(p, 1, 77 + seq))
                } else {
                    call("isTableEnabled", seq, |p| bytes_field(p, 1, b"t"))
                };
                let mut framed_m = Vec::new();
                if framed {
                    framed_m.extend_from_slice(&(m.len() as u32).to_be_bytes());
                }
                framed_m.extend_from_slice(&m);
                let t = if framed { Transport::Framed } else { Transport::Buffered };
                serve(&framed_m[..], &mut one_by_one, t, &processor, &hot, 1 << 20, None).unwrap();
                input.extend_from_slice(&framed_m);
            }
            let t = if framed { Transport::Framed } else { Transport::Buffered };
            let mut w = Counting { writes: 0, bytes: Vec::new() };
            serve(&input[..], &mut w, t, &processor, &hot, 1 << 20, None).unwrap();
            assert_eq!(w.writes, 1, "framed {framed}");
            assert_eq!(w.bytes, one_by_one, "framed {framed}");
        }
    }

    /// On a tenant's port every request byte is charged to the tenant's ingress bucket and
    /// every reply byte to its egress bucket (both transports), a tenant over its rate is held
    /// back (the run takes at least the time its rate allows) and counted, and no request stays
    /// outstanding once its reply is written.
    #[test]
    fn tenant_ports_are_shaped_by_the_tenants_buckets() {
        let (processor, hot) = unreachable_hbase();
        for framed in [false, true] {
            let mut input = Vec::new();
            for seq in 0..40 {
                let m = call("isTableEnabled", seq, |p| bytes_field(p, 1, b"t"));
                if framed {
                    input.extend_from_slice(&(m.len() as u32).to_be_bytes());
                }
                input.extend_from_slice(&m);
            }
            // 20 kB/s each way, 200-byte bursts: the ~2.5 kB of replies need >= 100 ms.
            let now = slipstream_tenancy::since_start_ns();
            let shaper = TenantShaper::new(20_000, 20_000, 200, 4, 0.5, now);
            let t = if framed { Transport::Framed } else { Transport::Buffered };
            let mut out = Vec::new();
            let started = std::time::Instant::now();
            serve(&input[..], &mut out, t, &processor, &hot, 1 << 20, Some(&shaper)).unwrap();
            let took = started.elapsed();
            assert_eq!(shaper.ingress.charged_bytes_total(), input.len() as u64, "framed {framed}");
            assert_eq!(shaper.egress.charged_bytes_total(), out.len() as u64, "framed {framed}");
            let floor_s = (out.len() as f64 - 200.0) / 20_000.0;
            assert!(took.as_secs_f64() >= floor_s * 0.9, "framed {framed}: {took:?} < {floor_s} s");
            assert!(shaper.counters.throttled.load(std::sync::atomic::Ordering::Relaxed) > 0);
            assert_eq!(shaper.outstanding(), 0);
        }
    }

    fn msg(body: &[u8]) -> Vec<u8> {
        let mut m = vec![0x80, 0x01, 0x00, 0x01, 0, 0, 0, 3];
        m.extend_from_slice(b"get");
        m.extend_from_slice(&[0, 0, 0, 9]);
        m.extend_from_slice(body);
        m
    }

    #[test]
    fn hostile_lengths_are_protocol_errors_not_allocations() {
        // A binary field (type 11, id 1) claiming 2 GiB, and one claiming a negative length.
        for len in [[0x7f, 0xff, 0xff, 0xff], [0xff, 0xff, 0xff, 0xfe]] {
            let mut body = vec![11, 0, 1];
            body.extend_from_slice(&len);
            let m = msg(&body);
            let mut p = BoundedInput::new(&m[..]);
            p.reset(1 << 20);
            p.read_message_begin().unwrap();
            p.read_struct_begin().unwrap();
            let f = p.read_field_begin().unwrap();
            assert_eq!(f.field_type, TType::String);
            assert!(p.read_bytes().is_err());
        }
        // A list claiming 1e9 elements.
        let m = msg(&[15, 0, 1, 11, 0x3b, 0x9a, 0xca, 0x00]);
        let mut p = BoundedInput::new(&m[..]);
        p.reset(1 << 20);
        p.read_message_begin().unwrap();
        p.read_struct_begin().unwrap();
        p.read_field_begin().unwrap();
        assert!(p.read_list_begin().is_err());
    }

    #[test]
    fn message_budget_is_enforced() {
        let m = msg(&[0; 64]);
        let mut p = BoundedInput::new(&m[..]);
        // The header takes 15 bytes; 25 leave room for one i64 and not two.
        p.reset(25);
        p.read_message_begin().unwrap();
        assert!(p.read_i64().is_ok());
        assert!(p.read_i64().is_err());
    }

    #[test]
    fn non_strict_messages_are_rejected() {
        let m = [0, 0, 0, 3, b'g', b'e', b't', 1, 0, 0, 0, 0];
        let mut p = BoundedInput::new(&m[..]);
        p.reset(100);
        assert!(p.read_message_begin().is_err());
    }
}
