//! `budget = ".."` and `segments = auto`: the planner's objective, shared by
//! `#[checkpointed]` and `model!`. The budget string is parsed here, at compile time, with
//! the grammar of the `ckpt-budget` crate, which the runtime's `ckpt::plan::Budget`
//! (`FromStr`) uses too, so that a bad string is a compile error on the literal; the
//! expansion holds the parsed value.

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
    ckpt_budget::parse(s)
        .map(|b| match b {
            ckpt_budget::Budget::Bytes(n) => Objective::Bytes(n),
            ckpt_budget::Budget::Fraction(f) => Objective::Fraction(f),
        })
        .map_err(|why| {
            format!(
                "budget {s:?}: {why}; write bytes with a unit (`budget = \"512 MiB\"`, `\"1.5GiB\"`; units B, KiB, MiB, GiB, TiB, kB, MB, GB, TB) or a fraction of the plain run's predicted peak (`budget = \"40%\"` or `\"0.4\"`)"
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The grammar is `ckpt-budget`'s (tested there); here, the mapping and the message.
    #[test]
    fn maps_the_shared_grammar() {
        assert_eq!(parse("512 MiB"), Ok(Objective::Bytes(512 << 20)));
        assert_eq!(parse("40%"), Ok(Objective::Fraction(0.4)));
        let e = parse("12 parsecs").unwrap_err();
        assert!(
            e.starts_with(
                "budget \"12 parsecs\": unknown unit \"parsecs\"; write bytes with a unit"
            ),
            "{e}"
        );
    }
}
