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
//!   (`plan_for`).
//! - **`#[checkpointed(segments = auto)]` functions**: the statements but the last are
//!   the stages, run over a type-erased environment of the values live between them
//!   (the design is described in the docs of `#[checkpointed]`; their run time is in the
//!   macro/runtime contract, `crate::contract`); [`function_plans`] lists their plans.
//!
//! # The schedule
//!
//! A chain of `L` stages maps `x_0 → x_1 → … → x_L` (stage `i` maps `x_i` to `x_{i+1}`).
//! A [`Plan`] is a set of cuts `0 < c_1 < … < c_{k-1} < L`; with `c_0 = 0` and `c_k = L`
//! segment `j` is the stage range `c_j..c_{j+1}`. Every segment but the last is
//! checkpointed (run without grad in forward, its input `x_{c_j}` stashed, recomputed
//! with grad in backward); the last runs plainly (as in PyTorch's
//! `checkpoint_sequential`). So every stage is recomputed at most once, and the extra time
//! is the forward time of the stages before the last cut.
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
//! recompute replays them instead of computing them ([`Policy`]); the
//! planner chooses, per segment, among [`PLANNED_POLICIES`]: full recompute, dropout
//! masks kept (`masks`), and `selective` (masks and `Linear` outputs kept). The profile
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
//! tests of `plan/dp.rs` (500 random chains each, up to 7 stages and 3^6 policy
//! assignments per cut set).
//!
//! One level of checkpoints (each stage recomputed at most once) is what the dynamic
//! program plans. Griewank and Walther's binomial checkpointing ("Algorithm 799:
//! revolve", ACM TOMS 26(1), 2000) nests segments, recomputing stages several times to
//! bring the stash down to `s` inputs for `L <= C(s + r, s)` stages recomputed `r` times
//! (O(log L) memory for O(log L) recomputes): [`checkpoint_sequential_binomial`], selected
//! explicitly with the number of stashes.

mod binomial;
mod budget;
mod dp;
mod profile;
mod schedule;

use std::fmt;
use std::ops::Range;

pub use binomial::{
    binomial_capacity, binomial_repetitions, checkpoint_sequential_binomial,
    checkpoint_sequential_binomial_t, f_checkpoint_sequential_binomial,
    f_checkpoint_sequential_binomial_t,
};
pub use budget::Budget;
pub(crate) use profile::{
    InputKey, detached_leaf, measure_stage, nbytes, probe_checkpoint_bytes, profile,
};
pub use profile::{
    SequentialPlanner, checkpoint_sequential_plan, checkpoint_sequential_plan_t,
    f_checkpoint_sequential_plan, f_checkpoint_sequential_plan_t, f_profile_chain,
    f_profile_sequential, f_profile_sequential_t, profile_chain, profile_sequential,
    profile_sequential_t,
};
pub use schedule::Schedule;

pub use crate::contract::{
    FunctionPlan, MAX_PLANS_PER_FUNCTION, clear_function_plans, explain, function_plans,
};

use crate::{CkptError, Policy};

/// What one stage of a chain costs, as measured by [`profile_sequential`] (see the
/// [module docs](self) for how each figure enters the predicted peak).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct StageCost {
    /// Bytes of the stage's input tensor: what stashing a segment that starts here costs.
    pub input_bytes: u64,
    /// Bytes still allocated after running the stage with grad on a detached input, its
    /// output held: the tensors saved for backward plus the output.
    pub kept_bytes: u64,
    /// Peak bytes of that forward above `kept_bytes`: temporaries freed before it returns.
    pub forward_extra_bytes: u64,
    /// Peak bytes of the stage's backward above `kept_bytes` and its incoming gradient
    /// (the output's size): the gradients and temporaries it makes.
    pub backward_extra_bytes: u64,
    /// Seconds of the forward with grad, which is what a full recompute costs.
    pub forward_seconds: f64,
    /// What the stage keeps and costs to recompute in a segment checkpointed with
    /// [`Policy::selective`]`().save_linear(false)` (dropout masks kept); `None` when not
    /// profiled, which the planner takes as "keeps nothing, saves nothing".
    pub masks: Option<KeepCost>,
    /// The same for [`Policy::selective`] (linear outputs and dropout masks kept).
    pub selective: Option<KeepCost>,
}

/// What a stage keeps, and what its recompute costs, in a segment checkpointed with a
/// selective [`Policy`] (see [`StageCost::masks`], [`StageCost::selective`]).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct KeepCost {
    /// Bytes the policy keeps from the segment's forward until its recompute is done
    /// (linear outputs, dropout masks at 1 byte an element and a generator state each).
    pub kept_bytes: u64,
    /// Seconds of the stage's recompute under the policy: its forward with grad with the
    /// kept results replayed instead of computed.
    pub recompute_seconds: f64,
}

impl StageCost {
    /// A stage with the given input bytes, kept bytes and forward seconds, and no
    /// temporaries (`forward_extra_bytes = backward_extra_bytes = 0`).
    pub fn new(input_bytes: u64, kept_bytes: u64, forward_seconds: f64) -> Self {
        StageCost {
            input_bytes,
            kept_bytes,
            forward_extra_bytes: 0,
            backward_extra_bytes: 0,
            forward_seconds,
            masks: None,
            selective: None,
        }
    }

    /// What the stage keeps (bytes) and what recomputing it costs (seconds) in a segment
    /// checkpointed with `policy`: `(0, forward_seconds)` for [`Policy::RECOMPUTE_ALL`] and
    /// for a policy the profile has no figure for; `None` for a policy the planner does
    /// not model (linear outputs without dropout masks).
    pub fn keep(&self, policy: Policy) -> Option<(u64, f64)> {
        let full = (0, self.forward_seconds);
        let figure = |k: Option<KeepCost>| k.map_or(full, |k| (k.kept_bytes, k.recompute_seconds));
        if policy == Policy::RECOMPUTE_ALL {
            Some(full)
        } else if policy == MASKS {
            Some(figure(self.masks))
        } else if policy == Policy::selective() {
            Some(figure(self.selective))
        } else {
            None
        }
    }
}

/// The masks-only policy: dropout masks kept, linear outputs recomputed.
pub(crate) const MASKS: Policy = Policy::selective().save_linear(false);

/// The policies the planner chooses from for each checkpointed segment, in order of
/// preference on ties: full recompute, dropout masks kept, selective.
pub const PLANNED_POLICIES: [Policy; 3] = [Policy::RECOMPUTE_ALL, MASKS, Policy::selective()];

/// The cost profile of a chain: one [`StageCost`] per stage plus two chain-wide figures.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ChainCost {
    /// The stages, in order.
    pub stages: Vec<StageCost>,
    /// Bytes of the chain's output `x_L`; its gradient, handed back by the loss, is
    /// counted as a fresh tensor of this size.
    pub output_bytes: u64,
    /// Bytes a checkpointed segment keeps besides its stash (the RNG state copy when
    /// `preserve_rng_state` is on and the segment draws random numbers: 5,056 bytes on
    /// CPU, none on a CUDA device; the profile counts it for every segment).
    pub checkpoint_bytes: u64,
}

/// What the planner optimises.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Objective {
    /// The least predicted peak (each stage recomputed at most once); among the plans
    /// with that peak, the least extra time.
    MinPeak,
    /// The least extra (recompute) time with a predicted peak within the budget; among
    /// those, the least peak.
    Budget(Budget),
}

impl ChainCost {
    /// A chain of `stages` with the given output bytes and `checkpoint_bytes = 0`.
    pub fn new(stages: Vec<StageCost>, output_bytes: u64) -> Self {
        ChainCost {
            stages,
            output_bytes,
            checkpoint_bytes: 0,
        }
    }

    /// `len` copies of `stage`, the output as large as a stage input.
    pub fn uniform(len: usize, stage: StageCost) -> Self {
        ChainCost::new(vec![stage; len], stage.input_bytes)
    }

    /// Number of stages.
    pub fn len(&self) -> usize {
        self.stages.len()
    }

    /// Whether the chain has no stage.
    pub fn is_empty(&self) -> bool {
        self.stages.is_empty()
    }

    /// The predicted peak bytes of running the chain without checkpointing.
    ///
    /// # Errors
    ///
    /// As [`ChainCost::evaluate`].
    pub fn plain_peak_bytes(&self) -> Result<u64, CkptError> {
        Ok(self.evaluate(&[])?.predicted_peak_bytes)
    }

    /// The predicted figures of running the chain with the given cuts (stage indices
    /// where a new segment starts), following the [cost model](self) phase by phase. Use
    /// it to compare a hand-chosen plan with the planner's.
    ///
    /// # Errors
    ///
    /// [`CkptError::InvalidArgument`] when the cuts are not strictly increasing within
    /// `1..len`, or when a figure of the profile is unusable (a negative, infinite or
    /// NaN time; byte figures summing past 2^62).
    pub fn evaluate(&self, cuts: &[usize]) -> Result<Plan, CkptError> {
        self.evaluate_with_policies(cuts, &vec![Policy::RECOMPUTE_ALL; cuts.len()])
    }

    /// [`ChainCost::evaluate`] with a policy for each checkpointed segment
    /// (`policies[j]` for the segment that ends at `cuts[j]`): what a selective policy
    /// keeps ([`StageCost::keep`]) is held from the segment's forward until its
    /// recompute is done, and its recompute costs the stages' recompute seconds under
    /// the policy.
    ///
    /// # Errors
    ///
    /// As [`ChainCost::evaluate`]; [`CkptError::InvalidArgument`] when `policies` is not
    /// one per cut, or holds a policy the planner does not model (one of
    /// [`PLANNED_POLICIES`] is needed).
    pub fn evaluate_with_policies(
        &self,
        cuts: &[usize],
        policies: &[Policy],
    ) -> Result<Plan, CkptError> {
        self.check()?;
        schedule::check_cuts(cuts, self.len())?;
        if policies.len() != cuts.len() {
            return Err(CkptError::InvalidArgument(format!(
                "{} policies for {} checkpointed segments: give one per cut",
                policies.len(),
                cuts.len()
            )));
        }
        if let Some(p) = policies.iter().find(|p| !PLANNED_POLICIES.contains(p)) {
            return Err(CkptError::InvalidArgument(format!(
                "policy {p:?} is not one the planner models (full recompute, dropout masks kept, or selective)"
            )));
        }
        Ok(self.make_plan(cuts.to_vec(), policies.to_vec(), None))
    }

    /// Chooses the cuts for `objective` by dynamic programming (see the
    /// [module docs](self) for the model, the programs and their optimality), and for
    /// each checkpointed segment the policy of [`PLANNED_POLICIES`] when the profile has
    /// figures for them ([`StageCost::masks`], [`StageCost::selective`]; full recompute
    /// otherwise).
    ///
    /// # Errors
    ///
    /// [`CkptError::BudgetTooSmall`] when no plan fits the budget (it states the least
    /// feasible peak); [`CkptError::InvalidArgument`] for a budget fraction that is not
    /// positive and finite, or a profile that [`ChainCost::evaluate`] rejects.
    pub fn plan(&self, objective: &Objective) -> Result<Plan, CkptError> {
        self.plan_with(objective, &PLANNED_POLICIES)
    }

    /// [`ChainCost::plan`] with each checkpointed segment's policy chosen among
    /// `policies` only: `&[Policy::RECOMPUTE_ALL]` plans the cuts for full recompute,
    /// `&[Policy::selective()]` for a model whose policy the user fixed to selective.
    ///
    /// # Errors
    ///
    /// As [`ChainCost::plan`]; [`CkptError::InvalidArgument`] when `policies` is empty
    /// or holds a policy that is not one of [`PLANNED_POLICIES`].
    pub fn plan_with(&self, objective: &Objective, policies: &[Policy]) -> Result<Plan, CkptError> {
        self.check()?;
        if policies.is_empty() || policies.iter().any(|p| !PLANNED_POLICIES.contains(p)) {
            return Err(CkptError::InvalidArgument(format!(
                "plan_with: policies {policies:?}: give at least one, each full recompute, dropout masks kept, or selective"
            )));
        }
        let plain = dp::evaluate(self, &[], &[]).0;
        let budget = match objective {
            Objective::MinPeak => None,
            Objective::Budget(b) => Some(b.bytes(plain)?),
        };
        let (cuts, policies) = if policies == [Policy::RECOMPUTE_ALL] || !dp::has_policies(self) {
            // No figures: every policy costs what full recompute does; the first is taken.
            let cuts = dp::plan(self, budget)?;
            let policies = vec![policies[0]; cuts.len()];
            (cuts, policies)
        } else {
            dp::plan_with_policies(self, budget, policies)?
        };
        Ok(self.make_plan(cuts, policies, budget))
    }

    /// [`ChainCost::plan`] for [`Objective::MinPeak`].
    ///
    /// # Errors
    ///
    /// As [`ChainCost::evaluate`].
    pub fn plan_min_peak(&self) -> Result<Plan, CkptError> {
        self.plan(&Objective::MinPeak)
    }

    /// [`ChainCost::plan`] for [`Objective::Budget`].
    ///
    /// # Errors
    ///
    /// As [`ChainCost::plan`].
    pub fn plan_within(&self, budget: Budget) -> Result<Plan, CkptError> {
        self.plan(&Objective::Budget(budget))
    }

    fn check(&self) -> Result<(), CkptError> {
        let mut total: u128 = u128::from(self.output_bytes) + u128::from(self.checkpoint_bytes);
        for (i, s) in self.stages.iter().enumerate() {
            if !(s.forward_seconds.is_finite() && s.forward_seconds >= 0.0) {
                return Err(CkptError::InvalidArgument(format!(
                    "stage {i}: forward_seconds = {} (must be finite and not negative)",
                    s.forward_seconds
                )));
            }
            for (what, k) in [("masks", s.masks), ("selective", s.selective)] {
                if let Some(k) = k {
                    if !(k.recompute_seconds.is_finite() && k.recompute_seconds >= 0.0) {
                        return Err(CkptError::InvalidArgument(format!(
                            "stage {i}: {what}.recompute_seconds = {} (must be finite and not negative)",
                            k.recompute_seconds
                        )));
                    }
                    total += u128::from(k.kept_bytes);
                }
            }
            total += u128::from(s.input_bytes)
                + u128::from(s.kept_bytes)
                + u128::from(s.forward_extra_bytes)
                + u128::from(s.backward_extra_bytes)
                + u128::from(self.checkpoint_bytes);
        }
        if total > 1 << 62 {
            return Err(CkptError::InvalidArgument(
                "the byte figures of the chain sum past 2^62".into(),
            ));
        }
        Ok(())
    }

    /// Prefix sums of the forward times: `out[p]` = seconds of stages `0..p`, summed in
    /// order (the planner and [`ChainCost::evaluate`] use the same figures).
    fn time_prefix(&self) -> Vec<f64> {
        let mut out = Vec::with_capacity(self.len() + 1);
        let mut t = 0.0;
        out.push(t);
        for s in &self.stages {
            t += s.forward_seconds;
            out.push(t);
        }
        out
    }

    fn make_plan(&self, cuts: Vec<usize>, policies: Vec<Policy>, budget: Option<u64>) -> Plan {
        let (peak, phase, extra) = dp::evaluate(self, &cuts, &policies);
        Plan {
            len: self.len(),
            predicted_extra_seconds: extra,
            recomputed_stages: cuts.last().copied().unwrap_or(0),
            cuts,
            policies,
            predicted_peak_bytes: peak,
            peak_phase: phase,
            plain_peak_bytes: dp::evaluate(self, &[], &[]).0,
            budget_bytes: budget,
            measured_peak_bytes: None,
            stage_costs: self.stages.clone(),
            stage_names: Vec::new(),
        }
    }
}

/// The phase of a plan in which its predicted peak occurs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// The forward and backward of the last, plain segment.
    Plain,
    /// The recompute and backward of checkpointed segment `segment` (0-based; shown
    /// 1-based, as segment names are: "segment 1 of 3").
    Recompute {
        /// Index of the segment.
        segment: usize,
    },
}

/// Where to cut a chain, with what the [cost model](self) predicts for it; made by
/// [`ChainCost::plan`] or [`ChainCost::evaluate`], run by [`checkpoint_sequential_plan`].
/// `Display` (and [`Plan::explain`]) prints the cuts, the predicted peak and extra time,
/// and the measured peak once attached with [`Plan::set_measured_peak_bytes`].
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    len: usize,
    cuts: Vec<usize>,
    /// The policy of each checkpointed segment.
    policies: Vec<Policy>,
    predicted_peak_bytes: u64,
    predicted_extra_seconds: f64,
    recomputed_stages: usize,
    peak_phase: Phase,
    plain_peak_bytes: u64,
    budget_bytes: Option<u64>,
    measured_peak_bytes: Option<u64>,
    /// The profile the plan was made from, one entry per stage.
    stage_costs: Vec<StageCost>,
    /// The stages' names, when the caller knows them ([`Plan::with_stage_names`]).
    stage_names: Vec<String>,
}

impl Plan {
    /// Number of stages of the chain.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the chain has no stage.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The stage indices where a new segment starts (strictly increasing, in `1..len`).
    pub fn cuts(&self) -> &[usize] {
        &self.cuts
    }

    /// The policy of each checkpointed segment (`policies()[j]` for segment `j`, one per
    /// cut): [`Policy::RECOMPUTE_ALL`] unless the planner chose to keep dropout masks or
    /// linear outputs (see [`ChainCost::plan`]).
    pub fn policies(&self) -> &[Policy] {
        &self.policies
    }

    /// The policy segment `segment` runs with: its planned one, or
    /// [`Policy::RECOMPUTE_ALL`] for the last, plain segment (which keeps everything).
    pub fn policy_of(&self, segment: usize) -> Policy {
        self.policies
            .get(segment)
            .copied()
            .unwrap_or(Policy::RECOMPUTE_ALL)
    }

    /// Number of segments (`cuts().len() + 1`); all but the last are checkpointed.
    pub fn segments(&self) -> usize {
        self.cuts.len() + 1
    }

    /// The segments as stage ranges; the last one runs plainly.
    pub fn ranges(&self) -> Vec<Range<usize>> {
        ckpt_budget::cut_ranges(&self.cuts, self.len)
    }

    /// The predicted peak, in bytes above the baseline (see the [module docs](self)).
    pub fn predicted_peak_bytes(&self) -> u64 {
        self.predicted_peak_bytes
    }

    /// The predicted extra time of a training step, in seconds: the recompute of every
    /// stage before the last cut.
    pub fn predicted_extra_seconds(&self) -> f64 {
        self.predicted_extra_seconds
    }

    /// Number of stages recomputed in backward (those before the last cut).
    pub fn recomputed_stages(&self) -> usize {
        self.recomputed_stages
    }

    /// The phase in which the predicted peak occurs.
    pub fn peak_phase(&self) -> Phase {
        self.peak_phase
    }

    /// The predicted peak of the same chain without checkpointing, in bytes.
    pub fn plain_peak_bytes(&self) -> u64 {
        self.plain_peak_bytes
    }

    /// The budget the plan was made for, in bytes (`None` for [`Objective::MinPeak`] and
    /// for [`ChainCost::evaluate`]).
    pub fn budget_bytes(&self) -> Option<u64> {
        self.budget_bytes
    }

    /// The measured peak attached with [`Plan::set_measured_peak_bytes`], in bytes.
    pub fn measured_peak_bytes(&self) -> Option<u64> {
        self.measured_peak_bytes
    }

    /// Attaches a measured peak (bytes above the baseline, e.g.
    /// `memory::measure(..).1.peak_above_baseline_bytes` around forward and backward), so
    /// that [`Plan::explain`] compares it with the prediction.
    pub fn set_measured_peak_bytes(&mut self, bytes: u64) {
        self.measured_peak_bytes = Some(bytes);
    }

    /// The profiled costs of the stages the plan was made from, in order.
    pub fn stage_costs(&self) -> &[StageCost] {
        &self.stage_costs
    }

    /// The stages' names (empty unless given with [`Plan::with_stage_names`]; the plans of
    /// `#[checkpointed]` functions and `model!`'s `plan_for` name theirs).
    pub fn stage_names(&self) -> &[String] {
        &self.stage_names
    }

    /// The plan with names for its stages (`names.len()` should be [`Plan::len`]; missing
    /// names print as the stage index), for [`Plan::explain`].
    pub fn with_stage_names(mut self, names: Vec<String>) -> Self {
        self.stage_names = names;
        self
    }

    /// The segment (0-based) that holds stage `i`.
    pub fn segment_of(&self, stage: usize) -> usize {
        self.cuts.iter().take_while(|&&c| c <= stage).count()
    }

    /// What checkpointed segment `segment` keeps (bytes) and what its recompute costs
    /// (seconds) under `policy`, from the profile (`None` for a policy the planner does
    /// not model, or a plan without its profile).
    pub fn segment_keep(&self, segment: usize, policy: Policy) -> Option<(u64, f64)> {
        let range = self.ranges().get(segment)?.clone();
        let stages = self.stage_costs.get(range)?;
        let mut out = (0u64, 0.0);
        for s in stages {
            let (k, t) = s.keep(policy)?;
            out.0 += k;
            out.1 += t;
        }
        Some(out)
    }

    /// A human-readable account of the plan: segments, cuts, predicted peak (and the phase
    /// where it occurs), plain-run peak, budget, predicted extra time, measured peak
    /// (`Display` prints these); then one line per checkpointed segment: its policy, and
    /// why — what each policy the planner chooses from would keep and cost to recompute
    /// there (bytes kept against time saved); then one line per stage: its name, the
    /// segment that holds it (checkpointed, so recomputed in backward, or the plain last
    /// one), its profiled input bytes (what a segment starting there stashes), kept bytes
    /// (what it keeps for backward, its output included), forward time, and under its
    /// segment's policy what is kept from forward (`policy kept`) and what its recompute
    /// costs (`recompute`; `-` in the plain segment).
    pub fn explain(&self) -> String {
        use std::fmt::Write;
        let mut out = self.to_string();
        if self.stage_costs.len() != self.len {
            return out;
        }
        let last = self.segments() - 1;
        let ranges = self.ranges();
        for (j, r) in ranges.iter().enumerate().take(last) {
            let chosen = self.policy_of(j);
            let _ = write!(
                out,
                "\n  segment {} (stages {}..{}): checkpointed, policy {}",
                j + 1,
                r.start,
                r.end,
                policy_name(chosen)
            );
            let full = self.segment_keep(j, Policy::RECOMPUTE_ALL);
            let options: Vec<String> = PLANNED_POLICIES
                .iter()
                .filter_map(|&p| {
                    let (k, t) = self.segment_keep(j, p)?;
                    let saved = full.map_or(0.0, |f| f.1 - t);
                    let mark = if p == chosen { "*" } else { " " };
                    Some(format!(
                        "{mark}{} keeps {}, recompute {} (saves {})",
                        policy_name(p),
                        human_bytes(k),
                        human_seconds(t),
                        human_seconds(saved.max(0.0))
                    ))
                })
                .collect();
            if !options.is_empty() {
                let _ = write!(out, "\n    {}", options.join("; "));
            }
        }
        let width = self
            .stage_names
            .iter()
            .map(|n| n.chars().count())
            .max()
            .unwrap_or(0)
            .clamp(5, 60);
        let _ = write!(
            out,
            "\n  {:>5}  {:<width$}  {:<26}  {:>11}  {:>11}  {:>11}  {:>11}  {:>11}",
            "stage", "name", "segment", "input", "kept", "forward", "policy kept", "recompute"
        );
        for (i, cost) in self.stage_costs.iter().enumerate() {
            let name = self.stage_names.get(i).map_or("", String::as_str);
            let segment = self.segment_of(i);
            let (held, policy_kept, recompute) = if segment == last {
                (
                    format!("{} (plain)", segment + 1),
                    "-".to_string(),
                    "-".to_string(),
                )
            } else {
                let p = self.policy_of(segment);
                let (k, t) = cost.keep(p).unwrap_or((0, cost.forward_seconds));
                (
                    format!("{} (recomputed, {})", segment + 1, policy_name(p)),
                    human_bytes(k),
                    human_seconds(t),
                )
            };
            let _ = write!(
                out,
                "\n  {i:>5}  {name:<width$}  {held:<26}  {:>11}  {:>11}  {:>11}  {policy_kept:>11}  {recompute:>11}",
                human_bytes(cost.input_bytes),
                human_bytes(cost.kept_bytes),
                human_seconds(cost.forward_seconds),
            );
        }
        out
    }
}

/// The name of a policy in plans: `full`, `masks`, `selective` (the main program's
/// `--policy` values), `linear` for linear outputs alone.
pub fn policy_name(policy: Policy) -> &'static str {
    if policy == Policy::RECOMPUTE_ALL {
        "full"
    } else if policy == MASKS {
        "masks"
    } else if policy == Policy::selective() {
        "selective"
    } else {
        "linear"
    }
}

/// `bytes` as `12.50 MiB` (binary units).
pub(crate) fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

fn human_seconds(s: f64) -> String {
    if s >= 1.0 {
        format!("{s:.3} s")
    } else if s >= 1e-3 {
        format!("{:.3} ms", s * 1e3)
    } else {
        format!("{:.3} µs", s * 1e6)
    }
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let k = self.segments();
        writeln!(
            f,
            "plan for {} stages: {} segment{} ({} checkpointed, the last plain)",
            self.len,
            k,
            if k == 1 { "" } else { "s" },
            k - 1
        )?;
        writeln!(f, "  cuts: {:?}", self.cuts)?;
        let ranges: Vec<String> = self
            .ranges()
            .iter()
            .map(|r| format!("{}..{}", r.start, r.end))
            .collect();
        writeln!(f, "  segments: {}", ranges.join(" | "))?;
        if self.policies.iter().any(|&p| p != Policy::RECOMPUTE_ALL) {
            let names: Vec<&str> = self.policies.iter().map(|&p| policy_name(p)).collect();
            writeln!(
                f,
                "  policies of the checkpointed segments: {}",
                names.join(" | ")
            )?;
        }
        let phase = match self.peak_phase {
            Phase::Plain => "forward and backward of the plain segment".to_string(),
            Phase::Recompute { segment } => {
                let r = &self.ranges()[segment];
                format!(
                    "recompute of segment {} of {k} (stages {}..{})",
                    segment + 1,
                    r.start,
                    r.end
                )
            }
        };
        writeln!(
            f,
            "  predicted peak: {} ({} B), during the {phase}",
            human_bytes(self.predicted_peak_bytes),
            self.predicted_peak_bytes
        )?;
        let ratio = if self.plain_peak_bytes > 0 {
            format!(
                " ({:.1} % of it)",
                100.0 * self.predicted_peak_bytes as f64 / self.plain_peak_bytes as f64
            )
        } else {
            String::new()
        };
        writeln!(
            f,
            "  plain run, predicted: {}{ratio}",
            human_bytes(self.plain_peak_bytes)
        )?;
        if let Some(b) = self.budget_bytes {
            writeln!(f, "  budget: {} ({b} B)", human_bytes(b))?;
        }
        write!(
            f,
            "  predicted extra time: {} (recompute of {} stage{})",
            human_seconds(self.predicted_extra_seconds),
            self.recomputed_stages,
            if self.recomputed_stages == 1 { "" } else { "s" }
        )?;
        if let Some(m) = self.measured_peak_bytes {
            let diff = if self.predicted_peak_bytes > 0 {
                format!(
                    " ({:+.1} % vs predicted)",
                    100.0 * (m as f64 - self.predicted_peak_bytes as f64)
                        / self.predicted_peak_bytes as f64
                )
            } else {
                String::new()
            };
            write!(f, "\n  measured peak: {} ({m} B){diff}", human_bytes(m))?;
        }
        Ok(())
    }
}
