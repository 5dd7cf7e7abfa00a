//! What a connection's bytes travel over: plain TCP (the hot path, unchanged), a unix-domain
//! socket (`-s`), or TLS over TCP (`-Z`, rustls).
//!
//! What it is for: one `Stream` type the network loop reads, writes and registers with mio
//! whatever the transport, so the loop has one code path. Plain TCP costs one match per call.
//! What it is not for: protocol rules, or deciding when to read or write (the network loop).

pub mod tls;
pub mod unix;

use mio::event::Source;
use mio::net::{TcpStream, UnixStream};
use mio::{Interest, Registry, Token};
use std::io::{self, IoSlice, Read, Write};
use std::os::fd::{AsRawFd, RawFd};

/// A connection's socket.
pub enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
    Tls(Box<tls::TlsStream>),
}

impl Stream {
    /// Hand the socket what the transport still holds (TLS records). Ok(true) when nothing is
    /// left; Ok(false) when the socket would block first. Plain sockets hold nothing.
    pub fn drain(&mut self) -> io::Result<bool> {
        match self {
            Stream::Tls(t) => t.drain(),
            _ => Ok(true),
        }
    }
}

impl AsRawFd for Stream {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            Stream::Tcp(s) => s.as_raw_fd(),
            Stream::Unix(s) => s.as_raw_fd(),
            Stream::Tls(t) => t.sock.as_raw_fd(),
        }
    }
}

impl Read for Stream {
    #[inline]
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
            Stream::Tls(t) => t.read(buf),
        }
    }
}

impl Write for Stream {
    #[inline]
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
            Stream::Tls(t) => t.write_vectored(&[IoSlice::new(buf)]),
        }
    }

    #[inline]
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write_vectored(bufs),
            Stream::Unix(s) => s.write_vectored(bufs),
            Stream::Tls(t) => t.write_vectored(bufs),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self.drain()? {
            true => Ok(()),
            false => Err(io::ErrorKind::WouldBlock.into()),
        }
    }
}

impl Source for Stream {
    fn register(&mut self, registry: &Registry, token: Token, interests: Interest) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.register(registry, token, interests),
            Stream::Unix(s) => s.register(registry, token, interests),
            Stream::Tls(t) => t.sock.register(registry, token, interests),
        }
    }

    fn reregister(&mut self, registry: &Registry, token: Token, interests: Interest) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.reregister(registry, token, interests),
            Stream::Unix(s) => s.reregister(registry, token, interests),
            Stream::Tls(t) => t.sock.reregister(registry, token, interests),
        }
    }

    fn deregister(&mut self, registry: &Registry) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.deregister(registry),
            Stream::Unix(s) => s.deregister(registry),
            Stream::Tls(t) => t.sock.deregister(registry),
        }
    }
}
