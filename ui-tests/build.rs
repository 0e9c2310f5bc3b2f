//! Generates the random programs of the property test (`tests/prop.rs`): 1,000 by default
//! (`CKPT_PROP_PROGRAMS` draws another number).
//!
//! A proc macro needs its input at compile time, so the programs are drawn here, with
//! proptest's strategies and a fixed seed (`CKPT_PROP_SEED` draws another set), and
//! written to `$OUT_DIR/programs.rs` twice each: plain, and under `#[ckpt::checkpointed]`
//! with a random `segments = N`, random `ckpt::cut!()` markers or `segments = auto`. The
//! test then compares the two on random inputs. Each program is a chain of statements
//! over tensor ops (unary ops, products with weight matrices captured from a module
//! parameter, scalar products, dropout with `train`, sums and products of two earlier
//! values), with names drawn from a small pool so that `let` shadowing is frequent and
//! several values and skip connections cross cuts: `let`s of expressions, tuple and
//! struct patterns, nested blocks, `if` and `match`, closures used inside a block, `?`
//! (the programs return `Result`), and layer loops over the module's `layers` (a `for`
//! over `iter()`, `enumerate()`, an index range or `&Vec`, with one or two loop-carried
//! `let mut` values and an earlier value read inside, or a `fold`): under `segments = N`
//! their iterations are stages cut at run time, under markers they run whole. A quarter
//! of the programs mark one top-level `let` `#[ckpt::keep]` (run once, never recomputed,
//! under every layout: markers, `segments = N`, and chains cut at run time).

use std::fmt::Write;

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

/// Programs drawn by default; `CKPT_PROP_PROGRAMS` draws another number.
const PROGRAMS: usize = 1_000;
const NAMES: [&str; 5] = ["a", "b", "c", "d", "e"];

/// One statement's random choices; operands are resolved modulo what is defined.
#[derive(Debug, Clone)]
struct RawStmt {
    target: usize,
    /// The statement's form (see [`render_stmt`]).
    kind: u8,
    op: u8,
    op2: u8,
    lhs: u32,
    rhs: u32,
}

#[derive(Debug, Clone)]
struct RawProgram {
    stmts: Vec<RawStmt>,
    segments: u32,
    /// `Some`: cut markers instead of `segments`.
    cuts: Option<Vec<u32>>,
    /// `segments = auto` instead of a count (when no markers).
    auto: bool,
    /// `Some`: mark one top-level `let` (drawn modulo the statements) `#[ckpt::keep]`.
    keep: Option<u32>,
    outputs: (u32, u32),
}

fn raw_program() -> impl Strategy<Value = RawProgram> {
    let stmt = (
        0..NAMES.len(),
        0u8..20,
        0u8..10,
        0u8..10,
        any::<u32>(),
        any::<u32>(),
    )
        .prop_map(|(target, kind, op, op2, lhs, rhs)| RawStmt {
            target,
            kind,
            op,
            op2,
            lhs,
            rhs,
        });
    (
        vec(stmt, 2..14),
        any::<u32>(),
        prop::option::weighted(0.3, vec(any::<u32>(), 1..4)),
        prop::bool::weighted(0.08),
        prop::option::weighted(0.25, any::<u32>()),
        (any::<u32>(), any::<u32>()),
    )
        .prop_map(|(stmts, segments, cuts, auto, keep, outputs)| RawProgram {
            stmts,
            segments,
            cuts,
            auto,
            keep,
            outputs,
        })
}

/// `body` with the top-level `let` number `keep` (modulo the statements but the last)
/// marked `#[ckpt::keep]`, when that leaves a statement to checkpoint: with at least 4
/// statements (`segments = N` then has a checkpointed group of 2 or more, or two groups;
/// a chain cut at run time has 2 more), and with markers (`at`) when the statement is in
/// the inline last group or another statement is before the last marker.
fn keep_one(body: &str, count: usize, keep: Option<u32>, at: Option<&[usize]>) -> String {
    let mut lines: Vec<String> = body.split("\n    ").map(str::to_owned).collect();
    let Some(keep) = keep.filter(|_| count >= 4 && lines.len() == count) else {
        return body.to_owned();
    };
    let i = keep as usize % (count - 1);
    let last_cut = at.and_then(|a| a.last().copied()).unwrap_or(count);
    let leaves_one = at.is_none() || i >= last_cut || last_cut >= 2;
    if leaves_one && lines[i].starts_with("let ") {
        lines[i] = format!("#[ckpt::keep] {}", lines[i]);
    }
    lines.join("\n    ")
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

/// Renders one program (body only), its number of statements, and whether it has a
/// layer loop.
fn render(p: &RawProgram) -> (String, usize, bool) {
    let mut defined: Vec<String> = vec!["x0".into(), "x1".into()];
    let mut lines = Vec::new();
    let looped = p.stmts.iter().any(|s| s.kind >= 17);
    // With `segments = auto`, or a layer loop and `segments = N`, the cuts are chosen at
    // run time and `?` belongs in the last statement only.
    let question_marks = p.cuts.is_some() || !(looped || p.auto);
    for s in &p.stmts {
        let pick = |i: u32, defined: &[String]| defined[i as usize % defined.len()].clone();
        let (lhs, rhs) = (pick(s.lhs, &defined), pick(s.rhs, &defined));
        for n in render_stmt(s, &lhs, &rhs, question_marks, &mut lines) {
            if !defined.iter().any(|d| d == n) {
                defined.push(n.to_owned());
            }
        }
    }
    let (o1, o2) = (
        defined[p.outputs.0 as usize % defined.len()].clone(),
        defined[p.outputs.1 as usize % defined.len()].clone(),
    );
    lines.push(format!(
        "Ok(({}.shallow_clone(), {}.shallow_clone()))",
        o1, o2
    ));
    let count = lines.len();
    (lines.join("\n    "), count, looped)
}

/// One statement (one line each; a layer loop may add a `let mut` line first), by kind:
/// a `let` of an expression, a tuple pattern, a nested block, `if`, `match`, a closure
/// used in a block, a struct pattern, `?`, or a layer loop. Returns the names it binds.
fn render_stmt(
    s: &RawStmt,
    lhs: &str,
    rhs: &str,
    question_marks: bool,
    lines: &mut Vec<String>,
) -> Vec<&'static str> {
    let t = NAMES[s.target];
    let u = NAMES[(s.target + 1) % NAMES.len()];
    let (e1, e2) = (expr(s.op, lhs, rhs), expr(s.op2, rhs, lhs));
    match s.kind {
        0..=5 => {
            lines.push(format!("let {t} = {e1};"));
            vec![t]
        }
        6 => {
            lines.push(format!("let ({t}, {u}) = ({e1}, {e2});"));
            vec![t, u]
        }
        7 => {
            let inner = expr(s.op2, "v", rhs);
            lines.push(format!("let {t} = {{ let v = {e1}; {inner} }};"));
            vec![t]
        }
        8 => {
            lines.push(format!("let {t} = if k > 0.0 {{ {e1} }} else {{ {e2} }};"));
            vec![t]
        }
        9 => {
            lines.push(format!(
                "let {t} = match train {{ true => {e1}, false => {e2} }};"
            ));
            vec![t]
        }
        10 => {
            let l = operand(lhs);
            lines.push(format!(
                "let {t} = {{ let f = |v: &Tensor| v.tanh() * k; f({l}) + {e2} }};"
            ));
            vec![t]
        }
        11 => {
            lines.push(format!(
                "let Pair {{ a: {t}, b: {u} }} = Pair {{ a: {e1}, b: {e2} }};"
            ));
            vec![t, u]
        }
        12 | 13 if question_marks => {
            lines.push(format!("let {t} = {lhs}.f_tanh()?.f_mul_scalar(k)?;"));
            vec![t]
        }
        12..=16 => {
            lines.push(format!("let {t} = {e1};"));
            vec![t]
        }
        form => {
            render_loop(form - 17, s, lhs, rhs, lines);
            // The two-value loop (form 1 with an even operation) also binds `u`.
            if form == 18 && s.op.is_multiple_of(2) {
                vec![t, u]
            } else {
                vec![t]
            }
        }
    }
}

/// A layer loop over `w.layers` (each `[D, D]`): `let mut` carried values, then the
/// loop; or a `fold`. `other` is an earlier value the body reads. `form` 0 to 2, with the
/// operation's parity picking among 5 forms.
fn render_loop(form: u8, s: &RawStmt, init: &str, other: &str, lines: &mut Vec<String>) {
    let form = match (form, s.op % 2) {
        (0, 0) => 0,
        (0, _) => 1,
        (1, 0) => 2,
        (1, _) => 3,
        _ => 4,
    };
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
    println!("cargo:rerun-if-env-changed=CKPT_PROP_PROGRAMS");
    let programs: usize = std::env::var("CKPT_PROP_PROGRAMS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(PROGRAMS);
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
    for i in 0..programs {
        let raw = strategy.new_tree(&mut runner).expect("a program").current();
        let (body, count, _) = render(&raw);
        // `count` statements including the tail; cuts go between statements.
        let at: Option<Vec<usize>> = raw.cuts.as_ref().map(|cuts| {
            let mut at: Vec<usize> = cuts.iter().map(|c| 1 + *c as usize % (count - 1)).collect();
            at.sort();
            at.dedup();
            at
        });
        let body = keep_one(&body, count, raw.keep, at.as_deref());
        let (attr, body) = match &at {
            Some(at) => {
                let mut lines: Vec<&str> = body.split("\n    ").collect();
                for (k, pos) in at.iter().enumerate() {
                    lines.insert(pos + k, "ckpt::cut!();");
                }
                ("#[ckpt::checkpointed]".to_owned(), lines.join("\n    "))
            }
            None if raw.auto => ("#[ckpt::checkpointed(segments = auto)]".to_owned(), body),
            None => {
                let segments = 2 + raw.segments as usize % (count - 1);
                (
                    format!("#[ckpt::checkpointed(segments = {segments})]"),
                    body,
                )
            }
        };
        let sig = "(w: &Weights, x0: &Tensor, x1: Tensor, k: f64, train: bool) -> Result<(Tensor, Tensor), TchError>";
        let source = format!("{attr}\nfn p{i}{sig} {{\n    {body}\n}}");
        // The plain copy without the marks, which only the macro reads.
        let plain = body.replace("#[ckpt::keep] ", "");
        writeln!(
            out,
            "#[allow(unused_variables, unused_parens, unused_mut, unused_assignments, unused_braces, non_shorthand_field_patterns, deprecated, clippy::all)]\n{attr}\nfn p{i}_ckpt{sig} {{\n    {body}\n}}\n\
             #[allow(unused_variables, unused_parens, unused_mut, unused_assignments, unused_braces, non_shorthand_field_patterns, clippy::all)]\nfn p{i}_plain{sig} {{\n    {plain}\n}}\n"
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
