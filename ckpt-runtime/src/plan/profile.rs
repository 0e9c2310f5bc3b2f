//! Profiling a chain of modules for the planner, running it with a [`Plan`], and
//! [`SequentialPlanner`], which does both with a plan cached per input shape.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use tch::nn::{Module, ModuleT};
use tch::{Device, Kind, Tensor};

use super::{ChainCost, KeepCost, MASKS, Objective, Plan, StageCost};
use crate::checkpoint::{self, CheckpointOptions, Policy};
use crate::ffi::{GradMode, PolicyProbe};
use crate::memory;
use crate::sequential::{chain, run_chain};
use crate::{CkptError, ShallowClone};

/// Measures the [`ChainCost`] of running `input` through `modules` in order: one
/// profiling step per stage, exact bytes from [`memory`] on `input`'s device. This is
/// [`profile_chain`] with `step(i, x) = modules[i].forward(x)`; see there for what is
/// measured and how.
///
/// # Panics
///
/// When [`f_profile_sequential`] returns an error, or a module panics.
pub fn profile_sequential<M: Module>(modules: &[M], input: &Tensor) -> ChainCost {
    f_profile_sequential(modules, input).unwrap_or_else(|e| panic!("{e}"))
}

/// The fallible twin of [`profile_sequential`].
///
/// # Errors
///
/// As [`f_profile_chain`].
pub fn f_profile_sequential<M: Module>(
    modules: &[M],
    input: &Tensor,
) -> Result<ChainCost, CkptError> {
    f_profile_chain(modules.len(), input, |i, xs| modules[i].forward(xs))
}

/// [`profile_sequential`] for [`ModuleT`] modules, with the train flag.
///
/// # Panics
///
/// When [`f_profile_sequential_t`] returns an error, or a module panics.
pub fn profile_sequential_t<M: ModuleT>(modules: &[M], input: &Tensor, train: bool) -> ChainCost {
    f_profile_sequential_t(modules, input, train).unwrap_or_else(|e| panic!("{e}"))
}

/// The fallible twin of [`profile_sequential_t`].
///
/// # Errors
///
/// As [`f_profile_chain`].
pub fn f_profile_sequential_t<M: ModuleT>(
    modules: &[M],
    input: &Tensor,
    train: bool,
) -> Result<ChainCost, CkptError> {
    f_profile_chain(modules.len(), input, |i, xs| {
        modules[i].forward_t(xs, train)
    })
}

/// Measures the [`ChainCost`] of a chain of `len` stages given as a closure over stage
/// indices: `step(i, x_i)` runs stage `i` on its input and returns `x_{i+1}`, the chain
/// starting from `x_0 = input`. One profiling step per stage, exact bytes from
/// [`memory`] on `input`'s device. `model!`'s `segments = auto` profiles its stages with
/// it; [`profile_sequential`] is it over a slice of modules.
///
/// Per stage `i`, on the stage's input `x_i` detached from everything before it (so that
/// nothing upstream is counted) and set to require grad when it is a float tensor:
///
/// 1. a no-grad warm-up run (first-call allocations such as the cuBLAS workspace, and
///    lazy initialisation, must not count as the stage's);
/// 2. a forward with grad inside [`memory::measure`]: `kept_bytes` is what it retained
///    (the output and the tensors saved for backward), `forward_extra_bytes` its peak
///    above that, `forward_seconds` its wall time (CUDA synchronised);
/// 3. a backward of that output with a gradient of ones, for the input only
///    (`Tensor::run_backward(&[y], &[x_i], ..)`, so no parameter's `.grad` changes):
///    `backward_extra_bytes` is its peak above the kept bytes and the incoming gradient.
///    Parameter-gradient temporaries are therefore not seen; stages whose input or
///    output does not require grad (an embedding of integer ids) get 0.
///
/// `input_bytes` is `x_i`'s size (`numel × element size`), `output_bytes` the final
/// output's, and `checkpoint_bytes` is measured on a one-element probe segment that draws
/// a random number (the RNG state copy that [`checkpoint`](crate::checkpoint) keeps for a
/// segment that draws random numbers; an upper bound, since one that draws none keeps
/// none). The profile costs about two
/// forwards and one backward of the chain, one stage at a time, so its own peak is about
/// one stage's.
///
/// Side effects: on CUDA it resets the device's peak counter ([`memory::reset_peak`]; on
/// CPU the peak seen by an enclosing [`memory::measure`] is kept). Random
/// ops in the stages (dropout) run, but the generators' states (CPU, and every CUDA
/// device's) are saved before and restored after, so the random streams are as if the
/// profile had not run.
///
/// # Panics
///
/// When [`f_profile_chain`] returns an error, or `step` panics.
pub fn profile_chain<F>(len: usize, input: &Tensor, step: F) -> ChainCost
where
    F: FnMut(usize, &Tensor) -> Tensor,
{
    f_profile_chain(len, input, step).unwrap_or_else(|e| panic!("{e}"))
}

/// The fallible twin of [`profile_chain`].
///
/// # Errors
///
/// As [`memory::f_stats`] for `input`'s device (CPU and CUDA are supported);
/// [`CkptError::Torch`] when libtorch fails in the probe segment.
pub fn f_profile_chain<F>(len: usize, input: &Tensor, step: F) -> Result<ChainCost, CkptError>
where
    F: FnMut(usize, &Tensor) -> Tensor,
{
    profile(&CheckpointOptions::new(), len, input, step)
}

pub(crate) fn nbytes(t: &Tensor) -> u64 {
    if !t.defined() {
        return 0;
    }
    (t.numel() * t.kind().elt_size_in_bytes()) as u64
}

pub(crate) fn differentiable(t: &Tensor) -> bool {
    t.defined()
        && matches!(
            t.kind(),
            Kind::Half
                | Kind::Float
                | Kind::Double
                | Kind::BFloat16
                | Kind::ComplexHalf
                | Kind::ComplexFloat
                | Kind::ComplexDouble
        )
}

/// `t` detached from its graph, and a leaf requiring grad when it is a float tensor.
pub(crate) fn detached_leaf(t: &Tensor) -> Tensor {
    if differentiable(t) {
        t.detach().set_requires_grad(true)
    } else {
        t.detach()
    }
}

fn sync(device: Device) {
    if let Device::Cuda(i) = device {
        tch::Cuda::synchronize(i as i64);
    }
}

fn non_negative(bytes: i64) -> u64 {
    u64::try_from(bytes).unwrap_or(0)
}

/// What [`measure_stage`] measured of one stage (see [`StageCost`] for the meaning).
pub(crate) struct StageFigures {
    pub kept_bytes: u64,
    pub forward_extra_bytes: u64,
    pub backward_extra_bytes: u64,
    pub forward_seconds: f64,
}

/// The measuring core of every profiler: `run(true)`, a warm-up under `no_grad` whose
/// result is dropped, then `run(false)` with grad inside [`memory::measure`], then a
/// backward from the differentiable tensors that `roots` picks out of its result
/// (gradients of ones, which are subtracted) to `inputs` (the stage's detached leaves;
/// those that do not require grad are skipped).
pub(crate) fn measure_stage<R>(
    device: Device,
    mut run: impl FnMut(bool) -> R,
    roots: impl FnOnce(&R) -> Vec<Tensor>,
    inputs: &[Tensor],
) -> Result<(R, StageFigures), CkptError> {
    // Guards, not `tch::no_grad(..)` / `tch::with_grad(..)`, which leave grad mode as
    // they set it when the closure panics.
    drop({
        let _no_grad = GradMode::set(false);
        run(true)
    });
    sync(device);
    let ((out, elapsed), fwd) = memory::f_measure(device, || {
        let start = Instant::now();
        let out = {
            let _grad = GradMode::set(true);
            run(false)
        };
        sync(device);
        (out, start.elapsed())
    })?;
    let kept_bytes = non_negative(fwd.retained_bytes);
    let forward_extra_bytes = non_negative(fwd.peak_above_baseline_bytes - fwd.retained_bytes);
    let roots: Vec<Tensor> = roots(&out)
        .into_iter()
        .filter(|y| differentiable(y) && y.requires_grad())
        .collect();
    let inputs: Vec<&Tensor> = inputs
        .iter()
        .filter(|x| x.defined() && x.requires_grad())
        .collect();
    let mut backward_extra_bytes = 0;
    if !roots.is_empty() && !inputs.is_empty() {
        let root_refs: Vec<&Tensor> = roots.iter().collect();
        let (grads, bwd) = memory::f_measure(device, || {
            let _grad = GradMode::set(true);
            Tensor::f_run_backward(&root_refs, &inputs, false, false)
        })?;
        if grads.is_ok() {
            let incoming: u64 = roots.iter().map(nbytes).sum();
            backward_extra_bytes =
                non_negative(bwd.peak_above_baseline_bytes).saturating_sub(incoming);
        }
    }
    Ok((
        out,
        StageFigures {
            kept_bytes,
            forward_extra_bytes,
            backward_extra_bytes,
            forward_seconds: seconds(elapsed),
        },
    ))
}

pub(crate) fn profile<G>(
    options: &CheckpointOptions,
    len: usize,
    input: &Tensor,
    mut step: G,
) -> Result<ChainCost, CkptError>
where
    G: FnMut(usize, &Tensor) -> Tensor,
{
    let device = input.device();
    memory::f_stats(device)?;
    // Profiling runs the stages (dropout included) several times; the random streams
    // must not notice, so that the first profiled step draws what an unprofiled one would.
    let _rng = crate::ffi::RngFork::new();
    // Nor batch norm's running statistics: the real step updates them, once.
    let _stats = crate::ffi::FrozenRunningStats::new();
    let mut stages = Vec::with_capacity(len);
    let mut x = input.detach();
    for i in 0..len {
        let xd = detached_leaf(&x);
        let (y, fig) = measure_stage(
            device,
            |warm| {
                let segment = || format!("ckpt::plan profiling, stage {i}");
                checkpoint::run_plain(segment, || step(i, if warm { &x } else { &xd }))
            },
            |y| y.iter().map(Tensor::shallow_clone).collect(),
            std::slice::from_ref(&xd),
        )?;
        let y = y?;
        let (masks, selective) = measure_policies(device, |leaf| {
            let segment = || format!("ckpt::plan profiling, stage {i} (policies)");
            let xs = if leaf {
                detached_leaf(&x)
            } else {
                x.shallow_clone()
            };
            checkpoint::run_plain(segment, || step(i, &xs))
        });
        stages.push(StageCost {
            input_bytes: nbytes(&x),
            kept_bytes: fig.kept_bytes,
            forward_extra_bytes: fig.forward_extra_bytes,
            backward_extra_bytes: fig.backward_extra_bytes,
            forward_seconds: fig.forward_seconds,
            masks,
            selective,
        });
        x = y.detach();
    }
    Ok(ChainCost {
        output_bytes: nbytes(&x),
        checkpoint_bytes: probe_checkpoint_bytes(options, device)?,
        stages,
    })
}

/// What a stage keeps and what its recompute costs under the two selective policies the
/// planner chooses from ([`StageCost::masks`], [`StageCost::selective`]), measured with
/// the runtime's own policy kernels (`csrc/policy.cpp`) on a cache outside any segment:
/// `run(false)` under `no_grad` records as a checkpointed segment's forward would (the
/// kept bytes are what the cache then holds: linear outputs, dropout masks and generator
/// states), and `run(true)` with grad, on a detached leaf, replays as its recompute
/// would, timed. A policy that keeps nothing in the stage (no linear layer, no CPU
/// dropout in training mode) gets `None` without a timed run; so does one whose run
/// fails. Cost: per stage and policy that keeps something, one forward without grad and
/// one with grad.
pub(crate) fn measure_policies<T>(
    device: Device,
    mut run: impl FnMut(bool) -> Result<T, CkptError>,
) -> (Option<KeepCost>, Option<KeepCost>) {
    let mut one = |policy: Policy| -> Option<KeepCost> {
        let probe = PolicyProbe::new(policy.bits())?;
        {
            let _no_grad = GradMode::set(false);
            drop(probe.record(|| run(false)).ok()?);
        }
        let kept_bytes = probe.bytes();
        if kept_bytes == 0 {
            return None;
        }
        sync(device);
        let start = Instant::now();
        let out = {
            let _grad = GradMode::set(true);
            probe.replay(|| run(true))
        };
        sync(device);
        let elapsed = start.elapsed();
        drop(out.ok()?);
        Some(KeepCost {
            kept_bytes,
            recompute_seconds: seconds(elapsed),
        })
    };
    let selective = one(Policy::selective());
    // Dropout masks are part of what the selective policy keeps: nothing kept there,
    // nothing kept with masks alone.
    let masks = selective.and_then(|_| one(MASKS));
    (masks, selective)
}

fn seconds(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// What a checkpointed segment keeps besides its stash: the retained bytes of a
/// one-element segment that draws a random number minus those of the same computation
/// run plainly (with `preserve_rng_state`, the generator snapshot; an upper bound, since
/// a segment that draws no random numbers keeps none).
pub(crate) fn probe_checkpoint_bytes(
    options: &CheckpointOptions,
    device: Device,
) -> Result<u64, CkptError> {
    // Under grad, or `checkpoint::run` would run the closure plainly.
    tch::with_grad(|| {
        let probe = Tensor::zeros([1], (Kind::Float, device));
        let (plain, r_plain) = memory::f_measure(device, || &probe + 1.0)?;
        let (ckpt, r_ckpt) = memory::f_measure(device, || {
            // The probe draws a random number, as a segment with dropout does, so that
            // the generator snapshot is counted: a segment that draws none keeps none,
            // so the figure is an upper bound.
            checkpoint::run(
                options,
                "ckpt::plan profiling probe".into(),
                |x: Tensor| {
                    drop(x.rand_like());
                    &x + 1.0
                },
                probe.shallow_clone(),
            )
        })?;
        let ckpt: Tensor = ckpt?;
        let bytes = non_negative(r_ckpt.retained_bytes - r_plain.retained_bytes);
        drop((plain, ckpt));
        Ok(bytes)
    })
}

fn check_len(modules: usize, plan: &Plan) -> Result<(), CkptError> {
    if modules != plan.len() {
        return Err(CkptError::InvalidArgument(format!(
            "the plan is for a chain of {} stages, but {modules} modules were given",
            plan.len()
        )));
    }
    Ok(())
}

/// Runs `input` through `modules` in order, cut as `plan` says: every segment but the
/// last is checkpointed, the last runs plainly. This is
/// [`checkpoint_sequential`](crate::checkpoint_sequential) with arbitrary cut points
/// (a [`Plan`] from [`ChainCost::plan`], or any cuts through [`ChainCost::evaluate`]).
///
/// # Panics
///
/// When [`f_checkpoint_sequential_plan`] returns an error.
#[track_caller]
pub fn checkpoint_sequential_plan<M>(modules: &[M], plan: &Plan, input: &Tensor) -> Tensor
where
    M: Module + ShallowClone + 'static,
{
    f_checkpoint_sequential_plan(modules, plan, input).unwrap_or_else(|e| panic!("{e}"))
}

/// The fallible twin of [`checkpoint_sequential_plan`].
///
/// # Errors
///
/// [`CkptError::InvalidArgument`] when the plan is for a chain of another length; as
/// [`crate::f_checkpoint`] for a failing module.
#[track_caller]
pub fn f_checkpoint_sequential_plan<M>(
    modules: &[M],
    plan: &Plan,
    input: &Tensor,
) -> Result<Tensor, CkptError>
where
    M: Module + ShallowClone + 'static,
{
    check_len(modules.len(), plan)?;
    run_chain(
        modules,
        &plan.ranges(),
        plan.policies(),
        input,
        |m: &M, xs: &Tensor| m.forward(xs),
    )
}

/// [`checkpoint_sequential_plan`] for [`ModuleT`] modules, with the train flag.
///
/// # Panics
///
/// When [`f_checkpoint_sequential_plan_t`] returns an error.
#[track_caller]
pub fn checkpoint_sequential_plan_t<M>(
    modules: &[M],
    plan: &Plan,
    input: &Tensor,
    train: bool,
) -> Tensor
where
    M: ModuleT + ShallowClone + 'static,
{
    f_checkpoint_sequential_plan_t(modules, plan, input, train).unwrap_or_else(|e| panic!("{e}"))
}

/// The fallible twin of [`checkpoint_sequential_plan_t`].
///
/// # Errors
///
/// As [`f_checkpoint_sequential_plan`].
#[track_caller]
pub fn f_checkpoint_sequential_plan_t<M>(
    modules: &[M],
    plan: &Plan,
    input: &Tensor,
    train: bool,
) -> Result<Tensor, CkptError>
where
    M: ModuleT + ShallowClone + 'static,
{
    check_len(modules.len(), plan)?;
    run_chain(
        modules,
        &plan.ranges(),
        plan.policies(),
        input,
        move |m: &M, xs: &Tensor| m.forward_t(xs, train),
    )
}

/// The chain run plainly (under `no_grad`), a panic of a module being
/// [`CkptError::ClosurePanicked`] as in a checkpointed run.
fn plain_chain<M>(
    modules: &[M],
    input: &Tensor,
    step: impl Fn(&M, &Tensor) -> Tensor,
) -> Result<Tensor, CkptError> {
    checkpoint::run_plain(
        || {
            format!(
                "SequentialPlanner chain (modules 0..{}, no grad)",
                modules.len()
            )
        },
        || chain(modules, input.shallow_clone(), step),
    )
}

/// The key of a cached plan: what the profile depends on besides the modules.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct InputKey {
    size: Vec<i64>,
    kind: Kind,
    device: Device,
    train: Option<bool>,
}

impl InputKey {
    pub(crate) fn new(input: &Tensor, train: Option<bool>) -> Self {
        InputKey {
            size: input.size(),
            kind: input.kind(),
            device: input.device(),
            train,
        }
    }
}

/// `checkpoint_sequential` with the cuts chosen for you: on the first call for an input
/// shape (size, dtype, device, train flag) it profiles the chain
/// ([`profile_sequential`]), plans for its [`Objective`] ([`ChainCost::plan`]) and
/// caches the plan; every call runs the chain with the cached plan
/// ([`checkpoint_sequential_plan`]).
///
/// One planner belongs to one chain of modules: the cache is keyed by the input alone.
///
/// ```no_run
/// # extern crate ckpt_runtime as ckpt;
/// use ckpt::plan::{Budget, Objective, SequentialPlanner};
/// # fn f(layers: &[tch::nn::Linear], xs: &tch::Tensor) {
/// let mut planner = SequentialPlanner::new(Objective::Budget("40%".parse().unwrap()));
/// let ys = planner.forward(layers, xs); // profiles and plans on the first call
/// println!("{}", planner.plan_for(xs, None).unwrap());
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct SequentialPlanner {
    objective: Objective,
    plans: HashMap<InputKey, Plan>,
}

impl SequentialPlanner {
    /// A planner with an empty cache.
    pub fn new(objective: Objective) -> Self {
        SequentialPlanner {
            objective,
            plans: HashMap::new(),
        }
    }

    /// What the planner optimises.
    pub fn objective(&self) -> Objective {
        self.objective
    }

    /// The cached plan for inputs like `input` (`train`: `None` for [`Module`] chains,
    /// the flag for [`ModuleT`] ones), if that shape was planned.
    pub fn plan_for(&self, input: &Tensor, train: Option<bool>) -> Option<&Plan> {
        self.plans.get(&InputKey::new(input, train))
    }

    /// Forgets every cached plan.
    pub fn clear(&mut self) {
        self.plans.clear();
    }

    /// The plan for `input`: the cached one, or a new one from a profile of `modules`.
    ///
    /// # Errors
    ///
    /// As [`f_profile_sequential`] and [`ChainCost::plan`] (notably
    /// [`CkptError::BudgetTooSmall`]).
    pub fn f_plan<M: Module>(&mut self, modules: &[M], input: &Tensor) -> Result<&Plan, CkptError> {
        let objective = self.objective;
        self.plan_with(InputKey::new(input, None), || {
            f_profile_sequential(modules, input)?.plan(&objective)
        })
    }

    /// [`SequentialPlanner::f_plan`] for [`ModuleT`] modules.
    ///
    /// # Errors
    ///
    /// As [`SequentialPlanner::f_plan`].
    pub fn f_plan_t<M: ModuleT>(
        &mut self,
        modules: &[M],
        input: &Tensor,
        train: bool,
    ) -> Result<&Plan, CkptError> {
        let objective = self.objective;
        self.plan_with(InputKey::new(input, Some(train)), || {
            f_profile_sequential_t(modules, input, train)?.plan(&objective)
        })
    }

    fn plan_with(
        &mut self,
        key: InputKey,
        make: impl FnOnce() -> Result<Plan, CkptError>,
    ) -> Result<&Plan, CkptError> {
        use std::collections::hash_map::Entry;
        match self.plans.entry(key) {
            Entry::Occupied(e) => Ok(e.into_mut()),
            Entry::Vacant(e) => Ok(e.insert(make()?)),
        }
    }

    /// Runs `input` through `modules` with the plan for its shape (profiling and planning
    /// on first sight). Under `no_grad` it runs the chain plainly and plans nothing.
    ///
    /// # Panics
    ///
    /// When [`SequentialPlanner::f_forward`] returns an error.
    #[track_caller]
    pub fn forward<M>(&mut self, modules: &[M], input: &Tensor) -> Tensor
    where
        M: Module + ShallowClone + 'static,
    {
        self.f_forward(modules, input)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// The fallible twin of [`SequentialPlanner::forward`].
    ///
    /// # Errors
    ///
    /// As [`SequentialPlanner::f_plan`] and [`f_checkpoint_sequential_plan`].
    #[track_caller]
    pub fn f_forward<M>(&mut self, modules: &[M], input: &Tensor) -> Result<Tensor, CkptError>
    where
        M: Module + ShallowClone + 'static,
    {
        let step = |m: &M, xs: &Tensor| m.forward(xs);
        if !crate::ffi::grad_enabled() {
            return plain_chain(modules, input, step);
        }
        let plan = self.f_plan(modules, input)?;
        check_len(modules.len(), plan)?;
        run_chain(modules, &plan.ranges(), plan.policies(), input, step)
    }

    /// [`SequentialPlanner::forward`] for [`ModuleT`] modules, with the train flag.
    ///
    /// # Panics
    ///
    /// When [`SequentialPlanner::f_forward_t`] returns an error.
    #[track_caller]
    pub fn forward_t<M>(&mut self, modules: &[M], input: &Tensor, train: bool) -> Tensor
    where
        M: ModuleT + ShallowClone + 'static,
    {
        self.f_forward_t(modules, input, train)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// The fallible twin of [`SequentialPlanner::forward_t`].
    ///
    /// # Errors
    ///
    /// As [`SequentialPlanner::f_forward`].
    #[track_caller]
    pub fn f_forward_t<M>(
        &mut self,
        modules: &[M],
        input: &Tensor,
        train: bool,
    ) -> Result<Tensor, CkptError>
    where
        M: ModuleT + ShallowClone + 'static,
    {
        let step = move |m: &M, xs: &Tensor| m.forward_t(xs, train);
        if !crate::ffi::grad_enabled() {
            return plain_chain(modules, input, step);
        }
        let plan = self.f_plan_t(modules, input, train)?;
        check_len(modules.len(), plan)?;
        run_chain(modules, &plan.ranges(), plan.policies(), input, step)
    }
}
