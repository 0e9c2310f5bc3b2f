//! `budget = ".."` and `segments = auto`: the planner's objective, shared by
//! `#[checkpointed]` and `model!`. The budget string is parsed here, at compile time, with
//! the grammar of the runtime's `ckpt::plan::Budget` (`FromStr`), so that a bad string is
//! a compile error on the literal; the expansion holds the parsed value.

use proc_macro2::{Literal, TokenStream};
use quote::quote;

/// What the planner optimises.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Objective {
    /// `segments = auto`: the least predicted peak.
    MinPeak,
    /// `budget = "512 MiB"`.
    Bytes(u64),
    /// `budget = "40%"` or `"0.4"`: a fraction of the plain run's predicted peak.
    Fraction(f64),
}

impl Objective {
    /// The expression of `ckpt::plan::Objective` (usable in a `const` context).
    pub(crate) fn tokens(self) -> TokenStream {
        match self {
            Objective::MinPeak => quote!(::ckpt::plan::Objective::MinPeak),
            Objective::Bytes(b) => {
                let b = Literal::u64_suffixed(b);
                quote!(::ckpt::plan::Objective::Budget(::ckpt::plan::Budget::Bytes(#b)))
            }
            Objective::Fraction(f) => {
                let f = Literal::f64_suffixed(f);
                quote!(::ckpt::plan::Objective::Budget(
                    ::ckpt::plan::Budget::FractionOfPlain(#f)
                ))
            }
        }
    }

    /// How the docs describe it.
    pub(crate) fn describe(self) -> String {
        match self {
            Objective::MinPeak => "the least predicted peak memory (`segments = auto`)".into(),
            Objective::Bytes(b) => format!("the least recompute within a budget of {b} bytes"),
            Objective::Fraction(f) => format!(
                "the least recompute within a budget of {}% of the plain run's predicted peak",
                f * 100.0
            ),
        }
    }
}

/// Parses a budget string as `ckpt::plan::Budget::from_str` does: bytes with a unit
/// (`"512 MiB"`, `"1.5GiB"`, `"64 kB"`, `"1000 B"`), or a fraction of the plain run's
/// peak (`"0.4"`, `"40%"`). The error says what is wrong and what is valid.
pub(crate) fn parse(s: &str) -> Result<Objective, String> {
    let bad = |why: &str| {
        format!(
            "budget {s:?}: {why}; write bytes with a unit (`budget = \"512 MiB\"`, `\"1.5GiB\"`; units B, KiB, MiB, GiB, TiB, kB, MB, GB, TB) or a fraction of the plain run's predicted peak (`budget = \"40%\"` or `\"0.4\"`)"
        )
    };
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num.parse().map_err(|_| bad("no number"))?;
    let unit = unit.trim();
    if unit.is_empty() {
        return if value > 0.0 && value <= 1.0 {
            Ok(Objective::Fraction(value))
        } else {
            Err(bad(
                "a bare number is a fraction of the plain run's peak, in (0, 1]",
            ))
        };
    }
    if unit == "%" {
        return if value > 0.0 && value <= 100.0 {
            Ok(Objective::Fraction(value / 100.0))
        } else {
            Err(bad("a percentage must be in (0, 100]"))
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
        _ => return Err(bad(&format!("unknown unit {unit:?}"))),
    };
    let bytes = (value * scale).floor();
    if bytes >= u64::MAX as f64 {
        return Err(bad("more bytes than a u64 holds"));
    }
    Ok(Objective::Bytes(bytes as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cases of the runtime's `Budget` tests (`ckpt-runtime/src/plan/budget.rs`):
    /// the two parsers must agree.
    #[test]
    fn agrees_with_the_runtime_grammar() {
        let ok = [
            ("512 MiB", Objective::Bytes(512 * 1024 * 1024)),
            ("1.5GiB", Objective::Bytes(1_610_612_736)),
            (" 64 kib ", Objective::Bytes(65_536)),
            ("2G", Objective::Bytes(2 << 30)),
            ("3 MB", Objective::Bytes(3_000_000)),
            ("1.5 kB", Objective::Bytes(1_500)),
            ("1000 B", Objective::Bytes(1_000)),
            ("7 bytes", Objective::Bytes(7)),
            ("0.5 B", Objective::Bytes(0)),
            ("1 TiB", Objective::Bytes(1 << 40)),
            ("0.4", Objective::Fraction(0.4)),
            ("1", Objective::Fraction(1.0)),
            ("40%", Objective::Fraction(0.4)),
            ("12.5 %", Objective::Fraction(0.125)),
            ("100%", Objective::Fraction(1.0)),
        ];
        for (s, want) in ok {
            assert_eq!(parse(s), Ok(want), "{s:?}");
        }
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
            assert!(e.contains(&format!("{s:?}")), "{s:?}: {e}");
        }
    }
}
