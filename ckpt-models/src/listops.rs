//! ListOps: nested list operations over digits, generated from a seed.
//!
//! The task of Nangia & Bowman, "ListOps: A Diagnostic Dataset for Latent Tree
//! Learning" (NAACL SRW 2018), in the form Long Range Arena uses it (Tay et al. 2020,
//! `lra_benchmarks/data/listops.py`): an expression such as
//! `[MAX 2 9 [MIN 4 7 ] 0 ]` evaluates to a digit, the label (10 classes).
//!
//! The generator follows LRA's `generate_tree` step by step: a node at `depth`
//! (the root is at depth 1) is a digit with probability 0.75, or always when
//! `depth == max_depth`; otherwise it is an operator with `2..=max_args` arguments
//! (drawn first), each a node at `depth + 1`, then the operator, uniform over `MAX`,
//! `MIN`, `MED` (median of the arguments, rounded down: `int(np.median(..))`) and `SM`
//! (sum modulo 10). An expression's length counts one token per digit and two per
//! operator (its name and its closing `]`), and it is kept when
//! `min_length < length < max_length` (strict, as LRA). Duplicates are dropped (LRA
//! keeps a set), so the train and test splits never share an expression.
//!
//! Tokens are LRA's after its tokenizer: the operator names, the digits and `]`; the
//! parentheses of LRA's printed trees carry no information and are not emitted.
//! Randomness comes from ChaCha8 seeded with the seed, so a seed gives the same data on
//! every machine.

use std::collections::HashSet;
use std::fmt;

use anyhow::{Result, bail, ensure};
use rand::Rng;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// Probability that a node above the depth limit is a digit (LRA's `VALUE_P` is the
/// probability of the other branch: an operator when `random() <= 0.25`).
const VALUE_P: f64 = 0.25;

/// The vocabulary: padding (id 0, `data::PAD`), the four operators, `]`, the ten
/// digits. Ids are indices.
pub const VOCAB: [&str; 16] = [
    "<pad>", "[MAX", "[MIN", "[MED", "[SM", "]", "0", "1", "2", "3", "4", "5", "6", "7", "8", "9",
];
const END: i64 = 5;
const DIGIT0: i64 = 6;

/// One of ListOps' four operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// Largest argument.
    Max,
    /// Smallest argument.
    Min,
    /// Median, rounded down for an even number of arguments.
    Med,
    /// Sum modulo 10.
    Sm,
}

impl Op {
    const ALL: [Op; 4] = [Op::Min, Op::Max, Op::Med, Op::Sm]; // LRA's `OPERATORS` order

    fn token(self) -> i64 {
        match self {
            Op::Max => 1,
            Op::Min => 2,
            Op::Med => 3,
            Op::Sm => 4,
        }
    }

    fn apply(self, args: &[u8]) -> u8 {
        match self {
            Op::Max => *args.iter().max().expect("an operator has arguments"),
            Op::Min => *args.iter().min().expect("an operator has arguments"),
            Op::Med => {
                let mut v = args.to_vec();
                v.sort_unstable();
                let n = v.len();
                if n % 2 == 1 {
                    v[n / 2]
                } else {
                    (v[n / 2 - 1] + v[n / 2]) / 2
                }
            }
            Op::Sm => (args.iter().map(|&a| u32::from(a)).sum::<u32>() % 10) as u8,
        }
    }
}

/// An expression tree.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Expr {
    /// A digit 0..=9.
    Digit(u8),
    /// An operator applied to its arguments.
    Apply(Op, Vec<Expr>),
}

impl Expr {
    /// The value of the expression, a digit (the class label).
    pub fn value(&self) -> u8 {
        match self {
            Expr::Digit(d) => *d,
            Expr::Apply(op, args) => {
                let vals: Vec<u8> = args.iter().map(Expr::value).collect();
                op.apply(&vals)
            }
        }
    }

    /// Token ids (indices into [`VOCAB`]); as many as [`Expr::token_len`].
    pub fn tokens(&self) -> Vec<i64> {
        let mut out = Vec::new();
        self.push_tokens(&mut out);
        out
    }

    fn push_tokens(&self, out: &mut Vec<i64>) {
        match self {
            Expr::Digit(d) => out.push(DIGIT0 + i64::from(*d)),
            Expr::Apply(op, args) => {
                out.push(op.token());
                args.iter().for_each(|a| a.push_tokens(out));
                out.push(END);
            }
        }
    }

    /// Length in tokens, as LRA counts it: 1 per digit, 2 per operator.
    pub fn token_len(&self) -> usize {
        match self {
            Expr::Digit(_) => 1,
            Expr::Apply(_, args) => 2 + args.iter().map(Expr::token_len).sum::<usize>(),
        }
    }
}

impl fmt::Display for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let words: Vec<&str> = self.tokens().iter().map(|&t| VOCAB[t as usize]).collect();
        f.write_str(&words.join(" "))
    }
}

/// Parses the token form (`[MAX 2 9 [MIN 4 7 ] 0 ]`, tokens separated by spaces);
/// the tests write expressions this way.
#[cfg(test)]
pub fn parse(text: &str) -> Result<Expr> {
    fn node(toks: &[&str], pos: &mut usize) -> Result<Expr> {
        let Some(&tok) = toks.get(*pos) else {
            bail!("unexpected end of expression")
        };
        *pos += 1;
        let op = match tok {
            "[MAX" => Op::Max,
            "[MIN" => Op::Min,
            "[MED" => Op::Med,
            "[SM" => Op::Sm,
            d if d.len() == 1 && d.as_bytes()[0].is_ascii_digit() => {
                return Ok(Expr::Digit(d.as_bytes()[0] - b'0'));
            }
            other => bail!("unexpected token `{other}`"),
        };
        let mut args = Vec::new();
        loop {
            match toks.get(*pos) {
                Some(&"]") => {
                    *pos += 1;
                    break;
                }
                None => bail!("missing `]`"),
                Some(_) => args.push(node(toks, pos)?),
            }
        }
        ensure!(!args.is_empty(), "an operator needs arguments");
        Ok(Expr::Apply(op, args))
    }
    let toks: Vec<&str> = text.split_whitespace().collect();
    let mut pos = 0;
    let e = node(&toks, &mut pos)?;
    ensure!(pos == toks.len(), "trailing tokens after the expression");
    Ok(e)
}

/// The generator's settings (LRA's flags of the same names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ListOpsConfig {
    /// Depth at which a node is always a digit; the root is at depth 1.
    pub max_depth: usize,
    /// Most arguments of one operator (at least 2).
    pub max_args: usize,
    /// Kept expressions are longer than this (tokens).
    pub min_length: usize,
    /// Kept expressions are shorter than this (tokens).
    pub max_length: usize,
}

/// One random tree, as LRA's `generate_tree(depth, max_depth, max_args)`.
fn generate_tree(rng: &mut ChaCha8Rng, depth: usize, cfg: &ListOpsConfig) -> Expr {
    let r = if depth < cfg.max_depth {
        rng.r#gen::<f64>()
    } else {
        1.0
    };
    if r > VALUE_P {
        return Expr::Digit(rng.gen_range(0..10u8));
    }
    let n = rng.gen_range(2..=cfg.max_args);
    let args = (0..n).map(|_| generate_tree(rng, depth + 1, cfg)).collect();
    let op = Op::ALL[rng.gen_range(0..Op::ALL.len())];
    Expr::Apply(op, args)
}

/// `count` distinct expressions with lengths in `(min_length, max_length)`, the same for
/// the same `seed` and settings.
///
/// # Errors
///
/// When the settings are out of range, or when `count` distinct expressions are not
/// found within a bounded number of draws (the length window is too narrow or too far
/// from what `max_depth` / `max_args` produce).
pub fn generate(cfg: &ListOpsConfig, count: usize, seed: u64) -> Result<Vec<Expr>> {
    ensure!(cfg.max_depth >= 1, "--listops-max-depth must be at least 1");
    ensure!(cfg.max_args >= 2, "--listops-max-args must be at least 2");
    ensure!(
        cfg.min_length + 1 < cfg.max_length,
        "ListOps length window ({}, {}) is empty: lengths must satisfy min < length < max",
        cfg.min_length,
        cfg.max_length
    );
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut seen = HashSet::with_capacity(count);
    let mut out = Vec::with_capacity(count);
    let max_draws = 10_000 * count.max(100);
    let mut draws = 0usize;
    while out.len() < count {
        if draws == max_draws {
            bail!(
                "found only {} of {count} ListOps expressions with {} < length < {} in {draws} \
                 draws (max depth {}, max args {}): widen the length window",
                out.len(),
                cfg.min_length,
                cfg.max_length,
                cfg.max_depth,
                cfg.max_args
            );
        }
        draws += 1;
        let tree = generate_tree(&mut rng, 1, cfg);
        let len = tree.token_len();
        if len > cfg.min_length && len < cfg.max_length && seen.insert(tree.clone()) {
            out.push(tree);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> ListOpsConfig {
        ListOpsConfig {
            max_depth: 10,
            max_args: 10,
            min_length: 16,
            max_length: 128,
        }
    }

    #[test]
    fn evaluates_hand_written_expressions() {
        let cases = [
            ("7", 7),
            ("[MAX 2 9 4 ]", 9),
            ("[MIN 4 7 1 8 ]", 1),
            ("[MED 3 1 2 ]", 2),
            ("[MED 1 2 ]", 1),     // int(np.median([1, 2])) = int(1.5) = 1
            ("[MED 8 1 9 4 ]", 6), // median of 1 4 8 9 = 6.0
            ("[SM 5 6 7 ]", 8),    // 18 mod 10
            ("[MAX 2 9 [MIN 4 7 ] 0 ]", 9),
            ("[SM [MAX 3 8 ] [MED 1 5 9 ] 9 ]", 2), // 8 + 5 + 9 = 22
            ("[MIN [SM 9 9 ] [MAX 0 [MED 7 7 7 ] ] ]", 7), // min(8, 7)
        ];
        for (text, want) in cases {
            let e = parse(text).unwrap();
            assert_eq!(e.value(), want, "{text}");
            assert_eq!(e.to_string(), text, "round trip");
            assert_eq!(e.token_len(), e.tokens().len());
        }
    }

    #[test]
    fn parse_rejects_malformed_input() {
        for bad in ["", "[MAX 1 2", "[MAX ]", "[FOO 1 ]", "12", "1 2"] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn same_seed_same_data_other_seed_other_data() {
        let a = generate(&cfg(), 50, 7).unwrap();
        let b = generate(&cfg(), 50, 7).unwrap();
        let c = generate(&cfg(), 50, 8).unwrap();
        assert_eq!(a, b);
        assert_ne!(a, c);
        // A longer run starts with the shorter one.
        let d = generate(&cfg(), 80, 7).unwrap();
        assert_eq!(&d[..50], &a[..]);
    }

    #[test]
    fn respects_the_definition() {
        let c = cfg();
        let data = generate(&c, 300, 1).unwrap();
        let distinct: HashSet<_> = data.iter().collect();
        assert_eq!(distinct.len(), data.len(), "no duplicates");
        let mut labels = HashSet::new();
        for e in &data {
            assert!(e.token_len() > c.min_length && e.token_len() < c.max_length);
            check_limits(e, 1, &c);
            labels.insert(e.value());
        }
        assert!(
            labels.len() >= 8,
            "labels spread over the digits: {labels:?}"
        );
    }

    fn check_limits(e: &Expr, depth: usize, c: &ListOpsConfig) {
        if let Expr::Apply(_, args) = e {
            assert!(depth < c.max_depth, "operator at the depth limit");
            assert!((2..=c.max_args).contains(&args.len()));
            args.iter().for_each(|a| check_limits(a, depth + 1, c));
        }
    }

    #[test]
    fn impossible_window_is_an_error() {
        let c = ListOpsConfig {
            max_depth: 2,
            max_args: 2,
            min_length: 50,
            max_length: 60,
        };
        let err = generate(&c, 3, 0).unwrap_err().to_string();
        assert!(err.contains("widen the length window"), "{err}");
        let empty = ListOpsConfig {
            min_length: 10,
            max_length: 11,
            ..cfg()
        };
        assert!(generate(&empty, 1, 0).is_err());
    }
}
