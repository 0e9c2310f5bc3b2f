//! The `unsafe` boundary of the checkpoint node (`ckpt::dist` has its own, in
//! `dist/ffi.rs`): declarations of `csrc/ckpt.cpp` and its siblings, and the Rust
//! callbacks they call. Nothing here unwinds into C++: every callback runs Rust code
//! inside `catch_unwind` and reports failure through the C++ sink.

use std::any::Any;
use std::cell::Cell;
use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};

use tch::Tensor;
use torch_sys::C_tensor;

type RunFn =
    extern "C" fn(*mut c_void, i32, *mut *mut C_tensor, usize, *mut c_void, *mut c_void) -> i32;
type DropFn = extern "C" fn(*mut c_void);
type PushFn = extern "C" fn(*mut c_void, *mut C_tensor);
type MsgFn = extern "C" fn(*mut c_void, *const u8, usize);

/// `ckpt_segment_spec` of `csrc/ckpt.cpp`: what one segment is made of, besides its
/// closure. The pointers borrow Rust values for the duration of one `ckpt_apply` call.
#[repr(C)]
struct SegmentSpec {
    inputs: *const *mut C_tensor,
    n_inputs: usize,
    params: *const *mut C_tensor,
    n_params: usize,
    name: *const u8,
    name_len: usize,
    preserve_rng_state: i32,
    determinism_check: i32,
}

unsafe extern "C" {
    fn ckpt_sink_push(sink: *mut c_void, t: *mut C_tensor);
    fn ckpt_sink_error(sink: *mut c_void, msg: *const u8, len: usize);
    fn ckpt_apply(
        closure: *mut c_void,
        run: RunFn,
        drop: DropFn,
        spec: *const SegmentSpec,
        fwd_ctx: *mut c_void,
        out_ctx: *mut c_void,
        push_out: PushFn,
        set_err: MsgFn,
    ) -> i32;
    fn ckpt_policy_exchange(flags: u32) -> u32;
    fn ckpt_policy_probe_new(flags: u32) -> *mut c_void;
    fn ckpt_policy_probe_free(cache: *mut c_void);
    fn ckpt_policy_probe_enter(cache: *mut c_void, replay: bool) -> *mut c_void;
    fn ckpt_policy_probe_leave(scope: *mut c_void);
    fn ckpt_policy_probe_bytes(cache: *mut c_void) -> i64;
    fn ckpt_grad_enabled() -> i32;
    fn ckpt_live_segments() -> i64;
    fn ckpt_memory_enable();
    fn ckpt_cpu_current_bytes() -> i64;
    fn ckpt_cpu_peak_bytes() -> i64;
    fn ckpt_cpu_reset_peak();
    fn ckpt_cpu_raise_peak(bytes: i64);
    fn ckpt_cuda_memory(
        device: i32,
        current: *mut i64,
        peak: *mut i64,
        err: *mut c_void,
        set_err: MsgFn,
    ) -> i32;
    fn ckpt_cuda_reset_peak(device: i32, err: *mut c_void, set_err: MsgFn) -> i32;
    fn ckpt_cuda_available() -> i32;
    fn ckpt_autocast_set(
        device_type: i32,
        enabled: i32,
        dtype: i32,
        prev_enabled: *mut i32,
        prev_dtype: *mut i32,
        err: *mut c_void,
        set_err: MsgFn,
    ) -> i32;
    fn ckpt_autocast_enter();
    fn ckpt_rng_save() -> *mut c_void;
    fn ckpt_rng_restore(state: *mut c_void);
    fn ckpt_autocast_exit();
    fn ckpt_running_stats_freeze(on: i32);
}

/// A segment's closure with its types erased: flat input tensors in, flat output tensors
/// and the output's skeleton out. Panics are caught by the caller.
pub(crate) type ErasedFn = dyn Fn(Vec<Tensor>) -> (Vec<Tensor>, Box<dyn Any>) + Send;

struct Closure {
    run: Box<ErasedFn>,
    name: String,
}

/// What the forward run of a segment hands back to [`apply`] besides the tensors.
#[derive(Default)]
struct ForwardSlot {
    skeleton: Option<Box<dyn Any>>,
    panic: Option<String>,
}

#[derive(Default)]
struct Outputs {
    tensors: Vec<Tensor>,
    error: Option<String>,
}

thread_local! {
    static RECOMPUTING: Cell<u32> = const { Cell::new(0) };
}

pub(crate) fn is_recomputing() -> bool {
    RECOMPUTING.with(|r| r.get() > 0)
}

struct RecomputeFlag(bool);

impl RecomputeFlag {
    fn enter(recompute: bool) -> Self {
        if recompute {
            RECOMPUTING.with(|r| r.set(r.get() + 1));
        }
        RecomputeFlag(recompute)
    }
}

impl Drop for RecomputeFlag {
    fn drop(&mut self) {
        if self.0 {
            RECOMPUTING.with(|r| r.set(r.get() - 1));
        }
    }
}

/// The message of a panic payload, without the C++ backtrace that libtorch appends to
/// its errors (tch's panics carry it: `Exception raised from .. (most recent call
/// first): frame #0 ..`), which would otherwise be repeated in every error naming the
/// segment.
pub(crate) fn panic_message(payload: &(dyn Any + Send)) -> String {
    let message = if let Some(s) = payload.downcast_ref::<&str>() {
        *s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.as_str()
    } else {
        return "panic payload is not a string".to_owned();
    };
    let Some(i) = message.find("Exception raised from") else {
        return message.to_owned();
    };
    // The newline before it is real, or `\n` inside a Debug rendering (`unwrap()` on
    // tch's `Err(Torch("…"))`), which then also loses its closing `")`.
    let head = message[..i].trim_end().trim_end_matches("\\n").trim_end();
    let close = if head.contains("(\"") && !head.ends_with("\")") {
        "\")"
    } else {
        ""
    };
    format!("{head}{close}")
}

extern "C" fn run_callback(
    closure: *mut c_void,
    recompute: i32,
    inputs: *mut *mut C_tensor,
    n: usize,
    sink: *mut c_void,
    fwd_ctx: *mut c_void,
) -> i32 {
    // Everything that runs Rust code, dropping values included, stays inside
    // `catch_unwind`: a panic, even from a `Drop` impl of an output or of a panic
    // payload, must not unwind into C++.
    // SAFETY: `closure` is the `Box<Closure>` leaked in `apply`; the C++ `Segment` that
    // owns it outlives this call and only drops it through `drop_callback`.
    let closure = unsafe { &*(closure as *const Closure) };
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: C++ passes `n` pointers from `new at::Tensor(..)` and hands their
        // ownership to this callback; `Tensor::from_ptr` takes it (freed on drop).
        let tensors: Vec<Tensor> = (0..n)
            .map(|i| unsafe { Tensor::from_ptr(*inputs.add(i)) })
            .collect();
        let _flag = RecomputeFlag::enter(recompute != 0);
        match catch_unwind(AssertUnwindSafe(|| (closure.run)(tensors))) {
            Ok((outputs, skeleton)) => {
                for t in &outputs {
                    // SAFETY: `sink` is the live C++ `Sink` of this call; it copies the
                    // tensor handle (a refcount increment), so `outputs` may be dropped.
                    unsafe { ckpt_sink_push(sink, t.as_ptr() as *mut C_tensor) };
                }
                drop(outputs);
                if fwd_ctx.is_null() {
                    drop(skeleton);
                } else {
                    // SAFETY: during forward `fwd_ctx` is the `ForwardSlot` on `apply`'s
                    // stack.
                    unsafe { (*(fwd_ctx as *mut ForwardSlot)).skeleton = Some(skeleton) };
                }
                Ok(())
            }
            Err(payload) => {
                let message = panic_message(payload.as_ref());
                // The payload's own `Drop` could panic too; it is leaked instead (this
                // happens only on a panic, and the payload is small).
                std::mem::forget(payload);
                Err(message)
            }
        }
    }));
    let message = match outcome {
        Ok(Ok(())) => return 0,
        Ok(Err(message)) => message,
        Err(payload) => {
            std::mem::forget(payload);
            "dropping a value at the end of the segment panicked".to_owned()
        }
    };
    let err = crate::CkptError::ClosurePanicked {
        segment: closure.name.clone(),
        recompute: recompute != 0,
        message: message.clone(),
    }
    .to_string();
    if !fwd_ctx.is_null() {
        // SAFETY: as above.
        unsafe { (*(fwd_ctx as *mut ForwardSlot)).panic = Some(message) };
    }
    // SAFETY: `sink` is the live C++ `Sink` of this call.
    unsafe { ckpt_sink_error(sink, err.as_ptr(), err.len()) };
    1
}

extern "C" fn drop_callback(closure: *mut c_void) {
    // SAFETY: called exactly once, by the C++ `Segment` destructor, on the pointer that
    // `apply` leaked with `Box::into_raw`.
    let boxed = unsafe { Box::from_raw(closure as *mut Closure) };
    // Dropping captured tensors does not panic; if user code in a Drop impl does, the
    // panic stops here instead of unwinding into C++.
    let _ = catch_unwind(AssertUnwindSafe(move || drop(boxed)));
}

extern "C" fn push_output(ctx: *mut c_void, t: *mut C_tensor) {
    // SAFETY: `ctx` is the `Outputs` on `apply`'s stack; `t` comes from
    // `new at::Tensor(..)` and its ownership passes to the Rust `Tensor`.
    unsafe { (*(ctx as *mut Outputs)).tensors.push(Tensor::from_ptr(t)) };
}

extern "C" fn set_error(ctx: *mut c_void, msg: *const u8, len: usize) {
    // SAFETY: C++ passes a valid (pointer, length) of its own string, alive for the call.
    let bytes = unsafe { std::slice::from_raw_parts(msg, len) };
    let text = String::from_utf8_lossy(bytes).into_owned();
    // SAFETY: `ctx` is an `Outputs` on the caller's stack, alive for the call.
    unsafe { (*(ctx as *mut Outputs)).error = Some(text) };
}

/// What [`apply`] returns on failure.
pub(crate) enum ApplyError {
    Panicked(String),
    Torch(String),
}

/// Runs `run` as a checkpointed segment through the C++ node and returns its output
/// tensors and skeleton. `params` are tensors `run` captured; those that are leaves
/// requiring grad become inputs of the node (`csrc/params.cpp`).
pub(crate) fn apply(
    run: Box<ErasedFn>,
    name: String,
    inputs: &[Tensor],
    params: &[Tensor],
    preserve_rng_state: bool,
    determinism_check: bool,
) -> Result<(Vec<Tensor>, Box<dyn Any>), ApplyError> {
    let name_bytes = name.clone().into_bytes();
    let closure = Box::into_raw(Box::new(Closure { run, name })) as *mut c_void;
    let ptrs = |ts: &[Tensor]| -> Vec<*mut C_tensor> {
        ts.iter().map(|t| t.as_ptr() as *mut C_tensor).collect()
    };
    let (input_ptrs, param_ptrs) = (ptrs(inputs), ptrs(params));
    let spec = SegmentSpec {
        inputs: input_ptrs.as_ptr(),
        n_inputs: input_ptrs.len(),
        params: param_ptrs.as_ptr(),
        n_params: param_ptrs.len(),
        name: name_bytes.as_ptr(),
        name_len: name_bytes.len(),
        preserve_rng_state: preserve_rng_state as i32,
        determinism_check: determinism_check as i32,
    };
    let mut slot = ForwardSlot::default();
    let mut out = Outputs::default();
    // SAFETY: `ckpt_apply` takes ownership of `closure` (dropping it through
    // `drop_callback`); `spec`'s pointers stay valid for the call because `input_ptrs`,
    // `param_ptrs` and `name_bytes` live to the end of this function and `inputs` and
    // `params` borrow the tensors they point to (C++ copies what it keeps); `slot` and
    // `out` outlive the call; `SegmentSpec` and the callbacks match the C++ declarations.
    let rc = unsafe {
        ckpt_apply(
            closure,
            run_callback,
            drop_callback,
            &spec,
            &mut slot as *mut ForwardSlot as *mut c_void,
            &mut out as *mut Outputs as *mut c_void,
            push_output,
            set_error,
        )
    };
    if rc != 0 {
        return Err(match slot.panic {
            Some(message) => ApplyError::Panicked(message),
            None => ApplyError::Torch(out.error.unwrap_or_else(|| "unknown error".to_owned())),
        });
    }
    let skeleton = slot
        .skeleton
        .expect("ckpt: forward succeeded without a skeleton");
    Ok((out.tensors, skeleton))
}

/// Sets the selective-checkpointing policy bits of the segments this thread creates
/// while it lives (`csrc/policy.cpp`), and puts the previous bits back when dropped.
pub(crate) struct PolicyGuard(u32);

impl PolicyGuard {
    pub(crate) fn set(bits: u32) -> PolicyGuard {
        // SAFETY: swaps a thread-local integer; no pointers.
        PolicyGuard(unsafe { ckpt_policy_exchange(bits) })
    }
}

impl Drop for PolicyGuard {
    fn drop(&mut self) {
        // SAFETY: as in `set`.
        unsafe { ckpt_policy_exchange(self.0) };
    }
}

/// A selective-checkpointing cache outside any segment (`csrc/policy.cpp`), for the
/// planner's profile: [`PolicyProbe::record`] runs a closure as a segment's forward would
/// (linear outputs and dropout masks kept, as the policy bits say),
/// [`PolicyProbe::replay`] as its recompute would (the kept results used instead of
/// computed), and [`PolicyProbe::bytes`] is what it keeps.
pub(crate) struct PolicyProbe(*mut c_void);

/// Leaves a probe's scope when dropped (also on unwinding).
struct ProbeScope(*mut c_void);

impl Drop for ProbeScope {
    fn drop(&mut self) {
        // SAFETY: `self.0` came from `ckpt_policy_probe_enter`, and scopes are left in
        // reverse order (this guard lives within one call of `PolicyProbe::run`).
        unsafe { ckpt_policy_probe_leave(self.0) };
    }
}

impl PolicyProbe {
    /// A probe for the policy `bits`; `None` if C++ failed to allocate it.
    pub(crate) fn new(bits: u32) -> Option<PolicyProbe> {
        // SAFETY: allocates a cache, or returns null.
        let cache = unsafe { ckpt_policy_probe_new(bits) };
        (!cache.is_null()).then_some(PolicyProbe(cache))
    }

    fn run<R>(&self, replay: bool, f: impl FnOnce() -> R) -> R {
        // SAFETY: the cache is alive while `self` is; the scope is left by the guard.
        let scope = unsafe { ckpt_policy_probe_enter(self.0, replay) };
        if scope.is_null() {
            return f();
        }
        let _scope = ProbeScope(scope);
        f()
    }

    /// Runs `f` recording into the probe.
    pub(crate) fn record<R>(&self, f: impl FnOnce() -> R) -> R {
        self.run(false, f)
    }

    /// Runs `f` replaying from the probe (in recording order).
    pub(crate) fn replay<R>(&self, f: impl FnOnce() -> R) -> R {
        self.run(true, f)
    }

    /// Bytes of tensor data the probe holds.
    pub(crate) fn bytes(&self) -> u64 {
        // SAFETY: the cache is alive while `self` is.
        u64::try_from(unsafe { ckpt_policy_probe_bytes(self.0) }).unwrap_or(0)
    }
}

impl Drop for PolicyProbe {
    fn drop(&mut self) {
        // SAFETY: `self.0` came from `ckpt_policy_probe_new` and is freed once; no scope
        // over it is alive (they live within `run`).
        unsafe { ckpt_policy_probe_free(self.0) };
    }
}

pub(crate) fn grad_enabled() -> bool {
    // SAFETY: reads a thread-local flag of libtorch; no arguments.
    unsafe { ckpt_grad_enabled() != 0 }
}

pub(crate) fn live_segments() -> i64 {
    // SAFETY: reads an atomic counter; no arguments.
    unsafe { ckpt_live_segments() }
}

pub(crate) fn memory_enable() {
    // SAFETY: installs the counting allocator once (std::call_once); catches exceptions.
    unsafe { ckpt_memory_enable() }
}

pub(crate) fn cpu_memory() -> (i64, i64) {
    // SAFETY: reads two atomic counters; no arguments.
    unsafe { (ckpt_cpu_current_bytes(), ckpt_cpu_peak_bytes()) }
}

pub(crate) fn cpu_reset_peak() {
    // SAFETY: stores an atomic counter; no arguments.
    unsafe { ckpt_cpu_reset_peak() }
}

pub(crate) fn cpu_raise_peak(bytes: i64) {
    // SAFETY: a compare-and-swap loop on an atomic counter; a plain integer argument.
    unsafe { ckpt_cpu_raise_peak(bytes) }
}

pub(crate) fn cuda_available() -> bool {
    // SAFETY: asks libtorch's CUDA hooks; exceptions are caught in C++.
    unsafe { ckpt_cuda_available() != 0 }
}

pub(crate) fn cuda_memory(device: usize) -> Result<(i64, i64), String> {
    let (mut current, mut peak) = (0i64, 0i64);
    let mut out = Outputs::default();
    // SAFETY: the out-pointers are valid for the call; `out` outlives it.
    let rc = unsafe {
        ckpt_cuda_memory(
            device as i32,
            &mut current,
            &mut peak,
            &mut out as *mut Outputs as *mut c_void,
            set_error,
        )
    };
    if rc == 0 {
        Ok((current, peak))
    } else {
        Err(out.error.unwrap_or_default())
    }
}

pub(crate) fn cuda_reset_peak(device: usize) -> Result<(), String> {
    let mut out = Outputs::default();
    // SAFETY: `out` outlives the call.
    let rc = unsafe {
        ckpt_cuda_reset_peak(
            device as i32,
            &mut out as *mut Outputs as *mut c_void,
            set_error,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(out.error.unwrap_or_default())
    }
}

/// Sets the autocast state of CPU (`cuda = false`) or CUDA; returns the previous
/// `(enabled, dtype code)`.
pub(crate) fn autocast_set(cuda: bool, enabled: bool, dtype: i32) -> Result<(bool, i32), String> {
    let (mut prev_enabled, mut prev_dtype) = (0i32, 0i32);
    let mut out = Outputs::default();
    // SAFETY: the out-pointers and `out` are valid for the call; C++ catches exceptions.
    let rc = unsafe {
        ckpt_autocast_set(
            cuda as i32,
            enabled as i32,
            dtype,
            &mut prev_enabled,
            &mut prev_dtype,
            &mut out as *mut Outputs as *mut c_void,
            set_error,
        )
    };
    if rc == 0 {
        Ok((prev_enabled != 0, prev_dtype))
    } else {
        Err(out.error.unwrap_or_default())
    }
}

pub(crate) fn autocast_enter() {
    // SAFETY: increments libtorch's thread-local autocast nesting count.
    unsafe { ckpt_autocast_enter() }
}

pub(crate) fn autocast_exit() {
    // SAFETY: decrements it, clearing the cast cache at zero.
    unsafe { ckpt_autocast_exit() }
}

/// Fork semantics for the random generators (`torch.random.fork_rng`): the CPU
/// generator's state and every CUDA generator's are saved on creation and restored on
/// drop, so code run in between (profiling) leaves the random streams as they were.
pub(crate) struct RngFork(*mut c_void);

impl RngFork {
    pub(crate) fn new() -> Self {
        // SAFETY: returns a heap copy of the generator states (or null on failure),
        // owned by this value until `drop` hands it back.
        RngFork(unsafe { ckpt_rng_save() })
    }
}

impl Drop for RngFork {
    fn drop(&mut self) {
        // SAFETY: the pointer came from `ckpt_rng_save` and is restored and freed once.
        unsafe { ckpt_rng_restore(self.0) }
    }
}

/// libtorch's grad mode set for the calling thread until drop, which puts the previous
/// mode back, on unwinding too (`tch::no_grad(..)` and `tch::with_grad(..)` do not when
/// their closure panics).
pub(crate) struct GradMode(bool);

impl GradMode {
    pub(crate) fn set(enabled: bool) -> Self {
        // SAFETY: sets a thread-local flag of libtorch and returns the previous one; no
        // pointers.
        GradMode(unsafe { torch_sys::at_grad_set_enabled(enabled as i32) } != 0)
    }
}

impl Drop for GradMode {
    fn drop(&mut self) {
        // SAFETY: as in `set`.
        unsafe { torch_sys::at_grad_set_enabled(self.0 as i32) };
    }
}

/// Batch norm's running statistics frozen on the calling thread until drop
/// (`csrc/buffers.cpp`): training-mode batch norm and instance norm normalise with the
/// batch statistics but do not update the running ones. The node's recompute does the
/// same in C++.
/// Not `Send`: the counter it holds up is the creating thread's.
pub(crate) struct FrozenRunningStats(std::marker::PhantomData<*const ()>);

impl FrozenRunningStats {
    pub(crate) fn new() -> Self {
        // SAFETY: increments a thread-local counter; no pointers.
        unsafe { ckpt_running_stats_freeze(1) };
        FrozenRunningStats(std::marker::PhantomData)
    }
}

impl Drop for FrozenRunningStats {
    fn drop(&mut self) {
        // SAFETY: decrements the counter that `new` incremented, on the same thread (the
        // guard is not `Send`).
        unsafe { ckpt_running_stats_freeze(0) };
    }
}
