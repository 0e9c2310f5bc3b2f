//! [`Schedule`]: how a `model!` chain is cut at run time (the state a model keeps for it
//! is `ModelPlans`, in the macro/runtime contract).

use std::fmt;
use std::ops::Range;

use super::{Budget, Objective, Plan};
use crate::CkptError;

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
}
