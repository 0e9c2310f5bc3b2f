//! Timing and peak bytes of repeated training steps, measured the way `torch_side.py`
//! measures them.

use std::time::Instant;

use serde::Serialize;
use tch::Device;

/// What a series of steps measured.
#[derive(Debug, Clone, Serialize)]
pub struct Measured {
    /// Median wall-clock seconds of a step.
    pub step_seconds_median: f64,
    /// Every measured step's seconds.
    pub step_seconds: Vec<f64>,
    /// Peak tensor bytes of a step above the bytes live before it (the largest over the
    /// measured steps; they agree to the byte in steady state).
    pub peak_bytes: i64,
}

/// Runs `warmup` unmeasured steps (they allocate optimizer state and `.grad`), then
/// `steps` measured ones: before each, the CPU peak is reset and the live bytes taken as
/// the baseline; after it, the peak above that baseline and the elapsed time are kept.
pub fn steps(warmup: usize, steps: usize, mut step: impl FnMut()) -> Measured {
    for _ in 0..warmup {
        step();
    }
    let mut seconds = Vec::with_capacity(steps);
    let mut peak = 0i64;
    for _ in 0..steps {
        ckpt::memory::reset_peak(Device::Cpu);
        let base = ckpt::memory::current_bytes(Device::Cpu);
        let start = Instant::now();
        step();
        seconds.push(start.elapsed().as_secs_f64());
        peak = peak.max(ckpt::memory::peak_bytes(Device::Cpu) - base);
    }
    Measured {
        step_seconds_median: median(&seconds),
        step_seconds: seconds,
        peak_bytes: peak,
    }
}

/// Minor page faults of this process so far, all threads (`getrusage(RUSAGE_SELF)`'s
/// `ru_minflt`; Python's `resource.getrusage` reads the same counter): a step's difference
/// counts the pages its heap touched for the first time. 0 where the call fails.
pub fn minor_faults() -> u64 {
    // SAFETY: `getrusage` only writes the zeroed `rusage` it is given.
    unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut usage) == 0 {
            u64::try_from(usage.ru_minflt).unwrap_or(0)
        } else {
            0
        }
    }
}

/// The median ([`ckpt_models::stats::median`]); 0 when `values` is empty.
pub fn median(values: &[f64]) -> f64 {
    ckpt_models::stats::median(values).unwrap_or(0.0)
}

/// The slope of the least-squares line through `(ln x, ln y)`: the exponent `a` of
/// `y ≈ c · x^a`.
pub fn fitted_exponent(xs: &[f64], ys: &[f64]) -> f64 {
    let lx: Vec<f64> = xs.iter().map(|x| x.ln()).collect();
    let ly: Vec<f64> = ys.iter().map(|y| y.ln()).collect();
    let n = lx.len() as f64;
    let (mx, my) = (lx.iter().sum::<f64>() / n, ly.iter().sum::<f64>() / n);
    let cov: f64 = lx.iter().zip(&ly).map(|(x, y)| (x - mx) * (y - my)).sum();
    let var: f64 = lx.iter().map(|x| (x - mx).powi(2)).sum();
    cov / var
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exponent_of_a_power_law() {
        let xs = [8.0, 16.0, 32.0, 64.0];
        let ys: Vec<f64> = xs.iter().map(|x: &f64| 3.0 * x.powf(0.5)).collect();
        assert!((fitted_exponent(&xs, &ys) - 0.5).abs() < 1e-12);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
    }
}
