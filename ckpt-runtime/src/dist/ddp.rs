//! `DistributedDataParallel` over c10d's Reducer.

use std::cell::Cell;

use tch::{Tensor, nn::VarStore};

use super::agree::{kind_code, kind_name};
use super::{ProcessGroup, ffi::RawDdp};
use crate::CkptError;

/// Options of [`DistributedDataParallel`], PyTorch's defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct DdpOptions {
    /// Size limit of a gradient bucket, in MiB (PyTorch's `bucket_cap_mb`, default 25).
    pub bucket_cap_mb: f64,
    /// Size limit of the first bucket reduced (the last parameters), in MiB (PyTorch's
    /// `first_bucket_bytes_cap`, default 1 MiB): it fills early in backward, so its
    /// all-reduce starts early.
    pub first_bucket_cap_mb: f64,
    /// Allow parameters that get no gradient in some steps (layers a step skips).
    /// Under [`DdpOptions::static_graph`] (the default) the Reducer learns the unused
    /// set in the first step without this; set it for a graph that changes between steps
    /// together with `static_graph = false`. Its gradient is left untouched on every rank
    /// when no rank used it. The search for unused parameters walks the autograd graph
    /// from the forward's outputs, where a checkpointed segment shows only the tensors
    /// `ckpt` sees (its inputs, and the parameters the macros and
    /// `CheckpointOptions::parameters` list): a parameter a `checkpoint` closure
    /// captures unlisted is taken for unused, then its gradient arrives from the
    /// recompute, and backward fails with PyTorch's "marked as ready twice". List such
    /// parameters, or keep the static graph.
    pub find_unused_parameters: bool,
    /// The Reducer's static-graph mode (PyTorch's `static_graph=True`), the default here
    /// because it makes every checkpointed model correct. Parameters that `ckpt` sees
    /// (captured through `ShallowClone` by the macros and `checkpoint_sequential*`, or
    /// listed with `CheckpointOptions::parameters`) are inputs of the checkpoint node and
    /// have their gradient-accumulation hook fire once per backward, which either mode
    /// accepts; a tensor a closure captures unseen has it fire once per segment that uses
    /// it, since the segment's recompute runs its own backward inside the engine. In
    /// static-graph mode the Reducer counts the hooks of each parameter in the first step
    /// and marks the parameter ready for all-reduce after its last one; that first step is
    /// reduced at the end of backward by a callback queued on the outermost graph task
    /// (Python DDP's `_DDPSink`). The set of parameters used, and how often, must then be
    /// the same every step. With `false`, an unseen capture used by two segments is an
    /// error ("Expected to mark a variable ready only once").
    pub static_graph: bool,
    /// Broadcast rank 0's buffers (the variables that do not require grad: batch norm's
    /// running statistics, frozen parameters) to every rank before each synchronized
    /// forward, as Python DDP's `broadcast_buffers=True` (the default) does, so that every
    /// rank evaluates the same model.
    pub broadcast_buffers: bool,
    /// Record the order in which buckets are all-reduced during each backward and how far
    /// backward had come (see [`DistributedDataParallel::last_bucket_launches`]). It
    /// installs a communication hook equivalent to the default (divide by the world
    /// size, then sum) that records each launch.
    pub record_bucket_launches: bool,
}

impl Default for DdpOptions {
    fn default() -> Self {
        DdpOptions {
            bucket_cap_mb: 25.0,
            first_bucket_cap_mb: 1.0,
            find_unused_parameters: false,
            static_graph: true,
            broadcast_buffers: true,
            record_bucket_launches: false,
        }
    }
}

/// Bucket all-reduces of the last backward, in launch order (recorded with
/// [`DdpOptions::record_bucket_launches`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BucketLaunches {
    /// `(bucket index, gradient-accumulation hooks fired before the launch)`. The hook
    /// that completes a bucket launches it before it is itself counted, so a launch
    /// with `fired + 1 < hooks_total` started while backward still had gradients to
    /// compute.
    pub launches: Vec<(usize, u64)>,
    /// Gradient-accumulation hooks fired in the whole backward.
    pub hooks_total: u64,
}

/// PyTorch's `DistributedDataParallel` for a tch model, on c10d's `Reducer`.
///
/// At construction it checks that every rank has the same parameters (number, shapes,
/// dtypes; c10d's `verify_params_across_processes`, as Python DDP does), broadcasts
/// rank 0's parameters and buffers to every rank, and assigns the parameters to buckets
/// as Python DDP does (`compute_bucket_assignment_by_size` with limits
/// [`DdpOptions::first_bucket_cap_mb`], [`DdpOptions::bucket_cap_mb`], buckets in
/// reverse parameter order; after the first steps the Reducer rebuilds them in the order
/// gradients actually arrive).
///
/// Run each forward through [`DistributedDataParallel::forward`] and call
/// `loss.backward()` on a loss computed from its output: as gradients are accumulated,
/// full buckets are all-reduced while backward continues, and when `backward()` returns
/// every rank's `.grad` is the average over ranks, i.e. the gradient of the mean loss
/// over the global batch when each rank's loss is the mean over its shard. Any
/// `nn::Optimizer` then takes the same step on every rank.
///
/// Checkpointed models (`#[checkpointed]`, `model!`, [`crate::checkpoint`]) are correct
/// under the default [`DdpOptions::static_graph`] mode, including a layer shared by
/// several segments. Not supported: parameters on several devices, sparse gradients,
/// `create_graph = true`, communication hooks.
pub struct DistributedDataParallel {
    raw: RawDdp,
    group: ProcessGroup,
    sync: Cell<bool>,
    n_params: usize,
    // Broadcast before each synchronized forward (empty without `broadcast_buffers`).
    buffers: Vec<Tensor>,
}

impl std::fmt::Debug for DistributedDataParallel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DistributedDataParallel")
            .field("group", &self.group)
            .field("parameters", &self.n_params)
            .finish()
    }
}

fn mib(x: f64, what: &str) -> Result<i64, CkptError> {
    if !(x.is_finite() && x > 0.0) {
        return Err(CkptError::InvalidArgument(format!(
            "{what} must be a positive number of MiB, got {x}"
        )));
    }
    Ok((x * 1024.0 * 1024.0) as i64)
}

/// Checks, before anything else is exchanged, that every rank passes as many parameters
/// and buffers as rank 0, of the same dtypes and shapes. c10d's own check
/// (`verify_params_across_processes`) compares only parameter counts and shapes, and
/// a different number of dimensions makes its metadata broadcast itself mismatched
/// (Gloo then aborts a process); a dtype or buffer that differs would pass and the
/// broadcast of rank 0's values would silently leave garbage. Two all-gathers of
/// int64 metadata: `[n_params, n_buffers, total dims]`, then, when those agree,
/// per tensor its dtype code and number of dimensions, then all sizes.
fn check_same_tensors(
    group: &ProcessGroup,
    params: &[Tensor],
    buffers: &[Tensor],
) -> Result<(), CkptError> {
    let device = params.first().map_or(tch::Device::Cpu, Tensor::device);
    let all: Vec<&Tensor> = params.iter().chain(buffers).collect();
    let dims: i64 = all.iter().map(|t| t.dim() as i64).sum();
    let head = [params.len() as i64, buffers.len() as i64, dims];
    let gathered = group.f_all_gather(&Tensor::from_slice(&head).to_device(device))?;
    let rank = group.rank();
    for (r, g) in gathered.iter().enumerate() {
        let other = Vec::<i64>::try_from(&g.to_device(tch::Device::Cpu))
            .map_err(|e| CkptError::Dist(e.to_string()))?;
        if other[..2] != head[..2] {
            return Err(CkptError::Dist(format!(
                "DistributedDataParallel expects the same model on every rank, but rank \
                 {rank} has {} trainable parameters and {} buffers, while rank {r} has {} \
                 and {}",
                head[0], head[1], other[0], other[1]
            )));
        }
        if other[2] != dims {
            return Err(CkptError::Dist(format!(
                "DistributedDataParallel expects the same model on every rank, but the \
                 shapes of rank {rank}'s parameters and buffers have {dims} dimensions in \
                 all, those of rank {r} {}",
                other[2]
            )));
        }
    }
    let mut meta: Vec<i64> = all.iter().map(|t| kind_code(t.kind())).collect();
    meta.extend(all.iter().map(|t| t.dim() as i64));
    for t in &all {
        meta.extend(t.size());
    }
    let gathered = group.f_all_gather(&Tensor::from_slice(&meta).to_device(device))?;
    let n = all.len();
    let describe = |m: &[i64], i: usize| {
        let start = 2 * n + m[n..n + i].iter().sum::<i64>() as usize;
        let sizes = &m[start..start + m[n + i] as usize];
        format!("{} {sizes:?}", kind_name(m[i]))
    };
    for (r, g) in gathered.iter().enumerate() {
        let other = Vec::<i64>::try_from(&g.to_device(tch::Device::Cpu))
            .map_err(|e| CkptError::Dist(e.to_string()))?;
        if other == meta {
            continue;
        }
        let i = (0..n)
            .find(|&i| describe(&other, i) != describe(&meta, i))
            .unwrap_or(0);
        let what = if i < params.len() {
            format!("parameter {i}")
        } else {
            format!("buffer {}", i - params.len())
        };
        return Err(CkptError::Dist(format!(
            "DistributedDataParallel expects the same model on every rank, but {what} is \
             {} on rank {rank} and {} on rank {r} (parameters in creation order, \
             buffers by name)",
            describe(&meta, i),
            describe(&other, i)
        )));
    }
    Ok(())
}

impl DistributedDataParallel {
    /// Wraps the trainable variables of `vs` that require grad (in creation order, which
    /// must be the same on every rank: build the model the same way everywhere); its
    /// other variables (buffers, frozen parameters, including trainable ones frozen with
    /// `set_requires_grad(false)` or `vs.freeze()`) are broadcast from rank 0 at
    /// construction and, with [`DdpOptions::broadcast_buffers`], before each
    /// synchronized forward, sorted by name.
    ///
    /// # Panics
    ///
    /// On the errors of [`DistributedDataParallel::f_new`].
    pub fn new(group: &ProcessGroup, vs: &VarStore, opts: DdpOptions) -> Self {
        Self::f_new(group, vs, opts).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`DistributedDataParallel::new`], returning errors: [`CkptError::Dist`] when the
    /// ranks' parameters differ (c10d's message names the parameter) or a peer does not
    /// answer, [`CkptError::InvalidArgument`] for bad options or no trainable variable.
    pub fn f_new(group: &ProcessGroup, vs: &VarStore, opts: DdpOptions) -> Result<Self, CkptError> {
        // A trainable variable frozen later (`set_requires_grad(false)`, `vs.freeze()`)
        // stays in tch's trainable list: like Python DDP, skip it in the Reducer; it is
        // broadcast with the buffers below.
        let params: Vec<Tensor> = vs
            .trainable_variables()
            .into_iter()
            .filter(Tensor::requires_grad)
            .collect();
        let mut named: Vec<(String, Tensor)> = vs
            .variables()
            .into_iter()
            .filter(|(_, t)| !t.requires_grad())
            .collect();
        named.sort_by(|a, b| a.0.cmp(&b.0));
        let buffers: Vec<Tensor> = named.into_iter().map(|(_, t)| t).collect();
        Self::f_from_tensors(group, &params, &buffers, opts)
    }

    /// Wraps explicit parameters (each must require grad; same order on every rank) and
    /// buffers (broadcast from rank 0 once).
    ///
    /// # Panics
    ///
    /// On the errors of [`DistributedDataParallel::f_from_tensors`].
    pub fn from_tensors(
        group: &ProcessGroup,
        params: &[Tensor],
        buffers: &[Tensor],
        opts: DdpOptions,
    ) -> Self {
        Self::f_from_tensors(group, params, buffers, opts).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`DistributedDataParallel::from_tensors`], returning the errors of
    /// [`DistributedDataParallel::f_new`].
    pub fn f_from_tensors(
        group: &ProcessGroup,
        params: &[Tensor],
        buffers: &[Tensor],
        opts: DdpOptions,
    ) -> Result<Self, CkptError> {
        let bucket = mib(opts.bucket_cap_mb, "bucket_cap_mb")?;
        let first = mib(opts.first_bucket_cap_mb, "first_bucket_cap_mb")?;
        if params.is_empty() {
            return Err(CkptError::InvalidArgument(
                "DistributedDataParallel needs at least one parameter that requires grad \
                 (none given, or all frozen)"
                    .into(),
            ));
        }
        if let Some(i) = params.iter().position(|p| !p.requires_grad()) {
            return Err(CkptError::InvalidArgument(format!(
                "parameter {i} does not require grad"
            )));
        }
        check_same_tensors(group, params, buffers)?;
        let raw = RawDdp::new(
            group.raw(),
            params,
            buffers,
            bucket,
            first,
            opts.find_unused_parameters,
            opts.static_graph,
            opts.record_bucket_launches,
        )?;
        Ok(DistributedDataParallel {
            raw,
            group: group.clone(),
            sync: Cell::new(true),
            n_params: params.len(),
            buffers: if opts.broadcast_buffers {
                buffers.iter().map(Tensor::shallow_clone).collect()
            } else {
                Vec::new()
            },
        })
    }

    /// The process group.
    pub fn group(&self) -> &ProcessGroup {
        &self.group
    }

    /// Runs the model's forward `f` as a DDP forward and returns its output, through
    /// which the next `backward()` reduces gradients. Inside [`DistributedDataParallel::no_sync`]
    /// gradients are only accumulated locally.
    ///
    /// # Panics
    ///
    /// On the errors of [`DistributedDataParallel::f_forward`], and when `f` panics.
    pub fn forward(&self, f: impl FnOnce() -> Tensor) -> Tensor {
        self.f_forward(f).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`DistributedDataParallel::forward`], returning c10d's errors (for example a
    /// previous backward that did not finish reducing).
    pub fn f_forward(&self, f: impl FnOnce() -> Tensor) -> Result<Tensor, CkptError> {
        let mut outs = self.f_forward_many(|| vec![f()])?;
        Ok(outs.remove(0))
    }

    /// [`DistributedDataParallel::forward`] for a forward with several output tensors.
    pub fn f_forward_many(
        &self,
        f: impl FnOnce() -> Vec<Tensor>,
    ) -> Result<Vec<Tensor>, CkptError> {
        let sync = self.sync.get();
        if sync && !self.buffers.is_empty() && crate::ffi::grad_enabled() {
            // 250 MiB: Python DDP's `broadcast_bucket_size`.
            self.group
                .raw()
                .broadcast_coalesced(&self.buffers, 250 << 20, 0)?;
        }
        self.raw.pre_forward(sync)?;
        let outs = f();
        self.raw.post_forward(&outs, sync)
    }

    /// Gradient accumulation (PyTorch's `ddp.no_sync()`): while the returned guard
    /// lives, forwards do not all-reduce in backward; gradients add up locally. The first
    /// forward after the guard is dropped reduces the accumulated gradients.
    pub fn no_sync(&self) -> NoSync<'_> {
        let prev = self.sync.replace(false);
        NoSync { ddp: self, prev }
    }

    /// Elements (not bytes) of each gradient bucket, in reduction order.
    pub fn bucket_sizes(&self) -> Vec<usize> {
        let d = self.raw.describe().unwrap_or_default();
        d.split('|')
            .next()
            .unwrap_or("")
            .split(';')
            .filter_map(|b| b.split(':').nth(1)?.parse().ok())
            .collect()
    }

    /// The bucket all-reduces of the last backward, when
    /// [`DdpOptions::record_bucket_launches`] is set (empty otherwise).
    pub fn last_bucket_launches(&self) -> BucketLaunches {
        let d = self.raw.describe().unwrap_or_default();
        let mut parts = d.split('|');
        let _ = parts.next();
        let launches = parts
            .next()
            .unwrap_or("")
            .split(';')
            .filter_map(|l| {
                let (b, h) = l.split_once('@')?;
                Some((b.parse().ok()?, h.parse().ok()?))
            })
            .collect();
        let hooks_total = parts.next().and_then(|h| h.parse().ok()).unwrap_or(0);
        BucketLaunches {
            launches,
            hooks_total,
        }
    }
}

/// Guard of [`DistributedDataParallel::no_sync`].
#[derive(Debug)]
pub struct NoSync<'a> {
    ddp: &'a DistributedDataParallel,
    prev: bool,
}

impl Drop for NoSync<'_> {
    fn drop(&mut self) {
        self.ddp.sync.set(self.prev);
    }
}
