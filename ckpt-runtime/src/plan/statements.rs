//! The run time of `#[checkpointed]` functions whose cuts are chosen at run time:
//! `segments = auto`, `budget = ".."`, and `segments = N` over a body with a layer loop
//! (whose number of iterations is only known then). Their statements are units over a
//! type-erased environment; a layer loop is a unit with one stage per iteration; the
//! chain of stages is cut as the schedule says (profiled once per input and planned for
//! `auto` / `budget`, `ckpt_budget::sequential_ranges` for `segments = N`).
//!
//! # The design
//!
//! The macro has no types, and the cuts are only known at run time, so it cannot write
//! one closure per segment as `segments = N` does. Instead every statement but the last
//! becomes a *stage*: a closure `Fn(&mut Env)` that takes the values it uses out of an
//! environment of *slots* (one per binding that some later statement uses: the
//! parameters those statements need and the `let`s they define), runs the statement
//! unchanged, and puts what it defines back. A value in a slot is kept unpacked, as its
//! [`Stash`] tensors and its skeleton (behind an `Arc<Mutex<..>>`, so that it can be
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
//! statement uses must be [`Stash`], since any statement boundary may become a cut.
//!
//! The environment's slots and the units' uses and definitions are static tables
//! ([`FnChain`]); per call, with the number of iterations of each layer loop, the run
//! time expands them to one entry per stage ([`Stages`]) and derives liveness, segment
//! inputs and outputs from those. A loop unit is a closure over a range of its
//! iterations: it re-derives the items of those iterations from its iterable (which the
//! macro restricts to `self` and the parameters) with [`iter_range`], so a segment may
//! start or end inside the loop. The plans are cached in the function's own `static`,
//! per input (the shapes, dtypes and devices of the tensors in the arguments the stages
//! use, the values of those arguments whose type implements `Hash`, such as a `train:
//! bool`, and the iteration counts).

use std::any::Any;
use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::marker::PhantomData;
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use tch::{Device, Kind, Tensor};

use super::profile::{self, StageFigures};
use super::{ChainCost, Objective, Plan, StageCost};
use crate::checkpoint::CheckpointOptions;
use crate::{CkptError, Stash, lock, memory};

/// The type of a value, at compile time only (`Copy`, `Send`, `Sync`, zero-sized).
pub struct Witness<T>(PhantomData<fn() -> T>);

impl<T> Clone for Witness<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Witness<T> {}

impl<T> Default for Witness<T> {
    fn default() -> Self {
        Witness(PhantomData)
    }
}

/// A skeleton that can be rebuilt from any number of times, by any thread.
type SharedSkeleton = Arc<Mutex<Box<dyn Any + Send>>>;

/// One value, unpacked: its tensors and its skeleton.
struct Slot {
    tensors: Vec<Tensor>,
    skeleton: SharedSkeleton,
}

impl Slot {
    /// A copy sharing the tensors (shallow clones) and the skeleton.
    fn dup(&self) -> Slot {
        Slot {
            tensors: self.tensors.iter().map(Tensor::shallow_clone).collect(),
            skeleton: Arc::clone(&self.skeleton),
        }
    }

    /// A copy with detached tensors (`leaf`: float ones set to require grad).
    fn detached(&self, leaf: bool) -> Slot {
        Slot {
            tensors: self
                .tensors
                .iter()
                .map(|t| {
                    if !t.defined() {
                        Tensor::new()
                    } else if leaf {
                        profile::detached_leaf(t)
                    } else {
                        t.detach()
                    }
                })
                .collect(),
            skeleton: Arc::clone(&self.skeleton),
        }
    }
}

/// The values of a function's bindings between statements, by slot.
pub struct Env {
    slots: Vec<Option<Slot>>,
    /// Hashes of the arguments put with [`put_param`] (`None`: not `Hash`).
    hashes: Vec<Option<u64>>,
}

impl Env {
    /// An environment of `slots` empty slots.
    pub fn new(slots: usize) -> Env {
        Env {
            slots: (0..slots).map(|_| None).collect(),
            hashes: Vec::new(),
        }
    }

    fn tensors(&self) -> impl Iterator<Item = &Tensor> {
        self.slots.iter().flatten().flat_map(|s| &s.tensors)
    }
}

/// Puts a value into a slot and returns the witness of its type.
pub fn put<T: Stash>(env: &mut Env, slot: usize, value: T) -> Witness<T> {
    let mut tensors = Vec::new();
    let skeleton = value.unpack(&mut tensors);
    env.slots[slot] = Some(Slot {
        tensors,
        skeleton: Arc::new(Mutex::new(Box::new(skeleton))),
    });
    Witness::default()
}

/// [`put`] for an argument of the function; `hash` (of the argument's value, when its
/// type implements `Hash`) becomes part of the key of the plan cache.
pub fn put_param<T: Stash>(env: &mut Env, slot: usize, hash: Option<u64>, value: T) -> Witness<T> {
    env.hashes.push(hash);
    put(env, slot, value)
}

/// Takes the value of a slot, of the witnessed type; with `keep`, a copy sharing its
/// tensors stays in the slot (the value is used again later).
///
/// # Panics
///
/// If the slot is empty or holds another type (a bug of the macro).
pub fn take<T: Stash>(env: &mut Env, slot: usize, _: Witness<T>, keep: bool) -> T {
    let s = if keep {
        env.slots[slot].as_ref().map(Slot::dup)
    } else {
        env.slots[slot].take()
    }
    .unwrap_or_else(|| panic!("ckpt: slot {slot} of the environment is empty"));
    let skeleton = lock(&s.skeleton);
    let skeleton = skeleton
        .downcast_ref::<T::Skeleton>()
        .expect("ckpt: a slot holds the type of its witness");
    T::pack(skeleton, &mut s.tensors.into_iter())
}

/// Autoref specialisation for the plan cache's key: `(&KeyProbe(&arg)).__ckpt_key_hash()`
/// hashes the argument when its type implements `Hash` ([`ViaHash`]) and gives `None`
/// otherwise ([`ViaNoHash`]).
pub struct KeyProbe<'a, T: ?Sized>(pub &'a T);

/// Picked first, when `T: Hash`.
pub trait ViaHash {
    /// The hash of the value.
    fn __ckpt_key_hash(&self) -> Option<u64>;
}

impl<T: Hash + ?Sized> ViaHash for KeyProbe<'_, T> {
    fn __ckpt_key_hash(&self) -> Option<u64> {
        let mut h = DefaultHasher::new();
        self.0.hash(&mut h);
        Some(h.finish())
    }
}

/// Picked otherwise.
pub trait ViaNoHash {
    /// `None`.
    fn __ckpt_key_hash(&self) -> Option<u64>;
}

impl<T: ?Sized> ViaNoHash for &KeyProbe<'_, T> {
    fn __ckpt_key_hash(&self) -> Option<u64> {
        None
    }
}

/// A unit of the chain on the environment: a statement (called with `0..1`), or a layer
/// loop called with a range of its iterations.
pub type StageFn = Box<dyn Fn(&mut Env, Range<usize>) + Send + Sync>;

/// Boxes a unit's closure; returns the witnesses it returns (never calling it: witnesses
/// are only types).
pub fn stage<W, F>(f: F) -> (StageFn, W)
where
    W: Default,
    F: Fn(&mut Env, Range<usize>) -> W + Send + Sync + 'static,
{
    (
        Box::new(move |env: &mut Env, range: Range<usize>| {
            let _ = f(env, range);
        }),
        W::default(),
    )
}

/// The value of the last statement in a profiling run, put into its slot when its type
/// implements [`Stash`] ([`ViaStashPut`]; otherwise dropped, [`ViaNoPut`]): the planner
/// then sees its bytes and backpropagates through it.
pub struct ProbePut<T>(pub std::cell::Cell<Option<T>>);

/// Picked first, when `T: Stash`.
pub trait ViaStashPut {
    /// Puts the value into `slot`.
    fn __ckpt_probe_put(&self, env: &mut Env, slot: usize);
}

impl<T: Stash> ViaStashPut for ProbePut<T> {
    fn __ckpt_probe_put(&self, env: &mut Env, slot: usize) {
        if let Some(value) = self.0.take() {
            put(env, slot, value);
        }
    }
}

/// Picked otherwise.
pub trait ViaNoPut {
    /// Drops the value.
    fn __ckpt_probe_put(&self, env: &mut Env, slot: usize);
}

impl<T> ViaNoPut for &ProbePut<T> {
    fn __ckpt_probe_put(&self, _: &mut Env, _: usize) {}
}

/// The number of iterations of a layer loop: the length of its iterable.
pub fn iter_count<I: IntoIterator>(iterable: I) -> usize {
    iterable.into_iter().count()
}

/// The items of iterations `range` of a layer loop, re-derived from its iterable (a slice
/// iterator skips in O(1)).
pub fn iter_range<I: IntoIterator>(
    iterable: I,
    range: Range<usize>,
) -> std::iter::Take<std::iter::Skip<I::IntoIter>> {
    let len = range.end.saturating_sub(range.start);
    iterable.into_iter().skip(range.start).take(len)
}

/// The key of a function's cached plan.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct FnKey {
    tensors: Vec<(Vec<i64>, Kind, Device)>,
    hashes: Vec<Option<u64>>,
    counts: Vec<usize>,
}

impl FnKey {
    fn new(env: &Env, counts: &[usize]) -> FnKey {
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

    fn describe(&self) -> String {
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
struct PlanCache {
    plans: HashMap<FnKey, Plan>,
    order: VecDeque<FnKey>,
}

impl PlanCache {
    fn get(&self, key: &FnKey) -> Option<&Plan> {
        self.plans.get(key)
    }

    fn insert(&mut self, key: FnKey, plan: Plan) {
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

    fn clear(&mut self) {
        self.plans.clear();
        self.order.clear();
    }

    fn iter(&self) -> impl Iterator<Item = (&FnKey, &Plan)> {
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
    name: &'static str,
    slots: usize,
    units: &'static [Unit],
    tail: &'static [usize],
    tail_counts: bool,
    /// The slot a profiling run of the last statement puts its value in (one, or none
    /// when the last statement may not run in the profile); with one, the last statement
    /// is the last stage of the chains `segments = auto` plans.
    tail_out: &'static [usize],
    /// The last statement's label.
    tail_name: &'static str,
    schedule: ChainSchedule,
    plans: OnceLock<Mutex<PlanCache>>,
    /// `Type::method (file:line)`, set by the first plan.
    display: OnceLock<String>,
}

/// A chain expanded for one call: one entry per stage.
struct Stages {
    /// Per stage: its unit and its iteration.
    at: Vec<(usize, usize)>,
    /// Per stage: the slots it uses and defines.
    uses: Vec<&'static [usize]>,
    defs: Vec<&'static [usize]>,
    /// `used_from[b][s]`: slot `s` is used by a stage `>= b` or by the last statement.
    used_from: Vec<Vec<bool>>,
}

impl Stages {
    /// The stages of `chain` for `counts`; with `probe`, the last statement is one more
    /// stage at the end (unit index `units.len()`), using the tail's slots and defining
    /// `tail_out`.
    fn new(chain: &FnChain, counts: &[usize], probe: bool) -> Stages {
        let mut at = Vec::new();
        let mut uses = Vec::new();
        let mut defs = Vec::new();
        for (u, unit) in chain.units.iter().enumerate() {
            for i in 0..counts[u] {
                at.push((u, i));
                uses.push(if i == 0 { unit.first_uses } else { unit.uses });
                defs.push(unit.defs);
            }
        }
        if probe {
            at.push((chain.units.len(), 0));
            uses.push(chain.tail);
            defs.push(chain.tail_out);
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
            used_from,
        }
    }

    fn len(&self) -> usize {
        self.at.len()
    }

    /// The slots a segment `a..b` takes in (with whether each is also needed after `b`)
    /// and gives out.
    fn boundary(&self, range: &Range<usize>) -> (Vec<(usize, bool)>, Vec<usize>) {
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
    fn pieces(&self, range: &Range<usize>) -> Vec<(usize, Range<usize>)> {
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
    fn name(&self, chain: &FnChain, s: usize) -> String {
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

    fn plans(&'static self) -> MutexGuard<'static, PlanCache> {
        let plans = self.plans.get_or_init(|| {
            lock(&REGISTRY).push(self);
            Mutex::default()
        });
        lock(plans)
    }

    /// The segments of this call, as ranges of stages (the last runs inline, and the last
    /// statement after it); `None` runs every stage inline.
    fn ranges(
        &'static self,
        options: &CheckpointOptions,
        stages: &Stages,
        fns: &[StageFn],
        counts: &[usize],
        env: &Env,
        what: &str,
    ) -> Option<Vec<Range<usize>>> {
        if !crate::ffi::grad_enabled() {
            return None;
        }
        let n = stages.len();
        match self.schedule {
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
                Some(ranges)
            }
            ChainSchedule::Auto(objective) => {
                let key = FnKey::new(env, counts);
                let cached = self.plans().get(&key).cloned();
                let plan = match cached {
                    Some(p) => p,
                    None if crate::ffi::is_recomputing() => return None,
                    None => {
                        let made = profile_env(self, stages, options, fns, env)
                            .and_then(|costs| costs.plan(&objective));
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
                let mut ranges = plan.ranges();
                if self.probed() {
                    // The last stage is the last statement, profiled; it runs after the
                    // chain, as the end of the plain segment.
                    let last = ranges.last_mut().expect("at least one range");
                    last.end -= 1;
                }
                Some(ranges)
            }
        }
    }

    /// Whether the last statement is profiled as the chain's last stage.
    fn probed(&self) -> bool {
        matches!(self.schedule, ChainSchedule::Auto(_)) && !self.tail_out.is_empty()
    }
}

/// Every chain that has planned, for [`function_plans`].
static REGISTRY: Mutex<Vec<&'static FnChain>> = Mutex::new(Vec::new());

/// A plan made for a `#[checkpointed(segments = auto)]` (or `budget = ".."`) function.
#[derive(Debug, Clone)]
pub struct FunctionPlan {
    /// The function: `Type::method (src/model.rs:42)` for a method (the line of its first
    /// statement), `name (file:line)` for a free function.
    pub function: String,
    /// The input it was made for: shapes, dtypes and devices of the argument tensors.
    pub input: String,
    /// The plan; its stages are the function's statements, a layer loop counting one
    /// stage per iteration; the last statement is the last stage when it passes the
    /// side-effect rules (it is then profiled too), else it is left out.
    pub plan: Plan,
}

/// The plans made so far by every `#[checkpointed(segments = auto)]` and
/// `#[checkpointed(budget = "..")]` function of the program (one per function and
/// input, at most [`MAX_PLANS_PER_FUNCTION`] each), each function's oldest first. Print one
/// with `Display` or [`Plan::explain`].
pub fn function_plans() -> Vec<FunctionPlan> {
    let chains: Vec<&'static FnChain> = lock(&REGISTRY).clone();
    let mut out = Vec::new();
    for c in chains {
        for (key, plan) in c.plans().iter() {
            out.push(FunctionPlan {
                function: c
                    .display
                    .get()
                    .cloned()
                    .unwrap_or_else(|| c.name.to_owned()),
                input: key.describe(),
                plan: plan.clone(),
            });
        }
    }
    out
}

/// [`Plan::explain`] of every plan [`function_plans`] lists, each under its function and
/// input: per stage (a statement, or an iteration of a layer loop) its name, the segment
/// that holds it, its input and kept bytes and its forward time.
///
/// ```no_run
/// # extern crate ckpt_runtime as ckpt;
/// // after a training step of the model:
/// println!("{}", ckpt::plan::explain());
/// ```
pub fn explain() -> String {
    function_plans()
        .iter()
        .map(|p| format!("{}, input {}:\n{}", p.function, p.input, p.plan.explain()))
        .collect::<Vec<_>>()
        .join("\n\n")
}

/// Forgets the plans of every `#[checkpointed(segments = auto)]` / `budget` function: the
/// next training call of each profiles and plans again.
pub fn clear_function_plans() {
    let chains: Vec<&'static FnChain> = lock(&REGISTRY).clone();
    for c in chains {
        c.plans().clear();
    }
}

/// A list of slots, as a segment's input or output.
pub struct Slots(Vec<(usize, Slot)>);

impl Stash for Slots {
    type Skeleton = Vec<(usize, usize, SharedSkeleton)>;

    fn unpack(self, tensors: &mut Vec<Tensor>) -> Self::Skeleton {
        self.0
            .into_iter()
            .map(|(i, s)| {
                let n = s.tensors.len();
                tensors.extend(s.tensors);
                (i, n, s.skeleton)
            })
            .collect()
    }

    fn pack(skeleton: &Self::Skeleton, tensors: &mut std::vec::IntoIter<Tensor>) -> Self {
        Slots(
            skeleton
                .iter()
                .map(|(i, n, sk)| {
                    let ts: Vec<Tensor> = tensors.by_ref().take(*n).collect();
                    assert_eq!(
                        ts.len(),
                        *n,
                        "ckpt: a stash has fewer tensors than its skeleton needs"
                    );
                    (
                        *i,
                        Slot {
                            tensors: ts,
                            skeleton: Arc::clone(sk),
                        },
                    )
                })
                .collect(),
        )
    }
}

/// Runs the units of `chain` on `env` (`counts`: the number of iterations of each, 1 for a
/// statement), cut as the schedule says for this call: every segment but the last through
/// a checkpoint, the last inline. For `segments = auto` / `budget`, the first training
/// call for an input profiles and plans (`tail_probe`, the last statement as a closure
/// that puts its value into the chain's `tail_out` slot, is profiled as the last stage);
/// without grad, or inside a recompute when no plan is cached, every stage runs inline.
///
/// # Panics
///
/// When planning fails (an impossible budget: the message states the smallest feasible
/// one) or a checkpointed segment fails in forward, with the error's message (tch's
/// convention for calls that do not return `Result`).
#[allow(clippy::too_many_arguments)]
pub fn run_stages(
    chain: &'static FnChain,
    options: &CheckpointOptions,
    owner: Option<String>,
    file: &'static str,
    line: u32,
    mut fns: Vec<StageFn>,
    tail_probe: Option<StageFn>,
    counts: &[usize],
    env: &mut Env,
) {
    assert_eq!(fns.len(), chain.units.len(), "ckpt: one closure per unit");
    assert_eq!(counts.len(), chain.units.len(), "ckpt: one count per unit");
    let name = match &owner {
        Some(owner) => format!("{owner}::{}", chain.name),
        None => chain.name.to_owned(),
    };
    let what = format!("{name} ({file}:{line})");
    let probed = chain.probed() && tail_probe.is_some();
    if let (true, Some(probe)) = (probed, tail_probe) {
        // The profile runs it as unit `units.len()`; runs never reach it.
        fns.push(probe);
    }
    let stages = Stages::new(chain, counts, probed);
    let ranges = chain
        .ranges(options, &stages, &fns, counts, env, &what)
        .unwrap_or_else(|| std::iter::once(0..stages.len() - usize::from(probed)).collect());
    let (last, checkpointed) = ranges.split_last().expect("at least one range");
    if checkpointed.is_empty() {
        for (u, r) in stages.pieces(last) {
            fns[u](env, r);
        }
        return;
    }
    let fns: Arc<[StageFn]> = fns.into();
    let count = ranges.len();
    for (k, range) in checkpointed.iter().enumerate() {
        let (inputs, outputs) = stages.boundary(range);
        let input = Slots(
            inputs
                .iter()
                .map(|&(s, keep)| {
                    let slot = if keep {
                        env.slots[s].as_ref().map(Slot::dup)
                    } else {
                        env.slots[s].take()
                    };
                    (
                        s,
                        slot.expect("ckpt: a segment input is in the environment"),
                    )
                })
                .collect(),
        );
        let seg_name = crate::macro_support::chain_segment_name(
            owner.clone(),
            chain.name,
            k + 1,
            count,
            (
                range.clone(),
                stages.name(chain, range.start),
                stages.name(chain, range.end - 1),
            ),
            file,
            line,
        );
        let (fns, pieces, slots) = (Arc::clone(&fns), stages.pieces(range), chain.slots);
        let outputs_in = outputs.clone();
        let out: Slots = crate::macro_support::segment(
            options,
            seg_name,
            move |input: Slots| {
                let mut local = Env::new(slots);
                for (s, slot) in input.0 {
                    local.slots[s] = Some(slot);
                }
                for (u, r) in &pieces {
                    fns[*u](&mut local, r.clone());
                }
                Slots(
                    outputs_in
                        .iter()
                        .map(|&s| {
                            let slot = local.slots[s].take();
                            (s, slot.expect("ckpt: a segment output was defined"))
                        })
                        .collect(),
                )
            },
            input,
        );
        for (s, slot) in out.0 {
            env.slots[s] = Some(slot);
        }
    }
    for (u, r) in stages.pieces(last) {
        fns[u](env, r);
    }
}

/// Bytes of the distinct storages among `tensors`, leaving out those in `skip`.
fn storage_bytes<'a>(tensors: impl Iterator<Item = &'a Tensor>, skip: &HashSet<usize>) -> u64 {
    let mut seen: HashMap<usize, u64> = HashMap::new();
    for t in tensors {
        if !t.defined() || t.numel() == 0 {
            continue;
        }
        let key = storage_key(t);
        if skip.contains(&key) {
            continue;
        }
        let b = profile::nbytes(t);
        let e = seen.entry(key).or_insert(0);
        *e = (*e).max(b);
    }
    seen.values().sum()
}

fn storage_key(t: &Tensor) -> usize {
    let offset = t.storage_offset().max(0) as usize * t.kind().elt_size_in_bytes();
    (t.data_ptr() as usize).wrapping_sub(offset)
}

/// The [`ChainCost`] of the stages on `env` (see [`profile_chain`](super::profile_chain)
/// for the method): per stage (a statement, or one iteration of a layer loop), on detached
/// copies of the slots it uses. A stage's input bytes are those of every value live at
/// its start (distinct storages), less the arguments' tensors, which the caller holds.
fn profile_env(
    chain: &FnChain,
    stages: &Stages,
    options: &CheckpointOptions,
    fns: &[StageFn],
    env: &Env,
) -> Result<ChainCost, CkptError> {
    let device = env
        .tensors()
        .find(|t| t.defined())
        .map_or(Device::Cpu, Tensor::device);
    memory::f_stats(device)?;
    // As `profile::profile`: the random streams must not notice the profiling runs.
    let _rng = crate::ffi::RngFork::new();
    // Nor batch norm's running statistics: the real step updates them, once.
    let _stats = crate::ffi::FrozenRunningStats::new();
    let args: HashSet<usize> = env
        .tensors()
        .filter(|t| t.defined())
        .map(storage_key)
        .collect();
    let live = &stages.used_from;
    let mut cur = Env::new(chain.slots);
    for (s, slot) in env.slots.iter().enumerate() {
        if let Some(slot) = slot {
            cur.slots[s] = Some(slot.detached(false));
        }
    }
    let mut out = Vec::with_capacity(stages.len());
    for i in 0..stages.len() {
        let (u, iteration) = stages.at[i];
        let stage = &fns[u];
        let live_here = cur
            .slots
            .iter()
            .enumerate()
            .filter(|(s, _)| live[i][*s])
            .filter_map(|(_, slot)| slot.as_ref())
            .flat_map(|s| &s.tensors);
        let input_bytes = storage_bytes(live_here, &args);
        let local = |leaf: bool| {
            let mut e = Env::new(chain.slots);
            for &s in stages.uses[i] {
                if let Some(slot) = &cur.slots[s] {
                    e.slots[s] = Some(slot.detached(leaf));
                }
            }
            e
        };
        let mut run = Some(local(true));
        let leaves: Vec<Tensor> = run
            .iter()
            .flat_map(Env::tensors)
            .map(Tensor::shallow_clone)
            .collect();
        let defs = stages.defs[i];
        let (done, fig): (Env, StageFigures) = profile::measure_stage(
            device,
            |warm| {
                let mut e = if warm {
                    local(false)
                } else {
                    run.take().unwrap_or_else(|| local(true))
                };
                stage(&mut e, iteration..iteration + 1);
                e
            },
            |e| {
                defs.iter()
                    .filter_map(|&s| e.slots[s].as_ref())
                    .flat_map(|s| s.tensors.iter().map(Tensor::shallow_clone))
                    .collect()
            },
            &leaves,
        )?;
        out.push(StageCost {
            input_bytes,
            kept_bytes: fig.kept_bytes,
            forward_extra_bytes: fig.forward_extra_bytes,
            backward_extra_bytes: fig.backward_extra_bytes,
            forward_seconds: fig.forward_seconds,
            ..StageCost::default()
        });
        for &s in defs {
            if let Some(slot) = &done.slots[s] {
                cur.slots[s] = Some(slot.detached(false));
            }
        }
        for (s, slot) in cur.slots.iter_mut().enumerate() {
            if !live[i + 1][s] {
                *slot = None;
            }
        }
    }
    let output_bytes = storage_bytes(cur.tensors(), &args);
    Ok(ChainCost {
        stages: out,
        output_bytes,
        checkpoint_bytes: profile::probe_checkpoint_bytes(options, device)?,
    })
}
