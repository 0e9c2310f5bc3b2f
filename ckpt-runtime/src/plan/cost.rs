//! The cost model's inputs: what each stage of a chain costs ([`StageCost`], [`KeepCost`]),
//! the whole chain ([`ChainCost`]), and the entry points that turn them into a [`Plan`]
//! for an [`Objective`] (the dynamic programs are in `dp.rs`; the model is described in the
//! [module docs](super)).

use super::{Budget, Keeping, Plan, SegmentMode, dp, schedule};
use crate::{CkptError, Policy};

/// What one stage of a chain costs, as measured by [`profile_sequential`](super::profile_sequential) (see the
/// [module docs](super) for how each figure enters the predicted peak).
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
    /// [`Policy::masks`] (dropout masks kept); `None` when not
    /// profiled, which the planner takes as "keeps nothing, saves nothing".
    pub masks: Option<KeepCost>,
    /// The same for [`Policy::narrowing`] (dropout masks and the outputs of narrowing
    /// linear layers kept); `None` also where the stage has no narrowing linear, which
    /// the planner then costs as [`StageCost::masks`] (what the policy keeps there).
    pub narrowing: Option<KeepCost>,
    /// The same for [`Policy::selective`] (linear outputs and dropout masks kept).
    pub selective: Option<KeepCost>,
}

/// What a stage keeps, and what its recompute costs, in a segment checkpointed with a
/// selective [`Policy`] (see [`StageCost::masks`], [`StageCost::narrowing`],
/// [`StageCost::selective`]).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct KeepCost {
    /// Bytes the policy keeps from the segment's forward until its recompute is done
    /// (linear outputs, dropout masks at 1 bit an element and a generator state each).
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
            narrowing: None,
            selective: None,
        }
    }

    /// What the stage keeps (bytes) and what recomputing it costs (seconds) in a segment
    /// checkpointed with `policy`: `(0, forward_seconds)` for [`Policy::RECOMPUTE_ALL`] and
    /// for a policy the profile has no figure for (for [`Policy::narrowing`] without a
    /// figure, the masks' one: what it keeps in a stage without a narrowing linear);
    /// `None` for a policy the planner does not model (one not in [`PLANNED_POLICIES`],
    /// such as linear outputs without dropout masks).
    pub fn keep(&self, policy: Policy) -> Option<(u64, f64)> {
        let full = (0, self.forward_seconds);
        let figure = |k: Option<KeepCost>| k.map_or(full, |k| (k.kept_bytes, k.recompute_seconds));
        if policy == Policy::RECOMPUTE_ALL {
            Some(full)
        } else if policy == MASKS {
            Some(figure(self.masks))
        } else if policy == NARROWING {
            Some(figure(self.narrowing.or(self.masks)))
        } else if policy == Policy::selective() {
            Some(figure(self.selective))
        } else {
            None
        }
    }
}

/// The masks-only policy ([`Policy::masks`]): dropout masks kept, linear outputs recomputed.
pub(crate) const MASKS: Policy = Policy::masks();

/// The masks-and-narrowing-linears policy ([`Policy::narrowing`]).
pub(crate) const NARROWING: Policy = Policy::narrowing();

/// The policies the planner chooses from for each checkpointed segment, in order of
/// preference on ties (the order of what they keep): full recompute, dropout masks kept,
/// masks and narrowing linear outputs kept, selective.
pub const PLANNED_POLICIES: [Policy; 4] =
    [Policy::RECOMPUTE_ALL, MASKS, NARROWING, Policy::selective()];

/// The policies an auto schedule chooses each checkpointed segment's from: all of
/// [`PLANNED_POLICIES`] when the user fixed none, else the fixed one when the planner
/// models it, else full recompute (the cuts are then planned as for full recompute, and
/// the segments run with the fixed policy).
pub(crate) fn allowed_policies(fixed: Option<Policy>) -> Vec<Policy> {
    match fixed {
        None => PLANNED_POLICIES.to_vec(),
        Some(p) if PLANNED_POLICIES.contains(&p) => vec![p],
        Some(_) => vec![Policy::RECOMPUTE_ALL],
    }
}

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
    /// where a new segment starts), following the [cost model](super) phase by phase. Use
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
        let modes: Vec<SegmentMode> = policies
            .iter()
            .map(|&p| SegmentMode::Checkpointed(p))
            .collect();
        self.evaluate_with_modes(cuts, &modes)
    }

    /// [`ChainCost::evaluate`] with a mode for each segment but the last (`modes[j]` for
    /// the segment that ends at `cuts[j]`): checkpointed with a policy, as in
    /// [`ChainCost::evaluate_with_policies`], or [`SegmentMode::Kept`]: run once with
    /// grad, its stages' kept bytes held from its forward until its backward (the
    /// [cost model](super)), no stash, no RNG copy, no recompute time.
    ///
    /// # Errors
    ///
    /// As [`ChainCost::evaluate_with_policies`]; [`CkptError::InvalidArgument`] for
    /// [`SegmentMode::Plain`], which only the last segment is.
    pub fn evaluate_with_modes(
        &self,
        cuts: &[usize],
        modes: &[SegmentMode],
    ) -> Result<Plan, CkptError> {
        self.check()?;
        schedule::check_cuts(cuts, self.len())?;
        if modes.len() != cuts.len() {
            return Err(CkptError::InvalidArgument(format!(
                "{} modes for {} segments before the last: give one per cut",
                modes.len(),
                cuts.len()
            )));
        }
        for m in modes {
            match m {
                SegmentMode::Checkpointed(p) if !PLANNED_POLICIES.contains(p) => {
                    return Err(CkptError::InvalidArgument(format!(
                        "policy {p:?} is not one the planner models (full recompute, masks, narrowing or selective)"
                    )));
                }
                SegmentMode::Plain => {
                    return Err(CkptError::InvalidArgument(
                        "a segment before the last is checkpointed or kept, not plain".into(),
                    ));
                }
                _ => {}
            }
        }
        Ok(self.make_plan(cuts.to_vec(), modes.to_vec(), None))
    }

    /// Chooses the cuts for `objective` by dynamic programming (see the
    /// [module docs](super) for the model, the programs and their optimality), and for
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
                "plan_with: policies {policies:?}: give at least one, each full recompute, masks, narrowing or selective"
            )));
        }
        self.plan_keeping(objective, policies, &Keeping::none())
    }

    /// [`ChainCost::plan_with`] where a segment before the last may also be *kept*
    /// ([`SegmentMode::Kept`]: run once with grad, its activations held until its
    /// backward) when `keeping` allows all its stages, and must be kept (or be the plain
    /// last one) when it holds a stage that `keeping` forces: for each segment the
    /// planner chooses checkpointed with one of `policies`, or kept (rotor's choice
    /// between keeping a stage's input and all its activations). Exact for the
    /// [cost model](super), as [`ChainCost::plan`] is.
    ///
    /// # Errors
    ///
    /// As [`ChainCost::plan_with`].
    pub fn plan_keeping(
        &self,
        objective: &Objective,
        policies: &[Policy],
        keeping: &Keeping,
    ) -> Result<Plan, CkptError> {
        self.check()?;
        if policies.is_empty() || policies.iter().any(|p| !PLANNED_POLICIES.contains(p)) {
            return Err(CkptError::InvalidArgument(format!(
                "plan_with: policies {policies:?}: give at least one, each full recompute, masks, narrowing or selective"
            )));
        }
        let plain = dp::evaluate(self, &[], &[]).0;
        let budget = match objective {
            Objective::MinPeak => None,
            Objective::Budget(b) => Some(b.bytes(plain)?),
        };
        let planned =
            if !keeping.any() && (policies == [Policy::RECOMPUTE_ALL] || !dp::has_policies(self)) {
                // No figures: every policy costs what full recompute does; the first is taken.
                dp::plan(self, budget).map(|cuts| {
                    let modes = vec![SegmentMode::Checkpointed(policies[0]); cuts.len()];
                    (cuts, modes)
                })
            } else {
                dp::plan_with_modes(self, budget, policies, keeping)
            };
        let (cuts, modes) = planned.map_err(|e| match e {
            CkptError::BudgetTooSmall {
                budget_bytes,
                min_bytes,
                ..
            } => CkptError::BudgetTooSmall {
                budget_bytes,
                min_bytes,
                plain_bytes: plain,
                marked_keep: (0..self.len()).any(|i| keeping.must(i)),
            },
            e => e,
        })?;
        let mut plan = self.make_plan(cuts, modes, budget);
        plan.allowed = policies.to_vec();
        plan.marked = (0..self.len()).map(|i| keeping.must(i)).collect();
        Ok(plan)
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
            for (what, k) in [
                ("masks", s.masks),
                ("narrowing", s.narrowing),
                ("selective", s.selective),
            ] {
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
    pub(super) fn time_prefix(&self) -> Vec<f64> {
        let mut out = Vec::with_capacity(self.len() + 1);
        let mut t = 0.0;
        out.push(t);
        for s in &self.stages {
            t += s.forward_seconds;
            out.push(t);
        }
        out
    }

    fn make_plan(&self, cuts: Vec<usize>, modes: Vec<SegmentMode>, budget: Option<u64>) -> Plan {
        let (peak, phase, extra) = dp::evaluate(self, &cuts, &modes);
        let mut bounds = vec![0];
        bounds.extend_from_slice(&cuts);
        let recomputed = modes
            .iter()
            .enumerate()
            .filter(|(_, m)| m.is_checkpointed())
            .map(|(j, _)| bounds[j + 1] - bounds[j])
            .sum();
        Plan {
            len: self.len(),
            predicted_extra_seconds: extra,
            recomputed_stages: recomputed,
            cuts,
            policies: modes.iter().map(|m| m.policy()).collect(),
            modes,
            predicted_peak_bytes: peak,
            peak_phase: phase,
            plain_peak_bytes: dp::evaluate(self, &[], &[]).0,
            budget_bytes: budget,
            measured_peak_bytes: None,
            stage_costs: self.stages.clone(),
            stage_names: Vec::new(),
            allowed: Vec::new(),
            marked: Vec::new(),
            chain_bytes: (self.output_bytes, self.checkpoint_bytes),
        }
    }
}
