//! The request line and memcached's tokenizer (`tokenize_command`), shared by the text and
//! meta parsers.
//!
//! - A request line ends at the first `\n`; one `\r` before it is dropped when the line has at
//!   least two bytes; a NUL ends the line early (memcached works on C strings).
//! - Tokens are separated by spaces only (a tab is part of a token); runs of spaces are one
//!   separator. At most [`TOKENS_MAX`] tokens are split; the rest of the line is not looked at
//!   (the `get` family re-reads its keys from the line with [`Words`]).

use crate::rules::limits::TOKENS_MAX;

/// Position of the `\n` that ends the first line, if any.
#[inline]
pub fn line_end(input: &[u8]) -> Option<usize> {
    memchr::memchr(b'\n', input)
}

/// The request line at the front of `input` as memcached's parser sees it, and the bytes it
/// disposes of (through its `\n`). None until the `\n` has arrived.
#[inline]
pub fn request_line(input: &[u8]) -> Option<(&[u8], usize)> {
    let nl = line_end(input)?;
    let mut line = input.get(..nl).unwrap_or(&[]);
    // memcached drops one '\r' before the '\n' only when the line has at least two bytes.
    if nl > 1 {
        if let Some(stripped) = line.strip_suffix(b"\r") {
            line = stripped;
        }
    }
    // memcached parses C strings: a NUL ends the line.
    if let Some(z) = memchr::memchr(0, line) {
        line = line.get(..z).unwrap_or(&[]);
    }
    Some((line, nl + 1))
}

/// The space-separated words of (the rest of) a line, read lazily, in order, without a limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Words<'a> {
    rest: &'a [u8],
}

impl<'a> Words<'a> {
    pub fn new(rest: &'a [u8]) -> Words<'a> {
        Words { rest }
    }
}

impl<'a> Iterator for Words<'a> {
    type Item = &'a [u8];

    #[inline]
    fn next(&mut self) -> Option<&'a [u8]> {
        let start = self.rest.iter().position(|&b| b != b' ')?;
        let tail = self.rest.get(start..).unwrap_or(&[]);
        // Tokens are short: a plain loop beats memchr's call and setup cost here.
        let len = tail.iter().position(|&b| b == b' ').unwrap_or(tail.len());
        let (word, after) = tail.split_at(len);
        self.rest = after;
        Some(word)
    }
}

/// memcached's `tokenize_command`: up to [`TOKENS_MAX`] tokens of a line, on the stack.
#[derive(Clone, Copy, Debug)]
pub struct Tokens<'a> {
    toks: [&'a [u8]; TOKENS_MAX],
    count: usize,
}

impl<'a> Tokens<'a> {
    /// Split `line` (from [`request_line`]).
    #[inline]
    pub fn split(line: &'a [u8]) -> Tokens<'a> {
        let mut toks: [&'a [u8]; TOKENS_MAX] = [&[]; TOKENS_MAX];
        let mut count = 0;
        for (slot, tok) in toks.iter_mut().zip(Words::new(line)) {
            *slot = tok;
            count += 1;
        }
        Tokens { toks, count }
    }

    /// Tokens split (memcached's `ntokens - 1`: it counts a terminal token too).
    #[inline]
    pub fn count(&self) -> usize {
        self.count
    }

    /// Token `i`, or empty past the end.
    #[inline]
    pub fn get(&self, i: usize) -> &'a [u8] {
        if i < self.count {
            self.toks.get(i).copied().unwrap_or(&[])
        } else {
            &[]
        }
    }

    /// The tokens split, in order.
    #[inline]
    pub fn as_slice(&self) -> &[&'a [u8]] {
        self.toks.get(..self.count).unwrap_or(&[])
    }

    /// memcached's `set_noreply_maybe`: the last token split is exactly `noreply`.
    #[inline]
    pub fn last_is_noreply(&self) -> bool {
        self.count >= 1 && self.get(self.count - 1) == b"noreply"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_rules() {
        assert_eq!(request_line(b"get a"), None);
        assert_eq!(request_line(b"get a\r\nx"), Some((b"get a".as_slice(), 7)));
        assert_eq!(request_line(b"get a\nx"), Some((b"get a".as_slice(), 6)));
        // A lone "\r" is kept (the line has one byte); NUL cuts.
        assert_eq!(request_line(b"\r\n"), Some((b"\r".as_slice(), 2)));
        assert_eq!(request_line(b"get a\0b\r\n"), Some((b"get a".as_slice(), 9)));
        assert_eq!(request_line(b"get a\rb\r\n"), Some((b"get a\rb".as_slice(), 9)));
    }

    #[test]
    fn splits_on_spaces_only_and_stops_at_the_limit() {
        let t = Tokens::split(b"  set  a\tb 0  ");
        assert_eq!(t.as_slice(), [b"set".as_slice(), b"a\tb", b"0"]);
        assert_eq!(t.get(9), b"");
        let many: Vec<u8> = (0..40).flat_map(|i| format!("t{i} ").into_bytes()).collect();
        let t = Tokens::split(&many);
        assert_eq!(t.count(), TOKENS_MAX);
        assert_eq!(t.get(TOKENS_MAX - 1), b"t22");
        assert_eq!(Words::new(&many).count(), 40);
        assert!(Tokens::split(b"delete a noreply").last_is_noreply());
        assert!(!Tokens::split(b"delete a noreplyx").last_is_noreply());
    }
}
