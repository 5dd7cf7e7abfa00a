//! The cheap Thrift1 client of the load generator: requests written with the `thrift` crate's
//! binary protocol into one buffer (framed with `transport::frame_begin`/`frame_end`, the
//! daemon's own framing), several requests in flight per connection (pipelined: one `write` for
//! a batch), and replies *skimmed*: the frame length, the message header and the result field's
//! list size or scanner id are read; the rows themselves are not decoded (the tests check
//! answers; a load generator that decodes 100 `TRowResult`s per scan spends 3-5x the daemon's
//! CPU and measures itself). Exceptions are errors.

use slipstream_rangecache::transport::{frame_begin, frame_end};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use thrift::protocol::{
    TBinaryInputProtocol, TBinaryOutputProtocol, TFieldIdentifier, TInputProtocol, TListIdentifier, TMapIdentifier,
    TMessageIdentifier, TMessageType, TOutputProtocol, TStructIdentifier, TType,
};

/// A reply frame larger than this is an error (a 100-row scan is ~25 KB).
const REPLY_BYTES_MAX: usize = 64 << 20;

/// One argument of a request, in field order from 1.
pub enum Arg<'a> {
    Bin(&'a [u8]),
    I32(i32),
    /// An empty `list<Text>` (columns: all).
    NoColumns,
    /// An empty `map<Text, Text>` (attributes).
    NoAttributes,
}

/// What a reply carried in its result field.
#[derive(Debug, PartialEq, Eq)]
pub enum Answer {
    List(usize),
    I32(i32),
    Void,
}

pub struct RawConn {
    s: TcpStream,
    out: Vec<u8>,
    inbuf: Vec<u8>,
    seq: i32,
}

fn err<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

impl RawConn {
    pub fn connect(addr: SocketAddr) -> Result<RawConn, String> {
        let s = TcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
        s.set_nodelay(true).map_err(err)?;
        Ok(RawConn { s, out: Vec::with_capacity(4096), inbuf: Vec::with_capacity(64 << 10), seq: 0 })
    }

    /// Appends one framed call to the batch being built.
    pub fn call(&mut self, method: &str, args: &[Arg]) -> Result<(), String> {
        self.seq = self.seq.wrapping_add(1);
        let at = frame_begin(&mut self.out, true);
        let mut p = TBinaryOutputProtocol::new(&mut self.out, true);
        p.write_message_begin(&TMessageIdentifier::new(method, TMessageType::Call, self.seq)).map_err(err)?;
        p.write_struct_begin(&TStructIdentifier::new("args")).map_err(err)?;
        for (i, a) in args.iter().enumerate() {
            let id = i as i16 + 1;
            let ty = match a {
                Arg::Bin(_) => TType::String,
                Arg::I32(_) => TType::I32,
                Arg::NoColumns => TType::List,
                Arg::NoAttributes => TType::Map,
            };
            p.write_field_begin(&TFieldIdentifier::new::<Option<String>, String, i16>(None, ty, id)).map_err(err)?;
            match a {
                Arg::Bin(b) => p.write_bytes(b),
                Arg::I32(v) => p.write_i32(*v),
                Arg::NoColumns => p.write_list_begin(&TListIdentifier::new(TType::String, 0)),
                Arg::NoAttributes => p.write_map_begin(&TMapIdentifier::new(TType::String, TType::String, 0)),
            }
            .map_err(err)?;
            p.write_field_end().map_err(err)?;
        }
        p.write_field_stop().map_err(err)?;
        p.write_struct_end().map_err(err)?;
        p.write_message_end().map_err(err)?;
        frame_end(&mut self.out, at, true);
        Ok(())
    }

    /// Sends the batch (one write).
    pub fn flush(&mut self) -> Result<(), String> {
        self.s.write_all(&self.out).map_err(err)?;
        self.out.clear();
        Ok(())
    }

    /// Reads one reply and skims it.
    pub fn reply(&mut self) -> Result<Answer, String> {
        let mut len = [0u8; 4];
        self.s.read_exact(&mut len).map_err(err)?;
        let n = u32::from_be_bytes(len) as usize;
        if n > REPLY_BYTES_MAX {
            return Err(format!("reply frame of {n} bytes"));
        }
        self.inbuf.resize(n, 0);
        self.s.read_exact(&mut self.inbuf).map_err(err)?;
        skim(&self.inbuf)
    }
}

/// The result of one reply message: exceptions (application or declared) are errors.
pub fn skim(frame: &[u8]) -> Result<Answer, String> {
    let mut p = TBinaryInputProtocol::new(frame, true);
    let m = p.read_message_begin().map_err(err)?;
    if m.message_type != TMessageType::Reply {
        return Err(format!("{}: {:?} reply", m.name, m.message_type));
    }
    p.read_struct_begin().map_err(err)?;
    let f = p.read_field_begin().map_err(err)?;
    match (f.id, f.field_type) {
        (_, TType::Stop) => Ok(Answer::Void),
        (Some(0), TType::List) => Ok(Answer::List(p.read_list_begin().map_err(err)?.size.max(0) as usize)),
        (Some(0), TType::I32) => Ok(Answer::I32(p.read_i32().map_err(err)?)),
        (id, t) => Err(format!("{}: exception field {id:?} ({t:?})", m.name)),
    }
}
