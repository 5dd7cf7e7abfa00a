//! The credentials a server with authentication checks against (`-Y` authfile, `-S`
//! `MEMCACHED_SASL_PWDB`): the files' formats, their bounds, and which authentication is on.
//!
//! What it is for: data read once at start-up, shared by the settings, the auth executor and
//! `stats settings`. What it is not for: the exchanges themselves (auth.rs) — this module
//! imports nothing of the server, so everything may import it.

/// Most entries a credential file may hold (memcached's authfile stops at 8; a longer file is
/// refused here rather than cut silently).
pub const ENTRIES_MAX: usize = 1024;
/// Longest line of a credential file (memcached's `MAX_ENTRY_LEN`).
pub const ENTRY_BYTES_MAX: usize = 256;
/// Largest credential file read at start-up.
pub const FILE_BYTES_MAX: usize = ENTRIES_MAX * ENTRY_BYTES_MAX;
/// Which authentication a server requires.
pub enum Auth {
    /// `-Y`: text protocol only; the first command must be `set <key> <flags> <exptime> <n>`
    /// whose data is `user pass`. `path` is shown by `stats settings`.
    Ascii { path: String, creds: Credentials },
    /// `-S`: binary protocol only; SASL PLAIN.
    Sasl { creds: Credentials },
}

impl std::fmt::Debug for Auth {
    // Never print credentials.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Auth::Ascii { path, creds } => write!(f, "Auth::Ascii({path}, {} entries)", creds.entries.len()),
            Auth::Sasl { creds } => write!(f, "Auth::Sasl({} entries)", creds.entries.len()),
        }
    }
}

/// A credential file that cannot be used (the server refuses to start, saying why).
#[derive(Debug, PartialEq, Eq)]
pub enum CredError {
    TooLarge,
    TooManyEntries,
    /// 1-based line number of a line without `:` or longer than `ENTRY_BYTES_MAX`.
    Malformed(usize),
}

impl std::fmt::Display for CredError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CredError::TooLarge => write!(f, "larger than {FILE_BYTES_MAX} bytes"),
            CredError::TooManyEntries => write!(f, "more than {ENTRIES_MAX} entries"),
            CredError::Malformed(n) => {
                write!(f, "line {n} is malformed (should be 'user:password', at most {ENTRY_BYTES_MAX} bytes)")
            }
        }
    }
}

impl std::error::Error for CredError {}

/// `user:password` pairs. The password runs from the first `:` to the end of the line (for the
/// SASL file, memcached also stops at a second `:`).
pub struct Credentials {
    entries: Vec<(Vec<u8>, Vec<u8>)>,
}

impl Credentials {
    /// memcached's authfile (`-Y`): the user ends at the first `:`, the password at `\r`/`\n`.
    pub fn parse_authfile(text: &[u8]) -> Result<Credentials, CredError> {
        Credentials::parse(text, false)
    }

    /// memcached's `MEMCACHED_SASL_PWDB` file: `user:password[:anything]` lines.
    pub fn parse_sasl_pwdb(text: &[u8]) -> Result<Credentials, CredError> {
        Credentials::parse(text, true)
    }

    fn parse(text: &[u8], colon_ends_password: bool) -> Result<Credentials, CredError> {
        if text.len() > FILE_BYTES_MAX {
            return Err(CredError::TooLarge);
        }
        let mut entries = Vec::new();
        for (i, line) in text.split(|&b| b == b'\n').enumerate() {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if line.is_empty() {
                // A blank line (the file's last newline, say) holds no entry.
                continue;
            }
            if line.len() >= ENTRY_BYTES_MAX {
                return Err(CredError::Malformed(i + 1));
            }
            let Some(colon) = line.iter().position(|&b| b == b':') else { return Err(CredError::Malformed(i + 1)) };
            let mut pass = &line[colon + 1..];
            if colon_ends_password {
                pass = pass.split(|&b| b == b':').next().unwrap_or(pass);
            }
            if let Some(cr) = pass.iter().position(|&b| b == b'\r') {
                pass = &pass[..cr];
            }
            if entries.len() == ENTRIES_MAX {
                return Err(CredError::TooManyEntries);
            }
            entries.push((line[..colon].to_vec(), pass.to_vec()));
        }
        Ok(Credentials { entries })
    }

    /// Whether `user`/`pass` is an entry. Every entry is compared in full, so the time taken
    /// does not say how much of a guess matched.
    pub fn check(&self, user: &[u8], pass: &[u8]) -> bool {
        let mut ok = false;
        for (u, p) in &self.entries {
            ok |= same(u, user) & same(p, pass);
        }
        ok
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Constant-time (for equal lengths) byte comparison.
fn same(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
