//! Key hashing for shard selection and the in-shard index: a small wyhash-style multiply-fold
//! mix written for this crate (SipHash is DoS-resistant but several times slower on short keys).
//!
//! Not for: anything needing cryptographic or seeded-DoS resistance. The high bits pick the
//! shard, the low 32 bits are the in-shard tag and probe start, so the two never correlate.

const P0: u64 = 0xa076_1d64_78bd_642f;
const P1: u64 = 0xe703_7ed1_a0b4_28db;
const P2: u64 = 0x8ebc_6af0_9c88_c6e3;
const P3: u64 = 0x5899_65cc_7537_4cc3;

/// 64x64 -> 128 bit multiply, folded back to 64 bits: the whole mixing step.
#[inline(always)]
fn mum(a: u64, b: u64) -> u64 {
    let r = (a as u128).wrapping_mul(b as u128);
    (r as u64) ^ ((r >> 64) as u64)
}

/// Little-endian read of the first 8 bytes; callers guarantee `b.len() >= 8`.
#[inline(always)]
fn read8(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

/// Little-endian read of the first 4 bytes; callers guarantee `b.len() >= 4`.
#[inline(always)]
fn read4(b: &[u8]) -> u64 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[..4]);
    u32::from_le_bytes(a) as u64
}

/// Hash a key to 64 well-mixed bits.
#[inline]
pub fn hash_key(key: &[u8]) -> u64 {
    let len = key.len();
    let mut h = P0 ^ (len as u64).wrapping_mul(P1);
    let mut rest = key;
    while rest.len() > 16 {
        h = mum(read8(rest) ^ P1, read8(&rest[8..]) ^ h);
        rest = &rest[16..];
    }
    let n = rest.len();
    // Overlapping reads cover 4..=16 trailing bytes without a byte loop.
    let (a, b) = if n >= 8 {
        (read8(rest), read8(&rest[n - 8..]))
    } else if n >= 4 {
        (read4(rest), read4(&rest[n - 4..]))
    } else if n > 0 {
        let a = ((rest[0] as u64) << 16) | ((rest[n / 2] as u64) << 8) | rest[n - 1] as u64;
        (a, 0)
    } else {
        (0, 0)
    };
    h = mum(a ^ P2, b ^ h);
    mum(h ^ P3, (len as u64) ^ P0)
}

#[cfg(test)]
mod tests {
    use super::hash_key;
    use std::collections::HashSet;

    #[test]
    fn distinct_short_keys_hash_apart() {
        let mut seen = HashSet::new();
        for i in 0..100_000u32 {
            let k = format!("key:{i}");
            assert!(seen.insert(hash_key(k.as_bytes())), "collision at {k}");
        }
        assert_ne!(hash_key(b""), hash_key(b"\0"));
        assert_ne!(hash_key(b"a"), hash_key(b"a\0"));
    }

    #[test]
    fn high_and_low_bits_both_spread() {
        // 64 shards from the top 6 bits, 1024 buckets from the low bits: no bucket badly loaded.
        let mut top = [0u32; 64];
        let mut low = [0u32; 1024];
        for i in 0..65_536u32 {
            let h = hash_key(format!("user:{i:08}").as_bytes());
            top[(h >> 58) as usize] += 1;
            low[(h & 1023) as usize] += 1;
        }
        assert!(top.iter().all(|&c| (768..=1280).contains(&c)), "{top:?}");
        assert!(low.iter().all(|&c| (20..=120).contains(&c)));
    }
}
