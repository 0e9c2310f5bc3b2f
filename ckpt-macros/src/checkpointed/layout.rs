//! How a `#[checkpointed]` function is cut, decided once from its arguments and its body:
//! the whole function as one segment, groups fixed at compile time, or a chain of stages
//! cut at run time.
//!
//! | arguments | body | layout |
//! |---|---|---|
//! | none | no `cut!()` | [`Layout::Whole`]: one checkpointed segment, nothing inline |
//! | none | `cut!()` markers | [`Layout::Static`] at the markers, the last group inline |
//! | `segments = N` | no layer loop | [`Layout::Static`]: `ckpt_budget::sequential_ranges(stages, N)` |
//! | `segments = N` | a layer loop | [`Layout::Runtime`]: the same rule over the stages known at run time |
//! | `segments = auto`, `budget` | any | [`Layout::Runtime`]: the planner's cuts |
//!
//! A *stage* is a statement (method chains split into their links, `body.rs`), or one
//! iteration of a layer loop.
//!
//! A `let` marked `#[ckpt::keep]` runs once, inline, between the segments of a
//! [`Layout::Static`] function: the groups are cut as without the marks, then each run of
//! kept statements is taken out of its group (splitting the group around it) and becomes a
//! group of its own that is not checkpointed (in the last group, which runs inline anyway,
//! a mark changes nothing). Its value, and what its backward needs, stay alive as in the
//! plain function; it is not recomputed. In a [`Layout::Runtime`] chain a kept statement
//! is still a unit (a closure over the environment, under the same structural rules), but
//! the run time never puts it in a checkpointed segment: `segments = N` takes it out of
//! its segment as above, and the planner of `segments = auto` / `budget` must keep it (a
//! kept layer loop keeps every iteration). Either way backward never recomputes it; the
//! side-effect rules do not apply to it, except under `auto` / `budget`, whose profile
//! (the first call for an input) runs every statement again. [`Layout::Whole`] rejects the mark (nothing runs between
//! segments there).

use std::ops::Range;

use proc_macro2::Span;

use super::body::{self, Body, Modules};
use crate::args::{Args, CutArg};
use crate::ctxt::Ctxt;

/// The layout of a function (see the module docs).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Layout {
    /// `#[checkpointed]` without cuts: the whole body is one checkpointed segment.
    Whole,
    /// Groups fixed at compile time ([`Cut::ranges`]); the last runs inline.
    Static,
    /// Every statement is a unit of a chain cut at run time; the last statement runs
    /// inline after the chain.
    Runtime(Schedule),
}

/// The error when every statement that could be checkpointed is marked `#[ckpt::keep]`.
const NOTHING_LEFT: &str = "with the statements marked `#[ckpt::keep]` taken out, no segment is left to checkpoint (the last group runs inline anyway); keep fewer statements, or cut elsewhere";

/// How a run-time chain is cut: `segments = N` over the stages counted at run time, or
/// the planner's cuts.
pub(crate) use crate::args::Schedule;

/// A layout with its groups of statements.
pub(crate) struct Cut {
    pub layout: Layout,
    /// The groups: one over everything ([`Layout::Whole`]), the fixed groups
    /// ([`Layout::Static`]), or one per statement ([`Layout::Runtime`]).
    pub ranges: Vec<Range<usize>>,
    /// One entry per group: kept statements (`#[ckpt::keep]`), run inline.
    pub kept: Vec<bool>,
}

impl Cut {
    /// Whether group `g` runs as a checkpointed segment (or, at run time, may): not the
    /// last group, which runs inline, nor a group of kept statements.
    pub(crate) fn checkpointed(&self, g: usize) -> bool {
        match self.layout {
            Layout::Whole => true,
            Layout::Static | Layout::Runtime(_) => {
                g + 1 < self.ranges.len() && !self.kept.get(g).copied().unwrap_or(false)
            }
        }
    }

    /// Whether group `g` becomes a closure of its own, which takes its inputs and gives
    /// back its outputs (the structural rules of a segment apply: no `?`, `return` or
    /// `break` out of it, no `&mut` parameter into it): a checkpointed group, and every
    /// unit of a run-time chain, kept or not (the last statement runs inline).
    pub(crate) fn closure(&self, g: usize) -> bool {
        match self.layout {
            Layout::Runtime(_) => g + 1 < self.ranges.len(),
            Layout::Whole | Layout::Static => self.checkpointed(g),
        }
    }

    fn new(layout: Layout, ranges: Vec<Range<usize>>) -> Cut {
        let kept = vec![false; ranges.len()];
        Cut {
            layout,
            ranges,
            kept,
        }
    }

    /// Takes the kept statements out of their groups ([`Layout::Static`]; see the module
    /// docs). `None` (error in `cx`) when nothing would be checkpointed any more.
    fn with_kept(self, body: &Body, cx: &mut Ctxt) -> Option<Cut> {
        let kept = &body.kept;
        if !kept.contains(&true) {
            return Some(self);
        }
        let mut ranges = Vec::new();
        let mut flags = Vec::new();
        let (last, checkpointed) = self.ranges.split_last().expect("at least one group");
        for range in checkpointed {
            let mut start = range.start;
            for i in range.clone() {
                if i > start && kept[i] != kept[i - 1] {
                    ranges.push(start..i);
                    flags.push(kept[i - 1]);
                    start = i;
                }
            }
            ranges.push(start..range.end);
            flags.push(kept[range.end - 1]);
        }
        // The last group runs inline already, kept statements or not: not split, so that
        // its other statements stay inline too.
        ranges.push(last.clone());
        flags.push(false);
        let cut = Cut {
            layout: self.layout,
            ranges,
            kept: flags,
        };
        if !(0..cut.ranges.len()).any(|g| cut.checkpointed(g)) {
            cx.error_spanned_by(&body.first_keep, NOTHING_LEFT);
            return None;
        }
        Some(cut)
    }
}

/// Decides the layout, preparing `body` for it (chains split and layer loops recognised
/// when the macro chooses the cuts); `None` (errors in `cx`) when the function cannot be
/// cut.
pub(crate) fn resolve(
    args: &Args,
    body: &mut Body,
    modules: &Modules<'_>,
    cx: &mut Ctxt,
) -> Option<Cut> {
    let marker = body.markers.first().map(|(_, span)| *span);
    let (schedule, span) = match (args.cut, marker) {
        (CutArg::Invalid, _) => return None,
        (CutArg::Given(Schedule::Auto(_), _), Some(span)) => {
            cx.error_at(
                span,
                "`ckpt::cut!()` markers cannot be combined with `segments = auto` or `budget`, which choose the cuts at run time; remove the markers, or the argument",
            );
            return None;
        }
        (CutArg::Given(Schedule::Segments(_), _), Some(span)) => {
            cx.error_at(
                span,
                "`ckpt::cut!()` markers and `segments = N` cannot be combined: use `segments = N` for balanced segments, or markers alone",
            );
            return None;
        }
        (CutArg::Unspecified, None) => {
            if let Some(keep) = &body.first_keep {
                cx.error_spanned_by(
                    keep,
                    "`#[ckpt::keep]` needs the function cut into segments, for the kept statement to run between them: add `ckpt::cut!()` markers or `segments = N` (without them the whole function is one segment)",
                );
                return None;
            }
            return whole(body, args, cx);
        }
        (CutArg::Unspecified, Some(_)) => return markers(body, cx)?.with_kept(body, cx),
        (CutArg::Given(schedule, span), None) => (schedule, span),
    };
    body::split_chains(body, modules);
    body::find_loops(body);
    for stmt in &body.stmts {
        if let Some(pat) = body::unsupported_fold(stmt) {
            cx.error_spanned_by(
                pat,
                "a `fold` is a layer loop cut between its iterations when it is bound to one name (`let x = self.blocks.iter().fold(..);`); bind its result to one name and destructure that in the next statement",
            );
        }
    }
    let n = body.stmts.len();
    let has_loop = body.loops.iter().any(Option::is_some);
    match schedule {
        Schedule::Segments(segments) if !has_loop => {
            if segments > n {
                let fix = if n >= 2 {
                    format!("use `segments = {n}` or fewer")
                } else {
                    "`segments = N` needs at least 2 stages (one checkpointed, and the last, which runs inline): write the body as several statements, or use `#[checkpointed]` without arguments to checkpoint the whole function as one segment".to_owned()
                };
                cx.error_at(
                    span,
                    format!(
                        "`segments = {segments}` but the body has {n} stage{} to cut (a stage is a statement, or a layer call of a method chain; items and cut markers do not count); {fix}",
                        if n == 1 { "" } else { "s" },
                    ),
                );
                return None;
            }
            Cut::new(Layout::Static, ckpt_budget::sequential_ranges(n, segments))
                .with_kept(body, cx)
        }
        _ => {
            if n < 2 {
                cx.error_at(
                    span,
                    format!(
                        "`segments = auto` (or `budget`) needs at least 2 statements: the statements but the last are the stages the planner cuts (a layer loop counts one stage per iteration), the last runs inline; the body has {n}"
                    ),
                );
                return None;
            }
            let mut cut = Cut::new(
                Layout::Runtime(schedule),
                (0..n).map(|i| i..i + 1).collect(),
            );
            // One group per statement; the last runs inline anyway.
            cut.kept = body.kept.clone();
            cut.kept[n - 1] = false;
            if cut.kept[..n - 1].iter().all(|&k| k) {
                cx.error_spanned_by(&body.first_keep, NOTHING_LEFT);
                return None;
            }
            Some(cut)
        }
    }
}

fn whole(body: &Body, args: &Args, cx: &mut Ctxt) -> Option<Cut> {
    if body.stmts.is_empty() {
        cx.error_at(
            args.span.unwrap_or_else(Span::call_site),
            "`#[checkpointed]` on a function with an empty body: there is nothing to checkpoint",
        );
        return None;
    }
    Some(Cut::new(
        Layout::Whole,
        std::iter::once(0..body.stmts.len()).collect(),
    ))
}

fn markers(body: &Body, cx: &mut Ctxt) -> Option<Cut> {
    let n = body.stmts.len();
    let mut ok = true;
    let mut prev = 0;
    for (i, (at, span)) in body.markers.iter().enumerate() {
        let what = if *at == 0 {
            Some("before the first statement, which leaves the first segment empty")
        } else if *at == n {
            Some("after the last statement, which leaves the last segment empty")
        } else if i > 0 && *at == prev {
            Some("right after another cut, with no statement between them")
        } else {
            None
        };
        if let Some(what) = what {
            cx.error_at(*span, format!("`ckpt::cut!()` {what}; remove it"));
            ok = false;
        }
        prev = *at;
    }
    if !ok {
        return None;
    }
    let cuts: Vec<usize> = body.markers.iter().map(|(at, _)| *at).collect();
    Some(Cut::new(Layout::Static, ckpt_budget::cut_ranges(&cuts, n)))
}
