//! The C boundary of the runtime, mirroring `csrc/ffi.h`: the types that cross it, the
//! callback table C++ calls back through, the C API of `csrc/*.cpp`, and safe wrappers
//! over it (`ckpt::dist` declares `csrc/dist.cpp` in `dist/ffi.rs`, over the same types).
//!
//! Errors cross as raw messages through one error slot ([`ErrorSlot`], `ckpt_error`) in
//! both directions, and nothing here formats one (the text users see is built in
//! `checkpoint.rs` and `error.rs`, or is libtorch's own). C++ to Rust: every fallible
//! C++ entry point reports its exceptions into the slot [`call_cpp`] passes. Rust to
//! C++: every `extern "C"` callback body runs in [`guarded`], which catches panics and
//! writes the message of a panic or of a [`CkptError`] into the slot C++ passed; C++
//! throws it as a `std::runtime_error`. Nothing unwinds across the boundary.

use std::ffi::c_void;
use std::mem::ManuallyDrop;
use std::panic::{AssertUnwindSafe, catch_unwind};

use tch::Tensor;
use torch_sys::C_tensor;

use crate::CkptError;

/// `ckpt_msg_fn`: writes a message (`len` bytes of UTF-8) into a slot.
pub(crate) type MsgFn = extern "C" fn(*mut c_void, *const u8, usize);
/// `ckpt_push_fn`: hands a tensor's heap handle, and its ownership, to a list.
pub(crate) type PushFn = extern "C" fn(*mut c_void, *mut C_tensor);
type RunFn = extern "C" fn(*mut c_void, i32, *mut *mut C_tensor, usize, *const Ctx);
type DropFn = extern "C" fn(*mut c_void);

/// `ckpt_error`: the one error slot of a call; the callee that fails calls `set(slot, ..)`
/// once with its raw message.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct ErrorSlot {
    pub(crate) slot: *mut c_void,
    pub(crate) set: MsgFn,
}

impl ErrorSlot {
    fn report(&self, message: &str) {
        let message = escape_nul(message);
        (self.set)(self.slot, message.as_ptr(), message.len());
    }
}

/// `text` with each NUL byte written `\0`: C++ hands messages (and the segment names
/// in them) back through libtorch's and tch's C strings, which would end at a NUL.
fn escape_nul(text: &str) -> std::borrow::Cow<'_, str> {
    if text.contains('\0') {
        text.replace('\0', "\\0").into()
    } else {
        text.into()
    }
}

/// `ckpt_ctx`: where a callee hands back its tensors and its error.
#[repr(C)]
struct Ctx {
    tensors: *mut c_void,
    push: PushFn,
    error: ErrorSlot,
}

impl Ctx {
    /// Hands `t` to the caller, which takes over its heap handle.
    fn push(&self, t: Tensor) {
        let t = ManuallyDrop::new(t);
        (self.push)(self.tensors, t.as_ptr() as *mut C_tensor);
    }
}

/// `ckpt_callbacks`: the callback table, everything C++ calls in Rust. `user` is a leaked
/// `Box<Box<ErasedFn>>`.
#[repr(C)]
struct Callbacks {
    user: *mut c_void,
    run: RunFn,
    drop: DropFn,
}

/// `ckpt_segment`: one segment as `ckpt_apply` takes it. The pointers borrow Rust values
/// for the duration of the call.
#[repr(C)]
struct Segment {
    callbacks: Callbacks,
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
    fn ckpt_apply(segment: *const Segment, ctx: *const Ctx) -> i32;
    fn ckpt_policy_exchange(flags: u32) -> u32;
    fn ckpt_compact_dropout_exchange(on: bool) -> bool;
    fn ckpt_bernoulli_force_portable(on: bool) -> bool;
    fn ckpt_bernoulli_kernel() -> i32;
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
        err: *const ErrorSlot,
    ) -> i32;
    fn ckpt_cuda_reset_peak(device: i32, err: *const ErrorSlot) -> i32;
    fn ckpt_cuda_available() -> i32;
    fn ckpt_autocast_set(
        device_type: i32,
        enabled: i32,
        dtype: i32,
        prev_enabled: *mut i32,
        prev_dtype: *mut i32,
        err: *const ErrorSlot,
    ) -> i32;
    fn ckpt_autocast_enter();
    fn ckpt_rng_save() -> *mut c_void;
    fn ckpt_rng_restore(state: *mut c_void);
    fn ckpt_autocast_exit();
    fn ckpt_running_stats_freeze(on: i32);
}

/// A segment's closure with its types erased: flat input tensors and whether this is the
/// recompute in, flat output tensors out, or the error to report (`checkpoint.rs` builds
/// it, catching the panics of user code).
pub(crate) type ErasedFn = dyn Fn(Vec<Tensor>, bool) -> Result<Vec<Tensor>, CkptError> + Send;

/// Runs the body of an `extern "C"` callback: a panic, or an error it returns, becomes
/// its raw message in `error` (dropped where there is no slot to report to: freeing a
/// closure, receiving a C++ result); nothing unwinds into C++.
pub(crate) fn guarded(error: Option<&ErrorSlot>, body: impl FnOnce() -> Result<(), CkptError>) {
    let message = match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => return,
        Ok(Err(e)) => e.to_string(),
        Err(payload) => {
            let message = crate::checkpoint::panic_message(payload.as_ref());
            crate::checkpoint::drop_payload(payload);
            message
        }
    };
    if let Some(slot) = error {
        slot.report(&message);
    }
}

/// `callbacks.run`: runs the segment's closure for C++ (its forward, or its recompute).
extern "C" fn run_closure(
    user: *mut c_void,
    recompute: i32,
    inputs: *mut *mut C_tensor,
    n: usize,
    ctx: *const Ctx,
) {
    // SAFETY: `ctx` is the `ckpt_ctx` that C++'s `call_rust` made for this call; it lives
    // on C++'s stack until the call returns.
    let ctx = unsafe { &*ctx };
    guarded(Some(&ctx.error), || {
        // SAFETY: C++ passes `n` pointers from `new at::Tensor(..)` and hands their
        // ownership to this call; `Tensor::from_ptr` takes it (freed on drop).
        let tensors: Vec<Tensor> = (0..n)
            .map(|i| unsafe { Tensor::from_ptr(*inputs.add(i)) })
            .collect();
        // SAFETY: `user` is the `Box<Box<ErasedFn>>` leaked in `apply`. The C++ node owns
        // it and frees it only through `drop_closure`, after its last call, so the pointer
        // is alive. `ErasedFn` is `Send` but not `Sync`, so a shared reference to it is
        // sound only while no other thread calls it: calls never overlap, because the
        // forward call happens inside `ckpt_apply` before the node exists, and every later
        // call is the node's backward, which libtorch runs holding the node's mutex
        // (`CppNode::apply` in torch/csrc/autograd/custom_function.h).
        let closure = unsafe { &*(user as *const Box<ErasedFn>) };
        for t in closure(tensors, recompute != 0)? {
            ctx.push(t);
        }
        Ok(())
    });
}

/// `callbacks.drop`: frees the segment's closure.
extern "C" fn drop_closure(user: *mut c_void) {
    guarded(None, || {
        // SAFETY: called exactly once, by the C++ `Segment`'s destructor (or by
        // `ckpt_apply` when it could not make one), on the pointer that `apply` leaked with
        // `Box::into_raw`; no call of `run_closure` is in flight then.
        drop(unsafe { Box::from_raw(user as *mut Box<ErasedFn>) });
        Ok(())
    });
}

/// `ckpt_push_fn` into a `Vec<Tensor>`: receives a tensor from C++.
pub(crate) extern "C" fn push_tensor(sink: *mut c_void, t: *mut C_tensor) {
    guarded(None, || {
        // SAFETY: `sink` is the `Vec<Tensor>` of the Rust caller of the C++ entry point
        // that calls this, alive until that entry point returns; `t` comes from
        // `new at::Tensor(..)` and C++ hands its ownership over.
        unsafe { (*(sink as *mut Vec<Tensor>)).push(Tensor::from_ptr(t)) };
        Ok(())
    });
}

/// The Rust end of an [`ErrorSlot`]: the message a C++ entry point reported.
#[derive(Default)]
struct Message(Option<String>);

/// `ckpt_msg_fn` into a [`Message`].
extern "C" fn set_message(slot: *mut c_void, msg: *const u8, len: usize) {
    guarded(None, || {
        // SAFETY: C++ passes `len` bytes at `msg`, alive for the call.
        let bytes = unsafe { std::slice::from_raw_parts(msg, len) };
        let text = String::from_utf8_lossy(bytes).into_owned();
        // SAFETY: `slot` is the `Message` on `call_cpp`'s stack, alive until the C++
        // entry point that calls this returns.
        unsafe { (*(slot as *mut Message)).0 = Some(text) };
        Ok(())
    });
}

/// Calls a C++ entry point, `f(slot)`, with an error slot: `Ok` when it returns 0, else
/// the raw message it reported (`None` if it reported none).
pub(crate) fn call_cpp(f: impl FnOnce(&ErrorSlot) -> i32) -> Result<(), Option<String>> {
    let mut message = Message::default();
    let slot = ErrorSlot {
        slot: &mut message as *mut Message as *mut c_void,
        set: set_message,
    };
    if f(&slot) == 0 {
        Ok(())
    } else {
        Err(message.0)
    }
}

/// Runs `run` as a checkpointed segment named `name` through the C++ node and returns
/// its output tensors; `Err` holds the raw message of a failure, libtorch's or the one
/// `run` reported. `params` are tensors `run` captured; those that are leaves requiring
/// grad become inputs of the node (`csrc/params.cpp`).
pub(crate) fn apply(
    run: Box<ErasedFn>,
    name: &str,
    inputs: &[Tensor],
    params: &[Tensor],
    preserve_rng_state: bool,
    determinism_check: bool,
) -> Result<Vec<Tensor>, String> {
    let ptrs = |ts: &[Tensor]| -> Vec<*mut C_tensor> {
        ts.iter().map(|t| t.as_ptr() as *mut C_tensor).collect()
    };
    let (input_ptrs, param_ptrs) = (ptrs(inputs), ptrs(params));
    let name = escape_nul(name);
    let segment = Segment {
        callbacks: Callbacks {
            user: Box::into_raw(Box::new(run)) as *mut c_void,
            run: run_closure,
            drop: drop_closure,
        },
        inputs: input_ptrs.as_ptr(),
        n_inputs: input_ptrs.len(),
        params: param_ptrs.as_ptr(),
        n_params: param_ptrs.len(),
        name: name.as_ptr(),
        name_len: name.len(),
        preserve_rng_state: preserve_rng_state as i32,
        determinism_check: determinism_check as i32,
    };
    let mut outputs: Vec<Tensor> = Vec::new();
    let sink = &mut outputs as *mut Vec<Tensor> as *mut c_void;
    let applied = call_cpp(|error| {
        let ctx = Ctx {
            tensors: sink,
            push: push_tensor,
            error: *error,
        };
        // SAFETY: `ckpt_apply` takes ownership of `segment.callbacks.user` (freeing it
        // through `drop_closure`); `segment`'s pointers stay valid for the call because
        // `input_ptrs`, `param_ptrs` and `name` outlive it and `inputs` and `params`
        // borrow the tensors they point to (C++ copies what it keeps); `ctx` and the
        // `outputs` it points to outlive the call; `Segment` and `Ctx` match `ckpt_segment`
        // and `ckpt_ctx` of `csrc/ffi.h`.
        unsafe { ckpt_apply(&segment, &ctx) }
    });
    match applied {
        Ok(()) => Ok(outputs),
        Err(message) => Err(message.unwrap_or_else(|| "unknown error".to_owned())),
    }
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

/// Compact dropout (`csrc/policy.cpp`) on or off on this thread until drop, which puts
/// back the previous setting (guards nest). Not `Send`: the setting is the creating
/// thread's.
pub(crate) struct CompactDropout {
    prev: bool,
    _thread: std::marker::PhantomData<*const ()>,
}

impl CompactDropout {
    pub(crate) fn set(on: bool) -> CompactDropout {
        // SAFETY: sets a thread-local flag and returns the previous one; no pointers.
        let prev = unsafe { ckpt_compact_dropout_exchange(on) };
        CompactDropout {
            prev,
            _thread: std::marker::PhantomData,
        }
    }
}

impl Drop for CompactDropout {
    fn drop(&mut self) {
        // SAFETY: as in `set`.
        unsafe { ckpt_compact_dropout_exchange(self.prev) };
    }
}

/// Makes the dropout masks' draw (`csrc/bernoulli.cpp`) use its portable loop where the
/// CPU would take the AVX2 one, process-wide; returns the previous setting.
pub(crate) fn force_portable_draw(on: bool) -> bool {
    // SAFETY: sets a process-wide atomic flag and returns the previous one; no pointers.
    unsafe { ckpt_bernoulli_force_portable(on) }
}

/// The kernel the dropout masks' draw uses now: 0 `bernoulli_` (csrc/bernoulli.cpp's
/// kernels disagree with this libtorch), 1 the portable loop, 2 the AVX2 one.
pub(crate) fn mask_draw_kernel() -> i32 {
    // SAFETY: reads process-wide state (checking the kernels once); no pointers.
    unsafe { ckpt_bernoulli_kernel() }
}

/// While alive, the selective-checkpointing policy is off on this thread (a null cache's
/// scope, `csrc/policy.cpp`): what runs is neither recorded into nor replayed from an
/// enclosing segment's cache. Segments made meanwhile set their own policy as usual.
///
/// What runs inline in an enclosing segment's forward (without grad) and as segments of
/// its own in its recompute (with grad) runs under it, so that both see the same calls
/// of the enclosing policy: none. That is a checkpoint run inline without grad
/// (`checkpoint.rs`, `run`) and every chain cut at run time (`model!`,
/// `SequentialPlanner`, a `#[checkpointed]` function cut at run time), which runs every
/// stage inline without grad and its plan with grad. Without it the forward would record
/// the inline calls in the enclosing cache and the recompute would replay them to other
/// calls (a same-shape dropout's mask to another dropout).
#[must_use = "the policy is off only while the guard lives"]
pub struct OutsidePolicy {
    _scope: Option<ProbeScope>,
}

impl OutsidePolicy {
    /// Turns the policy off on this thread until the guard is dropped.
    pub fn enter() -> OutsidePolicy {
        // SAFETY: a null cache is a valid scope ("policy off"); the scope is left by the
        // guard, in reverse order of entry (guards and the node's scopes nest).
        let scope = unsafe { ckpt_policy_probe_enter(std::ptr::null_mut(), false) };
        OutsidePolicy {
            _scope: (!scope.is_null()).then_some(ProbeScope(scope)),
        }
    }
}

impl std::fmt::Debug for OutsidePolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OutsidePolicy")
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
    call_cpp(|err| {
        // SAFETY: the out-pointers and `err` are valid for the call.
        unsafe { ckpt_cuda_memory(device as i32, &mut current, &mut peak, err) }
    })
    .map_err(Option::unwrap_or_default)?;
    Ok((current, peak))
}

pub(crate) fn cuda_reset_peak(device: usize) -> Result<(), String> {
    // SAFETY: `err` is valid for the call.
    call_cpp(|err| unsafe { ckpt_cuda_reset_peak(device as i32, err) })
        .map_err(Option::unwrap_or_default)
}

/// Sets the autocast state of CPU (`cuda = false`) or CUDA; returns the previous
/// `(enabled, dtype code)`.
pub(crate) fn autocast_set(cuda: bool, enabled: bool, dtype: i32) -> Result<(bool, i32), String> {
    let (mut prev_enabled, mut prev_dtype) = (0i32, 0i32);
    call_cpp(|err| {
        // SAFETY: the out-pointers and `err` are valid for the call.
        unsafe {
            ckpt_autocast_set(
                cuda as i32,
                enabled as i32,
                dtype,
                &mut prev_enabled,
                &mut prev_dtype,
                err,
            )
        }
    })
    .map_err(Option::unwrap_or_default)?;
    Ok((prev_enabled != 0, prev_dtype))
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

#[cfg(test)]
mod tests {
    use super::*;

    /// What `guarded` writes into an error slot when it runs `body`.
    fn report_of(body: impl FnOnce() -> Result<(), CkptError>) -> Option<String> {
        let mut seen = Message::default();
        let slot = ErrorSlot {
            slot: &mut seen as *mut Message as *mut c_void,
            set: set_message,
        };
        guarded(Some(&slot), body);
        seen.0
    }

    #[test]
    fn guarded_reports_the_raw_message_of_an_error() {
        let e = CkptError::Torch("boom".into());
        assert_eq!(report_of(|| Err(e)), Some("libtorch: boom".to_owned()));
    }

    #[test]
    fn guarded_reports_the_raw_message_of_a_panic_and_does_not_unwind() {
        let r = report_of(|| panic!("the callback panicked"));
        assert_eq!(r, Some("the callback panicked".to_owned()));
        let r = report_of(|| std::panic::panic_any(7u8));
        assert_eq!(r, Some("panic payload is not a string".to_owned()));
    }

    #[test]
    fn guarded_reports_nothing_on_success() {
        assert_eq!(report_of(|| Ok(())), None);
    }

    #[test]
    fn call_cpp_returns_the_message_the_callee_reported() {
        let r = call_cpp(|slot| {
            slot.report("c10d: no peer");
            1
        });
        assert_eq!(r, Err(Some("c10d: no peer".to_owned())));
        assert_eq!(call_cpp(|_| 1), Err(None));
        assert_eq!(call_cpp(|_| 0), Ok(()));
    }

    #[test]
    fn pushing_a_tensor_hands_its_handle_over() {
        let t = Tensor::from_slice(&[1.0f32, 2.0]);
        let mut sink: Vec<Tensor> = Vec::new();
        let ctx = Ctx {
            tensors: &mut sink as *mut Vec<Tensor> as *mut c_void,
            push: push_tensor,
            error: ErrorSlot {
                slot: std::ptr::null_mut(),
                set: set_message,
            },
        };
        ctx.push(t.shallow_clone());
        assert_eq!(sink.len(), 1);
        assert!(sink[0].is_set_to(&t), "the same tensor, not a copy");
    }
}
