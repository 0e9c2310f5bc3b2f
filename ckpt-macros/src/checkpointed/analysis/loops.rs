//! The layer loops of a run-time chain (`segments = auto`, `budget`, or `segments = N`
//! over a loop): each iteration is a stage, so the loop's iterable must be evaluated again
//! in backward to the same items, and nothing may end the loop early; a `fold`'s initial
//! value enters only its first iteration.

use std::collections::HashSet;

use proc_macro2::Span;
use syn::Expr;
use syn::visit::Visit;

use super::Bound;
use super::walker::Walker;
use crate::checkpointed::body::{LoopKind, LoopUnit};
use crate::checkpointed::parse::ParamKind;
use crate::ctxt::Ctxt;

/// The checks of a layer loop whose iterations are cut at run time: its iterable is
/// evaluated again in backward to re-derive an iteration's items, so it may use only
/// `self` and the parameters; and a `break` would end the loop at a point the run-time
/// cuts cannot know.
pub(super) fn check_loop(
    unit: &LoopUnit,
    bound: &Bound,
    n_params: usize,
    fn_name: &str,
    cx: &mut Ctxt,
) {
    // A parameter passed by value as the whole iterable would be consumed by the count.
    if let Expr::Path(p) = &unit.iter
        && let Some(id) = p.path.get_ident()
        && let Some((b, Some(ParamKind::Owned))) = bound.get(&id.to_string())
        && b.id < n_params
    {
        cx.error_spanned_by(
            id,
            format!(
                "the layer loop `{}` in `{fn_name}` iterates over `{id}` itself: its iterations are stages cut at run time, so the iterable is evaluated once to count them and again by every segment to re-derive its items, and iterating `{id}` by value would consume it; iterate over `{id}.iter()`",
                unit.label
            ),
        );
    }
    for (name, span) in expr_uses(&unit.iter) {
        // A `mut` parameter may be assigned before the loop, after its iterations were
        // counted from the value the function was called with.
        if let Some((b, Some(_))) = bound.get(&name)
            && b.id < n_params
            && b.mutable
        {
            cx.error_at(
                span,
                format!(
                    "the iterable of the layer loop `{}` in `{fn_name}` uses `{name}`, a `mut` parameter: the loop's iterations are counted when the function is called, before the body can change `{name}`; take `{name}` without `mut` (and bind a changed value to a new name used after the loop), or count from `self`",
                    unit.label
                ),
            );
        }
        // Parameters have the first ids; a `let` (shadowing one or not) comes after.
        if bound.get(&name).is_some_and(|(b, _)| b.id >= n_params) {
            cx.error_at(
                span,
                format!(
                    "the iterable of the layer loop `{}` in `{fn_name}` uses `{name}`, a local binding: each iteration is a stage cut at run time, and the recompute in backward evaluates the iterable again to re-derive the iteration's items, so it may use only `self` and the function's parameters; iterate over `self.<field>` or a parameter directly (`for b in self.blocks.iter()`), or compute the count from them (`for i in 0..self.blocks.len()`)",
                    unit.label
                ),
            );
        }
    }
    if let LoopKind::For(f) = &unit.kind {
        let mut finder = BreakFinder {
            label: f.label.as_ref().map(|l| l.name.ident.to_string()),
            depth: 0,
            found: Vec::new(),
        };
        finder.visit_block(&f.body);
        for span in finder.found {
            cx.error_at(
                span,
                format!(
                    "`break` in the layer loop `{}` of `{fn_name}`: its iterations are stages cut at run time, which must know how many there are before the loop runs, and a `break` ends it at a point only the data knows; bound the iterations in the iterable instead (`.take(n)` with `n` from `self` or the parameters), or put `ckpt::cut!();` markers around the loop so that it runs whole inside one segment",
                    unit.label
                ),
            );
        }
    }
}

/// The free names an expression uses (outside any binding it makes itself).
pub(super) fn expr_uses(e: &Expr) -> Vec<(String, Span)> {
    let mut cx = Ctxt::default();
    let mut walker = Walker::new(&mut cx, false, String::new(), "");
    walker.visit_expr(e);
    walker.finish().uses
}

/// The bindings (by id) that only a `fold`'s initial value uses: its first iteration
/// takes them, later ones do not need them. A `mut` binding is not one of them: the unit
/// may change it (it is then taken in and given back by every iteration).
pub(super) fn fold_init_only(unit: &LoopUnit, init: &Expr, bound: &Bound) -> Vec<usize> {
    let LoopKind::Fold { closure, .. } = &unit.kind else {
        return Vec::new();
    };
    let rest: HashSet<String> = expr_uses(&unit.iter)
        .into_iter()
        .chain(expr_uses(closure))
        .map(|(n, _)| n)
        .collect();
    expr_uses(init)
        .into_iter()
        .filter(|(n, _)| !rest.contains(n))
        .filter_map(|(n, _)| bound.get(&n).map(|(b, _)| b))
        .filter(|b| !b.mutable)
        .map(|b| b.id)
        .collect()
}

/// Finds the `break`s that leave a loop (unlabelled at its own level, or naming its
/// label), outside nested loops and closures.
struct BreakFinder {
    label: Option<String>,
    depth: usize,
    found: Vec<Span>,
}

impl<'ast> Visit<'ast> for BreakFinder {
    fn visit_expr_break(&mut self, e: &'ast syn::ExprBreak) {
        let leaves = match &e.label {
            Some(l) => self.label.as_deref() == Some(&*l.ident.to_string()),
            None => self.depth == 0,
        };
        if leaves {
            self.found.push(e.break_token.span);
        }
        syn::visit::visit_expr_break(self, e);
    }
    fn visit_expr_for_loop(&mut self, e: &'ast syn::ExprForLoop) {
        self.visit_expr(&e.expr);
        self.depth += 1;
        self.visit_block(&e.body);
        self.depth -= 1;
    }
    fn visit_expr_while(&mut self, e: &'ast syn::ExprWhile) {
        self.visit_expr(&e.cond);
        self.depth += 1;
        self.visit_block(&e.body);
        self.depth -= 1;
    }
    fn visit_expr_loop(&mut self, e: &'ast syn::ExprLoop) {
        self.depth += 1;
        self.visit_block(&e.body);
        self.depth -= 1;
    }
    fn visit_expr_closure(&mut self, _: &'ast syn::ExprClosure) {}
    fn visit_expr_async(&mut self, _: &'ast syn::ExprAsync) {}
    fn visit_item(&mut self, _: &'ast syn::Item) {}
}
