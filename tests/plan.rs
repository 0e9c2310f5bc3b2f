//! `ckpt::plan` on a real chain (issue 7): on a 64-block residual MLP, the measured peak
//! of the planner's plan is within 10 % of its prediction and within the budget;
//! `checkpoint_sequential_plan` gives the plain gradients; `SequentialPlanner` caches a
//! plan per input shape.

use std::sync::{Mutex, MutexGuard, PoisonError};

use ckpt::ShallowClone;
use ckpt::plan::{Budget, ChainCost, Objective, Plan, SequentialPlanner};
use tch::nn::{self, Module};
use tch::{Device, Kind, Tensor};

/// `x + relu(linear(x))`.
#[derive(Debug)]
struct Block(nn::Linear);

impl Module for Block {
    fn forward(&self, xs: &Tensor) -> Tensor {
        xs + self.0.forward(xs).relu()
    }
}

impl ShallowClone for Block {
    fn shallow_clone(&self) -> Self {
        Block(self.0.shallow_clone())
    }
}

/// The memory meter and `live_segments` are process-wide: the tests of this file take
/// turns.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

const BATCH: i64 = 1024;
const WIDTH: i64 = 64;
/// Bytes of one activation, `[BATCH, WIDTH]` f32.
const ACT: u64 = (BATCH * WIDTH * 4) as u64;

fn chain(vs: &nn::VarStore, len: usize) -> Vec<Block> {
    (0..len)
        .map(|i| {
            Block(nn::linear(
                vs.root() / format!("b{i}"),
                WIDTH,
                WIDTH,
                Default::default(),
            ))
        })
        .collect()
}

/// The loss: `(y * w).sum()` hands back a fresh gradient of `y`'s size (as cross-entropy
/// or MSE do; the cost model's assumption); `y.sum()` a free expanded scalar.
#[derive(Debug, Clone, Copy)]
enum Loss {
    Weighted,
    Sum,
}

/// Peak tensor bytes above the baseline of one forward + backward with `plan`.
fn measured_peak(blocks: &[Block], plan: &Plan, x: &Tensor, w: &Tensor, loss: Loss) -> u64 {
    let ((), report) = ckpt::memory::measure(Device::Cpu, || {
        let y = ckpt::checkpoint_sequential_plan(blocks, plan, x);
        let l = match loss {
            Loss::Weighted => (y * w).sum(Kind::Float),
            Loss::Sum => y.sum(Kind::Float),
        };
        l.backward();
    });
    u64::try_from(report.peak_above_baseline_bytes).unwrap()
}

fn zero_grads(vs: &nn::VarStore) {
    for v in vs.trainable_variables() {
        let mut g = v.grad();
        if g.defined() {
            let _ = g.zero_();
        }
    }
}

#[test]
fn measured_peak_matches_prediction_and_budget() {
    let _serial = serial();
    ckpt::memory::enable();
    tch::manual_seed(0);
    let vs = nn::VarStore::new(Device::Cpu);
    let blocks = chain(&vs, 64);
    let x = Tensor::randn([BATCH, WIDTH], (Kind::Float, Device::Cpu));
    let w = Tensor::randn([BATCH, WIDTH], (Kind::Float, Device::Cpu));

    let costs: ChainCost = ckpt::plan::profile_sequential(&blocks, &x);
    assert_eq!(costs.len(), 64);
    for s in &costs.stages {
        // The input; relu's saved output and the block's output; linear's output while
        // relu runs; backward: relu's gradient (linear's input gradient replaces it).
        assert_eq!(s.input_bytes, ACT);
        assert_eq!(s.kept_bytes, 2 * ACT);
        assert_eq!(s.forward_extra_bytes, ACT);
        assert_eq!(s.backward_extra_bytes, ACT);
        assert!(s.forward_seconds > 0.0);
    }
    assert_eq!(costs.output_bytes, ACT);
    assert_eq!(costs.checkpoint_bytes, 5056); // the CPU generator's state

    // Steady state: parameter gradients exist (allocated by a first step).
    ckpt::checkpoint_sequential(&blocks, 1, &x)
        .sum(Kind::Float)
        .backward();

    let objectives = [
        Objective::MinPeak,
        Objective::Budget("20%".parse().unwrap()),
        Objective::Budget("0.3".parse().unwrap()),
        Objective::Budget("12 MiB".parse().unwrap()),
        Objective::Budget("80%".parse().unwrap()),
    ];
    let mut seen = Vec::new();
    for objective in objectives {
        // With the planner choosing each segment's policy (here: keeping the blocks'
        // linear outputs or not), the prediction holds as well; the budget is checked
        // for the materialised loss gradient (`y.sum()`'s expanded one adds up to an
        // activation, the model error the module docs describe).
        let mut chosen = costs.plan(&objective).unwrap();
        for loss in [Loss::Weighted, Loss::Sum] {
            let measured = measured_peak(&blocks, &chosen, &x, &w, loss);
            chosen.set_measured_peak_bytes(measured);
            println!("{objective:?}, {loss:?} loss, policies chosen:\n{chosen}\n");
            let predicted = chosen.predicted_peak_bytes();
            let error = (measured as f64 - predicted as f64).abs() / predicted as f64;
            assert!(error <= 0.10, "{objective:?}, {loss:?}: {chosen}");
            if let (Some(budget), Loss::Weighted) = (chosen.budget_bytes(), loss) {
                assert!(measured <= budget, "{objective:?}: {chosen}");
            }
        }
        // The rest is about the cuts of full recompute.
        let mut plan = costs
            .plan_with(&objective, &[ckpt::Policy::RECOMPUTE_ALL])
            .unwrap();
        let predicted = plan.predicted_peak_bytes();
        for loss in [Loss::Weighted, Loss::Sum] {
            let measured = measured_peak(&blocks, &plan, &x, &w, loss);
            plan.set_measured_peak_bytes(measured);
            println!("{objective:?}, {loss:?} loss:\n{plan}\n");
            let error = (measured as f64 - predicted as f64).abs() / predicted as f64;
            assert!(
                error <= 0.10,
                "{objective:?}, {loss:?}: measured {measured} vs predicted {predicted}"
            );
            if let Some(budget) = plan.budget_bytes() {
                assert!(predicted <= budget);
                assert!(
                    measured <= budget,
                    "{objective:?}, {loss:?}: measured {measured} over budget {budget}"
                );
            }
        }
        seen.push(plan.cuts().to_vec());
    }
    // Five different plans, from many short segments to one long checkpointed prefix.
    seen.dedup();
    assert_eq!(seen.len(), 5);
    // Least peak: 15 segments shrinking from 8 stages to 1 (about sqrt(4 L)), 14 % of the
    // plain run's predicted peak.
    assert_eq!(
        seen[0],
        [8, 15, 22, 28, 34, 39, 44, 48, 52, 55, 58, 60, 62, 63]
    );
}

#[test]
fn planned_run_gives_plain_gradients() {
    let _serial = serial();
    tch::manual_seed(1);
    let vs = nn::VarStore::new(Device::Cpu);
    let blocks = chain(&vs, 10);
    let x = Tensor::randn([8, WIDTH], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let grads = |loss: Tensor| -> Vec<Tensor> {
        zero_grads(&vs);
        let mut gx = x.grad();
        if gx.defined() {
            let _ = gx.zero_();
        }
        loss.backward();
        let mut out: Vec<Tensor> = vs
            .trainable_variables()
            .iter()
            .map(|v| v.grad().copy())
            .collect();
        out.push(x.grad().copy());
        out
    };
    let plain = grads(
        blocks
            .iter()
            .fold(x.shallow_clone(), |h, b| b.forward(&h))
            .sum(Kind::Float),
    );
    let costs = ckpt::plan::profile_sequential(&blocks, &x);
    for cuts in [&[][..], &[3], &[1, 2, 7], &[1, 2, 3, 4, 5, 6, 7, 8, 9]] {
        let plan = costs.evaluate(cuts).unwrap();
        assert_eq!(plan.segments(), cuts.len() + 1);
        let y = ckpt::checkpoint_sequential_plan(&blocks, &plan, &x);
        assert_eq!(ckpt::live_segments(), cuts.len() as i64);
        let got = grads(y.sum(Kind::Float));
        drop(y);
        for (a, b) in got.iter().zip(&plain) {
            assert!(a.equal(b), "cuts {cuts:?}: gradients differ");
        }
        assert_eq!(ckpt::live_segments(), 0);
    }
    // A plan for another chain length is an error.
    let other = ckpt::plan::profile_sequential(&blocks[..4], &x)
        .plan_min_peak()
        .unwrap();
    let err = ckpt::f_checkpoint_sequential_plan(&blocks, &other, &x).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid argument: the plan is for a chain of 4 stages, but 10 modules were given"
    );
}

#[test]
fn impossible_budget_names_the_smallest_feasible_one() {
    let _serial = serial();
    tch::manual_seed(2);
    let vs = nn::VarStore::new(Device::Cpu);
    let blocks = chain(&vs, 16);
    let x = Tensor::randn([BATCH, WIDTH], (Kind::Float, Device::Cpu));
    let costs = ckpt::plan::profile_sequential(&blocks, &x);
    // Profiling computes input gradients only: no parameter got a `.grad`.
    assert!(vs.trainable_variables().iter().all(|v| !v.grad().defined()));
    let least = costs.plan_min_peak().unwrap().predicted_peak_bytes();
    let err = costs.plan_within(Budget::Bytes(1 << 20)).unwrap_err();
    assert_eq!(
        err,
        ckpt::CkptError::BudgetTooSmall {
            budget_bytes: 1 << 20,
            min_bytes: least,
            plain_bytes: costs.plain_peak_bytes().unwrap(),
            marked_keep: false,
        }
    );
    assert!(err.to_string().contains(&format!("({least} B, ")), "{err}");
    assert!(costs.plan_within(Budget::Bytes(least)).is_ok());
}

#[test]
fn planner_profiles_once_per_input_shape() {
    let _serial = serial();
    tch::manual_seed(3);
    let vs = nn::VarStore::new(Device::Cpu);
    let blocks = chain(&vs, 12);
    let mut planner = SequentialPlanner::new(Objective::Budget("50%".parse().unwrap()));
    let small = Tensor::randn([64, WIDTH], (Kind::Float, Device::Cpu));
    let large = Tensor::randn([256, WIDTH], (Kind::Float, Device::Cpu));
    assert!(planner.plan_for(&small, None).is_none());

    let want = blocks
        .iter()
        .fold(small.shallow_clone(), |h, b| b.forward(&h));
    let got = planner.forward(&blocks, &small);
    assert!(got.equal(&want));
    let first = planner.plan_for(&small, None).unwrap().clone();
    assert!(first.segments() > 1);
    assert!(first.predicted_peak_bytes() <= first.plain_peak_bytes() / 2);
    // Same shape: the cached plan, no new profile.
    let _ = planner.forward(&blocks, &small);
    assert_eq!(planner.plan_for(&small, None), Some(&first));
    // Another shape gets its own plan; activations scale with the batch.
    let _ = planner.forward(&blocks, &large);
    // (The cuts may differ: the planner also chooses each segment's policy, from
    // measured times.)
    let second = planner.plan_for(&large, None).unwrap();
    assert_eq!(second.plain_peak_bytes(), 4 * first.plain_peak_bytes());
    assert_eq!(second.budget_bytes(), Some(second.plain_peak_bytes() / 2));
    assert!(second.predicted_peak_bytes() <= second.plain_peak_bytes() / 2);
    // Under no_grad nothing is planned.
    planner.clear();
    let _ = tch::no_grad(|| planner.forward(&blocks, &small));
    assert!(planner.plan_for(&small, None).is_none());
}

/// `x + relu(linear(x))` that counts its forward runs (forward and recomputes).
#[derive(Debug)]
struct Counted {
    lin: nn::Linear,
    runs: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Module for Counted {
    fn forward(&self, xs: &Tensor) -> Tensor {
        self.runs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        xs + self.lin.forward(xs).relu()
    }
}

impl ShallowClone for Counted {
    fn shallow_clone(&self) -> Self {
        Counted {
            lin: self.lin.shallow_clone(),
            runs: std::sync::Arc::clone(&self.runs),
        }
    }
}

/// Binomial checkpointing (issue 7, item 4): at most `r` recomputes of a stage, the
/// plain gradients, and less memory than the best one-level plan when few stashes are
/// allowed.
#[test]
fn binomial_checkpointing_bounds_recomputes_and_memory() {
    use std::sync::atomic::Ordering;
    let _serial = serial();
    tch::manual_seed(4);
    let vs = nn::VarStore::new(Device::Cpu);
    let blocks: Vec<Counted> = chain(&vs, 64)
        .into_iter()
        .map(|b| Counted {
            lin: b.0,
            runs: Default::default(),
        })
        .collect();
    let x = Tensor::randn([BATCH, WIDTH], (Kind::Float, Device::Cpu));
    let w = Tensor::randn([BATCH, WIDTH], (Kind::Float, Device::Cpu));
    let step = |f: &dyn Fn() -> Tensor| {
        for b in &blocks {
            b.runs.store(0, Ordering::Relaxed);
        }
        let ((), report) = ckpt::memory::measure(Device::Cpu, || {
            let loss = (f() * &w).sum(Kind::Float);
            loss.backward();
        });
        let runs: Vec<usize> = blocks
            .iter()
            .map(|b| b.runs.load(Ordering::Relaxed))
            .collect();
        let mut grads: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
        grads.sort_by(|a, b| a.0.cmp(&b.0));
        let grads: Vec<Tensor> = grads.iter().map(|(_, v)| v.grad().copy()).collect();
        zero_grads(&vs);
        (report.peak_above_baseline_bytes as u64, runs, grads)
    };
    let plain = || blocks.iter().fold(x.shallow_clone(), |h, b| b.forward(&h));
    let _ = step(&plain); // allocates the parameters' gradients
    let (_, runs, reference) = step(&plain);
    assert!(runs.iter().all(|&r| r == 1));

    let least = ckpt::plan::profile_sequential(&blocks, &x)
        .plan_min_peak()
        .unwrap();
    let (one_level, runs, grads) = step(&|| ckpt::checkpoint_sequential_plan(&blocks, &least, &x));
    assert!(runs.iter().all(|&r| r <= 2));
    assert_all_equal(&grads, &reference);

    for (snapshots, r) in [(3, 6), (4, 4), (8, 3)] {
        assert_eq!(ckpt::plan::binomial_repetitions(64, snapshots), Some(r));
        let (peak, runs, grads) =
            step(&|| ckpt::plan::checkpoint_sequential_binomial(&blocks, snapshots, &x));
        println!(
            "binomial, {snapshots} stashes: peak {peak} B ({:.1} activations), runs of a stage up to {} (bound 1 + {r}), {} in all; one level: {one_level} B ({:.1})",
            peak as f64 / ACT as f64,
            runs.iter().max().unwrap(),
            runs.iter().sum::<usize>(),
            one_level as f64 / ACT as f64
        );
        assert!(runs.iter().all(|&n| n <= 1 + r), "{runs:?}");
        assert_all_equal(&grads, &reference);
        if snapshots <= 4 {
            assert!(
                peak < one_level,
                "{snapshots} stashes: {peak} vs {one_level}"
            );
        }
    }
    let err = ckpt::plan::f_checkpoint_sequential_binomial(&blocks, 0, &x).unwrap_err();
    assert!(matches!(err, ckpt::CkptError::InvalidArgument(_)), "{err}");
}

fn assert_all_equal(a: &[Tensor], b: &[Tensor]) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(x.equal(y), "gradient {i} differs");
    }
}
