//! The state a checkpointed `model!` model keeps for its schedule ([`ModelPlans`]: the
//! declared schedule, profiles and plans cached per input), and the profile of its stages.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use tch::Tensor;

use crate::plan::{ChainCost, InputKey, Keeping, Plan, Schedule, SegmentMode, allowed_policies};
use crate::{CheckpointOptions, CkptError, Policy, lock};

/// The state of a checkpointed `model!` model (a hidden field): its [`Schedule`], and
/// the profiles and auto plans cached per input (size, dtype, device, train flag). A
/// clone shares the caches (shallow clones of the model are taken every forward call);
/// profiles do not depend on the schedule and survive a change of it, plans do not.
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
        allowed_policies(self.policy_fixed.then_some(self.policy))
    }

    /// The segments of one forward call on `input`, each with the policy it is
    /// checkpointed with, or `None` when it runs inline (kept, or the last). A fixed
    /// schedule's ranges are checkpointed with the model's policy; an auto schedule uses
    /// the plan cached for the input, or profiles (`profile`) and plans when there is
    /// none: its segments and modes (the planner may keep any stage, and keeps those
    /// marked `#[keep]`, `kept(i)`), its checkpointed segments with the fixed policy if
    /// there is one, else the planned ones. Without grad (`no_grad`, inference), and
    /// inside the recompute of an enclosing checkpoint when nothing is cached, it does
    /// not profile and runs the chain as one plain segment. In every case each run of
    /// `#[keep]` stages is taken out of its checkpointed range ([`split_kept`]).
    ///
    /// # Errors
    ///
    /// As [`Schedule::check`], `profile` and [`ChainCost::plan_keeping`]
    /// ([`CkptError::BudgetTooSmall`]).
    pub fn segments(
        &self,
        len: usize,
        input: &Tensor,
        train: Option<bool>,
        kept: impl Fn(usize) -> bool,
        profile: impl FnOnce() -> Result<ChainCost, CkptError>,
    ) -> Result<Segments, CkptError> {
        let fixed = |ranges: Vec<Range<usize>>| {
            let n = ranges.len().saturating_sub(1);
            (ranges, vec![Some(self.policy); n])
        };
        let fixed_policy = self.policy_fixed.then_some(self.policy);
        let planned = |plan: &Plan| (plan.ranges(), run_policies(plan, fixed_policy));
        let key = InputKey::new(input, train);
        let (ranges, policies) = if let Some(r) = self.schedule.fixed_ranges(len)? {
            fixed(r)
        } else if !crate::ffi::grad_enabled() {
            fixed(ckpt_budget::cut_ranges(&[], len))
        } else if let Some(plan) = lock(&self.plans).get(&key).filter(|p| p.len() == len) {
            planned(plan)
        } else if crate::is_recomputing() && !lock(&self.profiles).contains_key(&key) {
            fixed(ckpt_budget::cut_ranges(&[], len))
        } else {
            planned(&self.plan(len, input, train, &kept, profile)?)
        };
        Ok(split_kept(ranges, &policies, kept))
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

    /// The plan of the current schedule for inputs like `input`: for an auto schedule
    /// the planner's (cached; every stage may be kept, up to [`MAX_KEEP_STAGES`] stages,
    /// and those marked `#[keep]`, `kept(i)`, must be), for a fixed one its segments evaluated on the profile, with the runs of
    /// `#[keep]` stages kept. Profiles on first sight of the input (with grad, whatever
    /// the caller's mode).
    ///
    /// # Errors
    ///
    /// As [`ModelPlans::segments`].
    pub fn plan(
        &self,
        len: usize,
        input: &Tensor,
        train: Option<bool>,
        kept: impl Fn(usize) -> bool,
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
                let plan = costs.plan_keeping(objective, &self.allowed(), &keeping(len, kept))?;
                lock(&self.plans).insert(key, plan.clone());
                Ok(plan)
            }
            fixed => {
                let ranges = fixed.fixed_ranges(len)?.expect("a fixed schedule");
                let policy = self.allowed()[0];
                let n = ranges.len().saturating_sub(1);
                let segments = split_kept(ranges, &vec![Some(policy); n], &kept);
                let cuts: Vec<usize> = segments[1..].iter().map(|(r, _)| r.start).collect();
                let modes: Vec<SegmentMode> = segments[..segments.len() - 1]
                    .iter()
                    .map(|(_, p)| p.map_or(SegmentMode::Kept, SegmentMode::Checkpointed))
                    .collect();
                Ok(costs.evaluate_with_modes(&cuts, &modes)?.with_marked(kept))
            }
        }
    }
}

/// What an auto schedule's planner may keep in a chain of `len` stages: any stage, up to
/// [`MAX_KEEP_STAGES`] stages (else none), and the stages marked keep (`kept(i)`) it must.
pub(super) fn keeping(len: usize, kept: impl Fn(usize) -> bool) -> Keeping {
    let may = if len <= MAX_KEEP_STAGES {
        Keeping::all(len)
    } else {
        Keeping::none()
    };
    may.with_forced(len, kept)
}

/// How each segment of `plan` but the last runs: `Some(policy)` when checkpointed (with
/// `fixed` when the user set a policy, which the planner may have planned as full
/// recompute when it does not model it; else the planned one), `None` when kept.
pub(super) fn run_policies(plan: &Plan, fixed: Option<Policy>) -> Vec<Option<Policy>> {
    (0..plan.cuts().len())
        .map(|j| match plan.mode(j) {
            SegmentMode::Checkpointed(p) => Some(fixed.unwrap_or(p)),
            SegmentMode::Kept | SegmentMode::Plain => None,
        })
        .collect()
}

/// The longest chain for which an auto schedule lets the planner keep any segment: its
/// budget program keeps Pareto fronts that grow fast with kept segments (a 128-stage
/// chain takes seconds), so longer chains keep only their `#[keep]` stages.
pub const MAX_KEEP_STAGES: usize = 64;

/// The segments of one forward call: each stage range with the policy it is checkpointed
/// with, or `None` when it runs inline.
pub type Segments = Vec<(Range<usize>, Option<Policy>)>;

/// The segments of one forward call of a model with stages marked `#[keep]`: `ranges`
/// (the schedule's or the plan's; the last runs inline) with every run of kept stages
/// (`kept(i)`) taken out of its checkpointed range, splitting it, as `#[ckpt::keep]` does
/// in a function. Each range comes with the policy it is checkpointed with
/// (`policies[g]` of its range `g`), or `None` when it runs inline: a run of kept stages,
/// a range whose policy is `None` (a segment the planner keeps), or the last range
/// (which is not split, as it runs inline anyway).
pub fn split_kept(
    ranges: Vec<Range<usize>>,
    policies: &[Option<Policy>],
    kept: impl Fn(usize) -> bool,
) -> Segments {
    let n = ranges.len();
    let mut out = Vec::with_capacity(n);
    for (g, range) in ranges.into_iter().enumerate() {
        let policy = policies
            .get(g)
            .copied()
            .unwrap_or(Some(Policy::RECOMPUTE_ALL));
        let Some(policy) = policy.filter(|_| g + 1 < n && !range.is_empty()) else {
            out.push((range, None));
            continue;
        };
        let mut start = range.start;
        for i in range.start + 1..range.end {
            if kept(i) != kept(i - 1) {
                out.push((start..i, (!kept(i - 1)).then_some(policy)));
                start = i;
            }
        }
        out.push((start..range.end, (!kept(range.end - 1)).then_some(policy)));
    }
    out
}

/// [`profile_chain`](crate::plan::profile_chain) with the model's checkpoint options (the
/// probe of what a checkpointed segment keeps follows `preserve_rng_state`).
///
/// # Errors
///
/// As [`f_profile_chain`](crate::plan::f_profile_chain).
pub fn profile_stages<F>(
    options: &CheckpointOptions,
    len: usize,
    input: &Tensor,
    step: F,
) -> Result<ChainCost, CkptError>
where
    F: FnMut(usize, &Tensor) -> Tensor,
{
    crate::plan::profile(options, len, input, step)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Objective;

    #[test]
    fn split_kept_takes_kept_runs_out_of_checkpointed_ranges() {
        let sel = Policy::selective();
        let full = Policy::RECOMPUTE_ALL;
        // Ranges 0..4 | 4..8 | 8..10, stages 1, 2 and 4 and 9 kept.
        let kept = |i: usize| [1, 2, 4, 9].contains(&i);
        let out = split_kept(vec![0..4, 4..8, 8..10], &[Some(sel), Some(full)], kept);
        assert_eq!(
            out,
            [
                (0..1, Some(sel)),
                (1..3, None),
                (3..4, Some(sel)),
                (4..5, None),
                (5..8, Some(full)),
                (8..10, None),
            ]
        );
        // Nothing kept: the ranges as they were, the last inline.
        let out = split_kept(vec![0..2, 2..3], &[Some(full)], |_| false);
        assert_eq!(out, [(0..2, Some(full)), (2..3, None)]);
        // A range that is all kept runs inline whole.
        let out = split_kept(vec![0..2, 2..3], &[Some(full)], |i| i < 2);
        assert_eq!(out, [(0..2, None), (2..3, None)]);
        // A range the planner keeps (`None`) runs inline whole, whatever `kept` says.
        let out = split_kept(vec![0..2, 2..5, 5..6], &[None, Some(sel)], |i| i == 3);
        assert_eq!(
            out,
            [
                (0..2, None),
                (2..3, Some(sel)),
                (3..4, None),
                (4..5, Some(sel)),
                (5..6, None)
            ]
        );
    }

    #[test]
    fn long_chains_keep_only_marked_stages() {
        use crate::plan::{Budget, StageCost};
        let x = Tensor::zeros([2], (tch::Kind::Float, tch::Device::Cpu));
        let budget = Schedule::Auto(Objective::Budget(Budget::FractionOfPlain(0.5)));
        for (len, keeps) in [(MAX_KEEP_STAGES, true), (MAX_KEEP_STAGES + 1, false)] {
            // Stage 0 dear to recompute: kept when the planner may keep it.
            let mut stages = vec![StageCost::new(1, 2, 1.0); len];
            stages[0].forward_seconds = 100.0;
            let costs = ChainCost::new(stages, 1);
            let p = ModelPlans::new(budget.clone());
            let plan = p.plan(len, &x, None, |i| i == 5, || Ok(costs)).unwrap();
            let kept0 = plan.mode(plan.segment_of(0)) == SegmentMode::Kept;
            assert_eq!(kept0, keeps, "{len}: {plan}");
            assert!(!plan.mode(plan.segment_of(5)).is_checkpointed(), "{plan}");
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
