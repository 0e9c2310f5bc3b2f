//! [`Schedule`]: how a `model!` chain is cut at run time, and [`ModelPlans`], the state a
//! checkpointed `model!` model keeps for it (the declared schedule, profiles and plans
//! cached per input).

use std::collections::HashMap;
use std::fmt;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use tch::Tensor;

use super::profile::InputKey;
use super::{Budget, ChainCost, Objective, PLANNED_POLICIES, Plan};
use crate::{CkptError, Policy, lock};

/// How the stages of a checkpointed `model!` chain are cut into segments: what
/// `#[checkpointed(..)]` declares, and what the generated `set_schedule` (and its
/// shorthands `set_segments`, `set_plan`, `set_auto`, `set_budget`) changes
/// at run time. Every segment but the last is checkpointed; the last runs plainly.
///
/// ```
/// # extern crate ckpt_runtime as ckpt;
/// use ckpt::plan::{Budget, Objective, Schedule};
/// assert_eq!(Schedule::Segments(3).to_string(), "segments = 3");
/// assert_eq!(Schedule::Cuts(vec![2, 5]).to_string(), "cuts [2, 5]");
/// assert_eq!(Schedule::Auto(Objective::MinPeak).to_string(), "segments = auto");
/// assert_eq!(
///     Schedule::Auto(Objective::Budget(Budget::Bytes(1 << 20))).to_string(),
///     "budget = 1.00 MiB (1048576 B)"
/// );
/// ```
#[derive(Debug, Clone, PartialEq)]
pub enum Schedule {
    /// `segments = N`: [`sequential_segments`](crate::sequential_segments)`(len, N)`,
    /// PyTorch's grouping (`N = 1` checkpoints nothing; `N` larger than the chain is
    /// clamped to its length).
    Segments(usize),
    /// Explicit cuts: the stage indices where a new segment starts, strictly increasing
    /// within `1..len` (empty: one plain segment). [`Plan::cuts`] are such cuts.
    Cuts(Vec<usize>),
    /// The planner's cuts for this objective, from a profile of the stages made on the
    /// first training call for each input shape, dtype, device and train flag
    /// (`segments = auto` is [`Objective::MinPeak`], `budget = ".."` is
    /// [`Objective::Budget`]).
    Auto(Objective),
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Schedule::Segments(n) => write!(f, "segments = {n}"),
            Schedule::Cuts(c) => write!(f, "cuts {c:?}"),
            Schedule::Auto(Objective::MinPeak) => write!(f, "segments = auto"),
            Schedule::Auto(Objective::Budget(b)) => write!(f, "budget = {b}"),
        }
    }
}

impl Schedule {
    /// Checks the schedule for a chain of `len` stages.
    ///
    /// # Errors
    ///
    /// [`CkptError::InvalidArgument`] for `Segments(0)`, cuts that are not strictly
    /// increasing within `1..len`, or a budget fraction that is not positive and finite.
    pub fn check(&self, len: usize) -> Result<(), CkptError> {
        match self {
            Schedule::Segments(n) => crate::sequential_segments(len, *n).map(drop),
            Schedule::Cuts(cuts) => check_cuts(cuts, len),
            Schedule::Auto(Objective::MinPeak) => Ok(()),
            Schedule::Auto(Objective::Budget(b)) => b.bytes(0).map(drop),
        }
    }

    /// The segments of a chain of `len` stages for the fixed schedules (`None` for
    /// [`Schedule::Auto`], which needs a profile).
    ///
    /// # Errors
    ///
    /// As [`Schedule::check`].
    pub fn fixed_ranges(&self, len: usize) -> Result<Option<Vec<Range<usize>>>, CkptError> {
        match self {
            Schedule::Segments(n) => crate::sequential_segments(len, *n).map(Some),
            Schedule::Cuts(cuts) => {
                check_cuts(cuts, len)?;
                Ok(Some(ckpt_budget::cut_ranges(cuts, len)))
            }
            Schedule::Auto(_) => Ok(None),
        }
    }
}

impl From<Objective> for Schedule {
    fn from(objective: Objective) -> Self {
        Schedule::Auto(objective)
    }
}

impl From<Budget> for Schedule {
    fn from(budget: Budget) -> Self {
        Schedule::Auto(Objective::Budget(budget))
    }
}

impl From<&Plan> for Schedule {
    /// The plan's cuts, as a fixed schedule.
    fn from(plan: &Plan) -> Self {
        Schedule::Cuts(plan.cuts().to_vec())
    }
}

/// Cuts of a `len`-stage chain must be strictly increasing and within `1..len`.
pub(crate) fn check_cuts(cuts: &[usize], len: usize) -> Result<(), CkptError> {
    let mut prev = 0;
    for &c in cuts {
        if c <= prev || c >= len {
            return Err(CkptError::InvalidArgument(format!(
                "cuts {cuts:?} of a {len}-stage chain: they must be strictly increasing and within 1..{len}"
            )));
        }
        prev = c;
    }
    Ok(())
}

/// The state of a checkpointed `model!` model (a hidden field): its [`Schedule`], and
/// the profiles and auto plans cached per input (size, dtype, device, train flag). A
/// clone shares the caches (shallow clones of the model are taken every forward call);
/// profiles do not depend on the schedule and survive a change of it, plans do not.
#[doc(hidden)]
#[derive(Debug, Clone)]
pub struct ModelPlans {
    schedule: Schedule,
    policy: Policy,
    /// Whether the policy was declared or set (`policy = ..`, `set_policy`): then the
    /// planner plans for it instead of choosing one per segment.
    policy_fixed: bool,
    profiles: Arc<Mutex<HashMap<InputKey, ChainCost>>>,
    plans: Arc<Mutex<HashMap<InputKey, Plan>>>,
}

impl ModelPlans {
    /// The state for a declared schedule (checked by the macro).
    pub fn new(schedule: Schedule) -> Self {
        ModelPlans {
            schedule,
            policy: Policy::RECOMPUTE_ALL,
            policy_fixed: false,
            profiles: Arc::default(),
            plans: Arc::default(),
        }
    }

    /// The state with a declared selective-checkpointing policy (fixed: the planner
    /// does not choose another).
    pub fn with_policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self.policy_fixed = true;
        self
    }

    /// What each checkpointed segment keeps from its forward, when declared or set;
    /// [`Policy::RECOMPUTE_ALL`] otherwise (an auto schedule then chooses per segment:
    /// [`Plan::policies`]).
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// Sets what each checkpointed segment keeps from its forward, for every segment
    /// (the planner no longer chooses); forgets the plans, which depend on it.
    pub fn set_policy(&mut self, policy: Policy) {
        self.policy = policy;
        self.policy_fixed = true;
        self.plans = Arc::default();
    }

    /// The policies an auto schedule chooses from: the fixed one when it is one the
    /// planner models (else full recompute: the cuts are planned for that), all of
    /// [`PLANNED_POLICIES`] when none was fixed.
    fn allowed(&self) -> Vec<Policy> {
        if !self.policy_fixed {
            PLANNED_POLICIES.to_vec()
        } else if PLANNED_POLICIES.contains(&self.policy) {
            vec![self.policy]
        } else {
            vec![Policy::RECOMPUTE_ALL]
        }
    }

    /// [`ModelPlans::ranges`] with the policy of each checkpointed segment (one per
    /// range but the last): the fixed policy, or for an auto schedule without one the
    /// plan's choice.
    ///
    /// # Errors
    ///
    /// As [`ModelPlans::ranges`].
    pub fn segments(
        &self,
        len: usize,
        input: &Tensor,
        train: Option<bool>,
        profile: impl FnOnce() -> Result<ChainCost, CkptError>,
    ) -> Result<(Vec<Range<usize>>, Vec<Policy>), CkptError> {
        let fixed = |ranges: Vec<Range<usize>>| {
            let n = ranges.len().saturating_sub(1);
            (ranges, vec![self.policy; n])
        };
        if self.policy_fixed || !matches!(self.schedule, Schedule::Auto(_)) {
            return self.ranges(len, input, train, profile).map(fixed);
        }
        if !crate::ffi::grad_enabled() {
            return Ok(fixed(ckpt_budget::cut_ranges(&[], len)));
        }
        let key = InputKey::new(input, train);
        if let Some(plan) = lock(&self.plans).get(&key)
            && plan.len() == len
        {
            return Ok((plan.ranges(), plan.policies().to_vec()));
        }
        if crate::ffi::is_recomputing() && !lock(&self.profiles).contains_key(&key) {
            return Ok(fixed(ckpt_budget::cut_ranges(&[], len)));
        }
        let plan = self.plan(len, input, train, profile)?;
        Ok((plan.ranges(), plan.policies().to_vec()))
    }

    /// The current schedule.
    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// Replaces the schedule after checking it for a chain of `len` stages; forgets the
    /// plans (not the profiles).
    ///
    /// # Errors
    ///
    /// As [`Schedule::check`]; the schedule is unchanged then.
    pub fn set(&mut self, schedule: Schedule, len: usize) -> Result<(), CkptError> {
        schedule.check(len)?;
        self.schedule = schedule;
        self.plans = Arc::default();
        Ok(())
    }

    /// Forgets every cached profile and plan (the next training call profiles again).
    pub fn clear(&self) {
        lock(&self.profiles).clear();
        lock(&self.plans).clear();
    }

    /// The segments of one forward call on `input`. Fixed schedules need nothing more;
    /// an auto schedule uses the plan cached for the input, or profiles (`profile`) and
    /// plans when there is none. Without grad (`no_grad`, inference), and inside the
    /// recompute of an enclosing checkpoint when nothing is cached, it does not profile
    /// and runs the chain as one plain segment.
    ///
    /// # Errors
    ///
    /// As [`Schedule::check`], `profile` and [`ChainCost::plan`]
    /// ([`CkptError::BudgetTooSmall`]).
    pub fn ranges(
        &self,
        len: usize,
        input: &Tensor,
        train: Option<bool>,
        profile: impl FnOnce() -> Result<ChainCost, CkptError>,
    ) -> Result<Vec<Range<usize>>, CkptError> {
        if let Some(r) = self.schedule.fixed_ranges(len)? {
            return Ok(r);
        }
        if !crate::ffi::grad_enabled() {
            return Ok(ckpt_budget::cut_ranges(&[], len));
        }
        let key = InputKey::new(input, train);
        if let Some(plan) = lock(&self.plans).get(&key)
            && plan.len() == len
        {
            return Ok(plan.ranges());
        }
        if crate::ffi::is_recomputing() && !lock(&self.profiles).contains_key(&key) {
            return Ok(ckpt_budget::cut_ranges(&[], len));
        }
        Ok(self.plan(len, input, train, profile)?.ranges())
    }

    /// The plan of the current schedule for inputs like `input`: for an auto schedule
    /// the planner's (cached), for a fixed one its cuts evaluated on the profile. Profiles
    /// on first sight of the input (with grad, whatever the caller's mode).
    ///
    /// # Errors
    ///
    /// As [`ModelPlans::ranges`].
    pub fn plan(
        &self,
        len: usize,
        input: &Tensor,
        train: Option<bool>,
        profile: impl FnOnce() -> Result<ChainCost, CkptError>,
    ) -> Result<Plan, CkptError> {
        let key = InputKey::new(input, train);
        if let Schedule::Auto(_) = self.schedule
            && let Some(plan) = lock(&self.plans).get(&key)
            && plan.len() == len
        {
            return Ok(plan.clone());
        }
        let cached = lock(&self.profiles).get(&key).cloned();
        let costs = match cached {
            Some(c) if c.len() == len => c,
            _ => {
                let c = profile()?;
                if c.len() != len {
                    return Err(CkptError::InvalidArgument(format!(
                        "the profile has {} stages, the chain {len}",
                        c.len()
                    )));
                }
                lock(&self.profiles).insert(key.clone(), c.clone());
                c
            }
        };
        match &self.schedule {
            Schedule::Auto(objective) => {
                let plan = costs.plan_with(objective, &self.allowed())?;
                lock(&self.plans).insert(key, plan.clone());
                Ok(plan)
            }
            fixed => {
                let ranges = fixed.fixed_ranges(len)?.expect("a fixed schedule");
                let cuts: Vec<usize> = ranges[1..].iter().map(|r| r.start).collect();
                let policy = self.allowed()[0];
                costs.evaluate_with_policies(&cuts, &vec![policy; cuts.len()])
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_ranges_and_checks() {
        assert_eq!(
            Schedule::Segments(3).fixed_ranges(7).unwrap(),
            Some(vec![0..2, 2..4, 4..7])
        );
        assert_eq!(
            Schedule::Cuts(vec![1, 5]).fixed_ranges(7).unwrap(),
            Some(vec![0..1, 1..5, 5..7])
        );
        assert_eq!(
            Schedule::Cuts(vec![]).fixed_ranges(7).unwrap(),
            Some(std::iter::once(0..7).collect())
        );
        assert_eq!(
            Schedule::Auto(Objective::MinPeak).fixed_ranges(7).unwrap(),
            None
        );
        for bad in [
            Schedule::Segments(0),
            Schedule::Cuts(vec![0]),
            Schedule::Cuts(vec![3, 3]),
            Schedule::Cuts(vec![7]),
            Schedule::Auto(Objective::Budget(Budget::FractionOfPlain(-1.0))),
        ] {
            assert!(
                matches!(bad.check(7), Err(CkptError::InvalidArgument(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn set_keeps_the_old_schedule_on_error() {
        let mut p = ModelPlans::new(Schedule::Segments(2));
        assert!(p.set(Schedule::Cuts(vec![4, 2]), 6).is_err());
        assert_eq!(p.schedule(), &Schedule::Segments(2));
        p.set(Schedule::Auto(Objective::MinPeak), 6).unwrap();
        assert_eq!(p.schedule(), &Schedule::Auto(Objective::MinPeak));
    }
}
