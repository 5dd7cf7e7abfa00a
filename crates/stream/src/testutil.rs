//! testutil: a seeded PRNG for the randomized tests (tests only).

/// Seed from `STREAM_TEST_SEED` if set, else `default`; always printed so a failure can be
/// replayed.
pub fn seed(default: u64) -> u64 {
    let s = std::env::var("STREAM_TEST_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    println!("seed = {s} (set STREAM_TEST_SEED to replay)");
    s
}

/// splitmix64.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

impl Rng {
    /// Standard normal by Box–Muller.
    pub fn gauss(&mut self) -> f64 {
        let u1 = 1.0 - self.uniform(); // (0, 1]
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
}
