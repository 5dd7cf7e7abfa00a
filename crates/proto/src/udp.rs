//! memcached's UDP frame header: 8 bytes in front of every datagram — request id, sequence
//! number, total datagrams in this message, reserved (0) — all big-endian u16.
//!
//! Not for: splitting replies into datagrams by size policy (the server decides the payload
//! size); this module only reads and writes the header.

/// Bytes in the frame header.
pub const FRAME_HEADER_BYTES: usize = 8;
/// Payload bytes per reply datagram memcached uses (UDP_MAX_PAYLOAD_SIZE 1400 minus header).
pub const REPLY_PAYLOAD_BYTES_MAX: usize = 1400 - FRAME_HEADER_BYTES;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    pub request_id: u16,
    pub sequence: u16,
    pub total: u16,
    pub reserved: u16,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameError {
    /// Datagram shorter than the header.
    Short,
    /// memcached accepts only single-datagram requests (total == 1; it ignores the sequence
    /// number).
    MultiDatagram,
}

/// Split a request datagram into header and payload.
pub fn parse(datagram: &[u8]) -> Result<(FrameHeader, &[u8]), FrameError> {
    if datagram.len() < FRAME_HEADER_BYTES {
        return Err(FrameError::Short);
    }
    let be = |i: usize| u16::from_be_bytes([datagram[i], datagram[i + 1]]);
    let h = FrameHeader { request_id: be(0), sequence: be(2), total: be(4), reserved: be(6) };
    if h.total != 1 {
        return Err(FrameError::MultiDatagram);
    }
    Ok((h, &datagram[FRAME_HEADER_BYTES..]))
}

/// Append a frame header.
pub fn compose(out: &mut Vec<u8>, h: FrameHeader) {
    out.extend_from_slice(&h.request_id.to_be_bytes());
    out.extend_from_slice(&h.sequence.to_be_bytes());
    out.extend_from_slice(&h.total.to_be_bytes());
    out.extend_from_slice(&h.reserved.to_be_bytes());
}

/// Number of datagrams a reply of `reply_bytes` needs at `REPLY_PAYLOAD_BYTES_MAX` each
/// (an empty reply still takes one datagram).
pub fn datagrams_for(reply_bytes: usize) -> usize {
    reply_bytes.div_ceil(REPLY_PAYLOAD_BYTES_MAX).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_header() {
        let mut v = Vec::new();
        compose(&mut v, FrameHeader { request_id: 0x1234, sequence: 0, total: 1, reserved: 0 });
        v.extend_from_slice(b"get a\r\n");
        let (h, p) = parse(&v).unwrap();
        assert_eq!(h.request_id, 0x1234);
        assert_eq!(p, b"get a\r\n");
    }

    #[test]
    fn short_and_multi_rejected() {
        assert_eq!(parse(b"1234567"), Err(FrameError::Short));
        assert_eq!(parse(&[0, 1, 0, 0, 0, 2, 0, 0]), Err(FrameError::MultiDatagram));
        assert_eq!(parse(&[0, 1, 0, 0, 0, 0, 0, 0]), Err(FrameError::MultiDatagram));
        // memcached answers a request whatever its sequence number.
        assert!(parse(&[0, 1, 0, 1, 0, 1, 0, 0]).is_ok());
    }

    #[test]
    fn datagram_count() {
        assert_eq!(datagrams_for(0), 1);
        assert_eq!(datagrams_for(REPLY_PAYLOAD_BYTES_MAX), 1);
        assert_eq!(datagrams_for(REPLY_PAYLOAD_BYTES_MAX + 1), 2);
    }
}
