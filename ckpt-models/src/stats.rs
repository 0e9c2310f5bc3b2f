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

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn median_of_odd_even_and_empty_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[7.0]), Some(7.0));
        assert_eq!(median(&[]), None);
    }
}
