//! Profiling a chain for the planner: per stage, the bytes and seconds of the cost model
//! ([`StageCost`]), measured with the exact memory counter on a detached input.

use std::time::{Duration, Instant};

use tch::nn::{Module, ModuleT};
use tch::{Device, Kind, Tensor};

use super::{ChainCost, KeepCost, MASKS, NARROWING, StageCost};
use crate::CkptError;
use crate::checkpoint::{self, CheckpointOptions, Policy};
use crate::ffi::{GradMode, PolicyProbe};
use crate::memory;

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

impl StageFigures {
    /// The stage's [`StageCost`]: these figures, its input bytes, and what the masks and
    /// narrowing and selective policies keep and cost ([`measure_policies`]).
    pub(crate) fn cost(
        self,
        input_bytes: u64,
        PolicyCosts {
            masks,
            narrowing,
            selective,
        }: PolicyCosts,
    ) -> StageCost {
        StageCost {
            input_bytes,
            kept_bytes: self.kept_bytes,
            forward_extra_bytes: self.forward_extra_bytes,
            backward_extra_bytes: self.backward_extra_bytes,
            forward_seconds: self.forward_seconds,
            masks,
            narrowing,
            selective,
        }
    }
}

/// What [`measure_policies`] measured of one stage: a [`KeepCost`] for each policy the
/// planner models besides full recompute (see [`StageCost`]).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct PolicyCosts {
    pub masks: Option<KeepCost>,
    pub narrowing: Option<KeepCost>,
    pub selective: Option<KeepCost>,
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
        let policies = measure_policies(device, |leaf| {
            let segment = || format!("ckpt::plan profiling, stage {i} (policies)");
            let xs = if leaf {
                detached_leaf(&x)
            } else {
                x.shallow_clone()
            };
            checkpoint::run_plain(segment, || step(i, &xs))
        });
        stages.push(fig.cost(nbytes(&x), policies));
        x = y.detach();
    }
    Ok(ChainCost {
        output_bytes: nbytes(&x),
        checkpoint_bytes: probe_checkpoint_bytes(options, device)?,
        stages,
    })
}

/// What a stage keeps and what its recompute costs under the three policies besides full
/// recompute that the planner chooses from ([`StageCost::masks`], [`StageCost::narrowing`],
/// [`StageCost::selective`]), measured with
/// the runtime's own policy kernels (`csrc/policy.cpp`) on a cache outside any segment:
/// `run(false)` under `no_grad` records as a checkpointed segment's forward would (the
/// kept bytes are what the cache then holds: linear outputs, dropout masks and generator
/// states), and `run(true)` with grad, on a detached leaf, replays as its recompute
/// would, timed. A policy that keeps nothing in the stage (no linear layer, no CPU
/// dropout in training mode) gets `None` without a timed run; so does one whose run
/// fails, and `narrowing` where it keeps no more than `masks` (no narrowing linear: its
/// record runs, its replay is not timed). Cost: per stage and policy that keeps something, one forward without grad and
/// one with grad.
pub(crate) fn measure_policies<T>(
    device: Device,
    mut run: impl FnMut(bool) -> Result<T, CkptError>,
) -> PolicyCosts {
    // `floor`: a policy that keeps no more bytes than this is not timed (`None`).
    let mut one = |policy: Policy, floor: u64| -> Option<KeepCost> {
        let probe = PolicyProbe::new(policy.bits())?;
        {
            let _no_grad = GradMode::set(false);
            drop(probe.record(|| run(false)).ok()?);
        }
        let kept_bytes = probe.bytes();
        if kept_bytes <= floor {
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
    let selective = one(Policy::selective(), 0);
    // Dropout masks are part of what the selective policy keeps: nothing kept there,
    // nothing kept with masks alone.
    let masks = selective.and_then(|_| one(MASKS, 0));
    // Narrowing linears' outputs are part of it too. A stage with none keeps what masks
    // keeps: its replay is not timed, and the planner costs `narrowing` there as `masks`
    // ([`StageCost::keep`]).
    let narrowing = selective.and_then(|_| one(NARROWING, masks.map_or(0, |m| m.kept_bytes)));
    PolicyCosts {
        masks,
        narrowing,
        selective,
    }
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
