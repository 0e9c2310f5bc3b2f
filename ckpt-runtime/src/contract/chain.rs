//! The static description of a `#[checkpointed]` function whose cuts are chosen at run time
//! ([`FnChain`]) and how one call of it is cut: `segments = auto`, `budget = ".."`, and
//! `segments = N` over a body with a layer loop (whose number of iterations is only known
//! then). Their statements are units over a type-erased environment; a layer loop is a
//! unit with one stage per iteration; the chain of stages is cut as the schedule says
//! (profiled once per input and planned for `auto` / `budget`, the planner keeping some
//! segments where that saves recompute time within the budget;
//! `ckpt_budget::sequential_ranges` for `segments = N`). A unit marked `#[ckpt::keep]`
//! never runs in a checkpointed segment: the planner must keep it, and `segments = N`
//! takes it out of its segment ([`split_kept`], as `model!` does).
//!
//! # The design
//!
//! The macro has no types, and the cuts are only known at run time, so it cannot write
//! one closure per segment as `segments = N` does. Instead every statement but the last
//! becomes a *stage*: a closure `Fn(&mut Env)` that takes the values it uses out of an
//! environment of *slots* (one per binding that some later statement uses: the
//! parameters those statements need and the `let`s they define), runs the statement
//! unchanged, and puts what it defines back. A value in a slot is kept unpacked, as its
//! [`Stash`](crate::Stash) tensors and its skeleton (behind an `Arc<Mutex<..>>`, so that it can be
//! rebuilt any number of times — forward, recompute — without `Clone` or `Sync`
//! bounds), which is exactly what a checkpoint's stash needs. So a segment `a..b` is one
//! closure that runs stages `a..b` on a local environment: its inputs are the slots those
//! stages use that were defined before `a` (shallow clones when they are also needed
//! after `b`), its outputs the slots they define that are needed after `b`. The last
//! statement runs inline after the chain, so it may `return`, use `?`, and borrow the
//! parameters.
//!
//! Types flow through *witnesses*: `put(env, slot, value)` returns a zero-sized
//! `Witness<T>` of the value's type, which a stage closure returns to its caller for each
//! slot it defines; a later stage passes it to `take(env, slot, witness, keep)`, so the
//! value comes back with its own type, inferred by the compiler from the statement that
//! made it. A value that cannot be stashed (a reference, a closure) is a compile error
//! on its binding, as with `segments = N`, except that here every value that a later
//! statement uses must be [`Stash`](crate::Stash), since any statement boundary may become a cut.
//!
//! The environment's slots and the units' uses and definitions are static tables
//! ([`FnChain`]); per call, with the number of iterations of each layer loop, the run
//! time expands them to one entry per stage ([`Stages`]) and derives liveness, segment
//! inputs and outputs from those. A loop unit is a closure over a range of its
//! iterations: it re-derives the items of those iterations from its iterable (which the
//! macro restricts to `self` and the parameters) with [`iter_range`](super::env::iter_range), so a segment may
//! start or end inside the loop. The plans are cached in the function's own `static`,
//! per input (the shapes, dtypes and devices of the tensors in the arguments the stages
//! use, the values of those arguments whose type implements `Hash`, such as a `train:
//! bool`, and the iteration counts).

use std::collections::{HashMap, HashSet, VecDeque};
use std::ops::Range;
use std::sync::{Mutex, MutexGuard, OnceLock};

use tch::{Device, Kind};

use super::env::{Env, StageFn};
use super::model::{Segments, keeping, run_policies, split_kept};
use super::registry::REGISTRY;
use super::run::profile_env;
use crate::checkpoint::CheckpointOptions;
use crate::lock;
use crate::plan::{Objective, Plan, allowed_policies};

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct FnKey {
    tensors: Vec<(Vec<i64>, Kind, Device)>,
    hashes: Vec<Option<u64>>,
    counts: Vec<usize>,
}

impl FnKey {
    pub(super) fn new(env: &Env, counts: &[usize]) -> FnKey {
        FnKey {
            tensors: env
                .tensors()
                .map(|t| {
                    if t.defined() {
                        (t.size(), t.kind(), t.device())
                    } else {
                        (Vec::new(), Kind::Float, Device::Cpu)
                    }
                })
                .collect(),
            hashes: env.hashes.clone(),
            counts: counts.to_vec(),
        }
    }

    pub(super) fn describe(&self) -> String {
        let shapes: Vec<String> = self
            .tensors
            .iter()
            .map(|(s, k, d)| format!("{s:?} {k:?} {d:?}"))
            .collect();
        format!("[{}]", shapes.join(", "))
    }
}

/// How many plans a `#[checkpointed(segments = auto)]` function keeps (one per input);
/// past that the oldest is forgotten, so an argument that changes on every call (a step
/// counter that a stage uses, hashed into the input) cannot grow the cache without end.
pub const MAX_PLANS_PER_FUNCTION: usize = 64;

/// The plans of one function by input, oldest first.
#[derive(Default)]
pub(super) struct PlanCache {
    plans: HashMap<FnKey, Plan>,
    order: VecDeque<FnKey>,
}

impl PlanCache {
    pub(super) fn get(&self, key: &FnKey) -> Option<&Plan> {
        self.plans.get(key)
    }

    pub(super) fn insert(&mut self, key: FnKey, plan: Plan) {
        if !self.plans.contains_key(&key) {
            if self.order.len() == MAX_PLANS_PER_FUNCTION
                && let Some(oldest) = self.order.pop_front()
            {
                self.plans.remove(&oldest);
            }
            self.order.push_back(key.clone());
        }
        self.plans.insert(key, plan);
    }

    pub(super) fn clear(&mut self) {
        self.plans.clear();
        self.order.clear();
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (&FnKey, &Plan)> {
        self.order.iter().map(|k| (k, &self.plans[k]))
    }
}

/// One unit of a function's chain: a statement, or a layer loop (one stage per
/// iteration), with the slots it uses and defines.
#[derive(Debug)]
pub struct Unit {
    /// A short source label: `let h = self.l1.forward(xs)`, `for b in self.blocks.iter()`.
    pub name: &'static str,
    /// Slots the unit's first iteration (a statement's only one) uses.
    pub first_uses: &'static [usize],
    /// Slots every later iteration uses (a `fold` also uses its own accumulator there).
    pub uses: &'static [usize],
    /// Slots it defines.
    pub defs: &'static [usize],
    /// A layer loop (its count comes from the call), not a statement.
    pub looped: bool,
    /// Marked `#[ckpt::keep]`: its stages never run in a checkpointed segment (inline,
    /// once, with grad; the planner must keep them).
    pub kept: bool,
}

/// How a function's chain is cut.
#[derive(Debug, Clone, Copy)]
pub enum ChainSchedule {
    /// `segments = N`: [`crate::sequential_segments`] over the stages counted at run time
    /// (with the last statement, when it counts).
    Segments(usize),
    /// `segments = auto` / `budget`: the planner's cuts for this objective.
    Auto(Objective),
}

/// The static description of a `#[checkpointed]` function whose cuts are chosen at run
/// time, generated as a `static` in its body: its name, its units and their slots, the
/// slots the last statement takes, the schedule, and the plans cached per input.
pub struct FnChain {
    pub(super) name: &'static str,
    pub(super) slots: usize,
    pub(super) units: &'static [Unit],
    pub(super) tail: &'static [usize],
    pub(super) tail_counts: bool,
    /// The slot a profiling run of the last statement puts its value in (one, or none
    /// when the last statement may not run in the profile); with one, the last statement
    /// is the last stage of the chains `segments = auto` plans.
    pub(super) tail_out: &'static [usize],
    /// The last statement's label.
    pub(super) tail_name: &'static str,
    pub(super) schedule: ChainSchedule,
    pub(super) plans: OnceLock<Mutex<PlanCache>>,
    /// `Type::method (file:line)`, set by the first plan.
    pub(super) display: OnceLock<String>,
}

/// A chain expanded for one call: one entry per stage.
pub(super) struct Stages {
    /// Per stage: its unit and its iteration.
    pub(super) at: Vec<(usize, usize)>,
    /// Per stage: the slots it uses and defines.
    pub(super) uses: Vec<&'static [usize]>,
    pub(super) defs: Vec<&'static [usize]>,
    /// Per stage: its unit is marked `#[ckpt::keep]`.
    pub(super) kept: Vec<bool>,
    /// `used_from[b][s]`: slot `s` is used by a stage `>= b` or by the last statement.
    pub(super) used_from: Vec<Vec<bool>>,
}

impl Stages {
    /// The stages of `chain` for `counts`; with `probe`, the last statement is one more
    /// stage at the end (unit index `units.len()`), using the tail's slots and defining
    /// `tail_out`.
    pub(super) fn new(chain: &FnChain, counts: &[usize], probe: bool) -> Stages {
        let mut at = Vec::new();
        let mut uses = Vec::new();
        let mut defs = Vec::new();
        let mut kept = Vec::new();
        for (u, unit) in chain.units.iter().enumerate() {
            for i in 0..counts[u] {
                at.push((u, i));
                uses.push(if i == 0 { unit.first_uses } else { unit.uses });
                defs.push(unit.defs);
                kept.push(unit.kept);
            }
        }
        if probe {
            at.push((chain.units.len(), 0));
            uses.push(chain.tail);
            defs.push(chain.tail_out);
            kept.push(false);
        }
        let n = at.len();
        let mut used_from = vec![vec![false; chain.slots]; n + 1];
        // After the chain: what the last statement takes, or (profiled) its value, which
        // the function returns.
        for &s in if probe { chain.tail_out } else { chain.tail } {
            used_from[n][s] = true;
        }
        for b in (0..n).rev() {
            used_from[b] = used_from[b + 1].clone();
            for &s in uses[b] {
                used_from[b][s] = true;
            }
        }
        Stages {
            at,
            uses,
            defs,
            kept,
            used_from,
        }
    }

    pub(super) fn len(&self) -> usize {
        self.at.len()
    }

    /// The slots a segment `a..b` takes in (with whether each is also needed after `b`)
    /// and gives out.
    pub(super) fn boundary(&self, range: &Range<usize>) -> (Vec<(usize, bool)>, Vec<usize>) {
        let live_after = &self.used_from[range.end];
        let mut defined = HashSet::new();
        let mut inputs = Vec::new();
        let mut seen = HashSet::new();
        for i in range.clone() {
            for &s in self.uses[i] {
                if !defined.contains(&s) && seen.insert(s) {
                    inputs.push(s);
                }
            }
            defined.extend(self.defs[i].iter().copied());
        }
        let inputs = inputs
            .into_iter()
            .map(|s| (s, live_after[s] && !defined.contains(&s)))
            .collect();
        let mut outputs: Vec<usize> = defined.into_iter().filter(|&s| live_after[s]).collect();
        outputs.sort_unstable();
        (inputs, outputs)
    }

    /// The units and iteration ranges that make up the stages `range`, in order.
    pub(super) fn pieces(&self, range: &Range<usize>) -> Vec<(usize, Range<usize>)> {
        let mut out: Vec<(usize, Range<usize>)> = Vec::new();
        for &(u, i) in &self.at[range.clone()] {
            match out.last_mut() {
                Some((last, r)) if *last == u && r.end == i => r.end = i + 1,
                _ => out.push((u, i..i + 1)),
            }
        }
        out
    }

    /// The name of stage `s`: its unit's, with the iteration for a loop.
    pub(super) fn name(&self, chain: &FnChain, s: usize) -> String {
        let (u, i) = self.at[s];
        let Some(unit) = chain.units.get(u) else {
            return chain.tail_name.to_owned();
        };
        if unit.looped {
            format!("{} [{i}]", unit.name)
        } else {
            unit.name.to_owned()
        }
    }
}

impl FnChain {
    /// A chain of `units` over `slots` slots.
    #[allow(clippy::too_many_arguments)]
    pub const fn new(
        name: &'static str,
        slots: usize,
        units: &'static [Unit],
        tail: &'static [usize],
        tail_counts: bool,
        tail_out: &'static [usize],
        tail_name: &'static str,
        schedule: ChainSchedule,
    ) -> FnChain {
        FnChain {
            name,
            slots,
            units,
            tail,
            tail_counts,
            tail_out,
            tail_name,
            schedule,
            plans: OnceLock::new(),
            display: OnceLock::new(),
        }
    }

    pub(super) fn plans(&'static self) -> MutexGuard<'static, PlanCache> {
        let plans = self.plans.get_or_init(|| {
            lock(&REGISTRY).push(self);
            Mutex::default()
        });
        lock(plans)
    }

    /// The segments of this call: ranges of stages, each with the policy it is
    /// checkpointed with, or `None` when it runs inline (the last, followed by the last
    /// statement; a segment the planner keeps; a run of `#[ckpt::keep]` statements, taken
    /// out of its range by [`split_kept`]). `None` runs every stage inline.
    pub(super) fn segments(
        &'static self,
        options: &CheckpointOptions,
        stages: &Stages,
        fns: &[StageFn],
        counts: &[usize],
        env: &Env,
        what: &str,
    ) -> Option<Segments> {
        if !crate::ffi::grad_enabled() {
            return None;
        }
        let n = stages.len();
        let kept = |i: usize| stages.kept.get(i).copied().unwrap_or(false);
        let (mut ranges, policies) = match self.schedule {
            ChainSchedule::Segments(segments) => {
                let with_tail = n + usize::from(self.tail_counts);
                let mut ranges = crate::sequential_segments(with_tail, segments)
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                if self.tail_counts {
                    // The last statement is the last stage of the last segment; it runs
                    // after the chain.
                    let last = ranges.last_mut().expect("at least one range");
                    last.end -= 1;
                }
                let policies = vec![Some(options.policy); ranges.len() - 1];
                (ranges, policies)
            }
            ChainSchedule::Auto(objective) => {
                let key = FnKey::new(env, counts);
                let cached = self.plans().get(&key).cloned();
                let plan = match cached {
                    Some(p) => p,
                    None if crate::is_recomputing() => return None,
                    None => {
                        let fixed = options.policy_set.then_some(options.policy);
                        // As `model!`'s planner; the `#[ckpt::keep]` units must be kept.
                        let keeping = keeping(n, kept);
                        let made = profile_env(self, stages, options, fns, env).and_then(|costs| {
                            costs.plan_keeping(&objective, &allowed_policies(fixed), &keeping)
                        });
                        let names = (0..n).map(|i| stages.name(self, i)).collect();
                        let plan = made
                            .unwrap_or_else(|e| panic!("{what}: {e}"))
                            .with_stage_names(names);
                        self.display.get_or_init(|| what.to_owned());
                        self.plans().insert(key, plan.clone());
                        plan
                    }
                };
                debug_assert_eq!(plan.len(), n);
                let fixed = options.policy_set.then_some(options.policy);
                let policies = run_policies(&plan, fixed);
                (plan.ranges(), policies)
            }
        };
        if self.probed() {
            // The last stage is the last statement, profiled; it runs after the chain, as
            // the end of the plain segment.
            let last = ranges.last_mut().expect("at least one range");
            last.end -= 1;
        }
        Some(split_kept(ranges, &policies, kept))
    }

    /// Whether the last statement is profiled as the chain's last stage.
    pub(super) fn probed(&self) -> bool {
        matches!(self.schedule, ChainSchedule::Auto(_)) && !self.tail_out.is_empty()
    }
}
