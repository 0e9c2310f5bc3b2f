//! Adversarial tests of `#[ckpt::keep]` in functions whose cuts are chosen
//! at run time (`segments = auto`, `budget`, `segments = N` over a layer loop): every
//! case compares the gradients of the parameters and the input, and the output, with
//! the unannotated function's bit for bit, and counts how often each kept statement
//! runs. Cases: tuple patterns, shadowing, kept first / second-to-last / adjacent /
//! separated statements, `let mut` mutated in a later loop, a kept statement after a
//! loop, a kept fold capturing a parameter, `?` in the last statement, dropout, no-grad
//! and nested-in-`checkpoint` calls, `segments = N` above the stages, the plan cache
//! across shapes and `train` flags, in-place ops in kept statements, a kept method
//! chain, chains longer than `plan::MAX_KEEP_STAGES`, and the least peak an impossible
//! budget states. The profiling call of `auto` / `budget` runs kept statements too, so the
//! side-effect rules apply to them there: an in-place op on an earlier value in a kept
//! statement is a compile error (`ui/fail/keep-at-run-time-misuse.rs`), as for any
//! statement.
//!
//! The counters and the RNG are process-wide: the tests take turns.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use ckpt::{ShallowClone, checkpointed};
use common::{assert_all_equal, grads_and_output};
use tch::nn::{self, Module};
use tch::{Device, Kind, Tensor};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Counts one run of a kept statement in `counter`, passing `t` through.
fn counted(counter: &AtomicUsize, t: Tensor) -> Tensor {
    counter.fetch_add(1, Ordering::SeqCst);
    t
}

const D: i64 = 64;

/// Five activations held for one output: what checkpointing a stage saves.
fn deep(t: &Tensor) -> Tensor {
    t.tanh().sigmoid().tanh().sigmoid().tanh()
}

#[derive(Debug, ShallowClone)]
struct Net {
    a: nn::Linear,
    b: nn::Linear,
    c: nn::Linear,
    blocks: Vec<nn::Linear>,
    scale: Tensor,
    probe: Probe,
}

static PROBE: AtomicUsize = AtomicUsize::new(0);

/// A linear layer that counts its forwards in `PROBE`.
#[derive(Debug, ShallowClone)]
struct Probe {
    lin: nn::Linear,
}

impl Module for Probe {
    fn forward(&self, xs: &Tensor) -> Tensor {
        PROBE.fetch_add(1, Ordering::SeqCst);
        xs.apply(&self.lin)
    }
}

impl Net {
    fn new(vs: &nn::VarStore, blocks: usize) -> Net {
        let p = vs.root();
        Net {
            a: nn::linear(&p / "a", D, D, Default::default()),
            b: nn::linear(&p / "b", D, D, Default::default()),
            c: nn::linear(&p / "c", D, D, Default::default()),
            blocks: (0..blocks)
                .map(|i| nn::linear(&p / "blocks" / i, D, D, Default::default()))
                .collect(),
            scale: p.randn("scale", &[D], 1.0, 0.5),
            probe: Probe {
                lin: nn::linear(&p / "probe", D, D, Default::default()),
            },
        }
    }
}

struct Setup {
    vs: nn::VarStore,
    net: Net,
    x: Tensor,
}

fn setup(seed: i64, blocks: usize, batch: i64) -> Setup {
    tch::manual_seed(seed);
    let vs = nn::VarStore::new(Device::Cpu);
    let net = Net::new(&vs, blocks);
    let x = Tensor::randn([batch, D], (Kind::Float, Device::Cpu));
    Setup { vs, net, x }
}

/// Defines the methods `$plain` (unannotated) and, for each `$name: ($args)`, the same
/// body under `#[checkpointed($args)]`: `$body!` writes the method, putting the marker it
/// is given (`allow(unused)` for the plain twin, `ckpt::keep`) on the statements to keep.
macro_rules! twins {
    ($body:ident, $plain:ident $(, $name:ident: ($($arg:tt)*))* $(,)?) => {
        impl Net {
            $body!(fn $plain, [], allow(unused));
            $($body!(fn $name, [#[checkpointed($($arg)*)]], ckpt::keep);)*
        }
    };
}

type Forward = fn(&Net, &Tensor) -> Tensor;

/// The gradients (parameters, input) and output of `f` and of `plain`, over three calls
/// of `f` (the first profiles), each after `tch::manual_seed(seed)`; after the first,
/// `counter` must show `runs` per call.
fn check(
    what: &str,
    s: &Setup,
    plain: Forward,
    cases: &[(&str, Forward)],
    counter: &AtomicUsize,
    runs: usize,
) {
    let call = |f: Forward| {
        grads_and_output(&s.vs, &s.x, &|x| {
            tch::manual_seed(77);
            f(&s.net, x)
        })
    };
    counter.store(0, Ordering::SeqCst);
    let want = call(plain);
    assert_eq!(counter.load(Ordering::SeqCst), runs, "{what}: plain runs");
    for (name, f) in cases {
        for k in 0..3 {
            counter.store(0, Ordering::SeqCst);
            let got = call(*f);
            if k == 0 && *name == "auto" {
                let function = format!("{}_auto", what.split(',').next().unwrap_or(what));
                let (any, plans) = checkpoints(&function);
                assert!(any, "{what}: the min-peak plan checkpoints:\n{plans}");
            }
            assert_all_equal(&format!("{what}: {name}, call {k}"), &got, &want);
            if k > 0 {
                assert_eq!(
                    counter.load(Ordering::SeqCst),
                    runs,
                    "{what}: {name}, call {k}: each kept statement runs once"
                );
            }
        }
    }
}

/// Whether a plan of `Net::$function` checkpoints a segment; the plans explained.
fn checkpoints(function: &str) -> (bool, String) {
    let prefix = format!("Net::{function} (");
    let all = ckpt::plan::function_plans();
    let mine: Vec<_> = all
        .iter()
        .filter(|p| p.function.starts_with(&prefix))
        .collect();
    assert!(!mine.is_empty(), "no plan of {function}: {all:#?}");
    let any = mine
        .iter()
        .any(|p| (0..p.plan.segments()).any(|j| p.plan.mode(j).is_checkpointed()));
    let explained = mine.iter().map(|p| p.plan.explain()).collect();
    (any, explained)
}

// ---------------------------------------------------------------------------------------
// Patterns, shadowing, positions.

static TUPLE: AtomicUsize = AtomicUsize::new(0);

macro_rules! tuple_body {
    (fn $name:ident, [$($attr:tt)*], $k:meta) => {
        $($attr)*
        fn $name(&self, x: &Tensor) -> Tensor {
            let h = deep(&self.a.forward(x));
            #[$k]
            let (p, q) = (
                self.b.forward(&h).sigmoid(),
                counted(&TUPLE, self.c.forward(&h)),
            );
            let r = deep(&(&p * &q));
            let s = self.a.forward(&r) + &h;
            s * p + q
        }
    };
}
twins!(tuple_body, tuple_plain, tuple_auto: (segments = auto), tuple_budget: (budget = "100%"));

#[test]
fn a_kept_tuple_pattern_gives_the_plain_gradients() {
    let _serial = serial();
    let s = setup(1, 0, 512);
    let cases: [(&str, Forward); 2] = [("auto", Net::tuple_auto), ("budget", Net::tuple_budget)];
    check("tuple", &s, Net::tuple_plain, &cases, &TUPLE, 1);
}

static SHADOW: AtomicUsize = AtomicUsize::new(0);

macro_rules! shadow_body {
    (fn $name:ident, [$($attr:tt)*], $k:meta) => {
        $($attr)*
        fn $name(&self, x: &Tensor) -> Tensor {
            let h = self.a.forward(x);
            #[$k]
            let h = counted(&SHADOW, self.b.forward(&h).tanh());
            let h = deep(&self.c.forward(&h)) + &h;
            #[$k]
            let h = counted(&SHADOW, h.sigmoid() * &self.scale);
            let g = deep(&self.a.forward(&h));
            g * h
        }
    };
}
twins!(shadow_body, shadow_plain, shadow_auto: (segments = auto), shadow_budget: (budget = "100%"));

#[test]
fn shadowed_kept_statements_give_the_plain_gradients() {
    let _serial = serial();
    let s = setup(2, 0, 512);
    let cases: [(&str, Forward); 2] = [("auto", Net::shadow_auto), ("budget", Net::shadow_budget)];
    check("shadow", &s, Net::shadow_plain, &cases, &SHADOW, 2);
}

static EDGE: AtomicUsize = AtomicUsize::new(0);

macro_rules! edge_body {
    (fn $name:ident, [$($attr:tt)*], $k:meta) => {
        $($attr)*
        fn $name(&self, x: &Tensor) -> Tensor {
            #[$k]
            let h = counted(&EDGE, self.a.forward(x).tanh());
            let g = deep(&self.b.forward(&h));
            let g = deep(&self.c.forward(&g));
            #[$k]
            let u = counted(&EDGE, self.a.forward(&g).sigmoid());
            #[$k]
            let v = counted(&EDGE, (&u * &h).tanh());
            v + g
        }
    };
}
twins!(edge_body, edge_plain, edge_auto: (segments = auto), edge_budget: (budget = "100%"));

#[test]
fn kept_first_and_adjacent_last_statements_give_the_plain_gradients() {
    let _serial = serial();
    let s = setup(3, 0, 512);
    let cases: [(&str, Forward); 2] = [("auto", Net::edge_auto), ("budget", Net::edge_budget)];
    check("edge", &s, Net::edge_plain, &cases, &EDGE, 3);
}

static MISC: AtomicUsize = AtomicUsize::new(0);

macro_rules! values_body {
    (fn $name:ident, [$($attr:tt)*], $k:meta) => {
        $($attr)*
        fn $name(&self, x: &Tensor) -> Tensor {
            let h = deep(&self.a.forward(x));
            // A `Vec<Tensor>`, an `i64`, and a value no later statement uses.
            #[$k]
            let parts = counted(&MISC, self.b.forward(&h)).chunk(2, 1);
            #[$k]
            let n = counted(&MISC, h.shallow_clone()).size()[0];
            #[$k]
            let _unused = counted(&MISC, h.sigmoid());
            let g = deep(&(&parts[0] * &parts[1]));
            let g = deep(&self.c.forward(&Tensor::cat(&[&g, &parts[1]], 1))) / (n as f64);
            g + &parts[0].repeat([1, 2])
        }
    };
}
twins!(values_body, values_plain, values_auto: (segments = auto), values_budget: (budget = "100%"));

#[test]
fn kept_statements_of_other_values_give_the_plain_gradients() {
    let _serial = serial();
    let s = setup(14, 0, 512);
    let cases: [(&str, Forward); 2] = [("auto", Net::values_auto), ("budget", Net::values_budget)];
    check("values", &s, Net::values_plain, &cases, &MISC, 3);
}

macro_rules! chain_body {
    (fn $name:ident, [$($attr:tt)*], $k:meta) => {
        $($attr)*
        fn $name(&self, x: &Tensor) -> Tensor {
            let h = deep(&self.a.forward(x));
            // A method chain of layer calls, which the macro splits into stages: every
            // piece is kept.
            #[$k]
            let h = h.apply(&self.b).tanh().apply(&self.probe).sigmoid().apply(&self.c);
            let g = deep(&self.c.forward(&h));
            g * h
        }
    };
}
twins!(chain_body, chain_plain, chain_auto: (segments = auto), chain_budget: (budget = "100%"));

#[test]
fn a_kept_method_chain_gives_the_plain_gradients() {
    let _serial = serial();
    let s = setup(15, 0, 512);
    let cases: [(&str, Forward); 2] = [("auto", Net::chain_auto), ("budget", Net::chain_budget)];
    check("chain", &s, Net::chain_plain, &cases, &PROBE, 1);
    let plans = ckpt::plan::function_plans();
    let plan = plans
        .iter()
        .find(|p| p.function.starts_with("Net::chain_auto ("))
        .expect("a plan");
    assert!(
        plan.plan.len() > 4,
        "the chain is split: {}",
        plan.plan.explain()
    );
}

// ---------------------------------------------------------------------------------------
// Layer loops.

static LOOP: AtomicUsize = AtomicUsize::new(0);

macro_rules! loop_body {
    (fn $name:ident, [$($attr:tt)*], $k:meta) => {
        $($attr)*
        fn $name(&self, x: &Tensor) -> Tensor {
            #[$k]
            let s = counted(&LOOP, self.a.forward(x).tanh());
            let mut h = deep(&self.b.forward(&s));
            for l in self.blocks.iter() {
                h = deep(&l.forward(&h));
            }
            #[$k]
            let g = counted(&LOOP, self.c.forward(&h).sigmoid());
            let z = deep(&g) * &h;
            z + s
        }
    };
}
twins!(
    loop_body,
    loop_plain,
    loop_auto: (segments = auto),
    loop_budget: (budget = "100%"),
    loop_seg2: (segments = 2),
    loop_seg3: (segments = 3),
    loop_seg9: (segments = 9),
);

impl Net {
    // The same cuts without the marks (which are then plain `let`s).
    loop_body!(fn loop_seg3_unmarked, [#[checkpointed(segments = 3)]], allow(unused));
}

static MUT: AtomicUsize = AtomicUsize::new(0);

macro_rules! mut_body {
    (fn $name:ident, [$($attr:tt)*], $k:meta) => {
        $($attr)*
        fn $name(&self, x: &Tensor) -> Tensor {
            let h = deep(&self.a.forward(x));
            #[$k]
            let mut h = counted(&MUT, self.b.forward(&h).sigmoid());
            for l in self.blocks.iter() {
                h = deep(&l.forward(&h));
            }
            h.relu() * &self.scale
        }
    };
}
twins!(
    mut_body,
    mut_plain,
    mut_auto: (segments = auto),
    mut_budget: (budget = "100%"),
    mut_seg2: (segments = 2),
    mut_seg4: (segments = 4),
    mut_seg50: (segments = 50),
);

#[test]
fn kept_statements_around_a_layer_loop_give_the_plain_gradients() {
    let _serial = serial();
    // The last is above `plan::MAX_KEEP_STAGES`, where the planner keeps only the marked
    // statements.
    for blocks in [0, 1, 2, 5, ckpt::plan::MAX_KEEP_STAGES + 6] {
        let s = setup(4, blocks, 128);
        let cases: [(&str, Forward); 5] = [
            ("auto", Net::loop_auto),
            ("budget", Net::loop_budget),
            ("segments 2", Net::loop_seg2),
            ("segments 3", Net::loop_seg3),
            ("segments 9", Net::loop_seg9),
        ];
        check(
            &format!("loop, {blocks} blocks"),
            &s,
            Net::loop_plain,
            &cases,
            &LOOP,
            2,
        );
        let cases: [(&str, Forward); 5] = [
            ("auto", Net::mut_auto),
            ("budget", Net::mut_budget),
            ("segments 2", Net::mut_seg2),
            ("segments 4", Net::mut_seg4),
            ("segments 50", Net::mut_seg50),
        ];
        check(
            &format!("mut, {blocks} blocks"),
            &s,
            Net::mut_plain,
            &cases,
            &MUT,
            1,
        );
    }
}

static FOLD: AtomicUsize = AtomicUsize::new(0);

macro_rules! fold_body {
    (fn $name:ident, [$($attr:tt)*], $k:meta) => {
        $($attr)*
        fn $name(&self, x: &Tensor) -> Tensor {
            let h = deep(&self.a.forward(x));
            #[$k]
            let h = self
                .blocks
                .iter()
                .fold(h, |h, l| counted(&FOLD, l.forward(&h).tanh() * &self.scale));
            let g = deep(&self.b.forward(&h));
            g * h
        }
    };
}
twins!(
    fold_body,
    fold_plain,
    fold_auto: (segments = auto),
    fold_budget: (budget = "100%"),
    fold_seg2: (segments = 2),
    fold_seg3: (segments = 3),
);

#[test]
fn a_kept_fold_capturing_a_parameter_gives_the_plain_gradients() {
    let _serial = serial();
    let s = setup(5, 4, 512);
    let cases: [(&str, Forward); 4] = [
        ("auto", Net::fold_auto),
        ("budget", Net::fold_budget),
        ("segments 2", Net::fold_seg2),
        ("segments 3", Net::fold_seg3),
    ];
    check("fold", &s, Net::fold_plain, &cases, &FOLD, 4);
}

// ---------------------------------------------------------------------------------------
// `?` in the last statement, dropout.

static QUESTION: AtomicUsize = AtomicUsize::new(0);

macro_rules! question_body {
    (fn $name:ident, [$($attr:tt)*], $k:meta) => {
        $($attr)*
        fn $name(&self, x: &Tensor) -> Result<Tensor, tch::TchError> {
            let h = deep(&self.a.forward(x));
            #[$k]
            let g = counted(&QUESTION, self.b.forward(&h).tanh());
            let u = deep(&self.c.forward(&g));
            Ok(u.f_mul(&g)?.f_add(&h)?.tanh())
        }
    };
}
twins!(question_body, question_plain, question_auto: (segments = auto));

#[test]
fn a_kept_statement_before_a_fallible_last_statement_gives_the_plain_gradients() {
    let _serial = serial();
    let s = setup(6, 0, 512);
    let cases: [(&str, Forward); 1] = [("auto", |n, x| n.question_auto(x).unwrap())];
    check(
        "question",
        &s,
        |n, x| n.question_plain(x).unwrap(),
        &cases,
        &QUESTION,
        1,
    );
}

static DROP: AtomicUsize = AtomicUsize::new(0);

macro_rules! dropout_body {
    (fn $name:ident, [$($attr:tt)*], $k:meta) => {
        $($attr)*
        fn $name(&self, x: &Tensor) -> Tensor {
            let h = self.a.forward(x).dropout(0.5, true);
            #[$k]
            let h = counted(&DROP, self.b.forward(&h).dropout(0.5, true));
            let mut g = deep(&self.c.forward(&h)).dropout(0.3, true);
            for l in self.blocks.iter() {
                g = deep(&l.forward(&g)).dropout(0.2, true);
            }
            #[$k]
            let u = counted(&DROP, g.dropout(0.4, true) * &h);
            u.tanh().dropout(0.1, true)
        }
    };
}
twins!(
    dropout_body,
    dropout_plain,
    dropout_auto: (segments = auto),
    dropout_budget: (budget = "100%"),
    dropout_seg3: (segments = 3),
    dropout_selective: (segments = auto, policy = selective),
    dropout_budget_selective: (budget = "100%", policy = selective),
);

#[test]
fn kept_dropout_draws_the_plain_masks() {
    let _serial = serial();
    let s = setup(7, 3, 512);
    let cases: [(&str, Forward); 5] = [
        ("auto", Net::dropout_auto),
        ("budget", Net::dropout_budget),
        ("segments 3", Net::dropout_seg3),
        ("selective", Net::dropout_selective),
        ("budget, selective", Net::dropout_budget_selective),
    ];
    check("dropout", &s, Net::dropout_plain, &cases, &DROP, 2);
}

// ---------------------------------------------------------------------------------------
// How often a kept statement runs: the profiling call, no grad, nested.

#[test]
fn kept_statements_run_once_without_grad() {
    let _serial = serial();
    let s = setup(8, 2, 512);
    let want = tch::no_grad(|| s.net.loop_plain(&s.x));
    for f in [Net::loop_auto, Net::loop_budget, Net::loop_seg2] {
        LOOP.store(0, Ordering::SeqCst);
        let got = tch::no_grad(|| f(&s.net, &s.x));
        assert!(got.equal(&want));
        assert_eq!(LOOP.load(Ordering::SeqCst), 2);
    }
}

#[test]
fn kept_statements_inside_an_outer_checkpoint_give_the_plain_gradients() {
    let _serial = serial();
    let s = setup(9, 3, 512);
    let want = grads_and_output(&s.vs, &s.x, &|x| s.net.loop_plain(x));
    for (name, f) in [
        ("auto", Net::loop_auto as Forward),
        ("budget", Net::loop_budget),
        ("segments 3 unmarked", Net::loop_seg3_unmarked),
        ("segments 3", Net::loop_seg3),
    ] {
        for k in 0..3 {
            LOOP.store(0, Ordering::SeqCst);
            let net = s.net.shallow_clone();
            let got = grads_and_output(&s.vs, &s.x, &|x| {
                let net = net.shallow_clone();
                ckpt::checkpoint(move |x: Tensor| f(&net, &x), x.shallow_clone())
            });
            assert_all_equal(&format!("nested {name}, call {k}"), &got, &want);
            // Once in the outer forward (no grad), once in its recompute.
            if k > 0 && !name.ends_with("unmarked") {
                assert_eq!(LOOP.load(Ordering::SeqCst), 4, "nested {name}, call {k}");
            }
        }
    }
}

/// The first training call of an `auto` / `budget` function for an input profiles every
/// statement, kept ones too (that is why the side-effect rules apply to kept statements
/// there, and the docs say so): its kept statements run more than once in that call,
/// then once a step.
#[test]
fn the_profiling_call_runs_kept_statements_again_then_once_a_step() {
    let _serial = serial();
    let s = setup(10, 2, 13); // an input no other test plans for
    LOOP.store(0, Ordering::SeqCst);
    let _ = grads_and_output(&s.vs, &s.x, &|x| Net::loop_auto(&s.net, x));
    assert!(
        LOOP.load(Ordering::SeqCst) > 2,
        "the profile runs the 2 kept statements too"
    );
    for call in 1..3 {
        LOOP.store(0, Ordering::SeqCst);
        let _ = grads_and_output(&s.vs, &s.x, &|x| Net::loop_auto(&s.net, x));
        assert_eq!(
            LOOP.load(Ordering::SeqCst),
            2,
            "call {call}: each kept statement once"
        );
    }
}

// ---------------------------------------------------------------------------------------
// The plan cache: shapes and `train` flags.

static CACHE: AtomicUsize = AtomicUsize::new(0);

macro_rules! cache_body {
    (fn $name:ident, [$($attr:tt)*], $k:meta) => {
        $($attr)*
        fn $name(&self, x: &Tensor, train: bool) -> Tensor {
            let h = self.a.forward(x);
            #[$k]
            let h = counted(&CACHE, h.dropout(0.5, train));
            let mut g = deep(&self.b.forward(&h));
            for l in self.blocks.iter() {
                g = l.forward(&g).dropout(0.3, train);
            }
            g.dropout(0.2, train) + h
        }
    };
}

impl Net {
    cache_body!(fn cache_plain, [], allow(unused));
    cache_body!(fn cache_auto, [#[checkpointed(segments = auto)]], ckpt::keep);
    cache_body!(fn cache_budget, [#[checkpointed(budget = "100%")]], ckpt::keep);
    cache_body!(fn cache_seg2, [#[checkpointed(segments = 2)]], ckpt::keep);
}

#[test]
fn the_plan_cache_across_shapes_and_train_flags_gives_the_plain_gradients() {
    let _serial = serial();
    let s = setup(11, 3, 512);
    type Train = fn(&Net, &Tensor, bool) -> Tensor;
    let cases: [(&str, Train); 3] = [
        ("auto", Net::cache_auto),
        ("budget", Net::cache_budget),
        ("segments 2", Net::cache_seg2),
    ];
    let inputs: Vec<(Tensor, bool)> = [(4, true), (7, true), (4, false), (7, false), (4, true)]
        .iter()
        .map(|&(b, t)| (Tensor::randn([b, D], (Kind::Float, Device::Cpu)), t))
        .collect();
    for (name, f) in cases {
        let mut seen = std::collections::HashSet::new();
        for round in 0..2 {
            for (i, (x, train)) in inputs.iter().enumerate() {
                let run = |f: Train| {
                    grads_and_output(&s.vs, x, &|x| {
                        tch::manual_seed(5);
                        f(&s.net, x, *train)
                    })
                };
                let want = run(Net::cache_plain);
                CACHE.store(0, Ordering::SeqCst);
                let got = run(f);
                let what = format!("{name}, round {round}, input {i}");
                assert_all_equal(&what, &got, &want);
                if !seen.insert((x.size()[0], *train)) {
                    assert_eq!(CACHE.load(Ordering::SeqCst), 1, "{what}");
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// In-place ops in kept statements, which the side-effect rules do not refuse where
// nothing profiles the statement (`segments = N`).

static INPLACE: AtomicUsize = AtomicUsize::new(0);

macro_rules! mutate_body {
    (fn $name:ident, [$($attr:tt)*], $k:meta) => {
        $($attr)*
        fn $name(&self, x: &Tensor) -> Tensor {
            let h = deep(&self.a.forward(&(x + 1.0)));
            // Doubles the argument in place: the plain function's gradients do not
            // change (`x + 1` is a new tensor), but the first segment, which recomputes
            // `x + 1` from `x` in backward, would see the doubled `x`.
            #[$k]
            let k = {
                let mut y = x.shallow_clone();
                let _ = y.g_mul_scalar_(2.0);
                counted(&INPLACE, h.sigmoid())
            };
            let mut g = deep(&self.b.forward(&k));
            for l in self.blocks.iter() {
                g = deep(&l.forward(&g));
            }
            g * k
        }
    };
}
twins!(mutate_body, mutate_plain, mutate_seg2: (segments = 2));

/// The side-effect rules do not apply to a kept statement, so the in-place rule, which
/// protects the inputs of the segments that recompute, does not refuse this at compile
/// time; the checkpoint node then refuses it in backward, with a message that says what
/// happened (no wrong gradients, no abort).
#[test]
fn a_kept_statement_mutating_an_earlier_segments_input_fails_in_backward() {
    let _serial = serial();
    let s = setup(13, 2, 512);
    let params = common::params(&s.vs);
    // The plain function's gradients do not depend on the mutation.
    let x = s.x.copy();
    let y = s.net.mutate_plain(&x);
    let want = common::grads_of(&(&y * &y).sum(Kind::Float), &params);
    assert!(want[0].defined(), "a.bias has a gradient");
    for k in 0..2 {
        INPLACE.store(0, Ordering::SeqCst);
        let x = s.x.copy();
        let y = s.net.mutate_seg2(&x);
        assert_eq!(INPLACE.load(Ordering::SeqCst), 1);
        let err = (&y * &y)
            .sum(Kind::Float)
            .f_backward()
            .expect_err("the first segment's input changed");
        let msg = err.to_string();
        assert!(
            msg.contains("segment 1 of 4")
                && msg.contains(
                    "an input of the segment was modified in place after the forward pass"
                ),
            "call {k}: {}",
            &msg[..msg.len().min(600)]
        );
    }
}

// ---------------------------------------------------------------------------------------
// An impossible budget: the smallest feasible peak it states keeps the marked statements.

macro_rules! feasible_body {
    (fn $name:ident, [$($attr:tt)*], $k:meta) => {
        $($attr)*
        fn $name(&self, x: &Tensor) -> Tensor {
            let h = deep(&self.a.forward(x));
            // Holds five activations: the least peak is higher with it kept.
            #[$k]
            let big = deep(&self.b.forward(&h));
            let g = deep(&self.c.forward(&big));
            let g = deep(&self.a.forward(&g));
            g * big
        }
    };
}
impl Net {
    feasible_body!(fn feasible_auto, [#[checkpointed(segments = auto)]], ckpt::keep);
    feasible_body!(fn feasible_budget, [#[checkpointed(budget = "5%")]], ckpt::keep);
    // The same function without the mark.
    feasible_body!(fn feasible_unmarked, [#[checkpointed(segments = auto)]], allow(unused));
}

#[test]
fn an_impossible_budget_states_the_least_peak_with_the_kept_statements() {
    let _serial = serial();
    let s = setup(16, 0, 512);
    let x = s.x.copy().set_requires_grad(true);
    let least = |name: &str, f: Forward| {
        let _ = f(&s.net, &x);
        let plans = ckpt::plan::function_plans();
        let p = plans
            .iter()
            .find(|p| p.function.starts_with(&format!("Net::{name} (")))
            .expect("a plan");
        p.plan.predicted_peak_bytes()
    };
    let marked = least("feasible_auto", Net::feasible_auto);
    let unmarked = least("feasible_unmarked", Net::feasible_unmarked);
    assert!(
        marked > unmarked,
        "keeping `big` costs memory: {marked} vs {unmarked}"
    );
    let err = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        Net::feasible_budget(&s.net, &x)
    }))
    .expect_err("5 % is below the least peak");
    let msg = err.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(
        msg.contains("the smallest feasible peak of this chain with the stages marked keep kept")
            && msg.contains(&format!("({marked} B, ")),
        "{msg} (min-peak plan: {marked} B, without the mark {unmarked} B)"
    );
}
