//! The distributions the generators draw from, over the one RNG of this crate
//! (`fastrand::Rng`, seeded so a seed gives the same stream every run): Zipf ranks and Gaussian
//! noise. Not a statistics library: only what the generators need, checked by the tests below.

use fastrand::Rng;

/// Uniform in [0, 1).
fn unit(rng: &mut Rng) -> f64 {
    rng.f64()
}

/// Standard normal values by Box–Muller; the second value of each pair is kept for the next call.
#[derive(Debug, Clone, Default)]
pub struct Gaussian {
    spare: Option<f64>,
}

impl Gaussian {
    pub fn sample(&mut self, rng: &mut Rng) -> f64 {
        if let Some(z) = self.spare.take() {
            return z;
        }
        // 1 - unit() is in (0, 1], so ln never sees 0.
        let u1 = 1.0 - unit(rng);
        let u2 = unit(rng);
        let r = (-2.0 * u1.ln()).sqrt();
        let theta = 2.0 * std::f64::consts::PI * u2;
        self.spare = Some(r * theta.sin());
        r * theta.cos()
    }
}

/// Zipf over ranks 0..V: P(rank k) proportional to 1/(k+1)^s, sampled by inverse CDF (binary
/// search over the cumulative weights).
#[derive(Debug, Clone)]
pub struct Zipf {
    cumulative: Vec<f64>,
}

impl Zipf {
    pub fn new(vocabulary: usize, s: f64) -> Zipf {
        let mut cumulative = Vec::with_capacity(vocabulary.max(1));
        let mut acc = 0.0;
        for k in 0..vocabulary.max(1) {
            acc += 1.0 / ((k + 1) as f64).powf(s);
            cumulative.push(acc);
        }
        Zipf { cumulative }
    }

    pub fn sample(&self, rng: &mut Rng) -> usize {
        let total = self.cumulative.last().copied().unwrap_or(1.0);
        let u = unit(rng) * total;
        let k = self.cumulative.partition_point(|&c| c <= u);
        // u < total always, but rounding must never yield an out-of-range rank.
        k.min(self.cumulative.len() - 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zipf_frequencies_follow_power_law() {
        let seed = 7;
        println!("seed {seed}");
        for s in [1.0f64, 1.5] {
            let v = 100;
            let z = Zipf::new(v, s);
            let mut rng = Rng::with_seed(seed);
            let n = 400_000;
            let mut hist = vec![0u64; v];
            for _ in 0..n {
                hist[z.sample(&mut rng)] += 1;
            }
            let h: f64 = (1..=v).map(|k| 1.0 / (k as f64).powf(s)).sum();
            for k in [1usize, 2, 3, 5, 10, 20] {
                let expect = n as f64 / (k as f64).powf(s) / h;
                let got = hist[k - 1] as f64;
                let rel = (got - expect).abs() / expect;
                assert!(rel < 0.05, "s={s} rank {k}: got {got}, expected {expect:.0}");
            }
            // Monotone in expectation: rank 1 clearly beats rank 2, which beats rank 10.
            assert!(hist[0] > hist[1] && hist[1] > hist[9]);
        }
        // s = 0 is uniform; a vocabulary of one always gives rank 0.
        let z = Zipf::new(4, 0.0);
        let mut rng = Rng::with_seed(seed);
        let mut hist = [0u64; 4];
        for _ in 0..40_000 {
            hist[z.sample(&mut rng)] += 1;
        }
        assert!(hist.iter().all(|&c| (9_000..11_000).contains(&c)), "{hist:?}");
        let z = Zipf::new(1, 1.0);
        assert!((0..100).all(|_| z.sample(&mut rng) == 0));
    }

    #[test]
    fn gaussian_mean_and_stddev() {
        let seed = 11;
        println!("seed {seed}");
        let mut rng = Rng::with_seed(seed);
        let mut g = Gaussian::default();
        let n = 200_000;
        let xs: Vec<f64> = (0..n).map(|_| 10.0 + 2.0 * g.sample(&mut rng)).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n as f64;
        assert!((mean - 10.0).abs() < 0.03, "mean {mean}");
        assert!((var.sqrt() - 2.0).abs() < 0.03, "stddev {}", var.sqrt());
        // About 68% within one sigma, 95% within two.
        let within1 = xs.iter().filter(|x| (**x - 10.0).abs() < 2.0).count() as f64 / n as f64;
        let within2 = xs.iter().filter(|x| (**x - 10.0).abs() < 4.0).count() as f64 / n as f64;
        assert!((within1 - 0.6827).abs() < 0.01, "{within1}");
        assert!((within2 - 0.9545).abs() < 0.01, "{within2}");
    }

    #[test]
    fn same_seed_same_stream() {
        let a: Vec<u64> = {
            let mut r = Rng::with_seed(3);
            (0..5).map(|_| r.u64(..)).collect()
        };
        let b: Vec<u64> = {
            let mut r = Rng::with_seed(3);
            (0..5).map(|_| r.u64(..)).collect()
        };
        let c: Vec<u64> = {
            let mut r = Rng::with_seed(4);
            (0..5).map(|_| r.u64(..)).collect()
        };
        assert_eq!(a, b);
        assert_ne!(a, c);
        let mut r = Rng::with_seed(0);
        assert!((0..1000).map(|_| unit(&mut r)).all(|u| (0.0..1.0).contains(&u)));
    }
}
