//! Data-parallel training on PyTorch's own distributed engine, c10d, from the libtorch
//! `ckpt` links: `TCPStore` / `PrefixStore` for rendezvous, `ProcessGroupGloo` for CPU
//! collectives, and the DDP `c10d::Reducer` (bucketed gradient all-reduce overlapped with
//! backward) behind [`DistributedDataParallel`]. No collective is home-made and no Python
//! runs.
//!
//! # Launching
//!
//! Every process (rank) runs the same program. The launcher sets the variables PyTorch's
//! `torchrun` sets — `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`,
//! `MASTER_ADDR`, `MASTER_PORT` — and [`init_from_env`] reads them:
//!
//! ```text
//! torchrun --no-python --nproc-per-node 2 ./target/release/examples/train
//! ```
//!
//! or, on one machine and without Python, with `ckpt`'s own launcher
//! ([`launch_local`], [`relaunch_self`] for a program's `--nproc N`), which sets the same
//! variables.
//!
//! Under torchrun's elastic agent (`TORCHELASTIC_USE_AGENT_STORE=True`) the agent
//! already serves the store on `MASTER_ADDR:MASTER_PORT`, so every rank, rank 0
//! included, connects as a client, and keys live under
//! `/worker/attempt_<TORCHELASTIC_RESTART_COUNT>` as in Python's `init_process_group`.
//! Otherwise rank 0 serves the store.
//!
//! # Example
//!
//! ```no_run
//! # extern crate ckpt_runtime as ckpt;
//! use ckpt::dist::{self, DdpOptions, DistributedDataParallel};
//! use tch::{nn, nn::Module, nn::OptimizerConfig, Device, Kind, Tensor};
//!
//! let pg = dist::init_from_env(); // RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...
//! let vs = nn::VarStore::new(Device::Cpu);
//! let model = nn::linear(vs.root(), 8, 2, Default::default());
//! // Broadcasts rank 0's parameters and checks every rank has the same shapes.
//! let ddp = DistributedDataParallel::new(&pg, &vs, DdpOptions::default());
//! let mut opt = nn::AdamW::default().build(&vs, 1e-3).unwrap();
//! let xs = Tensor::randn([4, 8], (Kind::Float, Device::Cpu)); // this rank's shard
//! let loss = ddp.forward(|| model.forward(&xs)).square().mean(Kind::Float);
//! opt.zero_grad();
//! loss.backward(); // gradients are all-reduced (averaged) bucket by bucket meanwhile
//! opt.step(); //      every rank takes the same step
//! ```
//!
//! Errors: every call has an `f_` twin returning [`CkptError::DistEnv`] (missing or
//! out-of-range launcher variables, bad arguments) or [`CkptError::Dist`] (c10d's
//! message: unreachable master, a peer that does not answer within the timeout, a port
//! in use, parameters that differ between ranks); the plain call panics with it.

mod agree;
mod ddp;
mod ffi;
mod launch;
mod sampler;

use std::sync::Arc;
use std::time::Duration;

use tch::Tensor;

pub use ddp::{BucketLaunches, DdpOptions, DistributedDataParallel, NoSync};
pub use launch::{LaunchResult, LocalLaunch, launch_local, relaunch_self, relaunch_self_from_args};
pub use sampler::DistributedSampler;

use crate::CkptError;
use agree::Collective;

/// PyTorch's default process-group timeout (`torch.distributed.default_pg_timeout`): 30
/// minutes. Store connection, rendezvous and every collective give up after it.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30 * 60);

/// The longest timeout c10d is given: 100 years (of 365 days). c10d adds a timeout to
/// the steady clock's count of nanoseconds (a signed 64-bit number, about 292 years), so
/// a longer one, such as `Duration::MAX` for "wait forever", would overflow into a
/// deadline in the past and fail at once; [`init`] uses this instead.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// A collective communication library.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// Gloo, on CPU tensors (PyTorch's `"gloo"`).
    Gloo,
    /// NCCL, on CUDA tensors (PyTorch's `"nccl"`): only with the `nccl` cargo feature
    /// (which compiles c10d's `ProcessGroupNCCL` in and links `libtorch_cuda`) and CUDA
    /// at run time; otherwise asking for it is a [`CkptError::DistEnv`] saying which is
    /// missing. Each rank should use its own device, `Device::Cuda(local_rank)`.
    Nccl,
}

impl Backend {
    /// Whether this build has the backend: Gloo always, NCCL with the `nccl` feature.
    pub fn is_built(self) -> bool {
        match self {
            Backend::Gloo => true,
            Backend::Nccl => ffi::has_nccl(),
        }
    }

    /// Whether [`init`] can use this backend here: Gloo always; NCCL when built
    /// ([`Backend::is_built`]) and libtorch sees a CUDA device.
    pub fn is_available(self) -> bool {
        match self {
            Backend::Gloo => true,
            Backend::Nccl => self.is_built() && tch::Cuda::is_available(),
        }
    }
}

/// How [`ProcessGroup::all_reduce`] and [`ProcessGroup::reduce_scatter`] combine ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    /// Element-wise sum.
    Sum,
    /// Element-wise mean over ranks (Gloo has no native average: a sum, then a division
    /// by the world size, as `torch.distributed` does).
    Avg,
    /// Element-wise maximum.
    Max,
    /// Element-wise minimum.
    Min,
}

impl ReduceOp {
    /// Every reduction with its name, in the order of the codes `csrc/dist.cpp` reads.
    const TABLE: [(ReduceOp, &'static str); 4] = [
        (ReduceOp::Sum, "Sum"),
        (ReduceOp::Avg, "Avg"),
        (ReduceOp::Max, "Max"),
        (ReduceOp::Min, "Min"),
    ];

    /// The code `csrc/dist.cpp` takes for this reduction: its index in `TABLE`.
    pub(crate) fn code(self) -> i32 {
        let index = Self::TABLE.iter().position(|&(op, _)| op == self);
        index.expect("every ReduceOp is in TABLE") as i32
    }

    /// The name of the reduction `code` stands for ("unknown" for no reduction's code).
    fn name_of(code: i64) -> &'static str {
        usize::try_from(code)
            .ok()
            .and_then(|i| Self::TABLE.get(i))
            .map_or("unknown", |&(_, name)| name)
    }
}

/// Where and how to join a process group: what [`init`] needs, and what
/// [`InitOptions::from_env`] reads from a launcher's variables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitOptions {
    /// Address of rank 0's store (`MASTER_ADDR`): a host name or an IP address.
    pub master_addr: String,
    /// Port of the store (`MASTER_PORT`).
    pub master_port: u16,
    /// This process's rank, `0..world_size` (`RANK`).
    pub rank: usize,
    /// Number of processes (`WORLD_SIZE`).
    pub world_size: usize,
    /// Rank on this machine (`LOCAL_RANK`; defaults to `rank`).
    pub local_rank: usize,
    /// Processes on this machine (`LOCAL_WORLD_SIZE`; defaults to `world_size`).
    pub local_world_size: usize,
    /// The collective library.
    pub backend: Backend,
    /// How long to wait for the store, the rendezvous and each collective; at most
    /// [`MAX_TIMEOUT`] is used (`Duration::MAX` waits for 100 years).
    pub timeout: Duration,
    /// `TORCHELASTIC_USE_AGENT_STORE=True`: a launcher's agent serves the store; every
    /// rank is a client and keys are prefixed by `/worker/attempt_<restart_count>`.
    pub use_agent_store: bool,
    /// `TORCHELASTIC_RESTART_COUNT` (0 when unset).
    pub restart_count: u32,
    /// Network interface(s) Gloo binds to (`GLOO_SOCKET_IFNAME`, comma-separated). When
    /// `None`, Gloo binds to the local address of the route to `master_addr`: loopback
    /// when the master is `127.0.0.1`, the interface facing the master otherwise; never
    /// a guessed interface.
    pub gloo_socket_ifname: Option<String>,
    /// Whether each collective first checks that the ranks agree on it (dtype, shape,
    /// root or reduction; one all-reduce of 26 int64s, `dist/agree.rs`), so that a
    /// mismatch is a [`CkptError::Dist`] on every rank. On by default; off saves that
    /// exchange (a 16-float all-reduce over loopback took 0.9 to 2.0 ms with it and 0.38
    /// to 0.59 ms without on a 2-core machine, `examples/dist_allreduce.rs --numel 16`)
    /// and lets a mismatch abort a process
    /// inside Gloo, as PyTorch does without `TORCH_DISTRIBUTED_DEBUG=DETAIL`.
    pub check_collectives: bool,
}

impl InitOptions {
    /// A group of `world_size` processes of which this is `rank`, rendezvousing at
    /// `master_addr:master_port`; Gloo, [`DEFAULT_TIMEOUT`], one machine.
    pub fn new(master_addr: &str, master_port: u16, rank: usize, world_size: usize) -> Self {
        InitOptions {
            master_addr: master_addr.to_string(),
            master_port,
            rank,
            world_size,
            local_rank: rank,
            local_world_size: world_size,
            backend: Backend::Gloo,
            timeout: DEFAULT_TIMEOUT,
            use_agent_store: false,
            restart_count: 0,
            gloo_socket_ifname: None,
            check_collectives: true,
        }
    }

    /// Reads the variables torchrun (and `ckpt`'s local launcher) set: `RANK`,
    /// `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT` (required), `LOCAL_RANK`,
    /// `LOCAL_WORLD_SIZE`, `TORCHELASTIC_USE_AGENT_STORE`, `TORCHELASTIC_RESTART_COUNT`,
    /// `GLOO_SOCKET_IFNAME` (optional). The timeout is [`DEFAULT_TIMEOUT`]; change the
    /// field before [`init`] for another.
    ///
    /// Errors: [`CkptError::DistEnv`] naming the variable that is missing, not a number,
    /// or out of range (`RANK >= WORLD_SIZE`, `WORLD_SIZE = 0`, `LOCAL_RANK >=
    /// LOCAL_WORLD_SIZE`, a port outside `1..=65535`).
    pub fn from_env() -> Result<Self, CkptError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// [`InitOptions::from_env`] over any source of variables (a map in tests).
    pub fn from_lookup(var: impl Fn(&str) -> Option<String>) -> Result<Self, CkptError> {
        let required = |k: &str| {
            var(k).ok_or_else(|| {
                CkptError::DistEnv(format!(
                    "environment variable {k} expected, but not set (launch with torchrun \
                     or `--nproc N`, or call dist::init with explicit options)"
                ))
            })
        };
        let number = |k: &str, v: String| -> Result<usize, CkptError> {
            v.trim()
                .parse::<usize>()
                .map_err(|_| CkptError::DistEnv(format!("{k}={v:?} is not a non-negative integer")))
        };
        let rank = number("RANK", required("RANK")?)?;
        let world_size = number("WORLD_SIZE", required("WORLD_SIZE")?)?;
        let master_addr = required("MASTER_ADDR")?;
        let port = required("MASTER_PORT")?;
        let master_port = port
            .trim()
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| {
                CkptError::DistEnv(format!("MASTER_PORT={port:?} is not a port in 1..=65535"))
            })?;
        let local_rank = match var("LOCAL_RANK") {
            Some(v) => number("LOCAL_RANK", v)?,
            None => rank,
        };
        let local_world_size = match var("LOCAL_WORLD_SIZE") {
            Some(v) => number("LOCAL_WORLD_SIZE", v)?,
            None => world_size,
        };
        let restart_count = match var("TORCHELASTIC_RESTART_COUNT") {
            Some(v) => number("TORCHELASTIC_RESTART_COUNT", v)? as u32,
            None => 0,
        };
        let opts = InitOptions {
            master_addr,
            master_port,
            rank,
            world_size,
            local_rank,
            local_world_size,
            backend: Backend::Gloo,
            timeout: DEFAULT_TIMEOUT,
            use_agent_store: var("TORCHELASTIC_USE_AGENT_STORE").as_deref() == Some("True"),
            restart_count,
            gloo_socket_ifname: var("GLOO_SOCKET_IFNAME").filter(|s| !s.is_empty()),
            check_collectives: true,
        };
        opts.validate()?;
        Ok(opts)
    }

    fn validate(&self) -> Result<(), CkptError> {
        let bad = |m: String| Err(CkptError::DistEnv(m));
        if self.world_size == 0 {
            return bad("WORLD_SIZE is 0: a process group has at least one rank".into());
        }
        if self.rank >= self.world_size {
            return bad(format!(
                "RANK={} is out of range for WORLD_SIZE={} (ranks are 0..{})",
                self.rank, self.world_size, self.world_size
            ));
        }
        if self.local_world_size == 0 || self.local_rank >= self.local_world_size {
            return bad(format!(
                "LOCAL_RANK={} is out of range for LOCAL_WORLD_SIZE={}",
                self.local_rank, self.local_world_size
            ));
        }
        if self.master_port == 0 {
            return bad("MASTER_PORT is 0: other ranks could not find the store".into());
        }
        if self.master_addr.is_empty() {
            return bad("MASTER_ADDR is empty".into());
        }
        if self.timeout.is_zero() {
            return bad("the timeout is zero".into());
        }
        Ok(())
    }
}

struct Inner {
    // Declared first: dropped before the store it was built on.
    group: ffi::RawGroup,
    store: ffi::RawStore,
    opts: InitOptions,
}

/// A c10d process group (PyTorch's `ProcessGroup` with its Gloo or NCCL backend): the
/// ranks that run collectives together. Cheap to clone (shared); dropped with its last clone.
///
/// Collectives are blocking: each returns when its result is in place on this rank, or
/// with [`CkptError::Dist`] after the timeout (for example when a peer died).
#[derive(Clone)]
pub struct ProcessGroup {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ProcessGroup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessGroup")
            .field("rank", &self.rank())
            .field("world_size", &self.world_size())
            .field("backend", &self.inner.opts.backend)
            .finish()
    }
}

/// Joins the process group described by `opts`: connects to (rank 0: serves) the
/// TCPStore at `master_addr:master_port`, then rendezvouses with all `world_size` ranks
/// through the backend. Returns when every rank has joined.
///
/// # Panics
///
/// On the errors of [`f_init`].
pub fn init(opts: &InitOptions) -> ProcessGroup {
    f_init(opts).unwrap_or_else(|e| panic!("{e}"))
}

/// [`init`], returning errors: [`CkptError::DistEnv`] for out-of-range options or the
/// NCCL backend where it is not available (not built with the `nccl` feature, or no
/// CUDA device), [`CkptError::Dist`] when the master is unreachable or the other ranks
/// do not all join within `opts.timeout`, or the port is in use.
pub fn f_init(opts: &InitOptions) -> Result<ProcessGroup, CkptError> {
    opts.validate()?;
    if opts.backend == Backend::Nccl && !Backend::Nccl.is_available() {
        return Err(CkptError::DistEnv(if !Backend::Nccl.is_built() {
            "the NCCL backend is not built in: build ckpt with the `nccl` feature \
             (`--features nccl`), or use Backend::Gloo"
                .into()
        } else {
            "the NCCL backend needs CUDA, which is not available here (libtorch sees no \
             CUDA device); use Backend::Gloo"
                .into()
        }));
    }
    let timeout_ms = opts.timeout.min(MAX_TIMEOUT).as_millis() as i64;
    let (is_server, prefix) = if opts.use_agent_store {
        (false, format!("/worker/attempt_{}", opts.restart_count))
    } else {
        (opts.rank == 0, String::new())
    };
    let store = ffi::RawStore::new(
        &opts.master_addr,
        opts.master_port,
        opts.world_size,
        is_server,
        timeout_ms,
        &prefix,
    )?;
    let group = match opts.backend {
        Backend::Gloo => ffi::RawGroup::new_gloo(
            &store,
            opts.rank,
            opts.world_size,
            opts.gloo_socket_ifname.as_deref().unwrap_or(""),
            &opts.master_addr,
            opts.master_port,
            timeout_ms,
            0,
        )?,
        Backend::Nccl => ffi::RawGroup::new_nccl(&store, opts.rank, opts.world_size, timeout_ms)?,
    };
    Ok(ProcessGroup {
        inner: Arc::new(Inner {
            group,
            store,
            opts: opts.clone(),
        }),
    })
}

/// [`init`] with [`InitOptions::from_env`]: the way to start under torchrun or
/// `--nproc N`.
///
/// # Panics
///
/// On the errors of [`f_init_from_env`].
pub fn init_from_env() -> ProcessGroup {
    f_init_from_env().unwrap_or_else(|e| panic!("{e}"))
}

/// [`init_from_env`], returning the errors of [`InitOptions::from_env`] and [`f_init`].
pub fn f_init_from_env() -> Result<ProcessGroup, CkptError> {
    f_init(&InitOptions::from_env()?)
}

impl ProcessGroup {
    /// Gloo takes CPU tensors, NCCL CUDA ones.
    fn check_device(&self, t: &Tensor, what: &str) -> Result<(), CkptError> {
        let (ok, name, wanted) = match self.inner.opts.backend {
            Backend::Gloo => (t.device() == tch::Device::Cpu, "Gloo", "CPU"),
            Backend::Nccl => (t.device().is_cuda(), "NCCL", "CUDA"),
        };
        if !ok {
            return Err(CkptError::InvalidArgument(format!(
                "{what}: the {name} backend of ckpt::dist takes {wanted} tensors, got one on {:?}",
                t.device()
            )));
        }
        Ok(())
    }

    /// This process's rank, `0..world_size()`.
    pub fn rank(&self) -> usize {
        self.inner.opts.rank
    }

    /// Number of ranks.
    pub fn world_size(&self) -> usize {
        self.inner.opts.world_size
    }

    /// Rank on this machine.
    pub fn local_rank(&self) -> usize {
        self.inner.opts.local_rank
    }

    /// Ranks on this machine.
    pub fn local_world_size(&self) -> usize {
        self.inner.opts.local_world_size
    }

    /// The options this group was created with.
    pub fn options(&self) -> &InitOptions {
        &self.inner.opts
    }

    pub(crate) fn raw(&self) -> &ffi::RawGroup {
        &self.inner.group
    }

    /// `t` itself when it is contiguous, else a contiguous copy: c10d's Gloo backend
    /// reads and writes a tensor's memory from its data pointer for `numel` elements, so
    /// a strided view (a column, a narrowed slice) would exchange the wrong elements and
    /// overwrite its neighbours.
    fn dense(t: &Tensor) -> Tensor {
        if t.is_contiguous() {
            t.shallow_clone()
        } else {
            t.contiguous()
        }
    }

    /// Writes `result` back into `t` when `result` is a contiguous copy of it.
    fn write_back(t: &Tensor, result: &Tensor, what: &str) -> Result<(), CkptError> {
        if t.is_contiguous() {
            return Ok(());
        }
        let mut t = t.shallow_clone();
        t.f_copy_(result).map(|_| ()).map_err(|e| {
            CkptError::InvalidArgument(format!("{what}: cannot write the result back: {e}"))
        })
    }

    /// [`ReduceOp::Avg`] divides the sum in place: it needs a floating-point tensor.
    fn check_op(t: &Tensor, op: ReduceOp, what: &str) -> Result<(), CkptError> {
        if op == ReduceOp::Avg && !t.is_floating_point() {
            return Err(CkptError::InvalidArgument(format!(
                "{what}: ReduceOp::Avg needs a floating-point tensor, got {:?} (use Sum and \
                 divide as you need)",
                t.kind()
            )));
        }
        Ok(())
    }

    /// Reduces `t` (any shape and strides, CPU) over all ranks in place: afterwards every
    /// rank holds the element-wise `op` of all ranks' `t` (`torch.distributed.all_reduce`).
    /// Every rank must pass the same shape, dtype and `op`: each collective first
    /// all-reduces a fingerprint of 2 x 13 int64s (see `agree.rs`), so ranks that disagree
    /// all get a [`CkptError::Dist`] instead of a crash in Gloo (PyTorch checks this only
    /// under `TORCH_DISTRIBUTED_DEBUG=DETAIL`).
    pub fn all_reduce(&self, t: &Tensor, op: ReduceOp) {
        self.f_all_reduce(t, op).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`ProcessGroup::all_reduce`], returning errors: [`CkptError::InvalidArgument`] for
    /// a tensor on the wrong device or [`ReduceOp::Avg`] of an integer tensor (before
    /// anything is exchanged), [`CkptError::Dist`] for a timeout or ranks that disagree
    /// on the shape, dtype or `op`.
    pub fn f_all_reduce(&self, t: &Tensor, op: ReduceOp) -> Result<(), CkptError> {
        self.check_device(t, "all_reduce")?;
        Self::check_op(t, op, "all_reduce")?;
        self.agree(Collective::AllReduce, op.code().into(), t)?;
        let _g = tch::no_grad_guard();
        let d = Self::dense(t);
        self.inner.group.all_reduce(&d, op.code())?;
        Self::write_back(t, &d, "all_reduce")
    }

    /// Copies rank `root`'s `t` into every rank's `t` (same shape and dtype everywhere).
    pub fn broadcast(&self, t: &Tensor, root: usize) {
        self.f_broadcast(t, root).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`ProcessGroup::broadcast`], returning errors: [`CkptError::InvalidArgument`] for
    /// `root >= world_size`, [`CkptError::Dist`] for a timeout or ranks that disagree on
    /// the shape, dtype or root.
    pub fn f_broadcast(&self, t: &Tensor, root: usize) -> Result<(), CkptError> {
        self.check_device(t, "broadcast")?;
        if root >= self.world_size() {
            return Err(CkptError::InvalidArgument(format!(
                "broadcast root {root} is not a rank of a group of {}",
                self.world_size()
            )));
        }
        self.agree(Collective::Broadcast, root as i64, t)?;
        let _g = tch::no_grad_guard();
        let d = Self::dense(t);
        self.inner.group.broadcast(&d, root as i32)?;
        Self::write_back(t, &d, "broadcast")
    }

    /// Every rank's `t`, in rank order: `world_size()` contiguous tensors of `t`'s shape.
    pub fn all_gather(&self, t: &Tensor) -> Vec<Tensor> {
        self.f_all_gather(t).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`ProcessGroup::all_gather`], returning errors: [`CkptError::Dist`] for a timeout
    /// or ranks whose tensors differ in shape or dtype.
    pub fn f_all_gather(&self, t: &Tensor) -> Result<Vec<Tensor>, CkptError> {
        self.check_device(t, "all_gather")?;
        self.agree(Collective::AllGather, 0, t)?;
        let _g = tch::no_grad_guard();
        let outs: Vec<Tensor> = (0..self.world_size())
            .map(|_| Tensor::empty(t.size(), (t.kind(), t.device())))
            .collect();
        self.inner.group.all_gather(&outs, &Self::dense(t))?;
        Ok(outs)
    }

    /// `inputs` holds one tensor per rank (`world_size()` of them, one shape and dtype);
    /// returns the `op` over ranks of every rank's `inputs[rank()]`
    /// (`torch.distributed.reduce_scatter`).
    pub fn reduce_scatter(&self, inputs: &[Tensor], op: ReduceOp) -> Tensor {
        self.f_reduce_scatter(inputs, op)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`ProcessGroup::reduce_scatter`], returning errors: [`CkptError::InvalidArgument`]
    /// for a wrong number of inputs, inputs of several shapes or dtypes, or
    /// [`ReduceOp::Avg`] of integers; [`CkptError::Dist`] for a timeout.
    pub fn f_reduce_scatter(&self, inputs: &[Tensor], op: ReduceOp) -> Result<Tensor, CkptError> {
        if inputs.len() != self.world_size() {
            return Err(CkptError::InvalidArgument(format!(
                "reduce_scatter takes one input per rank: {} for a group of {}",
                inputs.len(),
                self.world_size()
            )));
        }
        for (i, t) in inputs.iter().enumerate() {
            self.check_device(t, "reduce_scatter")?;
            if t.size() != inputs[0].size() || t.kind() != inputs[0].kind() {
                return Err(CkptError::InvalidArgument(format!(
                    "reduce_scatter inputs must share one shape and dtype: input 0 is {:?} \
                     {:?}, input {i} is {:?} {:?}",
                    inputs[0].size(),
                    inputs[0].kind(),
                    t.size(),
                    t.kind()
                )));
            }
        }
        Self::check_op(&inputs[0], op, "reduce_scatter")?;
        self.agree(Collective::ReduceScatter, op.code().into(), &inputs[0])?;
        let _g = tch::no_grad_guard();
        let dense: Vec<Tensor> = inputs.iter().map(Self::dense).collect();
        let out = Tensor::empty(inputs[0].size(), (inputs[0].kind(), inputs[0].device()));
        self.inner.group.reduce_scatter(&out, &dense, op.code())?;
        Ok(out)
    }

    /// Returns when every rank has called it.
    pub fn barrier(&self) {
        self.f_barrier().unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`ProcessGroup::barrier`], returning errors (a timeout).
    pub fn f_barrier(&self) -> Result<(), CkptError> {
        self.inner.group.barrier()
    }

    /// Stores `value` under `key` in the group's store (visible to every rank).
    pub fn f_store_set(&self, key: &str, value: &[u8]) -> Result<(), CkptError> {
        self.inner.store.set(key, value)
    }

    /// Waits (up to the timeout) for `key` in the group's store and returns its value.
    pub fn f_store_get(&self, key: &str) -> Result<Vec<u8>, CkptError> {
        self.inner.store.get(key)
    }
}
