//! Rules that `ckpt`'s runtime and its macros must apply identically, in one place: no
//! dependencies, so the proc-macro crate can use it.
//!
//! - [`sequential_ranges`]: how `segments = N` groups a chain of stages (PyTorch's
//!   `checkpoint_sequential`), for `checkpoint_sequential`, `model!` and
//!   `#[checkpointed]` alike (the macro applies it at compile time when the number of
//!   stages is known then, the runtime otherwise).
//! - [`cut_ranges`]: the segments between cuts (`ckpt::cut!()` markers, a plan's cuts,
//!   `Schedule::Cuts`).
//! - [`parse`]: the grammar of memory budgets (`ckpt::plan::Budget`'s `FromStr` at run
//!   time, `budget = ".."` checked at compile time):
//!
//! - bytes with a unit: `"512 MiB"`, `"1.5GiB"`, `"64KiB"`, `"1000000 B"`; binary units
//!   `KiB`, `MiB`, `GiB`, `TiB` (and the short `K`, `M`, `G`, `T`, also binary), decimal
//!   units `kB`, `MB`, `GB`, `TB`, and `B` / `byte` / `bytes`; case does not matter;
//!   fractional amounts are rounded down to whole bytes;
//! - a fraction of the plain (unchecked) run's predicted peak: a bare number in `(0, 1]`
//!   (`"0.4"`) or a percentage in `(0, 100]` (`"40%"`).

use std::ops::Range;

/// The groups of a chain of `len` stages cut into `segments` segments, as PyTorch's
/// `torch.utils.checkpoint.checkpoint_sequential` makes them: every group but the last
/// has `len / segments` stages, and the last takes the rest (it is the one that runs
/// without checkpointing). `segments` is clamped to `1..=max(len, 1)`; `len = 0` gives one
/// empty group.
///
/// ```
/// # use ckpt_budget::sequential_ranges;
/// assert_eq!(sequential_ranges(6, 3), vec![0..2, 2..4, 4..6]);
/// assert_eq!(sequential_ranges(8, 3), vec![0..2, 2..4, 4..8]);
/// assert_eq!(sequential_ranges(2, 5), vec![0..1, 1..2]);
/// ```
pub fn sequential_ranges(len: usize, segments: usize) -> Vec<Range<usize>> {
    let segments = segments.clamp(1, len.max(1));
    let size = len / segments;
    let mut ranges: Vec<Range<usize>> = (0..segments - 1)
        .map(|k| k * size..(k + 1) * size)
        .collect();
    ranges.push((segments - 1) * size..len);
    ranges
}

/// The segments of a chain of `len` stages cut before each stage in `cuts` (strictly
/// increasing, within `1..len`; not checked): `cuts.len() + 1` contiguous ranges
/// covering `0..len`, in order.
///
/// ```
/// # use ckpt_budget::cut_ranges;
/// assert_eq!(cut_ranges(&[2, 5], 8), vec![0..2, 2..5, 5..8]);
/// assert_eq!(cut_ranges(&[], 3), vec![0..3]);
/// ```
pub fn cut_ranges(cuts: &[usize], len: usize) -> Vec<Range<usize>> {
    let bounds: Vec<usize> = std::iter::once(0)
        .chain(cuts.iter().copied())
        .chain(std::iter::once(len))
        .collect();
    bounds.windows(2).map(|w| w[0]..w[1]).collect()
}

/// A parsed budget.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Budget {
    /// At most this many bytes.
    Bytes(u64),
    /// At most this fraction of the plain run's predicted peak, in `(0, 1]`.
    Fraction(f64),
}

/// Parses a budget string (see the [crate docs](crate)).
///
/// # Errors
///
/// What is wrong, without the input or the valid forms (callers add those in their own
/// words): no number, an unknown unit, a bare number outside `(0, 1]`, a percentage
/// outside `(0, 100]`, or a byte count past `u64::MAX`.
pub fn parse(s: &str) -> Result<Budget, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num.parse().map_err(|_| "no number".to_owned())?;
    let unit = unit.trim();
    if unit.is_empty() {
        return if value > 0.0 && value <= 1.0 {
            Ok(Budget::Fraction(value))
        } else {
            Err("a bare number is a fraction of the plain run's peak, in (0, 1]".to_owned())
        };
    }
    if unit == "%" {
        return if value > 0.0 && value <= 100.0 {
            Ok(Budget::Fraction(value / 100.0))
        } else {
            Err("a percentage must be in (0, 100]".to_owned())
        };
    }
    let scale: f64 = match unit.to_ascii_lowercase().as_str() {
        "b" | "byte" | "bytes" => 1.0,
        "kib" | "k" => 1024.0,
        "mib" | "m" => 1024f64.powi(2),
        "gib" | "g" => 1024f64.powi(3),
        "tib" | "t" => 1024f64.powi(4),
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        _ => return Err(format!("unknown unit {unit:?}")),
    };
    let bytes = (value * scale).floor();
    if bytes >= u64::MAX as f64 {
        return Err("more bytes than a u64 holds".to_owned());
    }
    Ok(Budget::Bytes(bytes as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn valid_budgets() {
        let ok = [
            ("512 MiB", Budget::Bytes(512 * 1024 * 1024)),
            ("1.5GiB", Budget::Bytes(1_610_612_736)),
            (" 64 kib ", Budget::Bytes(65_536)),
            ("2G", Budget::Bytes(2 << 30)),
            ("3 MB", Budget::Bytes(3_000_000)),
            ("1.5 kB", Budget::Bytes(1_500)),
            ("1000 B", Budget::Bytes(1_000)),
            ("7 bytes", Budget::Bytes(7)),
            ("0.5 B", Budget::Bytes(0)),
            ("1 TiB", Budget::Bytes(1 << 40)),
            ("0.4", Budget::Fraction(0.4)),
            ("1", Budget::Fraction(1.0)),
            ("40%", Budget::Fraction(0.4)),
            ("12.5 %", Budget::Fraction(0.125)),
            ("100%", Budget::Fraction(1.0)),
        ];
        for (s, want) in ok {
            assert_eq!(parse(s), Ok(want), "{s:?}");
        }
    }

    #[test]
    fn invalid_budgets() {
        let bad = [
            ("", "no number"),
            ("MiB", "no number"),
            ("512", "in (0, 1]"),
            ("0", "in (0, 1]"),
            ("1.5", "in (0, 1]"),
            ("0%", "(0, 100]"),
            ("150%", "(0, 100]"),
            ("-1 MiB", "no number"),
            ("12 parsecs", "unknown unit \"parsecs\""),
            ("1..2 MiB", "no number"),
            ("99999999999999999999 TiB", "u64"),
        ];
        for (s, why) in bad {
            let err = parse(s).unwrap_err();
            assert!(err.contains(why), "{s:?}: {err}");
        }
    }
}
