//! testutil: the seeded RNG of the randomized tests (tests only): fastrand, plus Box–Muller.

/// Seed from `STREAM_TEST_SEED` if set, else `default`; always printed so a failure can be
/// replayed.
pub fn seed(default: u64) -> u64 {
    let s = std::env::var("STREAM_TEST_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    println!("seed = {s} (set STREAM_TEST_SEED to replay)");
    s
}

/// The project's one RNG (fastrand), seeded so a printed seed replays.
pub struct Rng(fastrand::Rng);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(fastrand::Rng::with_seed(seed))
    }
    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        self.0.f64()
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.0.u64(..n.max(1))
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
