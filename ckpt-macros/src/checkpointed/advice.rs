//! Warnings for layouts the compiler can see save nothing: the checkpointed segments hold
//! no layer call while the inline one does, or a checkpointed segment of a cut function
//! holds a whole layer loop (its recompute rebuilds every iteration's activations at
//! once). A function checkpointed whole is taken for a block and not warned about.
//!
//! Stable Rust has no warnings from procedural macros; the expansion calls a local
//! function marked `#[deprecated(note = "..")]`, spanned on the user's statement, so rustc
//! reports `use of deprecated function `..::checkpointing_saves_little`: <advice>` there.
//! `#[allow(deprecated)]` on the function silences it.

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::visit::Visit;
use syn::{Expr, Stmt};

use super::analysis::Plan;
use super::body::{Modules, short_text};
use super::layout::Layout;

/// What a statement holds, for the advice.
#[derive(Default)]
struct Holds {
    /// The first call that applies a layer (a method of module state, `.apply(..)`,
    /// `.forward(..)`, a call with module state as an argument), as source text.
    layer: Option<String>,
    /// The first `for`/`while`/`loop` whose body applies a layer, with its span.
    layer_loop: Option<(String, Span)>,
}

struct Finder<'m> {
    modules: &'m Modules<'m>,
    holds: Holds,
    loop_depth: usize,
}

impl<'ast> Visit<'ast> for Finder<'_> {
    fn visit_expr_method_call(&mut self, m: &'ast syn::ExprMethodCall) {
        // Reading the shape of module state (`self.blocks.len()`) computes nothing.
        let reads = [
            "len", "is_empty", "iter", "size", "kind", "device", "numel", "dim",
        ]
        .iter()
        .any(|r| m.method == r);
        if self.modules.is_layer_call(m) || (self.modules.refers_to(&m.receiver) && !reads) {
            self.holds
                .layer
                .get_or_insert_with(|| short_text(Expr::MethodCall(m.clone()), 50));
        }
        syn::visit::visit_expr_method_call(self, m);
    }

    fn visit_expr_call(&mut self, c: &'ast syn::ExprCall) {
        if c.args.iter().any(|a| self.modules.refers_to(a)) {
            self.holds
                .layer
                .get_or_insert_with(|| short_text(Expr::Call(c.clone()), 50));
        }
        syn::visit::visit_expr_call(self, c);
    }

    fn visit_expr_for_loop(&mut self, f: &'ast syn::ExprForLoop) {
        self.in_loop(
            || {
                format!(
                    "for {} in {}",
                    short_text(&f.pat, 20),
                    short_text(&f.expr, 40)
                )
            },
            f.for_token.span,
            |v| syn::visit::visit_expr_for_loop(v, f),
        );
    }

    fn visit_expr_while(&mut self, w: &'ast syn::ExprWhile) {
        self.in_loop(
            || format!("while {}", short_text(&w.cond, 40)),
            w.while_token.span,
            |v| syn::visit::visit_expr_while(v, w),
        );
    }

    fn visit_expr_loop(&mut self, l: &'ast syn::ExprLoop) {
        self.in_loop(
            || "loop".to_owned(),
            l.loop_token.span,
            |v| syn::visit::visit_expr_loop(v, l),
        );
    }

    fn visit_item(&mut self, _: &'ast syn::Item) {}
}

impl Finder<'_> {
    fn in_loop(
        &mut self,
        label: impl FnOnce() -> String,
        span: Span,
        walk: impl FnOnce(&mut Self),
    ) {
        let had_layer = self.holds.layer.is_some();
        self.loop_depth += 1;
        walk(self);
        self.loop_depth -= 1;
        let layer_inside = self.holds.layer.is_some() && !had_layer;
        if layer_inside && self.holds.layer_loop.is_none() {
            self.holds.layer_loop = Some((label(), span));
        }
    }
}

fn holds(stmt: &Stmt, modules: &Modules<'_>) -> Holds {
    let mut finder = Finder {
        modules,
        holds: Holds::default(),
        loop_depth: 0,
    };
    finder.visit_stmt(stmt);
    finder.holds
}

/// The advice for `plan`, each with the span it points at.
pub(crate) fn advise(plan: &Plan, modules: &Modules<'_>, fn_name: &str) -> Vec<(Span, String)> {
    let mut out = Vec::new();
    let held: Vec<Holds> = plan.stmts.iter().map(|s| holds(s, modules)).collect();
    let count = plan.groups.len();
    // A layer loop held whole by a checkpointed segment (a top-level loop of a run-time
    // chain is cut between its iterations instead). Not for a function checkpointed
    // whole: that is a block (a mixture of experts loops over its experts), called from
    // the model's loop, which the macro cannot see.
    for (g, group) in plan.groups.iter().enumerate() {
        if !group.checkpointed || matches!(plan.layout, Layout::Whole) {
            continue;
        }
        for i in group.stmts.clone() {
            let cut = plan.loops.get(i).is_some_and(Option::is_some);
            let Some((label, span)) = &held[i].layer_loop else {
                continue;
            };
            if cut {
                continue;
            }
            let whom = match plan.layout {
                Layout::Whole => format!("checkpointing the whole of `{fn_name}` as one segment"),
                Layout::Static => {
                    format!("checkpointed segment {} of {count} of `{fn_name}`", g + 1)
                }
                Layout::Runtime(_) => format!("statement {} of `{fn_name}`", g + 1),
            };
            out.push((
                *span,
                format!(
                    "{whom} holds the whole layer loop `{label}`: its recompute in backward rebuilds every iteration's activations at once, so it saves little; write the loop as a top-level `for` statement of a function with `segments = N` or `segments = auto`, which cut between its iterations, or checkpoint each block (`#[checkpointed]` on the block's own forward)"
                ),
            ));
        }
    }
    // Checkpointed segments without a layer call, and the layers in the inline one.
    if let Layout::Static = plan.layout
        && count >= 2
    {
        let layer_in = |g: usize| {
            plan.groups[g]
                .stmts
                .clone()
                .find_map(|i| held[i].layer.clone())
        };
        let last = count - 1;
        if (0..last)
            .filter(|&g| plan.groups[g].checkpointed)
            .all(|g| layer_in(g).is_none())
            && let Some(layer) = layer_in(last)
        {
            let first = plan.groups[0].stmts.start;
            let which = if last == 1 {
                format!("the checkpointed segment of `{fn_name}` (1 of {count}) holds")
            } else {
                format!("the checkpointed segments of `{fn_name}` (1 to {last} of {count}) hold")
            };
            out.push((
                plan.stmts[first].span(),
                format!(
                    "{which} no layer call, while the last segment, which runs inline and is not checkpointed, holds `{layer}`: this checkpoints nothing that costs memory; put `ckpt::cut!();` after the layer calls that should be checkpointed, or use `segments = auto`"
                ),
            ));
        }
    }
    out
}

/// Statements that make rustc warn with each piece of advice, at its span.
pub(crate) fn warnings(advice: &[(Span, String)]) -> TokenStream {
    advice
        .iter()
        .map(|(span, note)| {
            let name = proc_macro2::Ident::new(
                "checkpointing_saves_little",
                Span::mixed_site().located_at(*span),
            );
            let note = format!("ckpt: {note}");
            quote_spanned! {*span=>
                {
                    #[deprecated(note = #note)]
                    #[allow(non_snake_case, dead_code)]
                    fn #name() {}
                    #name();
                }
            }
        })
        .collect::<Vec<_>>()
        .into_iter()
        .fold(TokenStream::new(), |mut acc, ts| {
            acc.extend(quote!(#ts));
            acc
        })
}
