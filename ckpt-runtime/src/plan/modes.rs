//! How each segment of a plan runs ([`SegmentMode`]: checkpointed with a policy, kept, or
//! the plain last one) and which stages the planner may or must keep ([`Keeping`]).

use crate::Policy;

/// How one segment of a [`Plan`](super::Plan) runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SegmentMode {
    /// Checkpointed with the policy: run without grad in forward, its input stashed
    /// (and the RNG state copied), recomputed with grad in backward; the policy's kept
    /// results are replayed instead of computed.
    Checkpointed(Policy),
    /// Kept: run once, inline, with grad, its activations (`K(a, b)` bytes: what its
    /// stages save for backward and their outputs) held from its forward until its
    /// backward, no stash and no recompute (rotor's "keep all activations" choice, and
    /// what `model!`'s `#[keep]` does to a stage). Never the last segment.
    Kept,
    /// The last segment: runs plainly, with grad, like a kept one.
    Plain,
}

impl SegmentMode {
    /// The policy of a checkpointed segment; [`Policy::RECOMPUTE_ALL`] (nothing replayed,
    /// nothing recomputed either) for a kept or plain one.
    pub fn policy(self) -> Policy {
        match self {
            SegmentMode::Checkpointed(p) => p,
            SegmentMode::Kept | SegmentMode::Plain => Policy::RECOMPUTE_ALL,
        }
    }

    /// Whether the segment is recomputed in backward (checkpointed).
    pub fn is_checkpointed(self) -> bool {
        matches!(self, SegmentMode::Checkpointed(_))
    }
}

/// Which stages of a chain the planner may run in a *kept* segment
/// ([`SegmentMode::Kept`]) and which it must not recompute: a stage that `must` be kept
/// lies in a kept segment or in the plain last one in every plan (a `#[keep]` stage of
/// `model!`); a kept segment holds only stages that `may` be kept. Stages past the end of
/// either list count as `false`; a stage that must be kept may be.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Keeping {
    /// `may[i]`: stage `i` may run in a kept segment.
    pub may: Vec<bool>,
    /// `must[i]`: stage `i` must not be recomputed.
    pub must: Vec<bool>,
}

impl Keeping {
    /// Nothing may be kept: every segment but the last is checkpointed (the planner of
    /// [`ChainCost::plan`](super::ChainCost::plan)).
    pub fn none() -> Self {
        Keeping::default()
    }

    /// Every one of `len` stages may be kept, none must.
    pub fn all(len: usize) -> Self {
        Keeping {
            may: vec![true; len],
            must: Vec::new(),
        }
    }

    /// The same, with the stages for which `must` holds (among the first `len`) forced
    /// kept.
    pub fn with_forced(mut self, len: usize, must: impl Fn(usize) -> bool) -> Self {
        self.must = (0..len).map(must).collect();
        self
    }

    /// Whether stage `i` may be kept.
    pub fn may(&self, i: usize) -> bool {
        self.may.get(i).copied().unwrap_or(false) || self.must(i)
    }

    /// Whether stage `i` must be kept.
    pub fn must(&self, i: usize) -> bool {
        self.must.get(i).copied().unwrap_or(false)
    }

    /// Whether any stage may be kept.
    pub fn any(&self) -> bool {
        self.may.iter().chain(&self.must).any(|&b| b)
    }
}
