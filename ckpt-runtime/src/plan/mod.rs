//! The planner: where to cut a chain of stages so that checkpointing fits a memory
//! budget, provably optimally for the cost model below (`segments = auto`, issue 7).
//!
//! Choosing `segments` by hand is the usual chore of checkpointing ("pick the segment size
//! empirically"). Here a one-off profiling step measures, per stage of the chain, the
//! bytes and seconds that matter ([`profile_sequential`]); a dynamic program then
//! chooses the cut points ([`ChainCost::plan`]), either for the smallest predicted peak
//! ([`Objective::MinPeak`]) or for the least recompute time within a byte budget
//! ([`Objective::Budget`], e.g. `"512 MiB"` or `"40%"` of the plain run's peak); and
//! [`checkpoint_sequential_plan`] runs the chain with those cuts. [`SequentialPlanner`]
//! does all three and caches the plan per input shape.
//!
//! # Where it is used
//!
//! - **`checkpoint_sequential`** over a slice of modules: [`profile_sequential`],
//!   [`ChainCost::plan`], [`checkpoint_sequential_plan`]; or [`SequentialPlanner`].
//! - **Any chain given as a stage function**: [`profile_chain`]`(len, input, |i, x| ..)`
//!   profiles stage `i` through a closure over stage indices.
//! - **`model!`** with `#[checkpointed(segments = auto)]` or `budget = ".."`: the model
//!   profiles its own stages with [`profile_chain`] and caches a plan per input (size,
//!   dtype, device, train flag). Every checkpointed model can change its [`Schedule`] at
//!   run time (`set_schedule`, `set_segments`, `set_budget`, ..) and show its plan
//!   (`plan_for`). Its planner may keep segments ([`ChainCost::plan_keeping`] with every
//!   stage allowed, in chains of up to [`MAX_KEEP_STAGES`] stages), and keeps the stages
//!   marked `#[keep]` in every plan.
//! - **`#[checkpointed(segments = auto)]` functions**: the statements but the last are
//!   the stages, run over a type-erased environment of the values live between them
//!   (the design is described in the docs of `#[checkpointed]`; their run time is in the
//!   macro/runtime contract, `crate::contract`); [`function_plans`] lists their plans.
//!   Their planner keeps segments as `model!`'s does, and keeps the statements marked
//!   `#[ckpt::keep]` in every plan.
//!
//! # The schedule
//!
//! A chain of `L` stages maps `x_0 → x_1 → … → x_L` (stage `i` maps `x_i` to `x_{i+1}`).
//! A [`Plan`] is a set of cuts `0 < c_1 < … < c_{k-1} < L`; with `c_0 = 0` and `c_k = L`
//! segment `j` is the stage range `c_j..c_{j+1}`. Every segment but the last is
//! checkpointed (run without grad in forward, its input `x_{c_j}` stashed, recomputed
//! with grad in backward); the last runs plainly (as in PyTorch's
//! `checkpoint_sequential`). So every stage is recomputed at most once, and the extra time
//! is the forward time of the stages before the last cut. (A segment may also be *kept*,
//! run once with grad like the last: see [Kept segments](#kept-segments-keep-or-recompute-per-segment).)
//!
//! # The cost model: what counts towards the peak
//!
//! Figures are tensor bytes above the *baseline*: what is live when the chain starts,
//! which includes the chain's input `x_0` (the caller holds it, so segment 0's stash is
//! free), the parameters and their gradients (allocated by any step after the first; the
//! first step's backward allocates them on top), and whatever the caller holds. Per stage
//! `i` the profile ([`StageCost`]) has
//!
//! - `in_i` = `input_bytes`: bytes of `x_i`, what stashing a segment that starts at `i`
//!   costs; `in_L` is [`ChainCost::output_bytes`];
//! - `k_i` = `kept_bytes`: bytes still allocated after running the stage with grad on a
//!   detached input, its output held: the tensors it saved for backward plus its output
//!   `x_{i+1}` (the next stage's input, which the next stage usually saves);
//! - `f_i` = `forward_extra_bytes`: the peak of that run above `k_i` (temporaries);
//! - `t_i` = `backward_extra_bytes`: the peak of the stage's backward above `k_i` and its
//!   incoming gradient (`in_{i+1}` bytes): the gradients and temporaries it makes;
//! - `forward_seconds`: the time of the forward with grad, i.e. of its recompute;
//!
//! and per chain `o` = [`ChainCost::checkpoint_bytes`], what a checkpointed segment keeps
//! besides its stash (the RNG state copy of `preserve_rng_state`: 5,056 bytes on CPU,
//! kept by a segment whose forward draws random numbers; the profile counts it for every
//! segment, an upper bound).
//!
//! With `K(a, b) = k_a + … + k_{b-1}`, `e_i = max(f_i, in_{i+1} + t_i)` (stage `i`'s
//! worst moment: its forward temporaries, or its backward with a fresh incoming gradient)
//! and `ê_i = max(f_i, t_i)` (the same when the incoming gradient is already counted),
//! this is how the runtime ([`checkpoint_sequential`](crate::checkpoint_sequential), the
//! autograd node of `csrc/ckpt.cpp`) spends memory, phase by phase:
//!
//! 1. **Stashes.** Checkpointed segment `j` keeps `σ_j = in_{c_j} + o` from its forward
//!    until its backward is done (for `j = 0` the stash is `x_0`, already in the
//!    baseline, so `σ_0 = o`); the input of the last, plain segment is kept too, by the
//!    autograd graph of its first stage (`σ_{k-1} = in_{c_{k-1}}`, or 0 if `k = 1`). Let
//!    `A_j = σ_0 + … + σ_j`. A checkpointed segment keeps nothing else: its output is the
//!    next segment's input.
//! 2. **Forward of checkpointed segment `j`** runs without grad, holding `A_j` and one or
//!    two activations; its recompute (phase 4) holds the same stashes and more, so it is
//!    never the peak and is not counted (this assumes a stage's no-grad forward needs no
//!    more than its forward with grad, which keeps everything the no-grad one allocates).
//! 3. **Last segment `a..L`, forward then backward**: all stashes, and the plain segment's
//!    activations; while stage `i` runs forward the stages `a..i` before it are kept, and
//!    while it runs backward stages `a..=i` are kept (an upper bound: some outputs of
//!    later stages are freed by then) plus its incoming gradient, which for `i = L - 1`
//!    is the loss's gradient of `x_L`, counted as a fresh `in_L`-byte tensor (what
//!    cross-entropy or MSE hand back):
//!    `peak_plain = A_{k-1} + W(c_{k-1})`, `W(a) = max_{a ≤ i < L} [K(a, i+1) + e_i]`.
//! 4. **Recompute and backward of checkpointed segment `j = c_j..c_{j+1} = a..b`**, for
//!    `j = k-2` down to 0: the later segments' stashes are freed by now (autograd
//!    releases a node's saved tensors after its backward); the node holds the gradient of
//!    its output (`in_b` bytes) until it returns, recomputes the segment with grad and
//!    backpropagates through it, the recomputed stages following the same accounting as
//!    in phase 3, except that the last stage's incoming gradient is the held one:
//!    `peak_j = A_j + in_b + U(a, b)`,
//!    `U(a, b) = max( max_{a ≤ i < b-1} [K(a, i+1) + e_i], K(a, b) + ê_{b-1} )`.
//!
//! The predicted peak is `max(peak_plain, max_{j < k-1} peak_j)` and the predicted extra
//! time is the forward time of stages `0..c_{k-1}`.
//!
//! **Prediction and measurement.** On the 64-block residual MLP of `tests/plan.rs`
//! (`x + relu(linear(x))`, activations of 256 KiB) the measured peaks of the plans are
//! within −4 % … +6 % of the predictions. What the model leaves out, by size:
//!
//! - the loss's gradient when it is not a real tensor: `y.sum()` hands back an expanded
//!   scalar, which autograd cannot add into in place where the gradients of a residual
//!   connection meet, so it allocates one activation more than with a materialised
//!   gradient (`(y * w).sum()`, cross-entropy, MSE): up to `+in_L` (+5.8 % for the
//!   least-peak plan there);
//! - a loss that consumes the output (`(y * w).sum()` moves `y`) frees `x_L` before
//!   backward, which the model keeps as held by the caller: up to `−in_L`;
//! - parameter-gradient temporaries: a weight's gradient lives for a moment before it is
//!   added into `.grad` (16 KiB there, +0.3 %); profiling computes input gradients only,
//!   to leave every `.grad` alone, so it does not see them.
//!
//! Not modelled: allocator rounding (the CUDA caching allocator rounds blocks to 512
//! bytes), outputs that are views of their input (counted as full tensors: an upper
//! bound), the loss's own temporaries, optimizer state, and non-tensor memory.
//!
//! This is the accounting of Chen, Xu, Zhang and Guestrin, "Training Deep Nets with
//! Sublinear Memory Cost" (arXiv:1604.06174, 2016), section 3 — memory = the stashed
//! segment inputs + the largest segment's activations, minimised at about `sqrt(L)`
//! segments of `sqrt(L)` stages for a uniform chain (a standard result; Chen et al. section 3) —
//! made exact per phase and per stage. Chen et al. choose cuts greedily under a budget;
//! here a dynamic program finds the optimum of this model. For a uniform chain that
//! optimum is not equal segments: segment `j` is recomputed on top of `j` stashes, so the
//! segments shrink towards the output (on 64 residual blocks: 8, 7, 7, 6, 6, …, 2, 2, 1
//! and a plain 1, 15 segments for `sqrt(4·64) = 16`, a peak 27 % below the best equal
//! split's).
//!
//! # The dynamic program
//!
//! The peak is a maximum over phases of prefix sums of stash costs plus a segment term,
//! which is not additive over segments; but a shift by a constant passes through a
//! maximum, and that gives an exact recursion from the right. Let `G(a)` be the least
//! predicted peak of the suffix `a..L`, counted relative to the stashes of the segments
//! before `a`, over the plans whose segment starts at `a`. Every phase from `a` on holds
//! `σ(a)`, the stash of the segment starting at `a`, so for a first segment `a..b`
//!
//! ```text
//! G(a) = min( σ_plain(a) + W(a),                                    the rest is plain
//!             min_{a < b < L} σ_ckpt(a) + max(in_b + U(a, b), G(b)) ) a..b is checkpointed
//! ```
//!
//! with `σ_plain(a) = in_a` and `σ_ckpt(a) = in_a + o` (`in_0` counted as 0), and the
//! least peak is `G(0)`. *Optimality*, by induction on `L - a`: a plan of the suffix is a
//! first segment and a plan of the rest, and its peak is `σ + max(u, rest)`, nondecreasing
//! in `rest`; so for each first segment an optimal rest is best, and the minimum over
//! first segments is optimal (the principle of optimality for bottleneck costs).
//!
//! **Least recompute time within a budget `B`.** The extra time of a plan is the prefix
//! time `T(p)` of the start `p = c_{k-1}` of its plain segment, nondecreasing in `p`; so
//! the question is the smallest `p` for which a plan within `B` exists. Let `E(b)` be the
//! least stash sum `A` at a boundary `b` over the cut sets of `0..b` whose phases so far
//! all fit in `B`:
//!
//! ```text
//! E(0) = 0;  E(b) = min { E(a) + σ_ckpt(a) : a < b, E(a) + σ_ckpt(a) + in_b + U(a, b) ≤ B }
//! ```
//!
//! and `p` is feasible iff `E(p) + σ_plain(p) + W(p) ≤ B`. *Optimality*: whether a prefix
//! can be completed within `B` depends on it only through its stash sum, and smaller is
//! never worse (every later phase adds it), so keeping the least one per boundary loses
//! no feasible plan (dominance). The answer's cuts come from `G` restricted to plains
//! starting at the `p` with `T(p)` minimal, which also makes its peak the least among the
//! fastest plans. [`Objective::MinPeak`] runs `G`, then the budget program with
//! `B = G(0)`, so among the least-peak plans it returns one with the least extra time.
//!
//! **Complexity.** Each program visits every segment `a..b` once, with `U(a, b)` kept up
//! to date in O(1) as `b` grows (a running maximum), and `W` for all `a` is a suffix
//! maximum: O(L²) time (three passes of `L²/2` steps) and O(L) memory. A 1,000-stage
//! chain is planned in about 3 ms in a release build (the `plan_1000_stages` benchmark
//! test).
//!
//! # A policy per checkpointed segment (selective checkpointing)
//!
//! A checkpointed segment may also keep part of its forward's results so that its
//! recompute replays them instead of computing them ([`Policy`](crate::Policy)); the
//! planner chooses, per segment, among [`PLANNED_POLICIES`]: full recompute, dropout
//! masks kept (`masks`), masks and the outputs of narrowing `Linear`s kept (`narrowing`),
//! and `selective` (masks and every `Linear` output kept). The profile
//! gives per stage `i` and policy `P` the bytes `κ_i(P)` the policy keeps and the seconds
//! `r_i(P)` of the stage's recompute when it replays them ([`StageCost::keep`]; full
//! recompute keeps nothing and costs `forward_seconds`). In the cost model the kept bytes
//! of a checkpointed segment `a..b` are held from its forward until its recompute and
//! backward are done, exactly as its stash is: `σ_j = in_{c_j} + o + κ(a, b, P_j)` with
//! `κ(a, b, P) = κ_a(P) + … + κ_{b-1}(P)`, in every phase from its forward on (in its own
//! recompute too: an upper bound, since a kept linear output is also the recomputed
//! activation). The extra time is the sum of `r_i(P_j)` over the checkpointed segments'
//! stages. Peak and phases are otherwise as above ([`ChainCost::evaluate_with_policies`]).
//!
//! The least peak is `G` with the first segment's choice extended to pairs `(b, P)`:
//! `σ_ckpt(a) + κ(a, b, P) + max(in_b + U(a, b), G(b))`, optimal by the same argument.
//! The least time within `B` is no longer a prefix time: stash sum and time now both
//! depend on the policies, so the budget program keeps at each boundary the Pareto
//! front of the partial plans' (stash sum, seconds, largest phase peak so far), each
//! extended by every segment and policy whose phase fits in `B`. Whether and how a
//! prefix can be completed depends on it only through its stash sum, time adds and
//! peaks take maxima, so a partial plan that another at the same boundary is no better
//! than in all three is never needed, and the fronts hold the fastest plan and, among
//! the fastest, the least peak. Fronts are small in practice (a chain without policy
//! figures, or with the policies fixed to full recompute, runs the programs above);
//! the worst case is exponential in the chain's length. Both programs are checked
//! against exhaustive search over every cut set and policy assignment by the property
//! tests of `plan/dp.rs` (500 random chains each, up to 7 stages and 4^6 policy
//! assignments per cut set).
//!
//! # Kept segments (keep or recompute, per segment)
//!
//! A segment before the last may also be *kept* ([`SegmentMode::Kept`]): run once,
//! inline, with grad, like the plain last segment, its activations held from its forward
//! until its backward; no stash, no RNG copy, no recompute (Beaumont, Eyraud-Dubois,
//! Herrmann, Joly and Shilova, "Optimal checkpointing for heterogeneous chains", rotor,
//! 2019, choose per stage between keeping its input and keeping all its activations; a
//! kept stage is the second). [`ChainCost::plan_keeping`] chooses per segment among the
//! policies and keeping, under a [`Keeping`]: the stages that may be kept, and those
//! that must (`model!`'s `#[keep]`), which then lie in a kept segment or the plain one.
//! In the phases above, with segment `j = a..b` kept:
//!
//! - **What it holds.** `K(a, b)`, from its forward on, in every later phase, as a stash
//!   is; its input `x_a` as the plain segment's is (by its first stage's graph,
//!   `in_a`, 0 for `a = 0`). Its output `x_b` is in `K(a, b)` (the last stage's kept
//!   bytes count its output), so the next segment's input is not counted again: the
//!   input term `in_{c_j}` of any segment is charged unless the segment before it is
//!   kept. So `σ_j = in_a' + K(a, b)`, with `in_a'` that input term.
//! - **Its phase.** Forward and backward of stage `i` run on `A_{j-1} + in_a'` (the
//!   later segments' holdings are not yet made, or already freed) and the stages before
//!   `i` in the segment: as in the plain segment, stage `i`'s worst moment is
//!   `K(a, i+1) + e_i`, the incoming gradient of its last stage being a fresh `in_b`
//!   from the next segment's backward:
//!   `peak_j = A_{j-1} + in_a' + V(a, b)`, `V(a, b) = max_{a ≤ i < b} [K(a, i+1) + e_i]`.
//! - **Time.** None: a kept segment adds no recompute.
//!
//! The least peak is then the recursion `G` counted without the first segment's input
//! term (which its predecessor decides): `G(a) = min(W(a),
//! o + κ(a, b, P) + max(in_b + U(a, b), in_b + G(b)),  max(V(a, b), K(a, b) + G(b)))` over
//! the segments `a..b` the constraints allow, and the least time within `B` the Pareto
//! program above, a label's held bytes now including the input term of its boundary and
//! the kept segments' `K` (a kept extension adds `K(a, b)` and no time; its phase is
//! the label's held bytes plus `V(a, b)`). Both are exact for the model by the same
//! arguments, and checked against exhaustive search over cut sets and per-segment modes
//! (each policy or kept) with random may/must constraints (`plan/dp/keep_tests.rs`).
//! [`ChainCost::plan`] and [`ChainCost::plan_with`] keep nothing (every segment but the
//! last checkpointed), as before.
//!
//! One level of checkpoints (each stage recomputed at most once) is what the dynamic
//! program plans. Griewank and Walther's binomial checkpointing ("Algorithm 799:
//! revolve", ACM TOMS 26(1), 2000) nests segments, recomputing stages several times to
//! bring the stash down to `s` inputs for `L <= C(s + r, s)` stages recomputed `r` times
//! (O(log L) memory for O(log L) recomputes): [`checkpoint_sequential_binomial`], selected
//! explicitly with the number of stashes.

mod binomial;
mod budget;
mod cost;
mod dp;
mod modes;
mod outcome;
mod planner;
mod profile;
mod schedule;

pub use binomial::{
    binomial_capacity, binomial_repetitions, checkpoint_sequential_binomial,
    checkpoint_sequential_binomial_t, f_checkpoint_sequential_binomial,
    f_checkpoint_sequential_binomial_t,
};
pub use budget::Budget;
pub use cost::{ChainCost, KeepCost, Objective, PLANNED_POLICIES, StageCost};
pub(crate) use cost::{MASKS, NARROWING, allowed_policies};
pub use modes::{Keeping, SegmentMode};
pub(crate) use outcome::human_bytes;
pub use outcome::{Phase, Plan, policy_name};
pub(crate) use planner::InputKey;
pub use planner::{
    SequentialPlanner, checkpoint_sequential_plan, checkpoint_sequential_plan_t,
    f_checkpoint_sequential_plan, f_checkpoint_sequential_plan_t,
};
pub(crate) use profile::{
    detached_leaf, measure_policies, measure_stage, nbytes, probe_checkpoint_bytes, profile,
};
pub use profile::{
    f_profile_chain, f_profile_sequential, f_profile_sequential_t, profile_chain,
    profile_sequential, profile_sequential_t,
};
pub use schedule::Schedule;

pub use crate::contract::{
    FunctionPlan, MAX_KEEP_STAGES, MAX_PLANS_PER_FUNCTION, clear_function_plans, explain,
    function_plans,
};
