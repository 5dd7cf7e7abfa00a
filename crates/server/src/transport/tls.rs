//! TLS on the TCP listeners (`-Z` and `-o ssl_*`, as in memcached 1.6), with rustls.
//!
//! What it is for: building the server configuration from memcached's options at start-up
//! (certificate chain, key, client-certificate verification, minimum version) and again on
//! `refresh_certs` (`TlsState`, with memcached's error lines and TLS counters), and `TlsStream`:
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
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

/// The TLS state the server is started with, so users of this crate need no rustls dependency
/// of their own.
pub type TlsConfig = TlsState;

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

/// What failed while loading the certificates, in memcached's (tls.c
/// load_server_certificates) terms: the stage, the file and OpenSSL 3's error text where
/// Slipstream can say the same (a file that cannot be read, a file with no PEM block, a key
/// that cannot be decoded or does not match the certificate).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadError {
    /// `ssl_chain_cert` is not set.
    NoChain,
    Chain {
        path: String,
        detail: String,
    },
    Key {
        path: String,
        detail: String,
    },
    Ca {
        path: String,
        detail: String,
    },
    /// The options cannot make a configuration (e.g. verify mode without a CA file).
    Config(String),
}

impl std::fmt::Display for LoadError {
    /// memcached's line (without its CRLF).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoadError::NoChain => f.write_str("ssl_chain_cert is required"),
            LoadError::Chain { path, detail } => write!(f, "Error loading the certificate chain: {path} : {detail}"),
            LoadError::Key { path, detail } => write!(f, "Error loading the key: {path} : {detail}"),
            LoadError::Ca { path, detail } => write!(f, "Error loading the CA certificate: {path} : {detail}"),
            LoadError::Config(why) => f.write_str(why),
        }
    }
}

/// OpenSSL 3's error text for a PEM file problem, as memcached prints it.
fn pem_detail(e: &rustls::pki_types::pem::Error) -> String {
    use rustls::pki_types::pem::Error as P;
    match e {
        // OpenSSL packs errno into a "system library" error.
        P::Io(io) => match io.raw_os_error() {
            Some(errno) => {
                let text = io::Error::from_raw_os_error(errno).to_string();
                let text = text.split(" (os error").next().unwrap_or(&text).to_string();
                format!("error:{:08X}:system library::{text}", 0x8000_0000u32 | (errno as u32 & 0x7f_ffff))
            }
            None => io.to_string(),
        },
        P::NoItemsFound => NO_START_LINE.to_string(),
        other => format!("{other:?}"),
    }
}

/// OpenSSL's error for a file without the PEM block it looked for.
const NO_START_LINE: &str = "error:0480006C:PEM routines::no start line";
/// OpenSSL's error for a key file without a key it can decode.
const KEY_UNSUPPORTED: &str = "error:1E08010C:DECODER routines::unsupported";
/// OpenSSL's error for a private key that does not match the certificate (loading the key
/// checks it against the certificate).
const KEY_MISMATCH: &str = "error:05800074:x509 certificate routines::key values mismatch";

/// Build the server configuration from the files `o` names (read now).
fn build_config(o: &TlsOptions) -> Result<Arc<ServerConfig>, LoadError> {
    let chain_path = o.chain_cert.as_deref().ok_or(LoadError::NoChain)?;
    let chain_err =
        |e: &rustls::pki_types::pem::Error| LoadError::Chain { path: chain_path.into(), detail: pem_detail(e) };
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(chain_path)
        .map_err(|e| chain_err(&e))?
        .collect::<Result<_, _>>()
        .map_err(|e| chain_err(&e))?;
    if chain.is_empty() {
        return Err(LoadError::Chain { path: chain_path.into(), detail: NO_START_LINE.into() });
    }
    let key_path = o.key.as_deref().unwrap_or(chain_path);
    let key = PrivateKeyDer::from_pem_file(key_path).map_err(|e| {
        let detail = match e {
            rustls::pki_types::pem::Error::NoItemsFound => KEY_UNSUPPORTED.to_string(),
            e => pem_detail(&e),
        };
        LoadError::Key { path: key_path.into(), detail }
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let versions: &[&rustls::SupportedProtocolVersion] = if o.min_version >= 3 {
        &[&rustls::version::TLS13]
    } else {
        &[&rustls::version::TLS13, &rustls::version::TLS12]
    };
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(versions)
        .map_err(|e| LoadError::Config(e.to_string()))?;
    let builder = match o.verify_mode {
        VerifyMode::None => builder.with_no_client_auth(),
        mode => {
            let ca = o.ca_cert.as_deref().ok_or_else(|| {
                LoadError::Config("ssl_verify_mode 1-3 needs -o ssl_ca_cert=<PEM file of client CAs>".into())
            })?;
            let ca_err = |detail: String| LoadError::Ca { path: ca.into(), detail };
            let mut roots = RootCertStore::empty();
            for c in CertificateDer::pem_file_iter(ca).map_err(|e| ca_err(pem_detail(&e)))? {
                roots.add(c.map_err(|e| ca_err(pem_detail(&e)))?).map_err(|e| ca_err(e.to_string()))?;
            }
            let v = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let v = if mode == VerifyMode::Request { v.allow_unauthenticated() } else { v };
            builder.with_client_cert_verifier(v.build().map_err(|e| ca_err(e.to_string()))?)
        }
    };
    let cfg = builder.with_single_cert(chain, key).map_err(|e| match e {
        rustls::Error::InconsistentKeys(_) => LoadError::Key { path: key_path.into(), detail: KEY_MISMATCH.into() },
        e => LoadError::Key { path: key_path.into(), detail: e.to_string() },
    })?;
    Ok(Arc::new(cfg))
}

/// Build the server's TLS state (the files are read now); errors name the file and the reason.
pub fn server_config(o: &TlsOptions) -> Result<Arc<TlsState>, String> {
    let config = build_config(o).map_err(|e| e.to_string())?;
    Ok(Arc::new(TlsState {
        opts: o.clone(),
        config: RwLock::new(config),
        handshake_errors: AtomicU64::new(0),
        refreshed_at_s: AtomicU64::new(NEVER_REFRESHED),
    }))
}

/// `refreshed_at_s` before the first `refresh_certs`.
const NEVER_REFRESHED: u64 = u64::MAX;
/// memcached's clock reads 0 when it loads the certificates at start and its `uptime` is its
/// clock less this (ITEM_UPDATE_INTERVAL): until the first refresh, its
/// `time_since_server_cert_refresh` is `uptime` plus this.
const START_LOAD_CLOCK_LAG_S: u64 = 60;

/// The server's TLS: the configuration new connections get (replaced by `refresh_certs`),
/// the options it is built from, and memcached's TLS counters for `stats`.
pub struct TlsState {
    opts: TlsOptions,
    config: RwLock<Arc<ServerConfig>>,
    /// Connections that ended before their handshake completed (`ssl_handshake_errors`).
    pub handshake_errors: AtomicU64,
    /// Server uptime second of the last successful `refresh_certs`.
    refreshed_at_s: AtomicU64,
}

impl std::fmt::Debug for TlsState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsState").field("opts", &self.opts).finish_non_exhaustive()
    }
}

impl TlsState {
    /// The configuration a new connection gets.
    pub fn current(&self) -> Arc<ServerConfig> {
        self.config.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// memcached's `refresh_certs`: load the certificate chain, key and CA file again from the
    /// configured paths; new connections use them, open ones keep theirs. On failure the
    /// configuration in force stays (memcached may be left with half of it) and the error is
    /// memcached's line.
    pub fn refresh(&self, now_s: u64) -> Result<(), LoadError> {
        let cfg = build_config(&self.opts)?;
        *self.config.write().unwrap_or_else(PoisonError::into_inner) = cfg;
        self.refreshed_at_s.store(now_s, Ordering::Relaxed);
        Ok(())
    }

    /// `time_since_server_cert_refresh` at server uptime `now_s`.
    pub fn since_refresh_s(&self, now_s: u64) -> u64 {
        match self.refreshed_at_s.load(Ordering::Relaxed) {
            NEVER_REFRESHED => now_s + START_LOAD_CLOCK_LAG_S,
            at => now_s.saturating_sub(at),
        }
    }
}

/// A TLS server connection over a non-blocking TCP socket.
pub struct TlsStream {
    pub sock: TcpStream,
    conn: ServerConnection,
    /// Counts this connection in `ssl_handshake_errors` if it ends before the handshake does.
    state: Arc<TlsState>,
    /// The socket reached end-of-file.
    eof: bool,
}

impl TlsStream {
    pub fn new(sock: TcpStream, state: &Arc<TlsState>) -> io::Result<TlsStream> {
        let conn = ServerConnection::new(state.current()).map_err(io::Error::other)?;
        Ok(TlsStream { sock, conn, state: state.clone(), eof: false })
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
        if self.conn.is_handshaking() {
            // memcached counts a connection whose TLS accept failed, a peer that hung up
            // before finishing its handshake included.
            self.state.handshake_errors.fetch_add(1, Ordering::Relaxed);
        }
        // A clean close for the peer when the socket takes it; never waits.
        self.conn.send_close_notify();
        let _ = self.drain();
    }
}
