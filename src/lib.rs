//! `ckpt`: activation checkpointing (gradient checkpointing) for tch / libtorch.
#![doc = include_str!("../README.md")]

pub use ckpt_runtime::*;

/// Cuts a forward function into checkpointed segments at compile time.
///
/// ```
/// use ckpt::checkpointed;
/// use tch::{nn, nn::Module, Device, Kind, Tensor};
///
/// #[derive(Debug, ckpt::ShallowClone)]
/// struct Mlp {
///     l1: nn::Linear,
///     l2: nn::Linear,
///     l3: nn::Linear,
/// }
///
/// impl Mlp {
///     #[checkpointed(segments = 3)]
///     fn forward(&self, xs: &Tensor) -> Tensor {
///         let h = self.l1.forward(xs).relu(); //   segment 1 (checkpointed)
///         let h = self.l2.forward(&h).relu(); //   segment 2 (checkpointed)
///         self.l3.forward(&h) //                   segment 3 (runs inline)
///     }
/// }
///
/// let vs = nn::VarStore::new(Device::Cpu);
/// let mlp = Mlp {
///     l1: nn::linear(vs.root() / "l1", 8, 32, Default::default()),
///     l2: nn::linear(vs.root() / "l2", 32, 32, Default::default()),
///     l3: nn::linear(vs.root() / "l3", 32, 2, Default::default()),
/// };
/// let xs = Tensor::randn([4, 8], (Kind::Float, Device::Cpu));
/// let loss = mlp.forward(&xs).sum(Kind::Float);
/// loss.backward(); // segments 2 and 1 are recomputed here; the gradients are the same
/// ```
///
/// At run time only each checkpointed segment's inputs (its *stash*) are kept; backward
/// recomputes the segment from them with the same random-number state, through
/// [`checkpoint`]'s autograd node. Outputs and gradients equal those of the function
/// without the attribute (bit for bit on CPU for deterministic ops), with less memory.
///
/// # Where it goes
///
/// Free functions, `&self` methods of inherent and trait impls (`Module::forward`,
/// `ModuleT::forward_t`, your traits, trait default methods), generic functions and
/// impls, `where` clauses, `impl Trait` arguments, `Result`-returning functions. `async
/// fn`, `&mut self` and `self` receivers are compile errors. Works in editions 2021 and
/// 2024. Generated code reaches the runtime through `::ckpt::...`, so the dependency must
/// be named `ckpt`.
///
/// # Arguments
///
/// - `segments = N` (`N >= 2`, at most the number of statements): the body's statements
///   are split into `N` groups balanced by statement count. Items (`use`, nested `fn`) do
///   not count; they are hoisted. **The last group is not checkpointed**: it runs inline,
///   since its activations are needed at once (as PyTorch's `checkpoint_sequential`).
/// - Or explicit cuts: no `segments`, and [`cut!`]`();` statements between the body's
///   statements. Each marker ends a segment; what follows the last marker runs inline.
///   Markers must be statements of the body itself (not nested in a block), with a
///   statement on each side; the two forms cannot be combined.
/// - `preserve_rng_state = bool` (default `true`) and `determinism_check = bool`
///   (default `true`): as [`CheckpointOptions`].
///
/// Unknown or duplicate keys, `segments = 0` or `1`, more segments than statements, and
/// misplaced markers are compile errors that say what is valid.
///
/// # How values cross a cut (liveness)
///
/// The macro has no types; it works on names. At each cut, a binding (a parameter or a
/// top-level `let` of the body) that is defined before the cut and used after it crosses
/// it. Shadowing is understood (`let xs = f(xs);` repeated is a new binding each time),
/// as are patterns (`let (a, b) = ..`, struct patterns), bindings local to blocks,
/// closures and match arms, format-string captures (`"{xs}"`), and, conservatively,
/// every identifier inside a macro invocation. For a checkpointed segment:
///
/// - **inputs** are the bindings it uses that were defined before it. One that is also
///   used after the segment (a skip connection: `let h = xs; ..; xs + h`) enters as a
///   shallow clone and stays available; otherwise it is moved in. They go through the
///   [`Stash`] trait: tensors, tuples, `Vec`, arrays, `Option`, numbers, `bool`,
///   `String`, `Kind`, `Device`, [`Carry`]. A reference or another type is a compile
///   error on the binding, with a fix.
/// - **outputs** are the bindings it defines that are used later; they leave through
///   [`Stash`] too and are rebound after the segment (with their `mut`).
/// - **parameters** `&Tensor`, `&Option<..>`, `&Vec<..>`, `&[T]`, `&str`, tuples,
///   arrays and numbers by reference enter the stash as shallow clones (or an owned
///   `Vec`/`String`) and are rebound as references inside, so the code types as written.
///   Any other `&T` parameter is module state: captured like `self`.
/// - **`self`** (and module parameters) are captured by one [`ShallowClone`] per call,
///   wrapped in a [`Shared`] whose `Arc` each segment clones: the type needs
///   `ShallowClone + Send + 'static` (`#[derive(ckpt::ShallowClone)]`). Inside segments
///   `self` is rewritten to that clone, also inside macro invocations. Module state
///   captured this way must hold leaves (parameters, buffers), not tensors computed
///   earlier in the graph.
///
/// Generic values crossing a cut need `T: Stash` (which implies `'static`); a trait's
/// default method needs `where Self: ShallowClone + Send + Sized + 'static`. A macro that
/// defines a `let` binding for the caller (unhygienic `macro_rules!`) is not seen; write
/// such bindings as `let`.
///
/// # `?` and other control flow
///
/// `?` is supported in checkpointed segments of functions returning `Result`: the
/// segment returns early with the error, which leaves the function (`From` conversion
/// as usual; the error type needs `Send + 'static`, not `Clone`). `anyhow::bail!` and
/// `ensure!` count as `?`. `?` on `Option` is not supported in a checkpointed segment.
/// If the runtime itself fails in forward, the function panics with the
/// [`CkptError`] message, as tch's plain calls do.
///
/// `return`, and `break`/`continue` that leave a segment, are errors in checkpointed
/// segments: a segment is a closure. **Escape hatch:** the last segment runs inline, so
/// early returns belong there — put a [`cut!`]`();` before them, or choose `segments` so
/// they land in the last group.
///
/// # Side-effect rules (DESIGN.md decision 9)
///
/// A checkpointed segment runs twice (forward, then recompute in backward), so it must
/// not change anything it did not create. The macro rejects, each with a span on the
/// offending expression, the reason and a fix, every violation of the function in one
/// compile (the function is still emitted unchanged next to the errors, so IDEs keep
/// working). The last (inline) segment is not checked. Each rule has an escape hatch: a
/// `#[ckpt::allow(rule, ..)]` attribute on the statement (at any depth) that contains
/// the expression, for the rare case where the effect is intended:
///
/// | rule | rejects | escape hatch |
/// |---|---|---|
/// | `assign` | `=` and `op=` on a place not bound inside the segment (`self.n += 1`, `*out = x`, an earlier `let mut`) | `#[ckpt::allow(assign)]` |
/// | `inplace` | in-place tensor ops (`*_`, `f_*_` methods, `Tensor::relu_(&mut x)`) on a value that enters the segment or on `self` | `#[ckpt::allow(inplace)]` |
/// | `io` | `println!`, `print!`, `eprintln!`, `eprint!`, `dbg!`, `write!`, `writeln!` | `#[ckpt::allow(io)]` (use [`is_recomputing`] to print once) |
/// | `unsafe` | `unsafe` blocks | `#[ckpt::allow(unsafe)]` |
/// | `mutation` | `borrow_mut`, `lock`, `set`, `replace`, `take`, `push`, `insert`, `remove`, `extend`, atomics `store`/`fetch_*`, .. on a value from outside the segment | `#[ckpt::allow(mutation)]` (e.g. `lock` of a read-only [`Shared`] module) |
/// | `rng` | randomness outside libtorch: `rand::..`, `fastrand::..`, `thread_rng`, `gen`/`gen_range`/`sample`/`shuffle` on an outside generator | `#[ckpt::allow(rng)]` |
/// | control flow | `return`, `break`/`continue` leaving the segment | placement: the last segment runs inline |
///
/// ```
/// # use tch::{Kind, Tensor};
/// #[ckpt::checkpointed(segments = 2)]
/// fn noisy(xs: &Tensor) -> Tensor {
///     #[ckpt::allow(io)]
///     if !ckpt::is_recomputing() {
///         println!("forward of {:?}", xs.size());
///     }
///     let ys = xs.tanh();
///     ys.sum(Kind::Float)
/// }
/// # let _ = noisy(&Tensor::ones([2], (Kind::Float, tch::Device::Cpu)));
/// ```
///
/// The rules are syntactic, so they can be fooled (a mutation hidden in a called
/// function, or in a macro's expansion); libtorch's version counters still catch an
/// in-place change of a stashed tensor at backward, and `determinism_check` a recompute
/// whose shapes differ from forward.
///
/// # Errors at run time
///
/// Segments are named `Type::method segment 2 of 3 (src/model.rs:42)` in [`CkptError`]
/// messages (a panic in forward, a failed recompute in `loss.backward()`).
pub use ckpt_macros::checkpointed;

/// Derives [`ShallowClone`](trait@ShallowClone) for a struct or an enum (generic ones
/// too): each field is copied with `ShallowClone` when its type implements it (tensors,
/// tch layers, other derived modules, numbers, `Vec`/`Option` of those) and with `Clone`
/// otherwise (configuration structs). Type parameters get a `ShallowClone` bound. A field
/// that is neither is a compile error on its type.
///
/// ```
/// use tch::{nn, Tensor};
///
/// #[derive(Clone, Debug)]
/// struct Config { dropout: f64 }
///
/// #[derive(Debug, ckpt::ShallowClone)]
/// struct Block {
///     attn: nn::Linear,
///     norm: nn::LayerNorm,
///     scale: Tensor,
///     config: Config, // by `Clone`
/// }
/// ```
pub use ckpt_macros::ShallowClone;

/// An explicit cut between two statements of a `#[checkpointed]` function (use it
/// instead of `segments = N`).
///
/// ```
/// # use tch::{Kind, Tensor};
/// #[ckpt::checkpointed]
/// fn f(xs: &Tensor) -> Tensor {
///     let a = xs.tanh();
///     ckpt::cut!();
///     let b = a.sigmoid();
///     ckpt::cut!();
///     b.sum(Kind::Float) // the last segment runs inline
/// }
/// # let _ = f(&Tensor::ones([2], (Kind::Float, tch::Device::Cpu)));
/// ```
///
/// It expands to nothing: outside `#[checkpointed]` (or nested in a block, which the
/// macro rejects) it has no effect.
#[macro_export]
macro_rules! cut {
    () => {};
}

#[doc(hidden)]
pub mod __private {
    pub use ckpt_runtime::__private::*;
    pub use tch;
}
