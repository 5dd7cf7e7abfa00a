//! TLS on the TCP listeners (`-Z` and `-o ssl_*`, as in memcached 1.6), with rustls.
//!
//! What it is for: building the server configuration from memcached's options at start-up
//! (certificate chain, key, client-certificate verification, minimum version), and `TlsStream`:
//! a rustls server connection driven over the non-blocking socket, so the network loop reads
//! and writes it like a plain socket. Reads return short only once the socket is drained (the
//! loop's edge-triggered polling relies on that); records rustls holds after a write go out in
//! `drain`, which the loop calls after every flush, registering for writability when the socket
//! is full.
//! What it is not for: plain TCP (never wrapped: the hot path does not pay for TLS), UDP, or
//! OpenSSL-only tuning (`ssl_ciphers`, `ssl_wbuf_size`, `ssl_session_cache`, `ssl_kernel_tls`
//! are accepted and reported as having no effect).

use mio::net::TcpStream;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig, ServerConnection};
use std::io::{self, IoSlice, Read, Write};
use std::sync::Arc;

/// The server configuration type, so users of this crate need no rustls dependency of their own.
pub type TlsConfig = ServerConfig;

/// memcached's `ssl_verify_mode`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum VerifyMode {
    /// 0: no client certificate asked for.
    #[default]
    None,
    /// 1: asked for, verified when given, not required.
    Request,
    /// 2: required.
    Require,
    /// 3: required (OpenSSL's "once" only matters for renegotiation, which TLS 1.3 lacks).
    Once,
}

/// memcached's TLS options (`-o ssl_*`).
#[derive(Clone, Debug)]
pub struct TlsOptions {
    pub chain_cert: Option<String>,
    /// Defaults to the chain file (memcached loads the key from it when `ssl_key` is unset).
    pub key: Option<String>,
    pub ca_cert: Option<String>,
    pub verify_mode: VerifyMode,
    /// Lowest TLS version accepted: 2 (TLS 1.2) or 3 (TLS 1.3); rustls has no 1.0/1.1.
    pub min_version: u8,
    /// What `ssl_min_version` asked for (0..=3), for the start-up notice.
    pub min_version_asked: u8,
    /// Sub-options accepted without effect.
    pub ignored: Vec<String>,
}

impl Default for TlsOptions {
    fn default() -> Self {
        TlsOptions {
            chain_cert: None,
            key: None,
            ca_cert: None,
            verify_mode: VerifyMode::None,
            min_version: 2,
            min_version_asked: 2,
            ignored: Vec::new(),
        }
    }
}

impl TlsOptions {
    /// Start-up notices: options that do not do here what they do in memcached.
    pub fn notices(&self) -> Vec<String> {
        let mut v: Vec<String> =
            self.ignored.iter().map(|k| format!("-o {k} has no effect (OpenSSL tuning; TLS is rustls here)")).collect();
        if self.min_version_asked < 2 {
            v.push("-o ssl_min_version below 2: TLS 1.0/1.1 are not offered (rustls); the minimum is TLS 1.2".into());
        }
        v
    }
}

/// Build the server configuration; errors name the file and the reason.
pub fn server_config(o: &TlsOptions) -> Result<Arc<ServerConfig>, String> {
    let chain_path = o.chain_cert.as_deref().ok_or("ssl_chain_cert is required")?;
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(chain_path)
        .map_err(|e| format!("ssl_chain_cert {chain_path}: {e}"))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("ssl_chain_cert {chain_path}: {e}"))?;
    if chain.is_empty() {
        return Err(format!("ssl_chain_cert {chain_path}: no certificate in the file"));
    }
    let key_path = o.key.as_deref().unwrap_or(chain_path);
    let key = PrivateKeyDer::from_pem_file(key_path).map_err(|e| format!("ssl_key {key_path}: {e}"))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let versions: &[&rustls::SupportedProtocolVersion] = if o.min_version >= 3 {
        &[&rustls::version::TLS13]
    } else {
        &[&rustls::version::TLS13, &rustls::version::TLS12]
    };
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions)
        .map_err(|e| e.to_string())?;
    let builder = match o.verify_mode {
        VerifyMode::None => builder.with_no_client_auth(),
        mode => {
            let ca = o.ca_cert.as_deref().ok_or("ssl_verify_mode 1-3 needs -o ssl_ca_cert=<PEM file of client CAs>")?;
            let mut roots = RootCertStore::empty();
            for c in CertificateDer::pem_file_iter(ca).map_err(|e| format!("ssl_ca_cert {ca}: {e}"))? {
                roots
                    .add(c.map_err(|e| format!("ssl_ca_cert {ca}: {e}"))?)
                    .map_err(|e| format!("ssl_ca_cert {ca}: {e}"))?;
            }
            let v = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let v = if mode == VerifyMode::Request { v.allow_unauthenticated() } else { v };
            builder.with_client_cert_verifier(v.build().map_err(|e| format!("ssl_ca_cert {ca}: {e}"))?)
        }
    };
    let cfg = builder.with_single_cert(chain, key).map_err(|e| format!("ssl_chain_cert/ssl_key: {e}"))?;
    Ok(Arc::new(cfg))
}

/// A TLS server connection over a non-blocking TCP socket.
pub struct TlsStream {
    pub sock: TcpStream,
    conn: ServerConnection,
    /// The socket reached end-of-file.
    eof: bool,
}

impl TlsStream {
    pub fn new(sock: TcpStream, cfg: &Arc<ServerConfig>) -> io::Result<TlsStream> {
        let conn = ServerConnection::new(cfg.clone()).map_err(io::Error::other)?;
        Ok(TlsStream { sock, conn, eof: false })
    }

    /// Write the records rustls holds. Ok(false): the socket would block first.
    pub fn drain(&mut self) -> io::Result<bool> {
        while self.conn.wants_write() {
            match self.conn.write_tls(&mut self.sock) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// Plaintext into `buf`. Returns less than `buf.len()` only when the socket has nothing
    /// more (WouldBlock) or is at its end; Ok(0) is the end of the connection.
    pub fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut got = 0usize;
        loop {
            match self.conn.reader().read(&mut buf[got..]) {
                Ok(0) => return Ok(got), // close_notify received
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                // End of socket without close_notify: what was decrypted is delivered first.
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(got),
                Err(e) => return Err(e),
            }
            if got == buf.len() || self.eof {
                return Ok(got);
            }
            match self.conn.read_tls(&mut self.sock) {
                Ok(0) => self.eof = true,
                Ok(_) => {
                    if let Err(e) = self.conn.process_new_packets() {
                        // Tell the peer why (the alert rustls queued), then fail the connection.
                        let _ = self.drain();
                        return Err(io::Error::new(io::ErrorKind::InvalidData, e));
                    }
                    // Handshake replies go out now; what the socket will not take waits for
                    // the loop's flush.
                    self.drain()?;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    return if got > 0 { Ok(got) } else { Err(e) };
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Encrypt as much of `bufs` as rustls will buffer, after the records already waiting have
    /// gone out (WouldBlock while they cannot).
    pub fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        if !self.drain()? {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let n = self.conn.writer().write_vectored(bufs)?;
        self.drain()?;
        Ok(n)
    }
}

impl Drop for TlsStream {
    fn drop(&mut self) {
        // A clean close for the peer when the socket takes it; never waits.
        self.conn.send_close_notify();
        let _ = self.drain();
    }
}
