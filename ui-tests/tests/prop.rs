//! Property test of `#[checkpointed]`: random programs of tensor ops with `let` shadowing
//! and layer loops with loop-carried values, cut at random (`segments = N`,
//! `ckpt::cut!()` markers, or `segments = auto`), a quarter of them with one statement
//! marked `#[ckpt::keep]`, give the same outputs (bit for bit on CPU) and the same
//! gradients (of the inputs and of the captured weights) as the same programs without
//! the attribute.
//!
//! Gradients are compared to within rounding (relative 1e-5 of the largest entry), not
//! bit for bit: when a value is used several times inside one segment and also outside
//! it, checkpointing sums its gradient contributions in another association
//! (`g_out + (g_in1 + g_in2)`, the segment's own backward summing first) than the plain
//! graph (`(g_out + g_in1) + g_in2`). That is inherent to recomputation (PyTorch's
//! checkpoint does the same); `tests/checkpointed.rs` checks bit-for-bit equality on
//! models where the association is the same.
//!
//! Why this shape: a proc macro needs its input as source at compile time, so the
//! programs cannot be drawn while the test runs. `build.rs` draws them with proptest's
//! strategies from a fixed seed and emits each twice, and every checkpointed copy goes
//! through the real macro, its real liveness analysis and the real runtime; an
//! interpreter that drove `run_segment` itself would test a re-implementation instead.
//! At run time proptest draws the program, the input shapes, the random seed (dropout
//! masks), `k` and `train`; `every_program_once` also runs each program, so none is left
//! out by sampling. `CKPT_PROP_SEED=<n> cargo test -p ckpt-ui-tests --test prop` builds
//! and checks another set of programs.

use std::sync::{Mutex, PoisonError};

use ckpt::ShallowClone;
use proptest::prelude::*;
use tch::{Device, Kind, TchError, Tensor};

/// The module whose weights the programs capture; layer loops run over `layers`.
#[derive(Debug, ShallowClone)]
struct Weights {
    w0: Tensor,
    w1: Tensor,
    layers: Vec<Tensor>,
}

/// What struct patterns in the programs destructure.
struct Pair {
    a: Tensor,
    b: Tensor,
}

type ProgramFn = fn(&Weights, &Tensor, Tensor, f64, bool) -> Result<(Tensor, Tensor), TchError>;

struct Program {
    ckpt: ProgramFn,
    plain: ProgramFn,
    source: &'static str,
}

include!(concat!(env!("OUT_DIR"), "/programs.rs"));

const D: i64 = 6;
/// Layers a program's layer loops run over.
const LAYERS: usize = 5;

struct Outcome {
    /// Checkpointed segments alive between forward and backward.
    segments: i64,
    outputs: [Tensor; 2],
    grads: Vec<Option<Tensor>>,
}

fn grad_of(t: &Tensor) -> Option<Tensor> {
    let g = t.grad();
    g.defined().then(|| g.copy())
}

/// Runs `f` on fresh leaves (same values every time), backpropagates a fixed weighting
/// of both outputs, and returns outputs and gradients.
fn outcome(f: ProgramFn, batch: i64, seed: i64, k: f64, train: bool) -> Outcome {
    tch::manual_seed(seed);
    let opts = (Kind::Float, Device::Cpu);
    let w = Weights {
        w0: (Tensor::randn([D, D], opts) * 0.5).set_requires_grad(true),
        w1: (Tensor::randn([D, D], opts) * 0.5).set_requires_grad(true),
        layers: (0..LAYERS)
            .map(|_| (Tensor::randn([D, D], opts) * 0.5).set_requires_grad(true))
            .collect(),
    };
    let x0 = Tensor::randn([batch, D], opts).set_requires_grad(true);
    let x1 = Tensor::randn([batch, D], opts).set_requires_grad(true);
    tch::manual_seed(seed + 1);
    let (o1, o2) = f(&w, &x0, x1.shallow_clone(), k, train).expect("the program succeeds");
    let segments = ckpt::live_segments();
    let weight = |o: &Tensor| {
        (Tensor::arange(o.numel() as i64, opts) + 1.0)
            .sin()
            .reshape(o.size())
    };
    let loss = (&o1 * weight(&o1)).sum(Kind::Float) + (&o2 * weight(&o2)).sum(Kind::Float) * 0.5;
    if loss.requires_grad() {
        loss.backward();
    }
    Outcome {
        segments,
        outputs: [o1.detach().copy(), o2.detach().copy()],
        grads: [&x0, &x1, &w.w0, &w.w1]
            .into_iter()
            .chain(&w.layers)
            .map(grad_of)
            .collect(),
    }
}

/// The RNG and the live-segment counter are process-wide: one check at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// Returns the number of segments the checkpointed run kept for backward.
fn check(index: usize, batch: i64, seed: i64, k: f64, train: bool) -> Result<i64, TestCaseError> {
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let p = &PROGRAMS[index];
    let plain = outcome(p.plain, batch, seed, k, train);
    let ckpt = outcome(p.ckpt, batch, seed, k, train);
    let context = || {
        format!(
            "program {index} (batch {batch}, seed {seed}, k {k}, train {train}):\n{}",
            p.source
        )
    };
    for (i, (a, b)) in plain.outputs.iter().zip(&ckpt.outputs).enumerate() {
        prop_assert!(a.equal(b), "output {} differs in {}", i, context());
    }
    let names: Vec<String> = ["x0", "x1", "w0", "w1"]
        .into_iter()
        .map(String::from)
        .chain((0..LAYERS).map(|i| format!("layers[{i}]")))
        .collect();
    for ((name, a), b) in names.iter().zip(&plain.grads).zip(&ckpt.grads) {
        match (a, b) {
            (Some(a), Some(b)) => {
                let scale = 1.0 + a.abs().max().double_value(&[]);
                let diff = (a - b).abs().max().double_value(&[]);
                prop_assert!(
                    diff <= 1e-5 * scale,
                    "gradient of {} differs by {} in {}",
                    name,
                    diff,
                    context()
                );
            }
            (None, None) => {}
            _ => prop_assert!(
                false,
                "gradient of {} defined in one run only, in {}",
                name,
                context()
            ),
        }
    }
    prop_assert_eq!(plain.segments, 0);
    prop_assert_eq!(ckpt::live_segments(), 0, "segments leaked in {}", context());
    Ok(ckpt.segments)
}

#[test]
fn every_program_once() {
    let mut fixed = 0;
    let mut checkpointed = 0;
    for (index, program) in PROGRAMS.iter().enumerate() {
        let segments = check(index, 3, index as i64, 0.7, true).unwrap_or_else(|e| panic!("{e}"));
        // `segments = auto` may rightly plan no checkpoint for these tiny tensors.
        if !program.source.contains("segments = auto") {
            fixed += 1;
            checkpointed += usize::from(segments > 0);
        }
    }
    // A segment whose results are all unused keeps nothing; most programs keep some.
    assert!(
        checkpointed * 3 >= fixed * 2,
        "only {checkpointed} of {fixed} programs with fixed cuts kept a segment for backward"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn checkpointed_programs_equal_plain_ones(
        index in 0..PROGRAMS.len(),
        batch in 1i64..5,
        seed in 0i64..1_000_000,
        k in -2.0f64..2.0,
        train in any::<bool>(),
    ) {
        check(index, batch, seed, k, train)?;
    }
}
