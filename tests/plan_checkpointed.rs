//! `#[checkpointed(segments = auto)]` and `#[checkpointed(budget = "..")]` on functions
//! (issue 7): the statements are the stages the planner cuts at run time (the last one,
//! which always runs inline, is profiled as the last stage when it is side-effect free).
//! On a 16-statement residual chain the measured peak is within 10 % of the prediction
//! and within the budget; outputs and gradients equal the plain function's bit for bit
//! (also with skip connections, several live values, slice and string parameters,
//! dropout); an impossible budget panics with the smallest feasible one; plans are
//! cached per input and listed by `ckpt::plan::function_plans`.

mod common;

use std::sync::{Mutex, MutexGuard, PoisonError};

use ckpt::{ShallowClone, checkpointed};
use tch::nn::{self, Module, ModuleT};
use tch::{Device, Kind, Tensor};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

#[derive(Debug, ShallowClone)]
struct Net {
    blocks: Vec<nn::Linear>,
}

impl Net {
    fn new(p: &nn::Path, width: i64, layers: usize) -> Self {
        Net {
            blocks: (0..layers)
                .map(|i| nn::linear(p / i, width, width, Default::default()))
                .collect(),
        }
    }
}

/// The same body under several attributes: 16 residual statements
/// `h + relu(linear(h))` and the tail `h`.
macro_rules! residual16 {
    ($($(#[$attr:meta])* fn $name:ident;)*) => {$(
        $(#[$attr])*
        fn $name(&self, xs: &Tensor) -> Tensor {
            let h = xs + self.blocks[0].forward(xs).relu();
            let h = &h + self.blocks[1].forward(&h).relu();
            let h = &h + self.blocks[2].forward(&h).relu();
            let h = &h + self.blocks[3].forward(&h).relu();
            let h = &h + self.blocks[4].forward(&h).relu();
            let h = &h + self.blocks[5].forward(&h).relu();
            let h = &h + self.blocks[6].forward(&h).relu();
            let h = &h + self.blocks[7].forward(&h).relu();
            let h = &h + self.blocks[8].forward(&h).relu();
            let h = &h + self.blocks[9].forward(&h).relu();
            let h = &h + self.blocks[10].forward(&h).relu();
            let h = &h + self.blocks[11].forward(&h).relu();
            let h = &h + self.blocks[12].forward(&h).relu();
            let h = &h + self.blocks[13].forward(&h).relu();
            let h = &h + self.blocks[14].forward(&h).relu();
            let h = &h + self.blocks[15].forward(&h).relu();
            h
        }
    )*};
}

impl Net {
    residual16! {
        fn plain;
        #[checkpointed(segments = auto)]
        fn auto;
        #[checkpointed(budget = "40%")]
        fn budget40;
        #[checkpointed(budget = "0.6")]
        fn budget60;
        #[checkpointed(budget = "3 MiB")]
        fn budget3mib;
        #[checkpointed(budget = "1 KiB")]
        fn impossible;
    }
}

const BATCH: i64 = 1024;
const WIDTH: i64 = 64;

fn step_peak(f: impl Fn() -> Tensor, w: &Tensor) -> u64 {
    let ((), report) = ckpt::memory::measure(Device::Cpu, || {
        // `let`: the product `y * w` is a temporary, freed before backward.
        let loss = (f() * w).sum(Kind::Float);
        loss.backward();
    });
    u64::try_from(report.peak_above_baseline_bytes).unwrap()
}

/// The plan `function_plans` lists for the function whose name starts with `name`, for
/// a float CPU input of shape `shape`.
fn plan_of(name: &str, shape: &[i64]) -> ckpt::plan::Plan {
    let all = ckpt::plan::function_plans();
    let input = format!("[{shape:?} Float Cpu]");
    let mine: Vec<_> = all
        .iter()
        .filter(|p| p.function.starts_with(&format!("{name} (")) && p.input == input)
        .collect();
    assert_eq!(mine.len(), 1, "{name} {input}: {all:#?}");
    mine[0].plan.clone()
}

#[test]
fn measured_peak_of_auto_plans_matches_prediction_and_budget() {
    let _serial = serial();
    tch::manual_seed(0);
    let vs = nn::VarStore::new(Device::Cpu);
    let net = Net::new(&vs.root(), WIDTH, 16);
    let x = Tensor::randn([BATCH, WIDTH], (Kind::Float, Device::Cpu));
    let w = Tensor::randn([BATCH, WIDTH], (Kind::Float, Device::Cpu));
    // Steady state: parameter gradients exist.
    let _ = step_peak(|| net.plain(&x), &w);
    let plain = step_peak(|| net.plain(&x), &w);

    type Forward = fn(&Net, &Tensor) -> Tensor;
    let cases: [(&str, Forward); 4] = [
        ("Net::auto", Net::auto),
        ("Net::budget40", Net::budget40),
        ("Net::budget60", Net::budget60),
        ("Net::budget3mib", Net::budget3mib),
    ];
    let mut seen = Vec::new();
    for (name, f) in cases {
        // The first call profiles and plans; the second is the measured step.
        let _ = step_peak(|| f(&net, &x), &w);
        let measured = step_peak(|| f(&net, &x), &w);
        let mut plan = plan_of(name, &[BATCH, WIDTH]);
        plan.set_measured_peak_bytes(measured);
        println!("#[checkpointed], {name}:\n{plan}\n");
        assert_eq!(
            plan.len(),
            17,
            "one stage per statement, the last one (pure) profiled too"
        );
        let predicted = plan.predicted_peak_bytes();
        let error = (measured as f64 - predicted as f64).abs() / predicted as f64;
        assert!(
            error <= 0.10,
            "{name}: measured {measured} vs predicted {predicted}"
        );
        if let Some(budget) = plan.budget_bytes() {
            assert!(predicted <= budget);
            assert!(measured <= budget, "{name}: {measured} over {budget}");
        }
        assert!(measured < plain, "{name}: {measured} vs plain {plain}");
        seen.push(plan.cuts().to_vec());
    }
    seen.dedup();
    assert_eq!(seen.len(), 4, "four different plans: {seen:?}");
    // The plain run's prediction against the unannotated function.
    let plan = plan_of("Net::auto", &[BATCH, WIDTH]);
    let error =
        (plain as f64 - plan.plain_peak_bytes() as f64).abs() / plan.plain_peak_bytes() as f64;
    assert!(
        error <= 0.10,
        "plain: measured {plain} vs predicted {}",
        plan.plain_peak_bytes()
    );
}

#[test]
fn auto_gradients_equal_the_plain_function_bit_for_bit() {
    let _serial = serial();
    tch::manual_seed(1);
    let vs = nn::VarStore::new(Device::Cpu);
    let net = Net::new(&vs.root(), 16, 16);
    let x = Tensor::randn([256, 16], (Kind::Float, Device::Cpu));
    let run = |f: &dyn Fn(&Tensor) -> Tensor| common::grads_and_output(&vs, &x, f);
    let reference = run(&|x| net.plain(x));
    type Forward = fn(&Net, &Tensor) -> Tensor;
    let cases: [(&str, Forward); 3] = [
        ("auto", Net::auto),
        ("budget40", Net::budget40),
        ("budget60", Net::budget60),
    ];
    for (name, f) in cases {
        for call in 0..2 {
            let before = ckpt::live_segments();
            let got = run(&|x| {
                let y = f(&net, x);
                if call == 1 {
                    // The second call runs the cached plan, checkpointed.
                    assert!(ckpt::live_segments() > before, "{name}: no segment");
                }
                y
            });
            for (i, (a, b)) in reference.iter().zip(&got).enumerate() {
                assert!(a.equal(b), "{name}, call {call}: tensor {i} differs");
            }
            assert_eq!(ckpt::live_segments(), before);
        }
    }
}

/// Several values cross the statements: a skip connection over the whole chain, a
/// `&[Tensor]` parameter, a `&str`, an owned `bool` used by many statements and the last,
/// a tuple pattern, an integer, dropout (random, replayed), `self`.
#[derive(Debug, ShallowClone)]
struct Mixer {
    a: nn::Linear,
    b: nn::Linear,
}

macro_rules! mixer_body {
    ($($(#[$attr:meta])* fn $name:ident;)*) => {$(
        $(#[$attr])*
        fn $name(&self, xs: &Tensor, extra: &[Tensor], act: &str, train: bool) -> (Tensor, i64) {
            let skip = xs.tanh();
            let (h, n) = (self.a.forward(xs), extra.len() as i64);
            let h = if act == "gelu" { h.gelu("none") } else { h.relu() };
            let h = h.dropout(0.5, train) + &extra[0];
            let g = self.b.forward(&h);
            let g = g * (n as f64);
            let h = (&h * g.sigmoid()).dropout(0.2, train);
            let h = self.a.forward(&h) + &extra[1];
            (h + skip * if train { 1.0 } else { 0.5 }, n)
        }
    )*};
}

impl Mixer {
    mixer_body! {
        fn plain;
        #[checkpointed(segments = auto)]
        fn auto;
        #[checkpointed(budget = "90%", preserve_rng_state = true)]
        fn budget;
    }
}

#[test]
fn several_live_values_and_parameter_kinds() {
    let _serial = serial();
    tch::manual_seed(2);
    let vs = nn::VarStore::new(Device::Cpu);
    let m = Mixer {
        a: nn::linear(vs.root() / "a", 32, 32, Default::default()),
        b: nn::linear(vs.root() / "b", 32, 32, Default::default()),
    };
    let x = Tensor::randn([1024, 32], (Kind::Float, Device::Cpu));
    let extra = [
        Tensor::randn([1024, 32], (Kind::Float, Device::Cpu)),
        Tensor::randn([1024, 32], (Kind::Float, Device::Cpu)),
    ];
    let run = |f: &dyn Fn(&Tensor) -> (Tensor, i64), seed: i64| {
        for v in vs.trainable_variables() {
            let mut g = v.grad();
            if g.defined() {
                let _ = g.zero_();
            }
        }
        let xl = x.detach().set_requires_grad(true);
        tch::manual_seed(seed);
        let (y, n) = f(&xl);
        assert_eq!(n, 2);
        (&y * &y).sum(Kind::Float).backward();
        let mut out: Vec<Tensor> = [&m.a.ws, &m.b.ws, m.a.bs.as_ref().unwrap()]
            .iter()
            .map(|v| v.grad().copy())
            .collect();
        out.push(xl.grad().copy());
        out.push(y.detach().copy());
        out
    };
    for (act, train) in [("gelu", true), ("relu", true), ("relu", false)] {
        let reference = run(&|x| m.plain(x, &extra, act, train), 7);
        type Forward = fn(&Mixer, &Tensor, &[Tensor], &str, bool) -> (Tensor, i64);
        for (name, f) in [("auto", Mixer::auto as Forward), ("budget", Mixer::budget)] {
            // Profile and plan first (the profile draws dropout masks), then compare.
            let _ = run(&|x| f(&m, x, &extra, act, train), 0);
            let got = run(&|x| f(&m, x, &extra, act, train), 7);
            for (i, (a, b)) in reference.iter().zip(&got).enumerate() {
                assert!(a.equal(b), "{name} {act} {train}: tensor {i} differs");
            }
        }
    }
    // One plan per value of the hashable arguments (`act`, `train`) and input shape.
    let plans: Vec<_> = ckpt::plan::function_plans()
        .into_iter()
        .filter(|p| p.function.starts_with("Mixer::budget ("))
        .collect();
    assert_eq!(plans.len(), 3, "{plans:#?}");
    // The budget forces at least one checkpointed segment.
    assert!(plans.iter().all(|p| p.plan.segments() > 1), "{plans:#?}");
}

/// A `mut` binding assigned in a statement (the `assign` rule's escape hatch) is moved
/// into that statement and put back.
#[checkpointed(budget = "90%")]
fn mutated(xs: &Tensor) -> Tensor {
    let mut h = xs.tanh();
    let k = h.exp();
    #[ckpt::allow(assign)]
    h = &h * &k;
    let g = h.sigmoid();
    g + h * k
}

fn mutated_plain(xs: &Tensor) -> Tensor {
    let mut h = xs.tanh();
    let k = h.exp();
    h = &h * &k;
    let g = h.sigmoid();
    g + h * k
}

#[test]
fn assigned_bindings_cross_statements() {
    let _serial = serial();
    tch::manual_seed(4);
    let x = Tensor::randn([1024, 64], (Kind::Float, Device::Cpu));
    let grad = |f: fn(&Tensor) -> Tensor| {
        let xl = x.detach().set_requires_grad(true);
        let y = f(&xl);
        y.sum(Kind::Float).backward();
        (y.detach(), xl.grad())
    };
    let (y0, g0) = grad(mutated_plain);
    for _ in 0..2 {
        let (y, g) = grad(mutated);
        assert!(y.equal(&y0) && g.equal(&g0));
    }
    let plan = plan_of("mutated", &[1024, 64]);
    assert_eq!(plan.len(), 5, "four statements and the (pure) last one");
    assert!(plan.segments() > 1, "{plan}");
}

#[test]
fn impossible_budget_panics_with_the_smallest_feasible_one() {
    let _serial = serial();
    tch::manual_seed(3);
    let vs = nn::VarStore::new(Device::Cpu);
    let net = Net::new(&vs.root(), 16, 16);
    let x = Tensor::randn([64, 16], (Kind::Float, Device::Cpu));
    let panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| net.impossible(&x)))
        .expect_err("a budget of 1 KiB is impossible");
    let message = panic.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(
        message.starts_with("Net::impossible (")
            && message.contains("memory budget of 1.00 KiB (1024 B, ")
            && message.contains(
                " % of the plain run's peak) is too small: the smallest feasible peak of this chain is"
            ),
        "{message}"
    );
    // Without grad nothing is planned, and the function runs.
    let y = tch::no_grad(|| net.impossible(&x));
    assert!(y.equal(&net.plain(&x)));
}

/// `segments = auto` runs statements as stages: an outer `mut` binding changed by a
/// statement through a method (`reverse`) is that statement's output too, so the next
/// statement sees the change, with grad and under `no_grad`.
#[checkpointed(segments = auto)]
fn reversed_rows(xs: &Tensor) -> Tensor {
    let mut order: Vec<i64> = vec![0, 1, 2];
    order.reverse();
    xs.index_select(0, &Tensor::from_slice(&order))
        .sum_dim_intlist(1, false, Kind::Float)
}

#[test]
fn auto_statements_keep_changes_to_mut_bindings() {
    let _g = serial(); // profiling resets the memory meter's peak
    let xs = Tensor::from_slice(&[1.0f32, 2.0, 3.0])
        .view([3, 1])
        .set_requires_grad(true);
    let want = Tensor::from_slice(&[3.0f32, 2.0, 1.0]);
    assert!(tch::no_grad(|| reversed_rows(&xs)).equal(&want));
    assert!(reversed_rows(&xs).equal(&want));
}

/// A hashed argument that a stage uses is part of the plan's input, so a step counter
/// makes a new plan per call; the function keeps the newest
/// `ckpt::plan::MAX_PLANS_PER_FUNCTION`.
#[checkpointed(segments = auto)]
fn stepped(xs: &Tensor, step: usize) -> Tensor {
    let h = xs.tanh() * (step as f64);
    let h = h.sigmoid();
    h.sum(Kind::Float)
}

#[test]
fn plans_per_function_are_bounded() {
    let _g = serial();
    let xs = Tensor::randn([4, 3], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let max = ckpt::plan::MAX_PLANS_PER_FUNCTION;
    let count = || {
        ckpt::plan::function_plans()
            .iter()
            .filter(|p| p.function.starts_with("stepped ("))
            .count()
    };
    for step in 0..max + 6 {
        stepped(&xs, step).backward();
        assert_eq!(count(), (step + 1).min(max), "after step {step}");
    }
}

#[derive(Debug, ShallowClone)]
struct Reshaper {
    lin: nn::Linear,
    bn: nn::BatchNorm,
}

impl Reshaper {
    /// Fails in its second statement for a batch that is not a multiple of 7.
    #[checkpointed(segments = auto)]
    fn forward(&self, xs: &Tensor) -> Tensor {
        let h = xs.apply(&self.lin).relu();
        let h = h.view([-1, 7]).relu();
        h.view([-1, 8])
    }
}

/// A stage that panics while `segments = auto` profiles it: the panic reaches the caller,
/// and grad mode, the random streams and batch norm's running statistics are as before
/// (the profiler holds them in guards, which unwinding releases).
#[test]
fn a_panic_while_profiling_leaves_grad_mode_and_statistics_alone() {
    let _serial = serial();
    tch::manual_seed(9);
    let vs = nn::VarStore::new(Device::Cpu);
    let m = Reshaper {
        lin: nn::linear(vs.root() / "lin", 8, 8, Default::default()),
        bn: nn::batch_norm1d(vs.root() / "bn", 8, Default::default()),
    };
    let bad = Tensor::randn([3, 8], (Kind::Float, Device::Cpu));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| m.forward(&bad)));
    assert!(r.is_err(), "the shape error reaches the caller");
    let probe = Tensor::ones([1], (Kind::Float, Device::Cpu)).set_requires_grad(true) * 2.0;
    assert!(probe.requires_grad(), "grad mode is on again");
    // Running statistics are updated by a training forward again (not left frozen).
    let before = m.bn.running_mean.copy();
    let _ =
        m.bn.forward_t(&Tensor::randn([4, 8], (Kind::Float, Device::Cpu)), true);
    assert!(!m.bn.running_mean.equal(&before), "statistics not frozen");
    // And the function works on a good batch.
    let good = Tensor::randn([7, 8], (Kind::Float, Device::Cpu));
    let y = m.forward(&good);
    assert_eq!(y.size(), [7, 8]);
}
