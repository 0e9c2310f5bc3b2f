//! Adversarial tests of session 22's features: `#[keep]` on `model!` stages at the ends,
//! adjacent, with batch norm, dropout, repeated stages, `policy = selective`, every
//! run-time schedule, no-grad forward and double backward; budget functions choosing a
//! policy per segment on chains without Linear layers or dropout, in eval mode, with
//! changing input shapes and nested; the recompute's grad-off check on legal code.
//!
//! The tests share the RNG: one at a time.

mod common;

use std::sync::{Mutex, MutexGuard, PoisonError};

use ckpt::plan::Schedule;
use ckpt::{CkptError, ShallowClone, checkpointed, model};
use common::{assert_all_equal, grads_and_output};
use tch::nn::{self, Module, ModuleT};
use tch::{Device, Kind, Tensor};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

#[derive(Debug, ShallowClone)]
struct Res {
    lin: nn::Linear,
}

impl Res {
    fn new(p: nn::Path, d: i64) -> Self {
        Res {
            lin: nn::linear(p, d, d, Default::default()),
        }
    }
}

impl Module for Res {
    fn forward(&self, xs: &Tensor) -> Tensor {
        xs + xs.apply(&self.lin).tanh()
    }
}

const D_IN: i64 = 6;
const D: i64 = 8;
/// Stages: a, b, dropout, bn, blocks[0..3], gelu, dropout, c, out.
const LEN: usize = 11;

macro_rules! chain {
    ($(#[$decl:meta])* struct $name:ident {
        a: [$($a:tt)*], b: [$($b:tt)*], dr: [$($dr:tt)*], bn: [$($bn:tt)*],
        blocks: [$($bl:tt)*], out: [$($out:tt)*]
    }) => {
        model! {
            $(#[$decl])*
            struct $name(p) {
                $($a)* a: nn::Linear = nn::linear(p, D_IN, D, Default::default()),
                $($b)* b: nn::Linear = nn::linear(p, D, D, Default::default()),
                $($dr)* dropout(0.3),
                $($bn)* #[train] bn: nn::BatchNorm = nn::batch_norm1d(p, D, Default::default()),
                $($bl)* blocks: [Res; 3] = Res::new(p, D),
                gelu,
                dropout(0.2),
                c: nn::Linear = nn::linear(p, D, D, Default::default()),
                $($out)* out: nn::Linear = nn::linear(p, D, 4, Default::default()),
            }
        }
    };
}

chain! {
    struct Plain { a: [], b: [], dr: [], bn: [], blocks: [], out: [] }
}

chain! {
    /// Kept: the first two stages (adjacent, at the start), the dropout, the batch norm,
    /// the repeated blocks and the last stage.
    #[checkpointed(segments = 2)]
    struct KeepMany {
        a: [#[keep]], b: [#[keep]], dr: [#[keep]], bn: [#[keep]], blocks: [#[keep]],
        out: [#[keep]]
    }
}

chain! {
    /// Nothing kept.
    #[checkpointed(segments = 2)]
    struct NoKeep { a: [], b: [], dr: [], bn: [], blocks: [], out: [] }
}

chain! {
    #[checkpointed(segments = 3, policy = selective)]
    struct KeepSelective {
        a: [#[keep]], b: [], dr: [#[keep]], bn: [], blocks: [#[keep]], out: [#[keep]]
    }
}

chain! {
    /// Only the second stage and the blocks: checkpointed stages on both sides.
    #[checkpointed(segments = 4)]
    struct KeepSome { a: [], b: [#[keep]], dr: [], bn: [], blocks: [#[keep]], out: [] }
}

fn build<M>(f: impl Fn(nn::Path) -> M) -> (nn::VarStore, M) {
    tch::manual_seed(7);
    let vs = nn::VarStore::new(Device::Cpu);
    let m = f(vs.root());
    (vs, m)
}

/// Output, gradients (variables, input), then the variables (batch-norm statistics) of one
/// training step from a fixed seed.
fn step(vs: &nn::VarStore, m: &dyn ModuleT, x: &Tensor) -> Vec<Tensor> {
    tch::manual_seed(11);
    let mut out = grads_and_output(vs, x, &|x| m.forward_t(x, true));
    out.extend(common::params(vs).iter().map(Tensor::copy));
    out
}

/// Every schedule to try on a chain of `LEN` stages: every segment count (past the
/// length too), every single cut and every pair of cuts.
fn schedules() -> Vec<Schedule> {
    let mut all: Vec<Schedule> = (1..=LEN + 2).map(Schedule::Segments).collect();
    all.push(Schedule::Cuts(vec![]));
    for i in 1..LEN {
        all.push(Schedule::Cuts(vec![i]));
        for j in i + 1..LEN {
            all.push(Schedule::Cuts(vec![i, j]));
        }
    }
    all.push(Schedule::Cuts((1..LEN).collect()));
    all
}

/// Plain model's step, then for every schedule a fresh model of type `M` (same
/// variables) with it: bit-equal outputs, gradients and batch-norm statistics.
fn every_schedule_equals_plain<M: ModuleT>(
    name: &str,
    schedules: &[Schedule],
    make: impl Fn(nn::Path) -> M,
    set: impl Fn(&mut M, Schedule) -> Result<(), CkptError>,
) {
    let x = Tensor::randn([5, D_IN], (Kind::Float, Device::Cpu));
    let (vs_plain, plain) = build(|p| Plain::new(p));
    let want = step(&vs_plain, &plain, &x);
    for schedule in schedules {
        let (vs, mut m) = build(&make);
        set(&mut m, schedule.clone()).unwrap();
        let got = step(&vs, &m, &x);
        assert_all_equal(&format!("{name} {schedule:?}"), &got, &want);
    }
}

#[test]
fn keep_at_the_ends_adjacent_bn_dropout_repeated_every_schedule() {
    let _s = serial();
    every_schedule_equals_plain(
        "KeepMany",
        &schedules(),
        |p| KeepMany::new(p),
        |m, s| m.set_schedule(s),
    );
    every_schedule_equals_plain(
        "KeepSome",
        &schedules(),
        |p| KeepSome::new(p),
        |m, s| m.set_schedule(s),
    );
}

#[test]
fn keep_with_selective_policy_every_schedule() {
    let _s = serial();
    // Every segment count and every single cut (pairs take minutes unoptimized).
    let few: Vec<Schedule> = schedules()
        .into_iter()
        .filter(|s| !matches!(s, Schedule::Cuts(c) if c.len() > 1))
        .collect();
    every_schedule_equals_plain(
        "KeepSelective",
        &few,
        |p| KeepSelective::new(p),
        |m, s| m.set_schedule(s),
    );
    // The policy changed at run time, back to full and to selective again.
    every_schedule_equals_plain(
        "KeepSelective/full",
        &few,
        |p| KeepSelective::new(p),
        |m, s| {
            m.set_policy(ckpt::Policy::RECOMPUTE_ALL);
            m.set_schedule(s)
        },
    );
}

#[test]
fn set_plan_with_kept_stages() {
    let _s = serial();
    let x = Tensor::randn([5, D_IN], (Kind::Float, Device::Cpu));
    let (vs_plain, plain) = build(|p| Plain::new(p));
    let want = step(&vs_plain, &plain, &x);
    let (vs, mut m) = build(|p| KeepSome::new(p));
    m.set_schedule(Schedule::Cuts(vec![1, 2, 8])).unwrap();
    let plan = m.plan_for(&x, true).unwrap();
    // The plan of a fixed schedule is its segments split around the kept stages, each
    // kept run a kept segment: the cuts 1, 2 and 8 and those of the splits.
    assert!(
        plan.cuts().starts_with(&[1, 2]) && plan.cuts().contains(&8),
        "{plan}"
    );
    assert_eq!(plan.len(), LEN);
    m.set_segments(2).unwrap();
    m.set_plan(&plan).unwrap();
    assert_eq!(m.schedule(), Schedule::Cuts(plan.cuts().to_vec()));
    let got = step(&vs, &m, &x);
    assert_all_equal("set_plan", &got, &want);
    // A plan of another chain: refused, the schedule unchanged.
    let (_vs3, other) = build(|p| {
        model! {
            #[checkpointed(segments = 2)]
            struct Short(p) {
                a: nn::Linear = nn::linear(p, D_IN, D, Default::default()),
                relu,
                #[keep] b: nn::Linear = nn::linear(p, D, D, Default::default()),
            }
        }
        Short::new(p)
    });
    let short_plan = other.plan_for(&x).unwrap();
    let e = m.set_plan(&short_plan).unwrap_err();
    assert!(matches!(e, CkptError::InvalidArgument(_)), "{e}");
    assert_eq!(m.schedule(), Schedule::Cuts(plan.cuts().to_vec()));
    // Bad cuts are errors, not panics.
    for bad in [vec![0], vec![LEN], vec![3, 3], vec![5, 2]] {
        let e = m.set_schedule(Schedule::Cuts(bad.clone())).unwrap_err();
        assert!(matches!(e, CkptError::InvalidArgument(_)), "{bad:?}: {e}");
    }
    assert!(matches!(
        m.set_segments(0).unwrap_err(),
        CkptError::InvalidArgument(_)
    ));
}

#[test]
fn keep_no_grad_forward_and_eval_equal_plain() {
    let _s = serial();
    let x = Tensor::randn([5, D_IN], (Kind::Float, Device::Cpu));
    let (vs_plain, plain) = build(|p| Plain::new(p));
    let (vs, m) = build(|p| KeepMany::new(p));
    for train in [true, false] {
        tch::manual_seed(3);
        let want = tch::no_grad(|| plain.forward_t(&x, train));
        tch::manual_seed(3);
        let got = tch::no_grad(|| m.forward_t(&x, train));
        assert!(got.equal(&want), "train {train}");
        assert!(!got.requires_grad());
        // The statistics (updated once in train mode) equal too.
        assert_all_equal(
            &format!("stats train {train}"),
            &common::params(&vs),
            &common::params(&vs_plain),
        );
    }
}

/// Gradient of `sum(grad_x(sum(f(x)^2))^2)` with respect to the variables: double
/// backward through the model.
fn double_backward(vs: &nn::VarStore, m: &dyn ModuleT, x: &Tensor) -> Vec<Tensor> {
    tch::manual_seed(11);
    let x = x.detach().set_requires_grad(true);
    let y = m.forward_t(&x, true);
    let loss = (&y * &y).sum(Kind::Float);
    let gx = Tensor::run_backward(&[&loss], &[&x], true, true);
    let second = (&gx[0] * &gx[0]).sum(Kind::Float);
    let params = common::params(vs);
    let trainable: Vec<&Tensor> = params.iter().filter(|p| p.requires_grad()).collect();
    let mut out = Tensor::run_backward(&[&second], &trainable, false, false);
    out.push(gx[0].detach().copy());
    out
}

model! {
    struct DPlain(p) {
        a: nn::Linear = nn::linear(p, D_IN, D, Default::default()),
        tanh,
        b: nn::Linear = nn::linear(p, D, D, Default::default()),
        tanh,
        out: nn::Linear = nn::linear(p, D, 4, Default::default()),
    }
}
model! {
    #[checkpointed(segments = 2)]
    struct DCkpt(p) {
        a: nn::Linear = nn::linear(p, D_IN, D, Default::default()),
        tanh,
        b: nn::Linear = nn::linear(p, D, D, Default::default()),
        tanh,
        out: nn::Linear = nn::linear(p, D, 4, Default::default()),
    }
}

/// First-order gradients (the last element) bit-equal; second-order gradients of the
/// variables equal to rounding (relative difference at most 1e-5; batch norm amplifies rounding).
fn assert_double_backward_close(what: &str, got: &[Tensor], want: &[Tensor]) {
    let n = want.len();
    assert_all_equal(
        &format!("{what}: first order"),
        &got[n - 1..],
        &want[n - 1..],
    );
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let rel = common::max_abs_diff(g, w) / w.abs().max().double_value(&[]).max(1e-30);
        assert!(rel <= 1e-5, "{what}[{i}]: relative difference {rel:e}");
    }
}

#[test]
#[ignore = "bug: double backward (create_graph) through a checkpointed model! segment \
            gives second-order gradients of the segment's parameters that differ from the \
            plain model's by rounding (DCkpt: a.bias rel 2.4e-8, a.weight rel 7.3e-8; the \
            first-order gradients are bit-equal), against the bit-for-bit promise; also \
            without #[keep], so not keep's doing"]
fn double_backward_simple_chain_is_bit_equal() {
    let _s = serial();
    let x = Tensor::randn([5, D_IN], (Kind::Float, Device::Cpu));
    let (vs_plain, plain) = build(|p| DPlain::new(p));
    let want = double_backward(&vs_plain, &plain, &x);
    let (vs, m) = build(|p| DCkpt::new(p));
    let got = double_backward(&vs, &m, &x);
    assert_all_equal("double backward, simple chain", &got, &want);
}

#[test]
fn keep_double_backward_equals_plain_to_rounding() {
    let _s = serial();
    let x = Tensor::randn([5, D_IN], (Kind::Float, Device::Cpu));
    let (vs_plain, plain) = build(|p| Plain::new(p));
    let want = double_backward(&vs_plain, &plain, &x);
    for n in [2, 4, LEN] {
        let (vs, mut m) = build(|p| NoKeep::new(p));
        m.set_segments(n).unwrap();
        let got = double_backward(&vs, &m, &x);
        assert_double_backward_close(&format!("nothing kept, {n} segments"), &got, &want);
        let (vs, mut m) = build(|p| KeepSome::new(p));
        m.set_segments(n).unwrap();
        let got = double_backward(&vs, &m, &x);
        assert_double_backward_close(&format!("kept, {n} segments"), &got, &want);
    }
    let (vs_plain, plain) = build(|p| DPlain::new(p));
    let want = double_backward(&vs_plain, &plain, &x);
    let (vs, m) = build(|p| DCkpt::new(p));
    let got = double_backward(&vs, &m, &x);
    assert_double_backward_close("simple chain", &got, &want);
}

// ---------------------------------------------------------------------------------------
// Budget functions choosing a policy per segment.

/// A block with no Linear layer and no dropout: the selective and masks policies keep
/// nothing more than full recompute.
#[derive(Debug, ShallowClone)]
struct Wave {
    w: Tensor,
}

impl Wave {
    fn forward(&self, xs: &Tensor) -> Tensor {
        (xs * &self.w).sin() + xs
    }
}

/// A block with a Linear layer and dropout applied with the given train flag.
#[derive(Debug, ShallowClone)]
struct Lin {
    lin: nn::Linear,
}

impl Lin {
    fn forward(&self, xs: &Tensor, train: bool) -> Tensor {
        (xs + xs.apply(&self.lin).tanh()).dropout(0.25, train)
    }
}

#[derive(Debug, ShallowClone)]
struct Net {
    waves: Vec<Wave>,
    lins: Vec<Lin>,
}

impl Net {
    fn waves_plain(&self, xs: &Tensor) -> Tensor {
        let mut h = xs.shallow_clone();
        for block in self.waves.iter() {
            h = block.forward(&h);
        }
        h
    }

    #[checkpointed(budget = "100%")]
    fn waves_budget(&self, xs: &Tensor) -> Tensor {
        let mut h = xs.shallow_clone();
        for block in self.waves.iter() {
            h = block.forward(&h);
        }
        h
    }

    fn lins_plain(&self, xs: &Tensor, train: bool) -> Tensor {
        let mut h = xs.shallow_clone();
        for block in self.lins.iter() {
            h = block.forward(&h, train);
        }
        h
    }

    #[checkpointed(budget = "100%")]
    fn lins_budget(&self, xs: &Tensor, train: bool) -> Tensor {
        let mut h = xs.shallow_clone();
        for block in self.lins.iter() {
            h = block.forward(&h, train);
        }
        h
    }

    #[checkpointed(segments = auto)]
    fn lins_auto(&self, xs: &Tensor, train: bool) -> Tensor {
        let mut h = xs.shallow_clone();
        for block in self.lins.iter() {
            h = block.forward(&h, train);
        }
        h
    }

    #[checkpointed(budget = "100%", policy = selective)]
    fn lins_selective(&self, xs: &Tensor, train: bool) -> Tensor {
        let mut h = xs.shallow_clone();
        for block in self.lins.iter() {
            h = block.forward(&h, train);
        }
        h
    }

    /// A budget function calling another one in its loop body.
    #[checkpointed(budget = "100%")]
    fn nested(&self, xs: &Tensor) -> Tensor {
        let mut h = xs.shallow_clone();
        for block in self.lins.iter() {
            h = self.waves_budget(&block.forward(&h, true));
        }
        h
    }

    fn nested_plain(&self, xs: &Tensor) -> Tensor {
        let mut h = xs.shallow_clone();
        for block in self.lins.iter() {
            h = self.waves_plain(&block.forward(&h, true));
        }
        h
    }
}

fn net() -> (nn::VarStore, Net) {
    tch::manual_seed(5);
    let vs = nn::VarStore::new(Device::Cpu);
    let root = vs.root();
    let waves = (0..6)
        .map(|i| Wave {
            w: root.randn(&format!("w{i}"), &[32], 0.0, 1.0),
        })
        .collect();
    let lins = (0..6)
        .map(|i| Lin {
            lin: nn::linear(&root / "lin" / i, 32, 32, Default::default()),
        })
        .collect();
    (vs, Net { waves, lins })
}

/// Gradients of the variables and of the input, and the output, of `f` from a fixed seed.
fn fn_step(vs: &nn::VarStore, x: &Tensor, f: &dyn Fn(&Tensor) -> Tensor) -> Vec<Tensor> {
    tch::manual_seed(13);
    grads_and_output(vs, x, f)
}

#[test]
fn budget_functions_without_linear_or_dropout_and_in_eval_mode() {
    let _s = serial();
    let (vs, net) = net();
    // Shapes change between calls: each gets its own plan, all bit-equal to plain.
    for rows in [16, 4, 16, 64, 1] {
        let x = Tensor::randn([rows, 32], (Kind::Float, Device::Cpu));
        let want = fn_step(&vs, &x, &|x| net.waves_plain(x));
        let got = fn_step(&vs, &x, &|x| net.waves_budget(x));
        assert_all_equal(&format!("waves, {rows} rows"), &got, &want);
        for train in [true, false] {
            let want = fn_step(&vs, &x, &|x| net.lins_plain(x, train));
            for (name, f) in [
                (
                    "budget",
                    Net::lins_budget as fn(&Net, &Tensor, bool) -> Tensor,
                ),
                ("auto", Net::lins_auto),
                ("selective", Net::lins_selective),
            ] {
                let got = fn_step(&vs, &x, &|x| f(&net, x, train));
                assert_all_equal(
                    &format!("lins {name}, {rows} rows, train {train}"),
                    &got,
                    &want,
                );
            }
        }
    }
    for p in ckpt::plan::function_plans() {
        assert_eq!(
            p.plan.policies().len(),
            p.plan.cuts().len(),
            "{}",
            p.function
        );
        if p.function.starts_with("Net::lins_selective (") {
            assert!(
                p.plan
                    .policies()
                    .iter()
                    .all(|&q| q == ckpt::Policy::selective()),
                "{}",
                p.plan
            );
        }
    }
}

#[test]
fn nested_budget_functions() {
    let _s = serial();
    let (vs, net) = net();
    for rows in [8, 3] {
        let x = Tensor::randn([rows, 32], (Kind::Float, Device::Cpu));
        let want = fn_step(&vs, &x, &|x| net.nested_plain(x));
        for _ in 0..2 {
            let got = fn_step(&vs, &x, &|x| net.nested(x));
            assert_all_equal(&format!("nested, {rows} rows"), &got, &want);
        }
    }
}

// ---------------------------------------------------------------------------------------
// The recompute's grad-off check.

fn xg() -> Tensor {
    Tensor::from_slice(&[0.5f32, -1.0, 2.0, 3.0, -0.25, 1.5])
        .view([2, 3])
        .set_requires_grad(true)
}

/// Gradient of `loss(f(x), x)` with respect to `x`, plainly and through a checkpoint.
fn plain_and_checkpointed<O: ckpt::Stash>(
    f: impl Fn(Tensor) -> O + Clone + Send + 'static,
    loss: impl Fn(&O, &Tensor) -> Tensor,
) -> (Tensor, Result<Tensor, String>) {
    let plain = xg();
    loss(&f(plain.shallow_clone()), &plain).backward();
    let checkpointed = xg();
    let out = ckpt::checkpoint(f, checkpointed.shallow_clone());
    let r = loss(&out, &checkpointed).f_backward();
    (
        plain.grad(),
        r.map(|()| checkpointed.grad()).map_err(|e| e.to_string()),
    )
}

#[test]
fn legal_grad_off_patterns_are_not_refused() {
    let _s = serial();
    // A statistic under no_grad scaling an output with a graph.
    let (plain, got) = plain_and_checkpointed(
        |x: Tensor| {
            let m = tch::no_grad(|| x.abs().max());
            &x.sin() / m
        },
        |y: &Tensor, _| y.sum(Kind::Float),
    );
    assert!(got.unwrap().equal(&plain));
    // with_grad nested in no_grad inside the closure.
    let (plain, got) = plain_and_checkpointed(
        |x: Tensor| tch::no_grad(|| tch::with_grad(|| x.sin())),
        |y: &Tensor, _| y.sum(Kind::Float),
    );
    assert!(got.unwrap().equal(&plain));
    // A frozen weight (requires_grad false) and an integer op.
    let (plain, got) = plain_and_checkpointed(
        |x: Tensor| {
            let w = Tensor::from_slice(&[2.0f32, 3.0, 4.0]);
            let idx = x.argmax(1, true);
            (&x * &w).sin() + idx.to_kind(Kind::Float)
        },
        |y: &Tensor, _| y.sum(Kind::Float),
    );
    assert!(got.unwrap().equal(&plain));
    // detach: no gradient in both, and another path.
    let (plain, got) = plain_and_checkpointed(
        |x: Tensor| x.detach().sin() * 2.0 + x.cos(),
        |y: &Tensor, _| y.sum(Kind::Float),
    );
    assert!(got.unwrap().equal(&plain));
}

/// A segment whose only output is computed under no_grad from its input, in both runs,
/// used beside another path: legal plainly (the output has no graph), refused through a
/// checkpoint (its recompute "does not require grad"). The forward cannot tell this from
/// the closure turning grad off only in the recompute, as PyTorch's reentrant
/// checkpoint cannot; the error must be a `CkptError`, not a panic.
#[test]
fn an_output_computed_under_no_grad_in_both_runs_is_a_clear_error() {
    let _s = serial();
    let (_plain, got) = plain_and_checkpointed(
        |x: Tensor| tch::no_grad(|| x.cos()),
        |y: &Tensor, x: &Tensor| y.sum(Kind::Float) + x.sin().sum(Kind::Float),
    );
    let e = got.unwrap_err();
    assert!(
        e.contains("output 0 receives a gradient, but its recompute does not require grad"),
        "{e}"
    );
}

/// The closure turns grad off only in its recompute, for the parameter's path, while the
/// output keeps a graph through the input: the parameter silently gets no gradient.
#[test]
#[ignore = "bug: a recompute that runs a parameter's op under no_grad (only when \
            ckpt::is_recomputing()) while the output keeps a graph through the input is \
            not refused: the parameter's gradient is silently zero (GradOffWatch only \
            errs when no output receiving a gradient has a graph, csrc/ckpt.cpp)"]
fn grad_off_for_a_parameter_only_in_the_recompute_is_refused() {
    let _s = serial();
    let w = Tensor::from_slice(&[2.0f32, 3.0, 4.0]).set_requires_grad(true);
    let w2 = w.shallow_clone();
    let x = xg();
    let y: Tensor = ckpt::checkpoint(
        move |x: Tensor| {
            let scaled = if ckpt::is_recomputing() {
                tch::no_grad(|| &w2 * 1.0)
            } else {
                &w2 * 1.0
            };
            (&x * scaled).sin()
        },
        x.shallow_clone(),
    );
    let r = y.sum(Kind::Float).f_backward();
    match r {
        Err(e) => assert!(e.to_string().contains("grad"), "{e}"),
        Ok(()) => {
            let g = w.grad();
            assert!(
                g.defined() && g.abs().sum(Kind::Float).double_value(&[]) > 0.0,
                "the weight's gradient is silently missing: {g:?}"
            );
        }
    }
}

/// A percentage budget displays as written: `"56%"` is 0.56, and 0.56 * 100 is
/// 56.00000000000001 in f64 (train_classifier printed "budget 56.00000000000001% of the
/// plain run's peak").
#[test]
fn budget_percentages_display_as_written() {
    for (s, want) in [
        ("56%", "56% of the plain run's peak"),
        ("0.56", "56% of the plain run's peak"),
        ("29%", "29% of the plain run's peak"),
        ("12.5%", "12.5% of the plain run's peak"),
        ("0.333", "33.3% of the plain run's peak"),
        ("100%", "100% of the plain run's peak"),
    ] {
        let b: ckpt::plan::Budget = s.parse().unwrap();
        assert_eq!(b.to_string(), want, "{s}");
    }
}

/// A budget function first called without grad at a new shape (nothing planned, the
/// body inline), then trained at that shape: output and gradients equal plain.
#[test]
fn a_budget_function_called_without_grad_first() {
    let _s = serial();
    let (vs, net) = net();
    let x = Tensor::randn([7, 32], (Kind::Float, Device::Cpu));
    tch::manual_seed(2);
    let want = tch::no_grad(|| net.lins_plain(&x, true));
    tch::manual_seed(2);
    let got = tch::no_grad(|| net.lins_budget(&x, true));
    assert!(got.equal(&want));
    let want = fn_step(&vs, &x, &|x| net.lins_plain(x, true));
    for _ in 0..2 {
        let got = fn_step(&vs, &x, &|x| net.lins_budget(x, true));
        assert_all_equal("after a no-grad call", &got, &want);
    }
}
