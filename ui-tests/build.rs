//! Generates the random straight-line programs of the property test (`tests/prop.rs`).
//!
//! A proc macro needs its input at compile time, so the programs are drawn here, with
//! proptest's strategies and a fixed seed (`CKPT_PROP_SEED` draws another set), and
//! written to `$OUT_DIR/programs.rs` twice each: plain, and under `#[ckpt::checkpointed]`
//! with a random `segments = N` or random `ckpt::cut!()` markers. The test then compares
//! the two on random inputs. Each program is a chain of `let` statements over tensor ops
//! (unary ops, products with weight matrices captured from a module parameter, scalar
//! products, dropout with `train`, sums and products of two earlier values), with names
//! drawn from a small pool so that `let` shadowing is frequent and skip connections cross
//! cuts, sometimes tuple patterns, and layer loops over the module's `layers` (a `for`
//! over `iter()`, `enumerate()` or an index range, with one or two loop-carried `let mut`
//! values and an earlier value read inside, or a `fold`): under `segments = N` their
//! iterations are stages cut at run time, under markers they run whole.

use std::fmt::Write;

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

const PROGRAMS: usize = 48;
const NAMES: [&str; 5] = ["a", "b", "c", "d", "e"];

/// One statement's random choices; operands are resolved modulo what is defined.
#[derive(Debug, Clone)]
struct RawStmt {
    target: usize,
    op: u8,
    lhs: u32,
    rhs: u32,
    tuple: bool,
    /// 0..=4: a layer loop of that form instead of a `let` (about one statement in six).
    looped: Option<u8>,
}

#[derive(Debug, Clone)]
struct RawProgram {
    stmts: Vec<RawStmt>,
    segments: u32,
    cuts: Option<Vec<u32>>,
    outputs: (u32, u32),
}

fn raw_program() -> impl Strategy<Value = RawProgram> {
    let stmt = (
        0..NAMES.len(),
        0u8..10,
        any::<u32>(),
        any::<u32>(),
        prop::bool::weighted(0.15),
        prop::option::weighted(0.17, 0u8..5),
    )
        .prop_map(|(target, op, lhs, rhs, tuple, looped)| RawStmt {
            target,
            op,
            lhs,
            rhs,
            tuple,
            looped,
        });
    (
        vec(stmt, 2..14),
        any::<u32>(),
        prop::option::weighted(0.3, vec(any::<u32>(), 1..4)),
        (any::<u32>(), any::<u32>()),
    )
        .prop_map(|(stmts, segments, cuts, outputs)| RawProgram {
            stmts,
            segments,
            cuts,
            outputs,
        })
}

/// A tensor operand: `x0` is a `&Tensor` parameter, the rest are owned `Tensor`s.
fn operand(name: &str) -> String {
    if name == "x0" {
        "x0".to_owned()
    } else {
        format!("&{name}")
    }
}

fn expr(op: u8, lhs: &str, rhs: &str) -> String {
    let (l, r) = (operand(lhs), operand(rhs));
    match op {
        0 => format!("{lhs}.tanh()"),
        1 => format!("{lhs}.sigmoid()"),
        2 => format!("{lhs}.relu()"),
        3 => format!("({l} * k)"),
        4 => format!("{lhs}.dropout(0.3, train)"),
        5 => format!("{lhs}.matmul(&w.w0)"),
        6 => format!("{lhs}.matmul(&w.w1).tanh()"),
        7 => format!("({l} + {r})"),
        8 => format!("({l} * {r})"),
        _ => format!("({l} - {r}).sin()"),
    }
}

/// Renders one program (body only) and its number of statements.
fn render(p: &RawProgram) -> (String, usize) {
    let mut defined: Vec<String> = vec!["x0".into(), "x1".into()];
    let mut lines = Vec::new();
    for s in &p.stmts {
        let pick = |i: u32, defined: &[String]| defined[i as usize % defined.len()].clone();
        let (lhs, rhs) = (pick(s.lhs, &defined), pick(s.rhs, &defined));
        let target = NAMES[s.target];
        if let Some(form) = s.looped {
            render_loop(form, s, &lhs, &rhs, &mut lines);
            let second = NAMES[(s.target + 1) % NAMES.len()];
            for n in std::iter::once(target).chain((form == 2).then_some(second)) {
                if !defined.iter().any(|d| d == n) {
                    defined.push(n.to_owned());
                }
            }
            continue;
        }
        if s.tuple {
            let other = NAMES[(s.target + 1) % NAMES.len()];
            lines.push(format!(
                "let ({target}, {other}) = ({}, {});",
                expr(s.op, &lhs, &rhs),
                expr(s.op.wrapping_add(3) % 10, &rhs, &lhs)
            ));
            for n in [target, other] {
                if !defined.iter().any(|d| d == n) {
                    defined.push(n.to_owned());
                }
            }
        } else {
            lines.push(format!("let {target} = {};", expr(s.op, &lhs, &rhs)));
            if !defined.iter().any(|d| d == target) {
                defined.push(target.to_owned());
            }
        }
    }
    let (o1, o2) = (
        defined[p.outputs.0 as usize % defined.len()].clone(),
        defined[p.outputs.1 as usize % defined.len()].clone(),
    );
    lines.push(format!("({}.shallow_clone(), {}.shallow_clone())", o1, o2));
    let count = lines.len();
    (lines.join("\n    "), count)
}

/// A layer loop over `w.layers` (each `[D, D]`): `let mut` carried values, then the
/// loop; or a `fold`. `other` is an earlier value the body reads.
fn render_loop(form: u8, s: &RawStmt, init: &str, other: &str, lines: &mut Vec<String>) {
    let c = NAMES[s.target];
    let c2 = NAMES[(s.target + 1) % NAMES.len()];
    let other = operand(other);
    match form {
        0 => {
            lines.push(format!("let mut {c} = {};", expr(s.op, init, init)));
            lines.push(format!(
                "for wk in w.layers.iter() {{ {c} = ({c}.matmul(wk) + {other}).tanh(); }}"
            ));
        }
        1 => {
            lines.push(format!("let mut {c} = {};", expr(s.op, init, init)));
            lines.push(format!(
                "for (i, wk) in w.layers.iter().enumerate() {{ {c} = {c}.matmul(wk).sigmoid() * ((i + 1) as f64); }}"
            ));
        }
        2 => {
            lines.push(format!("let mut {c} = {};", expr(s.op, init, init)));
            lines.push(format!("let mut {c2} = {c}.tanh();"));
            lines.push(format!(
                "for i in 0..w.layers.len() {{ {c} = (&{c} + {c}.matmul(&w.layers[i]).relu()) * 0.5; {c2} = &{c2} + &{c}; }}"
            ));
        }
        3 => {
            lines.push(format!("let mut {c} = {};", expr(s.op, init, init)));
            lines.push(format!(
                "for wk in &w.layers {{ {c} = {c}.matmul(wk).dropout(0.2, train) * k; }}"
            ));
        }
        _ => lines.push(format!(
            "let {c} = w.layers.iter().fold({}, |h, wk| (h.matmul(wk) + {other}).tanh());",
            expr(s.op, init, init)
        )),
    }
}

/// libtorch's directory, from the `ckpt` facade (`links = "ckpt"`): an rpath for this
/// package's test binaries, and `CKPT_LIBTORCH_LIB` for the trybuild harness, which runs
/// the pass cases with it on the loader path.
fn libtorch_rpath() {
    if let Ok(lib) = std::env::var("DEP_CKPT_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
        println!("cargo:rustc-env=CKPT_LIBTORCH_LIB={lib}");
    }
}

fn main() {
    libtorch_rpath();
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=CKPT_PROP_SEED");
    let seed: u64 = std::env::var("CKPT_PROP_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20_261_129);
    let mut seed_bytes = [0u8; 32];
    seed_bytes[..8].copy_from_slice(&seed.to_le_bytes());
    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        TestRng::from_seed(RngAlgorithm::ChaCha, &seed_bytes),
    );
    let strategy = raw_program();

    let mut out = String::new();
    writeln!(
        out,
        "// Generated by build.rs from seed {seed}; do not edit."
    )
    .unwrap();
    let mut table = Vec::new();
    for i in 0..PROGRAMS {
        let raw = strategy.new_tree(&mut runner).expect("a program").current();
        let (body, count) = render(&raw);
        // `count` statements including the tail; cuts go between statements.
        let (attr, body) = match &raw.cuts {
            Some(cuts) => {
                let mut at: Vec<usize> =
                    cuts.iter().map(|c| 1 + *c as usize % (count - 1)).collect();
                at.sort();
                at.dedup();
                let mut lines: Vec<&str> = body.split("\n    ").collect();
                for (k, pos) in at.iter().enumerate() {
                    lines.insert(pos + k, "ckpt::cut!();");
                }
                ("#[ckpt::checkpointed]".to_owned(), lines.join("\n    "))
            }
            None => {
                let segments = 2 + raw.segments as usize % (count - 1);
                (
                    format!("#[ckpt::checkpointed(segments = {segments})]"),
                    body,
                )
            }
        };
        let sig = "(w: &Weights, x0: &Tensor, x1: Tensor, k: f64, train: bool) -> (Tensor, Tensor)";
        let source = format!("{attr}\nfn p{i}{sig} {{\n    {body}\n}}");
        writeln!(
            out,
            "#[allow(unused_variables, unused_parens, unused_mut, unused_assignments, deprecated, clippy::all)]\n{attr}\nfn p{i}_ckpt{sig} {{\n    {body}\n}}\n\
             #[allow(unused_variables, unused_parens, unused_mut, unused_assignments, clippy::all)]\nfn p{i}_plain{sig} {{\n    {body}\n}}\n"
        )
        .unwrap();
        table.push(format!(
            "    Program {{ ckpt: p{i}_ckpt, plain: p{i}_plain, source: {source:?} }},"
        ));
    }
    writeln!(
        out,
        "const PROGRAMS: &[Program] = &[\n{}\n];",
        table.join("\n")
    )
    .unwrap();
    let path =
        std::path::Path::new(&std::env::var("OUT_DIR").expect("OUT_DIR")).join("programs.rs");
    std::fs::write(path, out).expect("write programs.rs");
}
