//! memcached's security and socket flags: `-s <path>` / `-a <mask>` (unix socket), `-S` (binary
//! SASL, credentials from `MEMCACHED_SASL_PWDB`), `-Y <authfile>` (ascii auth), `-Z` with the
//! `ssl_*` sub-options of `-o` (TLS on the TCP listeners).
//!
//! What it is for: parsing and checking these settings against each other the way memcached
//! 1.6.18 does (`memcached.c` main: its refusals are quoted), and loading the credential files
//! and certificates at start-up so a bad file stops the server with the reason.
//! What it is not for: the protocol exchange (`slipstream_server::auth`) or the TLS record layer
//! (`slipstream_server::transport::tls`).

use slipstream_server::auth::{Auth, Credentials};
use slipstream_server::transport::tls::{TlsOptions, VerifyMode};
use std::sync::Arc;

#[derive(Clone, Debug, Default)]
pub struct SecurityConfig {
    /// `-s`: serve this unix socket instead of TCP and UDP (memcached turns both off).
    pub unix_socket: Option<String>,
    /// `-a`: the socket file's permission bits (octal on the command line; memcached's 0700).
    pub unix_mode: Option<u32>,
    /// `-S`.
    pub sasl: bool,
    /// `-Y`.
    pub auth_file: Option<String>,
    /// `-Z`.
    pub tls: bool,
    pub tls_opts: TlsOptions,
}

/// memcached's default `-a`.
pub const UNIX_MODE_DEFAULT: u32 = 0o700;

impl SecurityConfig {
    /// The flags this module owns that take a value.
    pub fn takes_value(flag: &str) -> bool {
        matches!(flag, "s" | "unix-socket" | "a" | "unix-mask" | "Y" | "auth-file")
    }

    /// Apply one flag; None when it is not one of ours.
    pub fn apply_flag(&mut self, flag: &str, value: &str) -> Option<Result<(), String>> {
        Some(match flag {
            "s" | "unix-socket" => {
                self.unix_socket = Some(value.to_string());
                Ok(())
            }
            "a" | "unix-mask" => match u32::from_str_radix(value.trim(), 8) {
                Ok(m) if m <= 0o777 => {
                    self.unix_mode = Some(m);
                    Ok(())
                }
                _ => Err(format!("bad value `{value}` for -a: expected octal permission bits, e.g. 0700")),
            },
            "S" | "enable-sasl" => {
                self.sasl = true;
                Ok(())
            }
            "Y" | "auth-file" => {
                self.auth_file = Some(value.to_string());
                Ok(())
            }
            "Z" | "enable-ssl" => {
                self.tls = true;
                Ok(())
            }
            _ => return None,
        })
    }

    /// Apply one `-o` sub-option if it is an `ssl_*` one; None when it is not.
    pub fn apply_suboption(&mut self, key: &str, value: Option<&str>) -> Option<Result<(), String>> {
        if !key.starts_with("ssl_") {
            return None;
        }
        let need = |v: Option<&str>| v.map(str::to_string).ok_or_else(|| format!("Missing {key} argument"));
        let o = &mut self.tls_opts;
        Some((|| {
            match key {
                "ssl_chain_cert" => o.chain_cert = Some(need(value)?),
                "ssl_key" => o.key = Some(need(value)?),
                "ssl_ca_cert" => o.ca_cert = Some(need(value)?),
                "ssl_verify_mode" => {
                    let v = need(value)?;
                    o.verify_mode = match v.trim() {
                        "0" => VerifyMode::None,
                        "1" => VerifyMode::Request,
                        "2" => VerifyMode::Require,
                        "3" => VerifyMode::Once,
                        _ => return Err("Invalid ssl_verify_mode. Use help to see valid options.".into()),
                    }
                }
                "ssl_min_version" => {
                    let v = need(value)?;
                    o.min_version = match v.trim() {
                        "0" | "1" | "2" => 2,
                        "3" => 3,
                        _ => return Err("Invalid ssl_min_version. Use help to see valid options.".into()),
                    };
                    o.min_version_asked = v.trim().parse().unwrap_or(2);
                }
                "ssl_keyformat" => {
                    if need(value)?.trim() != "0" {
                        return Err("ssl_keyformat: only 0 (PEM) is supported".into());
                    }
                }
                // OpenSSL tuning with no counterpart in rustls: accepted, reported at start.
                "ssl_ciphers" | "ssl_wbuf_size" | "ssl_session_cache" | "ssl_kernel_tls" => {
                    o.ignored.push(key.to_string());
                }
                _ => return Err(format!("unknown TLS option `{key}`")),
            }
            Ok(())
        })())
    }

    /// memcached's start-up refusals for these flags, given the ports in effect (in tenant mode:
    /// nonzero when some tenant has such a port).
    ///
    /// Tenant mode (`tenants`): `-S`, `-Y` and `-Z` apply to every tenant's TCP port, as they
    /// apply to every `-l` listener in memcached; `-s` (and `-a`) are refused: a unix socket has
    /// no port to tell which tenant a connection belongs to.
    pub fn validate(&self, tcp_port: u16, udp_port: u16, tenants: bool) -> Result<(), String> {
        if tenants && self.unix_socket.is_some() {
            return Err("-s: a unix socket has no port to tell the tenants apart by, so it serves single-tenant \
                        mode only; with [[tenant]] every tenant is served on its tcp_port"
                .into());
        }
        if tenants && (self.sasl || self.auth_file.is_some()) && udp_port != 0 {
            return Err("-S/-Y authenticate every tenant's port, and UDP cannot authenticate (memcached refuses UDP \
                        with authentication): remove udp_port from the [[tenant]] tables"
                .into());
        }
        if self.sasl && self.auth_file.is_some() {
            return Err("-S and -Y together: memcached would serve ascii auth and ignore SASL; choose one".into());
        }
        if self.sasl && udp_port != 0 && self.unix_socket.is_none() {
            return Err("ERROR: Cannot enable UDP while using binary SASL authentication.".into());
        }
        if self.auth_file.is_some() && udp_port != 0 && self.unix_socket.is_none() {
            return Err("Cannot use UDP with ascii authentication enabled (-U 0 to disable)".into());
        }
        if self.tls && tcp_port == 0 && self.unix_socket.is_none() {
            return Err("ERROR: You cannot enable SSL without a TCP port.".into());
        }
        if self.tls && self.tls_opts.chain_cert.is_none() {
            return Err("-Z needs -o ssl_chain_cert=<PEM file> (and ssl_key= unless the key is in that file)".into());
        }
        if self.unix_mode.is_some() && self.unix_socket.is_none() {
            return Err("-a sets the mode of the -s unix socket; it needs -s".into());
        }
        Ok(())
    }

    /// Load the credential file the flags name (None without -S/-Y).
    pub fn load_auth(&self) -> Result<Option<Arc<Auth>>, String> {
        if let Some(path) = &self.auth_file {
            let creds = read_creds(path, Credentials::parse_authfile).map_err(|e| format!("Authfile [{path}]: {e}"))?;
            return Ok(Some(Arc::new(Auth::Ascii { path: path.clone(), creds })));
        }
        if self.sasl {
            // memcached with libsasl2 falls back to the sasldb when the variable is unset; there is
            // no libsasl2 here, so the file is required.
            let path = std::env::var("MEMCACHED_SASL_PWDB").map_err(|_| {
                "-S needs MEMCACHED_SASL_PWDB=<file of user:password lines> (libsasl2's sasldb is not supported)"
                    .to_string()
            })?;
            let creds = read_creds(&path, Credentials::parse_sasl_pwdb)
                .map_err(|e| format!("SASL password file [{path}]: {e}"))?;
            return Ok(Some(Arc::new(Auth::Sasl { creds })));
        }
        Ok(None)
    }

    /// `stats settings` rows that differ from memcached's defaults under `-Z`, as memcached
    /// prints them (its `ssl_ca_cert` is NULL without one, `ssl_key` (null)).
    pub fn settings_rows(&self) -> Vec<(&'static str, String)> {
        if !self.tls {
            return Vec::new();
        }
        let o = &self.tls_opts;
        let mut v = vec![("ssl_enabled", "yes".to_string())];
        if let Some(c) = &o.chain_cert {
            v.push(("ssl_chain_cert", c.clone()));
        }
        if let Some(k) = &o.key {
            v.push(("ssl_key", k.clone()));
        }
        if let Some(ca) = &o.ca_cert {
            v.push(("ssl_ca_cert", ca.clone()));
        }
        let mode = match o.verify_mode {
            VerifyMode::None => 0,
            VerifyMode::Request => 1,
            VerifyMode::Require => 2,
            VerifyMode::Once => 3,
        };
        v.push(("ssl_verify_mode", mode.to_string()));
        v.push(("ssl_min_version", format!("tlsv1.{}", o.min_version_asked)));
        v
    }

    /// The unix socket's permission bits.
    pub fn unix_mode(&self) -> u32 {
        self.unix_mode.unwrap_or(UNIX_MODE_DEFAULT)
    }
}

fn read_creds(
    path: &str,
    parse: fn(&[u8]) -> Result<Credentials, slipstream_server::auth::CredError>,
) -> Result<Credentials, String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("cannot open: {e}"))?;
    if meta.len() > slipstream_server::auth::FILE_BYTES_MAX as u64 {
        return Err(format!("larger than {} bytes", slipstream_server::auth::FILE_BYTES_MAX));
    }
    let text = std::fs::read(path).map_err(|e| format!("cannot read: {e}"))?;
    parse(&text).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_and_refusals() {
        let mut s = SecurityConfig::default();
        assert!(s.apply_flag("a", "0755").unwrap().is_ok());
        assert_eq!(s.unix_mode, Some(0o755));
        assert!(s.apply_flag("a", "999").unwrap().is_err());
        assert!(s.apply_flag("p", "1").is_none());
        assert!(s.validate(11211, 0, false).is_err(), "-a without -s");
        s.apply_flag("s", "/tmp/x.sock").unwrap().unwrap();
        assert!(s.validate(11211, 0, false).is_ok());
        let mut y = SecurityConfig { auth_file: Some("f".into()), ..Default::default() };
        assert!(y.validate(11211, 11211, false).unwrap_err().contains("-U 0"));
        y.sasl = true;
        assert!(y.validate(11211, 0, false).is_err());
        let z = SecurityConfig { tls: true, ..Default::default() };
        assert!(z.validate(11211, 0, false).is_err(), "no certificate");
        // Tenant mode: auth and TLS for every tenant port; no unix socket, no UDP under auth.
        let y = SecurityConfig { auth_file: Some("f".into()), ..Default::default() };
        assert!(y.validate(1, 0, true).is_ok());
        assert!(y.validate(1, 1, true).unwrap_err().contains("udp_port"));
        let s = SecurityConfig { unix_socket: Some("/tmp/x.sock".into()), ..Default::default() };
        assert!(s.validate(1, 0, true).unwrap_err().contains("single-tenant"));
    }

    #[test]
    fn ssl_suboptions() {
        let mut s = SecurityConfig::default();
        assert!(s.apply_suboption("modern", None).is_none());
        s.apply_suboption("ssl_chain_cert", Some("c.pem")).unwrap().unwrap();
        s.apply_suboption("ssl_verify_mode", Some("2")).unwrap().unwrap();
        s.apply_suboption("ssl_min_version", Some("3")).unwrap().unwrap();
        s.apply_suboption("ssl_session_cache", None).unwrap().unwrap();
        assert_eq!(s.tls_opts.verify_mode, VerifyMode::Require);
        assert_eq!(s.tls_opts.min_version, 3);
        assert!(s.apply_suboption("ssl_verify_mode", Some("7")).unwrap().is_err());
        assert!(s.settings_rows().is_empty(), "no rows without -Z");
        s.tls = true;
        let rows = s.settings_rows();
        assert!(rows.contains(&("ssl_enabled", "yes".into())) && rows.contains(&("ssl_chain_cert", "c.pem".into())));
        assert!(
            rows.contains(&("ssl_verify_mode", "2".into())) && rows.contains(&("ssl_min_version", "tlsv1.3".into()))
        );
        assert!(s.apply_suboption("ssl_key", None).unwrap().is_err());
    }
}
