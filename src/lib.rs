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
/// without the attribute (bit for bit on CPU for deterministic ops, when each gradient
/// sums its contributions in the same order: a weight used in several segments, as a
/// loop's shared cell is, gets its segments' sums added, which can differ in the last
/// bits), with less memory.
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
/// # Arguments: whole function, `segments = N`, markers, `auto`
///
/// - **None**: `#[checkpointed]` checkpoints the **whole function as one segment** — the
///   equivalent of PyTorch's `checkpoint(block, x)`. Put it on a block's own forward and
///   the block is checkpointed wherever it is called from: the model's loop over its
///   blocks, a `model!`, another forward. `return` and `?` work as without the attribute
///   (the function's value is the segment's output). This is the common choice for a
///   stack of blocks: one checkpoint per block.
///
///   ```
///   # use ckpt::checkpointed;
///   # use tch::{nn, nn::Module, Device, Kind, Tensor};
///   #[derive(Debug, ckpt::ShallowClone)]
///   struct Block { attn: nn::Linear, mlp: nn::Linear }
///
///   impl Block {
///       #[checkpointed] // one segment: the model's loop checkpoints block by block
///       fn forward(&self, x: &Tensor) -> Tensor {
///           let x = self.attn.forward(x).gelu("none") + x;
///           self.mlp.forward(&x) + x
///       }
///   }
///   # let vs = nn::VarStore::new(Device::Cpu);
///   # let blocks: Vec<Block> = (0..2).map(|i| Block {
///   #     attn: nn::linear(vs.root() / i / "a", 8, 8, Default::default()),
///   #     mlp: nn::linear(vs.root() / i / "m", 8, 8, Default::default()),
///   # }).collect();
///   let mut x = Tensor::randn([4, 8], (Kind::Float, Device::Cpu));
///   for block in &blocks {
///       x = block.forward(&x);
///   }
///   x.sum(Kind::Float).backward();
///   ```
/// - `segments = N` (`N >= 2`): the body is a chain of **stages**, cut into `N` segments
///   as PyTorch's `checkpoint_sequential` cuts modules ([`sequential_segments`]: every
///   segment has `stages / N` stages, the last takes the rest). **The last segment is
///   not checkpointed**: it runs inline, since its activations are needed at once. The
///   stages are
///   - each top-level statement (items such as `use` or a nested `fn` do not count;
///     they are hoisted);
///   - each **layer call of a method chain** in a `let` initializer or in the tail
///     expression: tch writes whole forwards as one chain, `xs.view(..).apply(&self.conv1)
///     .max_pool2d_default(2).apply(&self.conv2) ..`, which is cut before each layer call
///     but the first, so that the value flowing into a layer is the stash (as with
///     modules). A call applies a layer when it is `.apply(..)`, `.apply_t(..)`,
///     `.forward(..)` or `.forward_t(..)`, or when an argument refers to module state
///     (`&self.w`, `&self.blocks[i]`, a module parameter); the calls after it (views,
///     activations, pooling, dropout) stay in its stage;
///   - each **iteration of a layer loop**: a top-level `for` statement (`for b in
///     self.blocks.iter()`, `for b in &self.blocks`, `.iter().enumerate()`,
///     `.iter().zip(..)`, `for i in 0..n` with indexing), or a `fold` over layers bound by
///     a `let` (`let x = self.blocks.iter().fold(x, |x, b| b.forward(&x, m));`) or as the
///     tail expression. The number of iterations is known only at run time, so with a
///     layer loop the cuts are computed at run time (at every call, from the iteration
///     count), and the recompute re-derives an iteration's items from the loop's iterable:
///     it may use only `self` and the function's parameters (`for b in blocks.iter()`
///     over a local `blocks` is a compile error, with the fix). A `break` is a compile
///     error (the number of iterations must be known before the loop runs); `continue`
///     is fine. Values the loop assigns or mutates and that were declared before it
///     (`let mut x` … `x = block.forward(&x, ..)`, several of them, a skip list that a
///     U-Net pushes to and pops from) are its **loop-carried values**: they cross the
///     cuts between iterations like any live value; values it only reads (masks, rotary
///     tables, `train`) are passed to every segment that needs them.
///
///   Without a layer loop the stages are known at compile time, and `N` more than the
///   stages is a compile error; with one, `N` is clamped at run time. `model!` cuts its
///   chains with the same rule ([`sequential_segments`]).
/// - Or explicit cuts: no `segments`, and [`cut!`]`();` statements between the body's
///   statements. Each marker ends a segment; what follows the last marker runs inline.
///   Markers must be statements of the body itself (not nested in a block), with a
///   statement on each side; the two forms cannot be combined. Between markers, chains
///   and loops are not cut.
/// - Or `segments = auto` / `budget = ".."`: the planner chooses the cuts between stages
///   at run time from a profile of them (see [below](#automatic-cuts-segments--auto-and-budget)).
/// - `preserve_rng_state = bool` (default `true`) and `determinism_check = bool`
///   (default `true`): as [`CheckpointOptions`].
/// - `policy = full | selective` (default `full`): what each checkpointed segment keeps
///   from its forward, as [`Policy`]. `selective` keeps every `Linear` output and dropout
///   mask and recomputes the rest (norms, activations, attention scores): more bytes
///   kept, less recomputed; gradients unchanged.
/// - `#[ckpt::keep]` on a top-level `let` of a function cut by `segments = N` or markers:
///   the statement runs **once, inline between the segments**, as in the plain function
///   (its value and what its backward needs stay alive; it is not recomputed). The
///   groups are cut as without the mark, then each run of kept statements is taken out
///   of its checkpointed group, splitting it (in the last group, which runs inline
///   anyway, a mark changes nothing). Keep what is expensive to recompute and cheap to store
///   (a block's projections, as Megatron's selective recompute, Korthikanti et al.
///   2022); the side-effect rules do not apply to it, since it runs once. A mark on a
///   function checkpointed whole, with `segments = auto` / `budget`, with a layer loop,
///   nested in a block, with arguments, or one that leaves nothing to checkpoint is a
///   compile error that says what to do.
///
///   ```
///   # use ckpt::{checkpointed, ShallowClone};
///   # use tch::{nn, nn::Module, Device, Kind, Tensor};
///   # #[derive(Debug, ShallowClone)]
///   # struct Block { ln: nn::LayerNorm, qkv: nn::Linear, out: nn::Linear }
///   #[checkpointed]
///   fn block(m: &Block, x: &Tensor) -> Tensor {
///       let h = m.ln.forward(x); // segment 1 (recomputed)
///       #[ckpt::keep]
///       let qkv = m.qkv.forward(&h); // runs once, between the segments
///       let a = qkv.narrow(-1, 0, 8).softmax(-1, Kind::Float) * qkv.narrow(-1, 8, 8);
///       ckpt::cut!(); // segment 2 above (recomputed)
///       x + m.out.forward(&a) // inline
///   }
///   # let vs = nn::VarStore::new(Device::Cpu);
///   # let p = vs.root();
///   # let m = Block { ln: nn::layer_norm(&p / "ln", vec![8], Default::default()),
///   #     qkv: nn::linear(&p / "qkv", 8, 16, Default::default()),
///   #     out: nn::linear(&p / "out", 8, 8, Default::default()) };
///   # let x = Tensor::randn([2, 8], (Kind::Float, Device::Cpu)).set_requires_grad(true);
///   block(&m, &x).sum(Kind::Float).backward();
///   ```
///
/// **Which to use.** `#[checkpointed]` on a block's forward for a stack of blocks (each
/// block recomputed on its own, the least memory for one extra forward); `segments = N`
/// or `segments = auto` on a whole model's forward when its layers are not blocks of
/// their own, or to checkpoint groups of blocks; markers to choose the cuts by hand.
///
/// **When it saves nothing, the compiler says so.** A checkpointed segment pays off when
/// what it recomputes is larger than its inputs. Where the macro can see that it does
/// not — a checkpointed segment of a cut function holding a whole layer loop (its
/// recompute rebuilds every iteration's activations at once), or checkpointed segments
/// with no layer call while the last, inline one has them — it emits a warning on the
/// statement (``use of deprecated function `..::checkpointing_saves_little`: ckpt: ..``,
/// the one warning a macro can give on stable Rust; `#[allow(deprecated)]` on the
/// function silences it). At run time [`plan::explain`] shows every stage of the plans
/// made so far with its bytes and the segment that holds it.
///
/// Unknown or duplicate keys, `segments = 0` or `1`, more segments than stages, bad
/// budget strings, misplaced markers and layer loops that cannot be cut are compile
/// errors that say what is valid.
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
///   [`Stash`] too and are rebound after the segment (with their `mut`). An earlier `mut`
///   binding that the segment uses and later code reads is an input *and* an output, so
///   a change made inside (`v.sort()`, `f(&mut n)`) is seen after the segment, as
///   without the attribute (the recompute starts again from the stashed value).
/// - **values of the function** (its top-level `let`s, and parameters taken by value)
///   that a segment assigns (`x = block.forward(&x)`) or mutates as a collection
///   (`skips.push(..)`, `opt.take()`) are taken into the segment and given back: that is
///   not a side effect, since the recompute starts again from the stashed value. A
///   layer loop's carried values cross its cuts this way. (`op=`, in place on a tensor,
///   and interior mutability, which reaches state shared with the outside, stay errors.)
/// - **references**: a `let` that refers to a reference parameter or to a value of the
///   function (`let residual = xs;` with `xs: &Tensor`, `let residual = &xs;`, as CLIP's
///   encoder layer writes its skip connections) crosses a cut as what it refers to: a
///   shallow clone goes through the stash and is rebound as a reference on the other
///   side. A reference to module state (`let lin = &self.lin;`) cannot cross a cut: use
///   `self.lin` where it is needed.
/// - **parameters** `&Tensor`, `&Option<..>`, `&Vec<..>`, `&[T]`, `&str`, tuples,
///   arrays and numbers by reference enter the stash as shallow clones (or an owned
///   `Vec`/`String`) and are rebound as references inside, so the code types as written.
///   Any other `&T` parameter is module state: captured like `self`. The macro reads
///   the type as written, so a tensor behind a type alias (`type T = Tensor; xs: &T`)
///   would be taken for module state: write `&Tensor`.
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
/// such bindings as `let`. Items in the body (`use`, `fn`, `const`) are moved before the
/// segments; `macro_rules!` is a compile error there (its local names would then refer
/// to other bindings): define it outside the function.
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
/// segments: a segment is a closure (except when the whole function is the segment,
/// where `return` leaves it as it leaves the function). **Escape hatch:** the last segment runs inline, so
/// early returns belong there — put a [`cut!`]`();` before them, or choose `segments` so
/// they land in the last group.
///
/// # Side-effect rules
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
/// | `mutation` | `set`, `replace`, `take`, `push`, `insert`, `remove`, `extend`, atomics `store`/`fetch_*`, .. on a value from outside the segment, also through a lock or a `RefCell` borrow (`log.borrow_mut().push(..)`; taking the lock alone, as for a [`Shared`] module's `lock()`, is fine) | `#[ckpt::allow(mutation)]` |
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
/// "Outside" values are followed through local aliases, as far as each alias reaches:
/// an outside value moved into a local (`let mut t = xs;`) or `&mut place` is the value
/// for every rule; a shared reference (`&place`, `.as_ref()`, `.borrow()`, `.deref()`,
/// the parameter of a closure given to a method of an outside value, as in
/// `TL.with(|c| c.set(..))` or `self.bias.as_ref().map(|b| ..)`) carries in-place ops and
/// interior mutability to it, not changes of the local itself (`opt.take()` on a
/// `let mut opt = self.bias.as_ref();`); a shallow clone (`let h = xs.shallow_clone();`)
/// carries in-place ops, including `h += x` (in place on a tch tensor), and stops being an
/// alias when `h` is assigned a new value. Names shared with out-of-place methods are
/// told apart by argument count: tch's `take(&index)` and `set()`, `str::replace(a, b)`.
/// The rules are syntactic, so they can still be fooled (a mutation hidden in a called
/// function or in a macro's expansion, an `Arc` cloned out of `self` — `clone` is not
/// followed, since on most types it copies — or a binding made by `if let`, `match` or
/// `for` over an outside value); libtorch's version counters still catch an in-place
/// change of a stashed tensor at backward, and `determinism_check` a recompute whose
/// shapes differ from forward. `#[ckpt::allow(..)]` exists only inside a
/// `#[checkpointed]` function (rustc has no custom attributes on statements).
///
/// # Automatic cuts: `segments = auto` and `budget`
///
/// ```
/// # use ckpt::{checkpointed, ShallowClone};
/// # use tch::{nn, nn::Module, Device, Kind, Tensor};
/// #[derive(Debug, ShallowClone)]
/// struct Net { blocks: Vec<nn::Linear> }
///
/// impl Net {
///     #[checkpointed(segments = auto)] // or budget = "512 MiB", budget = "40%"
///     fn forward(&self, xs: &Tensor, train: bool) -> Tensor {
///         let h = xs + self.blocks[0].forward(xs).relu();
///         let h = &h + self.blocks[1].forward(&h).relu();
///         let h = &h + self.blocks[2].forward(&h).relu();
///         h.dropout(0.1, train) // the last statement always runs inline
///     }
/// }
/// # let vs = nn::VarStore::new(Device::Cpu);
/// # let net = Net { blocks: (0..3).map(|i| nn::linear(vs.root() / i, 8, 8, Default::default())).collect() };
/// # let xs = Tensor::randn([64, 8], (Kind::Float, Device::Cpu));
/// net.forward(&xs, true).sum(Kind::Float).backward(); // profiles, plans, runs the plan
/// for p in ckpt::plan::function_plans() {
///     println!("{}, input {}:\n{}", p.function, p.input, p.plan);
/// }
/// ```
///
/// The stages (statements, chain links, layer-loop iterations, as for `segments = N`) are
/// a chain that the planner ([`plan`]) cuts: `segments = auto` for the least predicted
/// peak memory, `budget =
/// "512 MiB"` (bytes, with a unit) or `budget = "40%"` / `"0.4"` (of the plain run's
/// predicted peak) for the least recompute time within that budget (`segments = auto,
/// budget = ..` says the same). The budget string is checked at compile time.
///
/// - **When.** The first call with grad enabled for an input profiles the stages (each
///   runs twice more forward — a no-grad warm-up and a measured run — and once
///   backward, on detached copies, one at a time; the random generators' states are
///   saved and restored around it, but other state a statement changes, such as batch
///   norm's running statistics, is changed by those runs too), plans, and caches the plan in
///   the function's own `static`; every later call with that input runs the cached plan.
///   The input is the shapes, dtypes and devices of the tensors in the arguments that
///   the stages use, and the values of those arguments whose type implements `Hash`
///   (`train: bool`, sizes, `&str`); instances of a type share their method's plans.
///   An argument that changes on every call (a step counter) and that a stage uses
///   makes every call a new input, profiled again: use it in the last statement, or
///   pass it in a type without `Hash`. A function keeps at most
///   [`plan::MAX_PLANS_PER_FUNCTION`] plans, forgetting the oldest.
///   Without grad (`tch::no_grad`) every statement runs inline and nothing is planned.
///   [`plan::function_plans`] lists the plans made so far (print one: cuts, predicted
///   peak and extra time), [`plan::clear_function_plans`] forgets them.
/// - **An impossible budget** panics on the first training call with
///   [`CkptError::BudgetTooSmall`]'s message, which states the smallest feasible one.
/// - **How.** Each statement but the last becomes a closure over a type-erased
///   environment: one *slot* per binding that a later statement uses, holding the value
///   unpacked as its [`Stash`] tensors and a shared skeleton; a statement takes the
///   values it uses out of their slots (shallow copies when they are used again later)
///   and puts back what it defines; a layer loop's closure runs a range of its
///   iterations. A checkpointed segment is then any run-time range of stages: its stash
///   is the slots its stages use that were defined before it (a value that is also
///   needed after it stays outside, shallow-cloned), its outputs the slots it defines
///   that are needed after it. Types flow through zero-sized witnesses returned by each
///   statement's closure, so the compiler infers every value's type from the statement
///   that made it: the macro still needs no types. `segments = N` over a body with a
///   layer loop works the same way, with [`sequential_segments`]' cuts instead of the
///   planner's.
/// - **What it asks of the code.** Every value that a later statement uses must be
///   [`Stash`] (a compile error on its binding otherwise, as for `segments = N`), since
///   any statement boundary may become a cut. The side-effect rules apply to every
///   statement but the last, and `return`, `break`/`continue` leaving a statement, and
///   `?` are allowed only in the last statement (which may be a block); `&mut` parameters
///   likewise. `ckpt::cut!()` markers and `segments = N` cannot be combined with it. The
///   body needs at least 2 statements.
/// - **The prediction.** The figures of [`plan`]'s cost model per stage; a stage's
///   input bytes are those of every value live at its start (distinct storages), less
///   the arguments' tensors, which the caller holds. The last statement (which always
///   runs inline) is profiled too, as the last stage, when it passes the side-effect
///   rules and uses only values of the chain; otherwise its activations are not in the
///   prediction. The measured peaks are within −5 % … +0.3 % of the predictions on a
///   16-statement residual chain (`tests/plan_checkpointed.rs`) and on a 12-block loop
///   with a head (`tests/forwards.rs`), for a training step whose loss consumes the
///   output (`let loss = (model.forward(&x) * w).sum(..); loss.backward();`: an output
///   the caller keeps through backward, or a temporary of the backward statement, is
///   extra). [`plan::explain`] prints each stage's figures.
///
/// # Errors at run time
///
/// Segments are named `Type::method segment 2 of 3 (src/model.rs:42)` in [`CkptError`]
/// messages (a panic in forward, a failed recompute in `loss.backward()`), a whole
/// function `Type::method (src/model.rs:42)`; with cuts chosen at run time,
/// ``Type::method segment 2 of 4: stages 3..5, `for b in self.blocks.iter() [1]` to `for b
/// in self.blocks.iter() [3]` (src/model.rs:42)``.
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

/// Declares a model — the struct, its constructor and its forward chain — in one place,
/// optionally checkpointed.
///
/// A tch model is three things kept in step by hand: a struct of layers, a constructor
/// that builds each layer under an `nn::Path`, and a `forward` that chains them. `model!`
/// declares the three at once:
///
/// ```
/// use tch::nn::{self, Module};
/// use tch::{Device, Kind, Tensor};
///
/// pub struct MlpConfig {
///     pub d_in: i64,
///     pub hidden: i64,
///     pub classes: i64,
/// }
///
/// ckpt::model! {
///     /// A perceptron: `[batch, d_in]` → logits `[batch, classes]`.
///     pub struct Mlp(p, cfg: &MlpConfig) {
///         fc1: nn::Linear = nn::linear(p, cfg.d_in, cfg.hidden, Default::default()),
///         relu,
///         fc2: nn::Linear = nn::linear(p, cfg.hidden, cfg.classes, Default::default()),
///     }
/// }
///
/// let vs = nn::VarStore::new(Device::Cpu);
/// let mlp = Mlp::new(vs.root(), &MlpConfig { d_in: 8, hidden: 32, classes: 3 });
/// let logits = mlp.forward(&Tensor::randn([4, 8], (Kind::Float, Device::Cpu)));
/// assert_eq!(logits.size(), [4, 3]);
/// let mut names: Vec<String> = vs.variables().into_keys().collect();
/// names.sort();
/// assert_eq!(names, ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"]);
/// ```
///
/// is the model a tch user writes by hand as
///
/// ```
/// # use tch::nn::{self, Module};
/// # use tch::Tensor;
/// # pub struct MlpConfig { pub d_in: i64, pub hidden: i64, pub classes: i64 }
/// #[derive(Debug)]
/// pub struct Mlp {
///     fc1: nn::Linear,
///     fc2: nn::Linear,
/// }
///
/// impl Mlp {
///     pub fn new(p: &nn::Path, cfg: &MlpConfig) -> Self {
///         Mlp {
///             fc1: nn::linear(p / "fc1", cfg.d_in, cfg.hidden, Default::default()),
///             fc2: nn::linear(p / "fc2", cfg.hidden, cfg.classes, Default::default()),
///         }
///     }
/// }
///
/// impl Module for Mlp {
///     fn forward(&self, xs: &Tensor) -> Tensor {
///         xs.apply(&self.fc1).relu().apply(&self.fc2)
///     }
/// }
/// ```
///
/// with the same variable names, so the two save and load each other's weight files
/// (`VarStore::save` / `load`), plus `ShallowClone` and one line of
/// `#[checkpointed(segments = N)]` away from activation checkpointing.
///
/// # The declaration
///
/// ```text
/// model! {
///     /// docs, #[checkpointed(..)], other attributes of the struct
///     VIS struct NAME<GENERICS>(p, ARG: TYPE, ..) where .. {
///         ITEM, ITEM, ..
///     }
/// }
/// ```
///
/// - **`struct NAME(p, cfg: &Config, ..)`**: the parameters are the constructor's,
///   `NAME::new(p, cfg, ..)` (with the struct's visibility). The first names the
///   `nn::Path` the variables are created under; untyped, `new` takes any
///   `Borrow<nn::Path>` (`vs.root()`, `&vs.root()`, `vs.root() / "encoder"`), or give it
///   a type (`p: &nn::Path`). The others are ordinary parameters (a configuration, sizes,
///   a module to wrap). Generics, const generics and `where` clauses are those of the
///   struct.
/// - **Items** are built in order by `new`; the *stages* among them form the forward
///   chain, in order: each maps the previous stage's output `xs: Tensor` to a `Tensor`.
///
/// # Stages
///
/// | item | field | applied as |
/// |---|---|---|
/// | `fc: nn::Linear = nn::linear(p, 4, 8, Default::default())` | `fc: nn::Linear` | `Module::forward(&self.fc, &xs)` |
/// | `#[train] bn: nn::BatchNorm = nn::batch_norm1d(p, 8, Default::default())` | `bn` | `ModuleT::forward_t(&self.bn, &xs, train)` |
/// | `blocks: [Block; cfg.layers] = Block::new(p, cfg)` | `blocks: Vec<Block>` | each block in turn |
/// | `blocks: [Block; n] = \|i\| Block::new(p, i)` | `blocks: Vec<Block>` | the builder gets the index |
/// | `layer: T = init => \|layer, xs\| layer.forward(xs, &mask)` | `layer: T` | the closure, `layer: &T`, `xs: &Tensor` |
/// | `layer: T = init => \|layer, xs, train\| ..` | `layer: T` | the closure, with the train flag |
/// | `relu`, `gelu`, `tanh`, `sigmoid`, `silu` | — | `xs.relu()`, `xs.gelu("none")`, .. |
/// | `dropout(p)` | (hidden, `p` is evaluated by `new`) | `xs.dropout(p, train)` |
/// | `my_fn`, `Tensor::relu` (a path) | — | `my_fn(&xs)` |
/// | `#[train] my_fn` | — | `my_fn(&xs, train)` |
/// | `\|xs\| xs * 2.0` | — | the closure on `&xs` |
/// | `\|xs, train\| xs.dropout(0.5, train)` | — | with the train flag |
///
/// **Paths: variable names follow field names.** In a stage's constructor expression `p`
/// is the stage's own path, `root / "fc"` (for repeated layers `root / "blocks" / i`),
/// so the variables are `fc.weight`, `blocks.0.lin.bias`, .. — the names a hand-written
/// model gets from `p / "fc"`. `p` is an owned `nn::Path`: pass it on (`Block::new(p,
/// cfg)`) or borrow it (`&p / "sub"`). The counts of repeated layers are evaluated by
/// `new`, so they may come from the configuration (`usize` or any integer type).
///
/// **`ModuleT` or `Module`, never both.** A model with a stage that takes the train flag
/// (`#[train]`, `dropout(p)`, a closure with a `train` parameter, a per-call value that
/// mentions `train`) implements `ModuleT`; otherwise it implements `Module`, and
/// `ModuleT` comes from tch's blanket `impl<T: Module> ModuleT for T`. A layer that
/// implements only `ModuleT` without `#[train]` is a compile error on its type that says
/// so.
///
/// Closures and apply closures are compiled into the model's methods: they can use
/// `self` (`self.pos`) and the per-call values below, but not the constructor's
/// parameters (store what the forward needs in a `#[field]`).
///
/// # Per-call values and fields
///
/// - **`let name: Type = expr`**, before the stages: a value computed once per forward
///   call from the model's input `xs: &Tensor` (and `train: bool`, and `self`), visible
///   to every later stage by name — a padding mask, sequence lengths, positions. Inside
///   a stage it is a shallow clone of the value, of the declared type. The type is
///   required (the value is handed to every stage and segment); it must implement
///   `ShallowClone`, and [`Stash`] when the model is checkpointed: checkpointed segments
///   receive it in their stash, so gradients flow through it.
/// - **`#[field] name: Type = expr`**: a field that is not a stage — a learned tensor
///   used by a closure, a hyperparameter. Here `p` is the *model's* path, so a raw
///   parameter names itself (`p.var("pos", ..)` is `pos`, as in a hand-written model).
///
/// Fields may carry doc comments and a visibility (`pub fc: nn::Linear = ..`).
///
/// A transformer encoder, with its block as an ordinary struct (`ckpt-models/src/encoder.rs`):
///
/// ```
/// # use tch::nn::{self, ModuleT};
/// # use tch::{Device, Kind, Tensor};
/// # #[derive(Debug, ckpt::ShallowClone)]
/// # pub struct Block { lin: nn::Linear }
/// # impl Block {
/// #     fn new(p: nn::Path, c: &Config) -> Self {
/// #         Block { lin: nn::linear(p, c.d_model, c.d_model, Default::default()) }
/// #     }
/// #     fn forward(&self, xs: &Tensor, pad: &Tensor, train: bool) -> Tensor {
/// #         let keep = pad.logical_not().unsqueeze(-1).to_kind(Kind::Float);
/// #         (xs + xs.apply(&self.lin).relu() * keep).dropout(0.1, train)
/// #     }
/// # }
/// pub struct Config {
///     pub vocab: i64, pub classes: i64, pub seq_len: i64, pub layers: usize,
///     pub d_model: i64, pub dropout: f64,
/// }
///
/// ckpt::model! {
///     /// Token ids `[batch, seq]` (0 = padding) → logits `[batch, classes]`.
///     #[checkpointed(segments = 3)]
///     pub struct Encoder(p, c: &Config) {
///         let pad: Tensor = xs.eq(0),
///         let keep: Tensor = xs.ne(0).unsqueeze(-1).to_kind(Kind::Float),
///         #[field] pos: Tensor = p.randn("pos", &[c.seq_len, c.d_model], 0.0, 0.02),
///         tok: nn::Embedding = nn::embedding(p, c.vocab, c.d_model, Default::default())
///             => |tok, ids| ids.apply(tok) + self.pos.narrow(0, 0, ids.size()[1]),
///         dropout(c.dropout),
///         blocks: [Block; c.layers] = Block::new(p, c)
///             => |b, xs, train| b.forward(xs, &pad, train),
///         ln_f: nn::LayerNorm = nn::layer_norm(p, vec![c.d_model], Default::default()),
///         |xs| (xs * &keep).sum_dim_intlist(1, false, Kind::Float)
///             / keep.sum_dim_intlist(1, false, Kind::Float),
///         head: nn::Linear = nn::linear(p, c.d_model, c.classes, Default::default()),
///     }
/// }
///
/// let c = Config { vocab: 20, classes: 3, seq_len: 8, layers: 4, d_model: 16, dropout: 0.1 };
/// let vs = nn::VarStore::new(Device::Cpu);
/// let model = Encoder::new(vs.root(), &c);
/// let ids = Tensor::randint_low(1, c.vocab, [2, c.seq_len], (Kind::Int64, Device::Cpu));
/// let logits = model.forward_t(&ids, true);
/// assert_eq!(logits.size(), [2, 3]);
/// logits.sum(Kind::Float).backward(); // segments 2 and 1 are recomputed here
/// ```
///
/// # Checkpointing
///
/// `#[checkpointed(segments = N)]` on the declaration cuts the *expanded* chain — every
/// repeated layer counted on its own — into `N` segments with the semantics of
/// [`checkpoint_sequential`]: the ranges come from [`sequential_segments`]`(len, N)` at
/// run time (the number of repeated layers is only known then): every segment has
/// `len / N` stages but the last, which takes the rest and is **not** checkpointed (its
/// activations are needed at once). The encoder above has 9 stages (`tok`, `dropout`,
/// 4 blocks, `ln_f`, the pooling closure, `head`): segments `0..3 | 3..6 | 6..9`. A
/// stack of 6 blocks alone with `segments = 3` has 2 blocks a segment. `segments = 1`
/// checkpoints nothing; `N` larger than the chain is clamped to its length.
///
/// Each forward call takes one [`ShallowClone`] of the model (sharing its parameters),
/// shared by the segments through [`Shared`]; each checkpointed segment stashes the
/// chain's tensor at its start and the per-call values, and backward recomputes it from
/// them, with the same random-number state (dropout masks) when `preserve_rng_state`.
/// Outputs and gradients equal those of the unannotated model, bit for bit on CPU.
///
/// - `preserve_rng_state = bool` (default `true`), `determinism_check = bool` (default
///   `true`): as [`CheckpointOptions`].
/// - `policy = full | selective` (default `full`): what each checkpointed segment keeps
///   from its forward ([`Policy`]); the generated `set_policy` / `policy` change and read
///   it at run time.
/// - Segments are named in [`CkptError`] messages, for example
///   ``Encoder::forward_t segment 1 of 3: stages 0..3, `tok` to `blocks[0]` (src/m.rs:12)``.
/// - Stages must be side-effect free, as for [`checkpointed`]: they run twice.
/// - Type parameters of a checkpointed model need `ShallowClone + Send + 'static`
///   (added to the generated impls' bounds).
///
/// # Automatic cuts, and changing them at run time
///
/// `#[checkpointed(segments = auto)]` lets the planner ([`plan`]) choose the cuts for the
/// least predicted peak memory; `#[checkpointed(budget = "512 MiB")]` (or `"40%"`,
/// `"0.4"`: of the plain run's predicted peak) for the least recompute time within the
/// budget. On the first training call for each input (size, dtype, device, train flag)
/// the model profiles its own stages ([`plan::profile_chain`] over its stage function:
/// each stage runs twice more forward — a no-grad warm-up and a measured run — and once
/// backward, on a detached copy of its input), plans, and caches the plan; later calls
/// run it. The profile keeps the random streams as they were, but a stage with running
/// state (batch norm in train mode) updates it in those runs too: call `plan_for` once
/// before training (or use a fixed `segments`) where that matters. Without grad nothing is planned and
/// the chain runs plainly. The budget string is checked at compile time.
///
/// Every checkpointed model also has public methods (with the struct's visibility) to
/// change and show its [`plan::Schedule`] at run time — a program can sweep segment
/// counts or budgets without one declaration per value:
///
/// | method | does |
/// |---|---|
/// | `schedule(&self) -> Schedule` | the current schedule |
/// | `set_schedule(&mut self, Schedule) -> Result<(), CkptError>` | `Segments(n)`, `Cuts(..)` or `Auto(Objective)`, checked (`InvalidArgument` for `Segments(0)`, bad cuts, a bad budget fraction; the schedule is unchanged then) |
/// | `set_segments(n)`, `set_auto()`, `set_budget(Budget)`, `set_plan(&Plan)` | shorthands |
/// | `plan_for(&self, xs[, train]) -> Result<Plan, CkptError>` | the plan for inputs like `xs`: cuts, predicted peak and extra time; for fixed schedules their cuts evaluated on the profile. Profiles on first sight of the input; `BudgetTooSmall` (stating the smallest feasible budget) when no plan fits |
/// | `stage_names(&self) -> Vec<String>` | the chain's stages, in order |
/// | `clear_plans(&self)` | forget cached profiles and plans |
///
/// ```
/// # use tch::nn::{self, Module};
/// # use tch::{Device, Kind, Tensor};
/// use ckpt::plan::Schedule;
/// # #[derive(Debug, ckpt::ShallowClone)]
/// # struct Block { lin: nn::Linear }
/// # impl Module for Block { fn forward(&self, xs: &Tensor) -> Tensor { xs + xs.apply(&self.lin).relu() } }
/// ckpt::model! {
///     #[checkpointed(segments = auto)]
///     struct Chain(p, width: i64, layers: usize) {
///         blocks: [Block; layers] = Block { lin: nn::linear(p, width, width, Default::default()) },
///     }
/// }
///
/// let vs = nn::VarStore::new(Device::Cpu);
/// let mut chain = Chain::new(vs.root(), 32, 12);
/// let xs = Tensor::randn([256, 32], (Kind::Float, Device::Cpu));
/// let mut plan = chain.plan_for(&xs)?; // profile + plan (cached)
/// let ((), report) = ckpt::memory::measure(Device::Cpu, || {
///     let loss = chain.forward(&xs).square().sum(Kind::Float);
///     loss.backward();
/// });
/// plan.set_measured_peak_bytes(report.peak_above_baseline_bytes as u64);
/// println!("{plan}"); // cuts, predicted and measured peak, predicted extra time
///
/// for n in 1..=chain.stage_names().len() {
///     chain.set_segments(n)?; // a sweep, one declaration
///     // ..
/// }
/// chain.set_budget("50%".parse()?)?;
/// assert!(chain.set_schedule(Schedule::Cuts(vec![5, 5])).is_err());
/// # Ok::<(), ckpt::CkptError>(())
/// ```
///
/// A forward whose budget is impossible panics with [`CkptError::BudgetTooSmall`]'s
/// message; call `plan_for` first to get it as a `Result`. The profile leaves the random
/// generators as it found them (their states are saved and restored around it), so a
/// seeded run draws the same dropout masks with or without it. `examples/plan_encoder.rs` compares `segments = auto` with
/// every `segments = N` on the transformer encoder.
///
/// # What is generated
///
/// The struct (the items' fields, with their docs and visibility; plus a hidden `f64`
/// per `dropout(p)`, and for checkpointed models a hidden field with the schedule and
/// its cached plans), `new`, `Module` or `ModuleT`, the schedule methods above, [`ShallowClone`] (stages by
/// `ShallowClone`, `#[field]`s by `ShallowClone` or else `Clone`) and `Debug` (the
/// fields) — so do not derive `Debug` or `ShallowClone` yourself. Every stage's type must implement `ShallowClone`: wrap a layer that cannot
/// (a closure-built `nn::FuncT` or `nn::SequentialT`) in [`Shared`]. Hidden inherent methods `__ckpt_*` run the chain one
/// stage at a time.
///
/// # Errors
///
/// Malformed declarations are compile errors on the offending tokens, all reported in
/// one compile (the struct and stub impls are still emitted, so the code using the model
/// reports nothing more): unknown stage syntax, duplicate fields, a stage or field
/// without its constructor, closures with the wrong parameters, built-ins with wrong
/// arguments, misplaced `#[train]`/`#[field]`, per-call values without a type or after a
/// stage, no stage at all, bad `#[checkpointed]` arguments (unknown or duplicate keys,
/// `segments = 0`, missing `segments`, a bad budget string, `budget` with
/// `segments = N`, wrong value types).
pub use ckpt_macros::model;

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
