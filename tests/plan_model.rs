//! `model!` with `#[checkpointed(segments = auto)]` and `budget = ".."` (issue 7): on a
//! 64-block residual chain the measured peak of the planned step is within 10 % of the
//! prediction and within the budget; gradients equal the plain model's bit for bit; an
//! impossible budget is an error stating the smallest feasible one; the run-time
//! schedule setters; plans cached per input; on the transformer encoder of
//! `ckpt-models/src/encoder.rs` (small shapes) `auto` needs no more memory than the best
//! `segments = N` (the seed's shapes: `cargo run --release --example plan_encoder`).

mod common;

use std::sync::{Mutex, MutexGuard, PoisonError};

use ckpt::plan::{Budget, Objective, Schedule};
use ckpt::{CkptError, ShallowClone, model};
use tch::nn::{self, Module, ModuleT};
use tch::{Device, Kind, Tensor};

use ckpt_models::encoder;

/// The memory meter, `live_segments` and the global RNG are process-wide: the tests of
/// this file take turns.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `x + relu(linear(x))`, the block of `tests/plan.rs`.
#[derive(Debug, ShallowClone)]
struct Block {
    lin: nn::Linear,
}

impl Block {
    fn new(p: nn::Path, width: i64) -> Self {
        Block {
            lin: nn::linear(p, width, width, Default::default()),
        }
    }
}

impl Module for Block {
    fn forward(&self, xs: &Tensor) -> Tensor {
        xs + xs.apply(&self.lin).relu()
    }
}

model! {
    /// `layers` residual blocks, cut by the planner for the least peak.
    #[checkpointed(segments = auto)]
    struct Chain(p, width: i64, layers: usize) {
        blocks: [Block; layers] = Block::new(p, width),
    }
}

model! {
    /// The same chain, within 40 % of the plain run's predicted peak.
    #[checkpointed(budget = "40%")]
    struct BudgetChain(p, width: i64, layers: usize) {
        blocks: [Block; layers] = Block::new(p, width),
    }
}

model! {
    /// The same chain, not checkpointed.
    struct PlainChain(p, width: i64, layers: usize) {
        blocks: [Block; layers] = Block::new(p, width),
    }
}

const BATCH: i64 = 1024;
const WIDTH: i64 = 64;
/// Bytes of one activation, `[BATCH, WIDTH]` f32.
const ACT: u64 = (BATCH * WIDTH * 4) as u64;

/// Peak tensor bytes above the baseline of one forward + backward, with the loss
/// `(y * w).sum()` (a fresh gradient of `y`'s size, the cost model's assumption).
fn step_peak(model: &impl Module, x: &Tensor, w: &Tensor) -> u64 {
    let ((), report) = ckpt::memory::measure(Device::Cpu, || {
        let y = model.forward(x);
        // `let`: the product `y * w` is a temporary, freed before backward.
        let loss = (y * w).sum(Kind::Float);
        loss.backward();
    });
    u64::try_from(report.peak_above_baseline_bytes).unwrap()
}

#[test]
fn measured_peak_of_auto_plans_matches_prediction_and_budget() {
    let _serial = serial();
    tch::manual_seed(0);
    let vs = nn::VarStore::new(Device::Cpu);
    let mut chain = Chain::new(vs.root(), WIDTH, 64);
    let x = Tensor::randn([BATCH, WIDTH], (Kind::Float, Device::Cpu));
    let w = Tensor::randn([BATCH, WIDTH], (Kind::Float, Device::Cpu));
    assert_eq!(chain.stage_names().len(), 64);
    assert_eq!(chain.stage_names()[5], "blocks[5]");

    // Steady state: a first step allocates the parameters' gradients.
    chain.set_segments(1).unwrap();
    let _ = step_peak(&chain, &x, &w);

    let schedules = [
        Schedule::Auto(Objective::MinPeak),
        Schedule::Auto(Objective::Budget("20%".parse().unwrap())),
        Schedule::Auto(Objective::Budget("0.3".parse().unwrap())),
        Schedule::Auto(Objective::Budget("12 MiB".parse().unwrap())),
        Schedule::Auto(Objective::Budget("80%".parse().unwrap())),
    ];
    let mut seen = Vec::new();
    for schedule in schedules {
        chain.set_schedule(schedule.clone()).unwrap();
        let mut plan = chain.plan_for(&x).unwrap();
        let predicted = plan.predicted_peak_bytes();
        let measured = step_peak(&chain, &x, &w);
        plan.set_measured_peak_bytes(measured);
        println!("model!, {schedule}:\n{plan}\n");
        let error = (measured as f64 - predicted as f64).abs() / predicted as f64;
        assert!(
            error <= 0.10,
            "{schedule}: measured {measured} vs predicted {predicted}"
        );
        if let Some(budget) = plan.budget_bytes() {
            assert!(predicted <= budget);
            assert!(
                measured <= budget,
                "{schedule}: measured {measured} over budget {budget}"
            );
        }
        // The forward used exactly this plan: one live segment per checkpointed
        // segment (the planner may keep some: they run inline).
        let y = chain.forward(&x);
        let checkpointed = plan.modes().iter().filter(|m| m.is_checkpointed()).count();
        assert_eq!(ckpt::live_segments(), checkpointed as i64, "{plan}");
        drop(y);
        seen.push(plan.cuts().to_vec());
    }
    seen.dedup();
    assert_eq!(seen.len(), 5, "five different plans: {seen:?}");
    // The least-peak plan of the 64-block chain (the stage figures are those of
    // `tests/plan.rs`: input 1, kept 2, temporaries 1 activation): segments shrinking
    // from 8 stages to 1.
    assert_eq!(
        seen[0],
        [8, 15, 22, 28, 34, 39, 44, 48, 52, 55, 58, 60, 62, 63]
    );
    let plan = {
        chain.set_auto().unwrap();
        chain.plan_for(&x).unwrap()
    };
    // Plain: 64 stages kept (2 activations each) and the last one's backward (its
    // incoming gradient and temporaries).
    assert_eq!(plan.plain_peak_bytes(), 130 * ACT);
}

#[test]
fn auto_gradients_equal_the_plain_model_bit_for_bit() {
    let _serial = serial();
    tch::manual_seed(1);
    let vs_plain = nn::VarStore::new(Device::Cpu);
    let plain = PlainChain::new(vs_plain.root(), 16, 12);
    let x = Tensor::randn([512, 16], (Kind::Float, Device::Cpu));
    let grads =
        |vs: &nn::VarStore, f: &dyn Fn(&Tensor) -> Tensor| common::grads_and_output(vs, &x, f);
    let reference = grads(&vs_plain, &|x| plain.forward(x));

    for budget in [None, Some("60%"), Some("0.4")] {
        let mut vs = nn::VarStore::new(Device::Cpu);
        let mut chain = Chain::new(vs.root(), 16, 12);
        vs.copy(&vs_plain).unwrap();
        if let Some(b) = budget {
            chain.set_budget(b.parse().unwrap()).unwrap();
        }
        let plan = chain.plan_for(&x).unwrap();
        assert!(plan.segments() > 1, "{budget:?}: {plan}");
        let got = grads(&vs, &|x| chain.forward(x));
        for (i, (a, b)) in reference.iter().zip(&got).enumerate() {
            assert!(a.equal(b), "{budget:?}: tensor {i} differs");
        }
    }
}

#[test]
fn impossible_budget_is_an_error_stating_the_smallest_feasible_one() {
    let _serial = serial();
    tch::manual_seed(2);
    let vs = nn::VarStore::new(Device::Cpu);
    let mut chain = Chain::new(vs.root(), WIDTH, 16);
    let x = Tensor::randn([256, WIDTH], (Kind::Float, Device::Cpu));
    let least_peak = chain.plan_for(&x).unwrap();
    let (least, plain) = (
        least_peak.predicted_peak_bytes(),
        least_peak.plain_peak_bytes(),
    );
    chain.set_budget(Budget::Bytes(least - 1)).unwrap();
    let err = chain.plan_for(&x).unwrap_err();
    assert_eq!(
        err,
        CkptError::BudgetTooSmall {
            budget_bytes: least - 1,
            min_bytes: least,
            plain_bytes: plain,
            marked_keep: false,
        }
    );
    // The forward panics with the same message, naming the model.
    let panic = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| chain.forward(&x)))
        .expect_err("an impossible budget panics");
    let message = panic.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(
        message.starts_with("Chain::forward: memory budget of")
            && message.contains("smallest feasible peak of this chain is ")
            && message.ends_with(&format!(
                "({least} B, {:.1} % of the plain run's peak)",
                100.0 * least as f64 / plain as f64
            )),
        "{message}"
    );
    chain.set_budget(Budget::Bytes(least)).unwrap();
    assert_eq!(chain.plan_for(&x).unwrap().predicted_peak_bytes(), least);
}

#[test]
fn schedule_setters_and_their_errors() {
    let _serial = serial();
    tch::manual_seed(3);
    let vs = nn::VarStore::new(Device::Cpu);
    let mut chain = BudgetChain::new(vs.root(), 8, 9);
    // The declared schedule, parsed at compile time as `Budget::from_str` does.
    assert_eq!(
        chain.schedule(),
        Schedule::Auto(Objective::Budget("40%".parse().unwrap()))
    );
    let x = Tensor::randn([4, 8], (Kind::Float, Device::Cpu));
    let count = |chain: &BudgetChain| {
        let before = ckpt::live_segments();
        let y = chain.forward(&x);
        let n = ckpt::live_segments() - before;
        drop(y);
        n
    };
    // A sweep over `segments = n`, one declaration.
    for n in 1..=12 {
        chain.set_segments(n).unwrap();
        assert_eq!(chain.schedule(), Schedule::Segments(n));
        assert_eq!(count(&chain), n.min(9) as i64 - 1, "segments = {n}");
    }
    chain.set_schedule(Schedule::Cuts(vec![2, 7])).unwrap();
    assert_eq!(count(&chain), 2);
    // Fixed schedules' plans are their cuts evaluated on the profile.
    assert_eq!(chain.plan_for(&x).unwrap().cuts(), [2, 7]);
    for bad in [
        Schedule::Segments(0),
        Schedule::Cuts(vec![0, 3]),
        Schedule::Cuts(vec![4, 4]),
        Schedule::Cuts(vec![9]),
        Schedule::Auto(Objective::Budget(Budget::FractionOfPlain(f64::NAN))),
    ] {
        let e = chain.set_schedule(bad.clone()).unwrap_err();
        assert!(matches!(e, CkptError::InvalidArgument(_)), "{bad:?}: {e}");
        assert_eq!(chain.schedule(), Schedule::Cuts(vec![2, 7]), "unchanged");
    }
    // A plan of another chain.
    let vs2 = nn::VarStore::new(Device::Cpu);
    let other = Chain::new(vs2.root(), 8, 4).plan_for(&x).unwrap();
    let e = chain.set_plan(&other).unwrap_err();
    assert_eq!(
        e.to_string(),
        "invalid argument: the plan is for a chain of 4 stages, but `BudgetChain` has 9"
    );
    chain.set_auto().unwrap();
    let auto = chain.plan_for(&x).unwrap();
    chain.set_segments(3).unwrap();
    chain.set_plan(&auto).unwrap();
    assert_eq!(chain.schedule(), Schedule::Cuts(auto.cuts().to_vec()));
    // Without grad nothing is checkpointed and nothing is planned.
    chain.set_auto().unwrap();
    chain.clear_plans();
    let y = tch::no_grad(|| chain.forward(&x));
    assert_eq!(ckpt::live_segments(), 0);
    drop(y);
}

#[test]
fn plans_are_cached_per_input_shape_and_train_flag() {
    let _serial = serial();
    tch::manual_seed(4);
    let vs = nn::VarStore::new(Device::Cpu);
    let chain = Chain::new(vs.root(), WIDTH, 12);
    let small = Tensor::randn([64, WIDTH], (Kind::Float, Device::Cpu));
    let large = Tensor::randn([256, WIDTH], (Kind::Float, Device::Cpu));
    let first = chain.plan_for(&small).unwrap();
    // The same plan again, from the cache (the profile's times would differ).
    assert_eq!(chain.plan_for(&small).unwrap(), first);
    let second = chain.plan_for(&large).unwrap();
    assert_eq!(second.plain_peak_bytes(), 4 * first.plain_peak_bytes());
    // A shallow clone shares the cache.
    assert_eq!(chain.shallow_clone().plan_for(&small).unwrap(), first);
    // `Module` models: `forward_t` is `forward`, whatever the flag.
    let y = chain.forward_t(&small, true);
    assert!(y.equal(&chain.forward(&small)));
    chain.clear_plans();
    assert_eq!(
        chain.plan_for(&small).unwrap().predicted_peak_bytes(),
        first.predicted_peak_bytes()
    );
}

/// The profiling run of a model's first call keeps the peak that an enclosing
/// `memory::measure` saw before it.
#[test]
fn profiling_inside_measure_keeps_the_enclosing_peak() {
    let _serial = serial();
    tch::manual_seed(5);
    let vs = nn::VarStore::new(Device::Cpu);
    let chain = Chain::new(vs.root(), 16, 8);
    let x = Tensor::randn([64, 16], (Kind::Float, Device::Cpu));
    let ((), report) = ckpt::memory::measure(Device::Cpu, || {
        drop(Tensor::zeros([1 << 22], (Kind::Float, Device::Cpu))); // 16 MiB, freed
        chain.forward(&x).sum(Kind::Float).backward(); // profiles, then runs the plan
    });
    assert!(
        report.peak_above_baseline_bytes >= 16 << 20,
        "the 16 MiB peak before the profile is lost: {report:?}"
    );
}

#[test]
fn auto_is_at_least_as_good_as_every_segment_count_on_the_encoder() {
    let _serial = serial();
    tch::manual_seed(5);
    let c = encoder::SMALL;
    let vs = nn::VarStore::new(Device::Cpu);
    let mut model = encoder::Encoder::new(vs.root(), &c);
    let ids = Tensor::randint_low(1, c.vocab, [16, c.seq_len], (Kind::Int64, Device::Cpu));
    let labels = Tensor::randint(c.classes, [16], (Kind::Int64, Device::Cpu));
    let peak = |model: &encoder::Encoder| {
        let ((), report) = ckpt::memory::measure(Device::Cpu, || {
            let loss = model
                .forward_t(&ids, true)
                .cross_entropy_for_logits(&labels);
            loss.backward();
        });
        u64::try_from(report.peak_above_baseline_bytes).unwrap()
    };
    model.set_segments(1).unwrap();
    let _ = peak(&model); // allocates the parameters' gradients
    let stages = model.stage_names().len();
    assert_eq!(stages, 11);
    let sweep: Vec<u64> = (1..=stages)
        .map(|n| {
            model.set_segments(n).unwrap();
            peak(&model)
        })
        .collect();
    model.set_auto().unwrap();
    let plan = model.plan_for(&ids, true).unwrap();
    let auto = peak(&model);
    let best = *sweep.iter().min().unwrap();
    println!("encoder: sweep {sweep:?}, auto {auto} B, plan\n{plan}");
    assert!(auto <= best, "auto {auto} B > best segments = N {best} B");
    let error = (auto as f64 - plan.predicted_peak_bytes() as f64).abs()
        / plan.predicted_peak_bytes() as f64;
    assert!(error <= 0.10, "auto: measured {auto} vs {plan}");
}
