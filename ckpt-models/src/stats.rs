//! Summary statistics of repeated measurements, shared by the benchmarks (`bench`) and
//! the main program (`examples/train_classifier`).

/// The median of `values`: the middle value, or the mean of the two middle values for an
/// even count (NumPy's `np.median`); `None` when `values` is empty. Values are ordered by
/// [`f64::total_cmp`] (a NaN sorts after every number).
pub fn median(values: &[f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// The `q` quantile of `values` (`0.0..=1.0`), interpolated linearly between the two
/// nearest order statistics (NumPy's `np.quantile`, method `linear`); `None` when
/// `values` is empty or `q` is outside `0..=1` (or NaN). Ordered as [`median`] orders.
pub fn quantile(values: &[f64], q: f64) -> Option<f64> {
    if values.is_empty() || !(0.0..=1.0).contains(&q) {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let pos = q * (v.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    Some(v[lo] + (v[hi] - v[lo]) * (pos - lo as f64))
}

#[cfg(test)]
mod tests {
    use super::{median, quantile};

    #[test]
    fn quantiles_interpolate_as_numpy() {
        let xs = [4.0, 1.0, 3.0, 2.0];
        // np.quantile([1, 2, 3, 4], [0, 0.25, 0.5, 0.75, 1]) = [1, 1.75, 2.5, 3.25, 4]
        assert_eq!(quantile(&xs, 0.0), Some(1.0));
        assert_eq!(quantile(&xs, 0.25), Some(1.75));
        assert_eq!(quantile(&xs, 0.5), median(&xs));
        assert_eq!(quantile(&xs, 0.75), Some(3.25));
        assert_eq!(quantile(&xs, 1.0), Some(4.0));
        assert_eq!(quantile(&[7.0], 0.25), Some(7.0));
        assert_eq!(quantile(&[], 0.5), None);
        assert_eq!(quantile(&xs, 1.5), None);
        assert_eq!(quantile(&xs, f64::NAN), None);
    }

    #[test]
    fn median_of_odd_even_and_empty_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[7.0]), Some(7.0));
        assert_eq!(median(&[]), None);
    }
}
