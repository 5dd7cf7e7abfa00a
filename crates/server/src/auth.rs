//! Authentication before any command: memcached's ascii auth (`-Y <authfile>`) and binary SASL
//! (`-S`, the PLAIN mechanism against a `MEMCACHED_SASL_PWDB` file of `user:password` lines).
//!
//! What it is for: the credential files (parsed once at start-up, bounded), and the executor
//! the network loop calls instead of the protocol executors while a connection of an
//! auth-enabled server has not authenticated (and, for SASL, for the SASL opcodes at any time:
//! a client may authenticate again). Replies are memcached 1.6.18's, byte for byte:
//! `proto_text.c` `try_read_command_asciiauth` and `authfile.c` for `-Y`; `proto_bin.c`
//! `dispatch_bin_command`/`authenticated`/`bin_list_sasl_mechs`/`process_bin_complete_sasl_auth`
//! and `sasl_defs.c` `sasl_server_userdb_checkpass` for `-S`.
//!
//! What it is not for: sockets (no I/O here), or the commands themselves (once authenticated
//! the connection runs through `memcache_text` / `memcache_binary` as usual). libsasl2's other
//! mechanisms and its sasldb are not offered: the mechanism list is `PLAIN`.

pub use crate::credentials::{Auth, CredError, Credentials, ENTRIES_MAX, ENTRY_BYTES_MAX, FILE_BYTES_MAX};
use crate::exec::{Ctx, Protocol, Step};
use crate::stats::ThreadStats;
use crate::{memcache_binary, memcache_text};
use slipstream_proto::binary::{self, opcode, status, Header, HEADER_BYTES};
use slipstream_proto::rules;

/// Longest ascii auth token (`user pass`); newer memcached's `MAX_AUTH_REQ_LEN`, with its reply.
pub const ASCII_TOKEN_BYTES_MAX: usize = 16384;
/// An ascii auth line longer than this without a newline closes the connection (memcached).
const ASCII_LINE_BYTES_MAX: usize = 2048;
/// Longest SASL mechanism name (memcached's `MAX_SASL_MECH_LEN`).
const SASL_MECH_BYTES_MAX: usize = 32;
/// Largest SASL_AUTH/STEP body accepted (PLAIN's is two names and a password).
const SASL_BODY_BYTES_MAX: usize = 16384;
/// What SASL_LIST_MECHS answers.
pub const SASL_MECHS: &[u8] = b"PLAIN";
/// memcached's PROTOCOL_BINARY_RESPONSE_AUTH_CONTINUE.
const AUTH_CONTINUE: u16 = 0x21;

/// The protocol every connection speaks (memcached forces its binding protocol).
fn forced_protocol(auth: &Auth) -> Protocol {
    match auth {
        Auth::Ascii { .. } => Protocol::Text,
        Auth::Sasl { .. } => Protocol::Binary,
    }
}
/// Handle the front of `input` on a connection of a server that requires `auth`: the
/// authentication exchange, memcached's refusal of anything else before it, or (once
/// authenticated) the ordinary executor.
pub fn execute(auth: &Auth, ctx: &mut Ctx<'_>, input: &[u8], out: &mut Vec<u8>) -> Step {
    ctx.conn.protocol = forced_protocol(auth);
    match auth {
        Auth::Ascii { creds, .. } if !ctx.conn.authenticated => ascii(creds, ctx, input, out),
        Auth::Ascii { .. } => memcache_text::execute(ctx, input, out),
        Auth::Sasl { creds } => sasl(creds, ctx, input, out),
    }
}

/// memcached 1.6.18's `try_read_command_asciiauth`.
fn ascii(creds: &Credentials, ctx: &mut Ctx<'_>, input: &[u8], out: &mut Vec<u8>) -> Step {
    if let Some(body) = ctx.conn.auth_body_bytes {
        if input.len() < body {
            return Step::Incomplete;
        }
        ctx.conn.auth_body_bytes = None;
        let data = &input[..body];
        let Some(token) = data.strip_suffix(b"\r\n") else {
            out.extend_from_slice(b"CLIENT_ERROR bad command line termination\r\n");
            return Step::Consumed(body);
        };
        // memcached tokenizes the token as a C string.
        let token = token.split(|&b| b == 0).next().unwrap_or(token);
        let mut words = token.split(|&b| b == b' ').filter(|w| !w.is_empty());
        let (Some(user), Some(pass)) = (words.next(), words.next()) else {
            out.extend_from_slice(b"CLIENT_ERROR bad authentication token format\r\n");
            return Step::Consumed(body);
        };
        ThreadStats::incr(&ctx.stats.auth_cmds);
        if creds.check(user, pass) {
            ctx.conn.authenticated = true;
            out.extend_from_slice(b"STORED\r\n");
        } else {
            ThreadStats::incr(&ctx.stats.auth_errors);
            out.extend_from_slice(b"CLIENT_ERROR authentication failure\r\n");
        }
        return Step::Consumed(body);
    }
    if input.len() < 2 {
        return Step::Incomplete;
    }
    let Some(nl) = input.iter().position(|&b| b == b'\n') else {
        // No newline after 2 KiB: junk, close (memcached).
        return if input.len() > ASCII_LINE_BYTES_MAX { Step::Close } else { Step::Incomplete };
    };
    let line = &input[..nl];
    let line = line.split(|&b| b == 0).next().unwrap_or(line);
    let words: Vec<&[u8]> = line.split(|&b| b == b' ').filter(|w| !w.is_empty()).take(6).collect();
    let size = match words.as_slice() {
        // memcached reads the size with safe_strtoul (64-bit strtoul stored into 32 bits).
        [cmd, _key, _flags, _exptime, n, ..] if *cmd == b"set" => rules::safe_strtoul(n).map(u64::from),
        _ => None,
    };
    let Some(size) = size else {
        out.extend_from_slice(b"CLIENT_ERROR unauthenticated\r\n");
        return Step::Consumed(nl + 1);
    };
    if size > ASCII_TOKEN_BYTES_MAX as u64 {
        out.extend_from_slice(b"CLIENT_ERROR auth token too long\r\n");
        return Step::Consumed(nl + 1);
    }
    ctx.conn.auth_body_bytes = Some(size as usize + 2);
    Step::Consumed(nl + 1)
}

/// The binary protocol with SASL (`proto_bin.c`).
fn sasl(creds: &Credentials, ctx: &mut Ctx<'_>, input: &[u8], out: &mut Vec<u8>) -> Step {
    if ctx.conn.swallow_bytes > 0 {
        return memcache_binary::execute(ctx, input, out);
    }
    let Some(h) = Header::decode(input) else { return Step::Incomplete };
    let is_sasl = matches!(h.opcode, opcode::SASL_LIST_MECHS | opcode::SASL_AUTH | opcode::SASL_STEP);
    if h.magic != binary::REQUEST_MAGIC || (!is_sasl && (ctx.conn.authenticated || h.opcode == opcode::VERSION)) {
        // Bad magic closes; authenticated commands and VERSION run as usual.
        return memcache_binary::execute(ctx, input, out);
    }
    let (extlen, keylen, bodylen) = (h.extlen as usize, h.keylen as usize, h.bodylen as usize);
    let head_end = HEADER_BYTES + extlen + keylen;
    if input.len() < head_end {
        return Step::Incomplete;
    }
    // dispatch_bin_command's checks, in its order.
    if keylen + extlen > bodylen {
        binary::compose_error(out, &h, status::UNKNOWN_COMMAND);
        return Step::Close;
    }
    if !is_sasl {
        binary::compose_error(out, &h, status::AUTH_ERROR);
        return Step::Close;
    }
    let value_bytes = bodylen - keylen - extlen;
    match h.opcode {
        opcode::SASL_LIST_MECHS => {
            if bodylen != 0 {
                binary::compose_error(out, &h, status::EINVAL);
                return Step::Close;
            }
            ctx.conn.authenticated = false;
            binary::compose_response(out, h.opcode, status::NO_ERROR, h.opaque, 0, &[], &[], SASL_MECHS);
            Step::Consumed(head_end)
        }
        _ => {
            if extlen != 0 || keylen == 0 {
                binary::compose_error(out, &h, status::EINVAL);
                return Step::Close;
            }
            if keylen > SASL_MECH_BYTES_MAX {
                binary::compose_error(out, &h, status::EINVAL);
                ctx.conn.swallow_bytes = value_bytes;
                return Step::Consumed(head_end);
            }
            if value_bytes > SASL_BODY_BYTES_MAX {
                // memcached cannot allocate the item it reads the data into.
                binary::compose_error(out, &h, status::ENOMEM);
                ctx.conn.swallow_bytes = value_bytes;
                return Step::Consumed(head_end);
            }
            let end = head_end + value_bytes;
            if input.len() < end {
                return Step::Incomplete;
            }
            let mech = &input[head_end - keylen..head_end];
            let data = &input[head_end..end];
            sasl_auth(creds, ctx, &h, mech, data, out);
            Step::Consumed(end)
        }
    }
}

/// SASL_AUTH / SASL_STEP with the whole body: PLAIN is `authzid \0 authcid \0 password`; an
/// AUTH without data asks for it (AUTH_CONTINUE) and the STEP that follows brings it.
fn sasl_auth(creds: &Credentials, ctx: &mut Ctx<'_>, h: &Header, mech: &[u8], data: &[u8], out: &mut Vec<u8>) {
    // memcached's init_sasl_conn: every SASL exchange starts unauthenticated.
    ctx.conn.authenticated = false;
    let plain = mech.eq_ignore_ascii_case(b"PLAIN");
    let verdict = if h.opcode == opcode::SASL_AUTH {
        ctx.conn.sasl_continue = false;
        if plain && data.is_empty() {
            ctx.conn.sasl_continue = true;
            binary::compose_response(out, h.opcode, AUTH_CONTINUE, h.opaque, 0, &[], &[], &[]);
            return;
        }
        plain && plain_ok(creds, data)
    } else {
        std::mem::take(&mut ctx.conn.sasl_continue) && plain_ok(creds, data)
    };
    ThreadStats::incr(&ctx.stats.auth_cmds);
    if verdict {
        ctx.conn.authenticated = true;
        binary::compose_response(out, h.opcode, status::NO_ERROR, h.opaque, 0, &[], &[], b"Authenticated");
    } else {
        ThreadStats::incr(&ctx.stats.auth_errors);
        binary::compose_error(out, h, status::AUTH_ERROR);
    }
}

/// Whether a PLAIN message names a known user with its password. An authorization identity
/// other than the user itself is refused (libsasl2 has no proxy policy for memcached).
fn plain_ok(creds: &Credentials, data: &[u8]) -> bool {
    let mut parts = data.splitn(3, |&b| b == 0);
    let (Some(authzid), Some(user), Some(pass)) = (parts.next(), parts.next(), parts.next()) else { return false };
    if !authzid.is_empty() && authzid != user {
        return false;
    }
    !user.is_empty() && creds.check(user, pass)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authfile_lines() {
        let c = Credentials::parse_authfile(b"alice:secret\r\nbob:pw:with:colons\n\ncarol:\n").unwrap();
        assert_eq!(c.len(), 3);
        assert!(c.check(b"alice", b"secret"));
        assert!(c.check(b"bob", b"pw:with:colons"));
        assert!(c.check(b"carol", b""));
        assert!(!c.check(b"alice", b"secre"));
        assert!(!c.check(b"alice", b"secretx"));
        assert!(!c.check(b"eve", b"secret"));
        assert_eq!(Credentials::parse_authfile(b"alice:x\nnocolon\n").err(), Some(CredError::Malformed(2)));
        let long = format!("u:{}\n", "p".repeat(ENTRY_BYTES_MAX));
        assert_eq!(Credentials::parse_authfile(long.as_bytes()).err(), Some(CredError::Malformed(1)));
        let many: String = (0..=ENTRIES_MAX).map(|i| format!("u{i}:p\n")).collect();
        assert_eq!(Credentials::parse_authfile(many.as_bytes()).err(), Some(CredError::TooManyEntries));
    }

    #[test]
    fn sasl_pwdb_password_stops_at_a_colon() {
        let c = Credentials::parse_sasl_pwdb(b"alice:secret:comment\n").unwrap();
        assert!(c.check(b"alice", b"secret"));
        assert!(!c.check(b"alice", b"secret:comment"));
    }

    #[test]
    fn plain_messages() {
        let c = Credentials::parse_sasl_pwdb(b"alice:secret\n").unwrap();
        assert!(plain_ok(&c, b"\0alice\0secret"));
        assert!(plain_ok(&c, b"alice\0alice\0secret"));
        assert!(!plain_ok(&c, b"bob\0alice\0secret"));
        assert!(!plain_ok(&c, b"\0alice\0wrong"));
        assert!(!plain_ok(&c, b"alice\0secret"));
        assert!(!plain_ok(&c, b""));
    }
}
