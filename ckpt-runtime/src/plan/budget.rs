//! [`Budget`]: a memory budget in bytes or as a fraction of the plain run's peak, and
//! its parsing from strings such as `"512 MiB"`, `"1.5GiB"`, `"0.4"` or `"40%"`.

use std::fmt;
use std::str::FromStr;

use crate::CkptError;

/// A memory budget for the planner: the predicted peak (bytes above the baseline, see
/// the [cost model](super)) must not exceed it.
///
/// Parsed from a string ([`str::parse`]; the grammar is the `ckpt-budget` crate's, which
/// the macros use for `budget = ".."` too):
///
/// - bytes with a unit: `"512 MiB"`, `"1.5GiB"`, `"64KiB"`, `"1000000 B"`; binary units
///   `KiB`, `MiB`, `GiB`, `TiB` (and the short `K`, `M`, `G`, `T`, also binary), decimal
///   units `kB`, `MB`, `GB`, `TB`, and `B` / `bytes`; case does not matter; fractional
///   amounts are rounded down to whole bytes;
/// - a fraction of the plain (unchecked) run's predicted peak: a bare number in `(0, 1]`
///   (`"0.4"`) or a percentage in `(0, 100]` (`"40%"`).
///
/// ```
/// # extern crate ckpt_runtime as ckpt;
/// use ckpt::plan::Budget;
/// assert_eq!("512 MiB".parse::<Budget>().unwrap(), Budget::Bytes(512 << 20));
/// assert_eq!("1.5GiB".parse::<Budget>().unwrap(), Budget::Bytes(3 << 29));
/// assert_eq!("40%".parse::<Budget>().unwrap(), Budget::FractionOfPlain(0.4));
/// assert_eq!("0.4".parse::<Budget>().unwrap(), Budget::FractionOfPlain(0.4));
/// assert!("512".parse::<Budget>().is_err()); // bytes need a unit
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Budget {
    /// At most this many bytes.
    Bytes(u64),
    /// At most this fraction of the plain run's predicted peak (positive; `1.0` is the
    /// plain run itself). Rounded down to whole bytes.
    FractionOfPlain(f64),
}

impl Budget {
    /// The budget in bytes, for a chain whose plain run's predicted peak is
    /// `plain_peak_bytes`.
    ///
    /// # Errors
    ///
    /// [`CkptError::InvalidArgument`] for a fraction that is not positive and finite.
    pub fn bytes(&self, plain_peak_bytes: u64) -> Result<u64, CkptError> {
        match *self {
            Budget::Bytes(b) => Ok(b),
            Budget::FractionOfPlain(f) if f.is_finite() && f > 0.0 => {
                Ok((f * plain_peak_bytes as f64).floor() as u64)
            }
            Budget::FractionOfPlain(f) => Err(CkptError::InvalidArgument(format!(
                "budget fraction {f}: it must be positive and finite"
            ))),
        }
    }
}

impl fmt::Display for Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Budget::Bytes(b) => write!(f, "{} ({b} B)", super::human_bytes(b)),
            // Rounded to 1e-9 %: `"56%"` is 0.56, and 0.56 * 100 is 56.00000000000001.
            Budget::FractionOfPlain(x) => write!(
                f,
                "{}% of the plain run's peak",
                (x * 100.0 * 1e9).round() / 1e9
            ),
        }
    }
}

impl FromStr for Budget {
    type Err = CkptError;

    /// Parses `"512 MiB"`, `"1.5GiB"`, `"0.4"`, `"40%"` (see [`Budget`]).
    ///
    /// # Errors
    ///
    /// [`CkptError::InvalidArgument`] naming the problem: no number, an unknown unit, a
    /// bare number outside `(0, 1]`, a percentage outside `(0, 100]`, or a byte count
    /// past `u64::MAX`.
    fn from_str(s: &str) -> Result<Self, CkptError> {
        ckpt_budget::parse(s)
            .map(|b| match b {
                ckpt_budget::Budget::Bytes(n) => Budget::Bytes(n),
                ckpt_budget::Budget::Fraction(f) => Budget::FractionOfPlain(f),
            })
            .map_err(|why| {
                CkptError::InvalidArgument(format!(
                    "budget {s:?}: {why} (write bytes with a unit, \"512 MiB\", \"1.5GiB\", or a fraction of the plain run's peak, \"0.4\" or \"40%\")"
                ))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<Budget, CkptError> {
        s.parse()
    }

    #[test]
    fn bytes_with_units() {
        assert_eq!(parse("512 MiB").unwrap(), Budget::Bytes(512 * 1024 * 1024));
        assert_eq!(parse("1.5GiB").unwrap(), Budget::Bytes(1_610_612_736));
        assert_eq!(parse(" 64 kib ").unwrap(), Budget::Bytes(65_536));
        assert_eq!(parse("2G").unwrap(), Budget::Bytes(2 << 30));
        assert_eq!(parse("3 MB").unwrap(), Budget::Bytes(3_000_000));
        assert_eq!(parse("1.5 kB").unwrap(), Budget::Bytes(1_500));
        assert_eq!(parse("1000 B").unwrap(), Budget::Bytes(1_000));
        assert_eq!(parse("7 bytes").unwrap(), Budget::Bytes(7));
        assert_eq!(parse("0.5 B").unwrap(), Budget::Bytes(0));
        assert_eq!(parse("1 TiB").unwrap(), Budget::Bytes(1 << 40));
    }

    #[test]
    fn fractions() {
        assert_eq!(parse("0.4").unwrap(), Budget::FractionOfPlain(0.4));
        assert_eq!(parse("1").unwrap(), Budget::FractionOfPlain(1.0));
        assert_eq!(parse("40%").unwrap(), Budget::FractionOfPlain(0.4));
        assert_eq!(parse("12.5 %").unwrap(), Budget::FractionOfPlain(0.125));
        assert_eq!(parse("100%").unwrap(), Budget::FractionOfPlain(1.0));
        assert_eq!(Budget::FractionOfPlain(0.25).bytes(1000).unwrap(), 250);
        assert_eq!(Budget::FractionOfPlain(0.3333).bytes(3).unwrap(), 0);
        assert_eq!(Budget::Bytes(77).bytes(1000).unwrap(), 77);
    }

    #[test]
    fn rejects() {
        for s in [
            "",
            "MiB",
            "512",
            "0",
            "1.5",
            "0%",
            "150%",
            "-1 MiB",
            "12 parsecs",
            "1..2 MiB",
            "1e3 B",
            "99999999999999999999999 TiB",
        ] {
            let e = parse(s).unwrap_err();
            assert!(
                matches!(&e, CkptError::InvalidArgument(m) if m.contains(&format!("{s:?}"))),
                "{s:?}: {e}"
            );
        }
        for f in [0.0, -0.5, f64::NAN, f64::INFINITY] {
            assert!(matches!(
                Budget::FractionOfPlain(f).bytes(100),
                Err(CkptError::InvalidArgument(_))
            ));
        }
    }

    #[test]
    fn display() {
        assert_eq!(Budget::Bytes(3 << 20).to_string(), "3.00 MiB (3145728 B)");
        assert_eq!(
            Budget::FractionOfPlain(0.4).to_string(),
            "40% of the plain run's peak"
        );
    }
}
