//! [`checkpoint`]: run a closure so that only its inputs are kept and it is recomputed
//! in backward; the errors of a segment, and their messages, are made here.

use std::any::Any;
use std::cell::Cell;
use std::panic::{AssertUnwindSafe, Location, catch_unwind};
use std::sync::{Arc, Mutex};

use tch::Tensor;

use crate::{CkptError, ShallowClone, Stash, ffi, lock};

/// Options of one checkpointed segment, with PyTorch's defaults
/// (`torch.utils.checkpoint.checkpoint`).
///
/// ```no_run
/// # extern crate ckpt_runtime as ckpt;
/// use ckpt::{CheckpointOptions, checkpoint_with};
/// # let xs = tch::Tensor::zeros([2, 3], (tch::Kind::Float, tch::Device::Cpu));
/// let opts = CheckpointOptions::new().name("attention").preserve_rng_state(false);
/// let ys = checkpoint_with(&opts, |x: tch::Tensor| x.relu(), xs);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointOptions {
    pub(crate) preserve_rng_state: bool,
    pub(crate) determinism_check: bool,
    pub(crate) name: Option<String>,
    pub(crate) policy: Policy,
    /// Whether [`CheckpointOptions::policy`] was called: a planner that chooses each
    /// segment's policy (`segments = auto` functions) then plans for this one instead.
    pub(crate) policy_set: bool,
    pub(crate) parameters: Parameters,
}

/// The tensors listed by [`CheckpointOptions::parameters`]: handles sharing the
/// caller's tensors. Two lists are equal when they hold the same tensors in the same
/// order (same storage, sizes and strides).
#[derive(Default)]
pub(crate) struct Parameters(pub(crate) Vec<Tensor>);

impl Clone for Parameters {
    fn clone(&self) -> Self {
        Parameters(self.0.iter().map(Tensor::shallow_clone).collect())
    }
}

impl PartialEq for Parameters {
    fn eq(&self, other: &Self) -> bool {
        self.0.len() == other.0.len()
            && self
                .0
                .iter()
                .zip(&other.0)
                .all(|(a, b)| a.f_is_set_to(b).unwrap_or(false))
    }
}

impl Eq for Parameters {}

impl std::fmt::Debug for Parameters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} tensors", self.0.len())
    }
}

impl Default for CheckpointOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl CheckpointOptions {
    /// `preserve_rng_state = true`, `determinism_check = true`, no name.
    pub fn new() -> Self {
        CheckpointOptions {
            preserve_rng_state: true,
            determinism_check: true,
            name: None,
            policy: Policy::RECOMPUTE_ALL,
            policy_set: false,
            parameters: Parameters::default(),
        }
    }

    /// Stash the random-number-generator state at forward and replay the segment with it,
    /// so dropout masks and other random ops are the same in the recompute (default on).
    ///
    /// The CPU generator is saved, and the CUDA generators of the devices of the segment's
    /// input tensors (of the current CUDA device when no input is on CUDA). The state is
    /// restored with fork semantics (`torch.random.fork_rng`): after backward the global
    /// generators are where they would be without checkpointing. Only the generators
    /// that the forward drew from are kept: the generators are compared before and after
    /// the segment's forward, and a segment that draws no random numbers (its recompute
    /// draws none either) keeps no state, while one that does keeps a copy of the CPU
    /// generator's state (5,056 bytes) or of a CUDA generator's (16 bytes). Turning it off
    /// saves that copy, and the comparison (about 5 KiB copied, host memory, per segment).
    pub fn preserve_rng_state(mut self, on: bool) -> Self {
        self.preserve_rng_state = on;
        self
    }

    /// Check that the recompute produces outputs of the shape, dtype and device that
    /// forward produced (default on); a mismatch fails backward with an error that names
    /// the segment, instead of computing wrong gradients. As PyTorch's
    /// `determinism_check="default"`. The number of outputs is always checked.
    pub fn determinism_check(mut self, on: bool) -> Self {
        self.determinism_check = on;
        self
    }

    /// The segment's name in error messages (default: the caller's source location,
    /// `file:line:column`).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// What the segment keeps from its forward instead of recomputing it (selective
    /// checkpointing; default [`Policy::RECOMPUTE_ALL`]). A `#[checkpointed(segments =
    /// auto)]` function whose options set no policy lets the planner choose one per
    /// segment; with one set, it plans the cuts for that policy.
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self.policy_set = true;
        self
    }

    /// Lists tensors the closure captures (parameters), adding to those listed before.
    ///
    /// The leaves among them that require grad and that the segment's forward reads (its
    /// ops are watched) become inputs of the checkpoint node, as the segment's inputs
    /// are: `Tensor::run_backward(&[loss], &[w], ..)` then returns `w`'s gradient, and
    /// `w`'s gradient accumulator node runs once per backward, after every segment that
    /// used `w`, with the complete `.grad` (post-hooks such as `ckpt::dist`'s DDP Reducer
    /// see one accumulation). In `backward()` each segment still adds its part to `.grad`
    /// as soon as it is complete, so nothing is held longer than without listing. A
    /// captured tensor that is not listed still gets its gradient from `backward()`, added
    /// in the recompute, and its accumulator node runs once per segment that uses it;
    /// `run_backward` cannot return it: asking for it is an error naming the segment when
    /// libtorch runs the node (another requested input lies behind it) and the tensor's
    /// accumulator exists, an undefined (or partial) gradient otherwise.
    ///
    /// `#[checkpointed]`, `model!` and [`checkpoint_sequential`](crate::checkpoint_sequential)
    /// list the tensors of the modules they capture through [`ShallowClone`] themselves.
    /// A listed tensor the segment does not use costs nothing but an edge of the graph.
    /// For closure-built modules (`nn::FuncT`), list the `VarStore`'s variables:
    ///
    /// ```no_run
    /// # extern crate ckpt_runtime as ckpt;
    /// use ckpt::{CheckpointOptions, checkpoint_with};
    /// use tch::nn::{self, ModuleT};
    /// let vs = nn::VarStore::new(tch::Device::Cpu);
    /// let block = nn::seq_t().add(nn::linear(vs.root() / "l", 4, 4, Default::default()));
    /// let opts = CheckpointOptions::new().parameters(&vs.trainable_variables());
    /// # let xs = tch::Tensor::zeros([2, 4], (tch::Kind::Float, tch::Device::Cpu));
    /// let ys = checkpoint_with(&opts, move |x: tch::Tensor| block.forward_t(&x, true), xs);
    /// ```
    pub fn parameters<'a>(mut self, tensors: impl IntoIterator<Item = &'a Tensor>) -> Self {
        self.parameters
            .0
            .extend(tensors.into_iter().map(Tensor::shallow_clone));
        self
    }

    /// Lists the tensors `module` holds ([`ShallowClone::visit_tensors`]), as
    /// [`parameters`](Self::parameters) does.
    pub fn parameters_of<T: ShallowClone>(mut self, module: &T) -> Self {
        module.visit_tensors(&mut |t| self.parameters.0.push(t.shallow_clone()));
        self
    }
}

/// A selective checkpointing policy: which results of a segment's forward run are kept
/// until backward rather than recomputed.
///
/// Full recompute ([`Policy::RECOMPUTE_ALL`], PyTorch's `checkpoint`) keeps only the
/// segment's inputs. [`Policy::selective`] also keeps what is expensive to recompute and
/// cheap to keep, after Korthikanti et al., "Reducing Activation Recomputation in Large
/// Transformer Models" (2022), as PyTorch's selective activation checkpointing does with
/// a policy that returns `CheckpointPolicy.MUST_SAVE` for matmuls
/// (`torch.utils.checkpoint.create_selective_checkpoint_contexts`):
///
/// - **linear outputs** (`save_linear`): the `[.., out_features]` result of every
///   `Linear` (`aten::linear` with a bias, on a 2-d input or a contiguous one, the
///   composite's fused `addmm` path), 4 bytes an element in float32; the recompute
///   skips the matmul. A `Linear` without a bias, or on a non-contiguous input of 3 or
///   more dimensions, keeps nothing and is recomputed. Norms, activations, softmax and
///   attention scores are recomputed.
/// - **narrowing linear outputs** (`save_narrowing_linear`): the same, only for a
///   `Linear` with fewer output than input features (`out_features < in_features`, such as
///   a transformer's feed-forward down-projection, `[.., d_ff] -> [.., d_model]`): its
///   output costs `2 * in_features` flops an element to recompute, more than the layers
///   on the narrower input (`2 * d_ff` against `2 * d_model`), and is among the narrowest
///   tensors of its block. Implied by `save_linear`.
/// - **dropout masks** (`save_dropout_masks`, CPU): a bit mask (1 bit an element, 8 a byte) and
///   the generator's state after the draw (about 5 KiB on CPU) for every training-mode
///   `dropout`; the recompute rebuilds the noise instead of drawing it again, and puts
///   the generator where the draw left it (inside the recompute, whose generator state
///   is handed back afterwards). With `preserve_rng_state(false)` it leaves the generator
///   alone instead: the recompute then moves the generator only by what it draws
///   besides the kept masks, so the generator after backward is as without checkpointing
///   when the segment draws nothing else.
///
/// Gradients are bit-equal to those of the full recompute (and of the model without
/// checkpointing): the recompute rebuilds the graph libtorch would have built, around
/// the kept tensors. A kept output changed in place after forward is recomputed; a
/// recompute that calls linear or dropout on other shapes than forward did fails
/// backward with an error, but the same layer on same-shape inputs in another order
/// cannot be told apart: the recompute must compute what forward did, as for every
/// policy. A checkpoint nested in the segment runs inline in its forward (no grad) and
/// as a segment of its own in its recompute; either way its calls stay out of this
/// segment's policy, and so do those of a chain cut at run time called in it (a
/// checkpointed `model!`, [`SequentialPlanner`](crate::plan::SequentialPlanner), a
/// `#[checkpointed]` function with `segments = auto`, `budget` or a layer loop). Bytes
/// kept by a segment are freed after its recompute (kept while `keep_graph` allows a
/// second backward).
///
/// Two policies are equal when they keep the same things: `save_linear` implies
/// `save_narrowing_linear`, so `Policy::selective().save_narrowing_linear(true) ==
/// Policy::selective()`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Policy {
    save_linear: bool,
    save_narrowing_linear: bool,
    save_dropout_masks: bool,
}

impl Policy {
    /// Keep only the segment's inputs; recompute everything (the default).
    pub const RECOMPUTE_ALL: Policy = Policy {
        save_linear: false,
        save_narrowing_linear: false,
        save_dropout_masks: false,
    };

    /// Keep linear outputs and dropout masks; recompute the rest.
    pub const fn selective() -> Policy {
        Policy {
            save_linear: true,
            save_narrowing_linear: false,
            save_dropout_masks: true,
        }
    }

    /// Keep dropout masks only; recompute the rest, `Linear` outputs included (the
    /// main program's `--policy masks`, `#[checkpointed(policy = masks)]`): for every
    /// training-mode `dropout` (CPU) the segment keeps a bit mask, 1 bit an element
    /// (`ceil(numel / 8)` bytes), and the generator's state after the draw (about 5 KiB
    /// on CPU) until its recompute is done; the recompute rebuilds the noise from the
    /// mask instead of drawing it again. Much less memory than [`Policy::selective`]
    /// (a float32 `Linear` output is 32 times its mask), less recompute time than
    /// [`Policy::RECOMPUTE_ALL`] where drawing the masks is a large part of the
    /// forward. The same as `Policy::selective().save_linear(false)`.
    pub const fn masks() -> Policy {
        Policy {
            save_linear: false,
            save_narrowing_linear: false,
            save_dropout_masks: true,
        }
    }

    /// Keep dropout masks and the outputs of narrowing `Linear` layers (`out_features <
    /// in_features`); recompute the rest (the main program's `--policy narrowing`,
    /// `#[checkpointed(policy = narrowing)]`). Between [`Policy::masks`] and
    /// [`Policy::selective`]: in a transformer block (`d_model` 256, `d_ff` 1024) it keeps
    /// the feed-forward down-projection's `[.., 256]` output, 4 bytes an element in float32,
    /// and skips its matmul, a third of the block's linear flops, for a ninth of the
    /// bytes of the block's linear outputs (seed encoder, seq 256, batch 16: 5.3 MiB a
    /// block with the masks, against 37.3 MiB under `selective`). The same as `Policy::masks().save_narrowing_linear(true)`.
    pub const fn narrowing() -> Policy {
        Policy {
            save_linear: false,
            save_narrowing_linear: true,
            save_dropout_masks: true,
        }
    }

    /// Keep (or not) the outputs of `Linear` layers.
    pub const fn save_linear(mut self, on: bool) -> Policy {
        self.save_linear = on;
        self
    }

    /// Keep (or not) the outputs of narrowing `Linear` layers (`out_features <
    /// in_features`); kept anyway when [`save_linear`](Policy::save_linear) is on.
    pub const fn save_narrowing_linear(mut self, on: bool) -> Policy {
        self.save_narrowing_linear = on;
        self
    }

    /// Keep (or not) dropout masks (CPU).
    pub const fn save_dropout_masks(mut self, on: bool) -> Policy {
        self.save_dropout_masks = on;
        self
    }

    /// The bits `csrc/policy.h` reads.
    pub(crate) fn bits(self) -> u32 {
        let (linear, narrowing, masks) = self.key();
        u32::from(linear) | (u32::from(masks) << 1) | (u32::from(narrowing) << 2)
    }
}

impl Policy {
    /// What the policy keeps, with the narrowing-linear flag implied by `save_linear`
    /// folded in: equality and hashing compare this.
    const fn key(self) -> (bool, bool, bool) {
        (
            self.save_linear,
            self.save_narrowing_linear && !self.save_linear,
            self.save_dropout_masks,
        )
    }
}

impl PartialEq for Policy {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}

impl Eq for Policy {}

impl std::hash::Hash for Policy {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.key().hash(state);
    }
}

/// Whether the calling code runs inside the recompute of a checkpointed segment (in
/// backward), as opposed to its first run in forward or an unchecked run.
///
/// Use it to skip work that must happen once, such as logging or a hand-written running
/// average. Batch norm's running statistics (`nn::BatchNorm`, `Tensor::batch_norm`,
/// `Tensor::instance_norm`) need nothing: they are not updated in a recompute.
pub fn is_recomputing() -> bool {
    RECOMPUTING.with(|r| r.get() > 0)
}

thread_local! {
    /// How many recomputes the calling thread is inside (nested checkpoints nest them).
    static RECOMPUTING: Cell<u32> = const { Cell::new(0) };
}

/// Counts the calling thread into a recompute while alive (when `recompute`).
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

/// Number of checkpointed segments alive: nodes in an autograd graph that still own their
/// closure and stash. It returns to its earlier value once the outputs (and the graph
/// that holds them) are dropped, whether or not backward ran.
pub fn live_segments() -> i64 {
    ffi::live_segments()
}

/// Runs `f(input)` as a checkpointed segment, with the default [`CheckpointOptions`].
///
/// What is saved: the tensors of `input` (the *stash*), the closure, and (with
/// `preserve_rng_state`, when `f` draws random numbers) the RNG state. What is not: the
/// activations inside `f`, which backward recomputes by calling `f` again on the stash,
/// with grad enabled, before backpropagating through the recomputed graph. Gradients
/// reach the input tensors that require grad and the parameters `f` captured (for
/// example a `ShallowClone` of a module; list them with
/// [`CheckpointOptions::parameters_of`] to make them inputs of the node), and equal those
/// without checkpointing. The training loop is unchanged: `loss.backward()` and
/// `nn::Optimizer` work as before.
///
/// - `input` and the output are any [`Stash`] value: a tensor, tuples, `Vec`, arrays,
///   `Option`, and non-tensor values (carried, not differentiated). Integer outputs are
///   marked non-differentiable.
/// - `f` must be `Fn + Send + 'static`: it owns what it touches and may run again on
///   another thread after this call returns. It must compute the same thing both times
///   (no side effects); `#[checkpointed]` checks that at compile time.
/// - No input needs `requires_grad`: parameters inside `f` get their gradients anyway.
/// - Under `tch::no_grad` it simply returns `f(input)` (a panic of `f` is then
///   [`f_checkpoint`]'s error all the same); nested checkpoints work.
/// - `Tensor::run_backward(&[loss], &[x], ..)` with `x` an input of the segment works,
///   and so it does with a parameter `f` captured when it is listed in the options
///   ([`CheckpointOptions::parameters`]); a captured tensor that is not listed cannot be
///   requested that way (see there); use `backward()`. Capture leaves (parameters,
///   buffers) only: a captured tensor that was computed (`h = &x * 2`, requiring grad)
///   is followed by `backward()`, but `run_backward` with respect to what it came from
///   (`x`) misses that path without an error, since the node does not know its captures;
///   pass such a tensor as an input instead.
/// - Double backward (`create_graph = true`) differentiates through the recompute.
/// - The inputs are kept until backward: changing one in place after this call makes
///   backward fail with an error naming the segment; an output that is an input returned
///   unchanged is a view of it through the node, and libtorch refuses in-place ops on it.
///   An output that is a view of a tensor made inside `f` (`(x * 2.0).view([2, 3])`) is
///   an ordinary output: in-place ops on it after this call work as in the plain
///   function. A view of an input shares the input's storage, so an in-place op on it
///   changes the stash: backward then fails with the error naming the segment.
/// - Batch norm (`nn::BatchNorm`, `Tensor::batch_norm`, `Tensor::instance_norm`) in
///   training mode updates its running statistics once per step, as without
///   checkpointing: in forward, not again in the recompute (which normalises with the
///   same batch statistics, so gradients are unchanged).
/// - A second backward through the graph needs the graph kept in the first (as
///   without checkpointing); without it, backward fails with libtorch's "backward
///   through the graph a second time" and the fix, naming the segment.
/// - `f` must not turn grad off in its recompute (`tch::no_grad` when
///   [`is_recomputing`]): the recompute builds the graph that
///   backward differentiates. When the recompute runs an op with grad off on a tensor
///   that requires grad and, after it, none of the outputs that receive a gradient
///   requires grad, backward fails with an error naming the segment, the output and the
///   op, instead of leaving the inputs and parameters without their gradient (PyTorch's
///   reentrant checkpoint raises "none of output has requires_grad=True" there). Outputs
///   that are constants, integer tensors or carried values are not that error, nor is a
///   value made under `no_grad` beside an output with a graph (it gets no gradient, as
///   in the plain function); for a value meant to carry no gradient, `detach()` says so.
///
/// # Panics
///
/// When [`f_checkpoint`] returns an error: `f` panicked in forward (the panic is caught
/// around `f`, inside the node's call, and re-raised here with its message) or libtorch
/// failed.
/// Failures during recompute (`f` panics, its outputs differ from the forward's, it ran
/// without grad: see above) surface from `loss.backward()` (tch panics) or
/// `loss.f_backward()` (an `Err` whose message names the segment).
///
/// Source: PyTorch's `torch.utils.checkpoint.checkpoint` (reentrant variant, with the
/// dummy-input fix for inputs that do not require grad, pytorch#7617).
#[track_caller]
pub fn checkpoint<I, O, F>(f: F, input: I) -> O
where
    I: Stash,
    O: Stash,
    F: Fn(I) -> O + Send + 'static,
{
    checkpoint_with(&CheckpointOptions::new(), f, input)
}

/// The fallible twin of [`checkpoint`].
///
/// # Errors
///
/// [`CkptError::ClosurePanicked`] when `f` panics in forward (under `tch::no_grad` too,
/// where `f` runs plainly), [`CkptError::Torch`] when libtorch fails (for example an
/// input tensor is undefined).
#[track_caller]
pub fn f_checkpoint<I, O, F>(f: F, input: I) -> Result<O, CkptError>
where
    I: Stash,
    O: Stash,
    F: Fn(I) -> O + Send + 'static,
{
    f_checkpoint_with(&CheckpointOptions::new(), f, input)
}

/// [`checkpoint`] with explicit [`CheckpointOptions`].
///
/// # Panics
///
/// As [`checkpoint`].
#[track_caller]
pub fn checkpoint_with<I, O, F>(options: &CheckpointOptions, f: F, input: I) -> O
where
    I: Stash,
    O: Stash,
    F: Fn(I) -> O + Send + 'static,
{
    match f_checkpoint_with(options, f, input) {
        Ok(o) => o,
        Err(e) => panic!("{e}"),
    }
}

/// The fallible twin of [`checkpoint_with`].
///
/// # Errors
///
/// As [`f_checkpoint`].
#[track_caller]
pub fn f_checkpoint_with<I, O, F>(
    options: &CheckpointOptions,
    f: F,
    input: I,
) -> Result<O, CkptError>
where
    I: Stash,
    O: Stash,
    F: Fn(I) -> O + Send + 'static,
{
    // Read here, not in a closure: a closure does not inherit `#[track_caller]`.
    let caller = Location::caller();
    let name = match &options.name {
        Some(name) => name.clone(),
        None => format!("{}:{}:{}", caller.file(), caller.line(), caller.column()),
    };
    run(options, name, f, input)
}

/// Runs `f()` where `ckpt` calls user code outside a checkpoint node (under `no_grad`,
/// the last group of a chain, a profiling run), turning a panic into
/// [`CkptError::ClosurePanicked`] (`recompute: false`, the segment named by `segment()`)
/// as the node turns a panic in forward into one, so every `f_` function returns it.
pub(crate) fn run_plain<T>(
    segment: impl FnOnce() -> String,
    f: impl FnOnce() -> T,
) -> Result<T, CkptError> {
    catch_panic(segment, false, f)
}

/// Runs user code `f`, turning a panic into [`CkptError::ClosurePanicked`] naming the
/// segment `segment()`: the one place where a panic of user code becomes an error.
fn catch_panic<T>(
    segment: impl FnOnce() -> String,
    recompute: bool,
    f: impl FnOnce() -> T,
) -> Result<T, CkptError> {
    catch_unwind(AssertUnwindSafe(f)).map_err(|payload| {
        let message = panic_message(payload.as_ref());
        drop_payload(payload);
        CkptError::ClosurePanicked {
            segment: segment(),
            recompute,
            message,
        }
    })
}

/// Drops a caught panic's payload; should its own `Drop` panic, that second payload is
/// leaked (dropping it could panic again) rather than unwinding further.
pub(crate) fn drop_payload(payload: Box<dyn Any + Send>) {
    if let Err(again) = catch_unwind(AssertUnwindSafe(move || drop(payload))) {
        std::mem::forget(again);
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
    // Only libtorch's backtrace: the marker followed by its "(most recent call first)"
    // (a user's message that merely mentions the words stays whole).
    let Some(i) = message
        .find("Exception raised from")
        .filter(|&i| message[i..].contains("(most recent call first)"))
    else {
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

/// What the forward run of a segment leaves for [`run`] besides its tensors: the output's
/// skeleton, or the closure's own error (C++ carries only its message).
type Forward<S> = Arc<Mutex<Option<Result<S, CkptError>>>>;

/// Runs `f(input)` as a segment named `name` (the macros and `checkpoint_sequential`
/// name their segments themselves).
#[doc(hidden)]
pub fn run<I, O, F>(
    options: &CheckpointOptions,
    name: String,
    f: F,
    input: I,
) -> Result<O, CkptError>
where
    I: Stash,
    O: Stash,
    F: Fn(I) -> O + Send + 'static,
{
    if !ffi::grad_enabled() {
        // `f` moves into the guarded call, so a panic in dropping its captures is caught
        // with the rest. Inside an enclosing segment's forward the run is inline, and in
        // its recompute a segment of its own, whose policy scope hides its calls from the
        // enclosing one's: hide them here too.
        let _off = ffi::OutsidePolicy::enter();
        return run_plain(|| name, move || f(input));
    }
    let mut stash = Vec::new();
    let skeleton = input.unpack(&mut stash);
    let forward: Forward<O::Skeleton> = Arc::default();
    let record = Arc::clone(&forward);
    let segment = name.clone();
    let erased = move |tensors: Vec<Tensor>, recompute: bool| {
        let _flag = RecomputeFlag::enter(recompute);
        let ran = catch_panic(
            || segment.clone(),
            recompute,
            || {
                let output = f(I::pack(&skeleton, &mut tensors.into_iter()));
                let mut out = Vec::new();
                let out_skeleton = output.unpack(&mut out);
                // The recompute's skeleton is dropped here, inside `catch_panic`.
                (out, (!recompute).then_some(out_skeleton))
            },
        );
        match ran {
            Ok((out, out_skeleton)) => {
                if let Some(out_skeleton) = out_skeleton {
                    *lock(&record) = Some(Ok(out_skeleton));
                }
                Ok(out)
            }
            Err(e) => {
                if !recompute {
                    *lock(&record) = Some(Err(e.clone()));
                }
                Err(e)
            }
        }
    };
    let applied = {
        let _policy = ffi::PolicyGuard::set(options.policy.bits());
        ffi::apply(
            Box::new(erased),
            &name,
            &stash,
            &options.parameters.0,
            options.preserve_rng_state,
            options.determinism_check,
        )
    };
    let forward = lock(&forward).take();
    match (applied, forward) {
        (Ok(tensors), Some(Ok(out_skeleton))) => {
            Ok(O::pack(&out_skeleton, &mut tensors.into_iter()))
        }
        // The closure failed in forward: its own error, not C++'s report of its message.
        (_, Some(Err(e))) => Err(e),
        (Err(message), _) => Err(CkptError::Torch(message)),
        (Ok(_), None) => unreachable!("ckpt: forward succeeded without running the closure"),
    }
}
