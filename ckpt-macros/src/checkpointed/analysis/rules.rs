//! The side-effect rules of a checkpointed segment, each a check with its message and
//! fix: what would run differently when backward replays the segment (assignment to
//! outside state, in-place ops and mutation of inputs, I/O, `unsafe`, randomness outside
//! libtorch) or cannot be replayed at all (control flow and `?` leaving the segment, a
//! `&mut` parameter). The walker (`walker.rs`) calls them on every expression; the
//! names they match are in `names.rs`; `#[ckpt::allow(rule)]` lifts a rule
//! ([`Walker::violation`]).

use proc_macro2::{Span, TokenStream, TokenTree};
use syn::Expr;

use super::alias::{AliasKind, Reach, path_string};
use super::names::{
    COLLECTION_METHODS, INTERIOR_METHODS, IO_MACROS, RNG_CRATES, RNG_FUNCTIONS, RNG_METHODS,
    is_inplace_name, mutating_arity,
};
use super::walker::Walker;
use crate::checkpointed::layout::Layout;
use crate::checkpointed::parse::Rule;
use crate::ctxt::Ctxt;

impl Walker<'_> {
    /// Reports `message` at `tokens` when the rules apply here and `rule` is not lifted.
    pub(super) fn violation(&mut self, rule: Rule, tokens: impl quote::ToTokens, message: String) {
        if self.check && !self.once && !self.allowed.contains(&rule) {
            let message = if self.kept_profiled {
                format!(
                    "{message} (the statement is marked `#[ckpt::keep]`, so backward does not recompute it, but with `segments = auto` or `budget` the first call for an input runs every statement again, on detached copies, to profile it: what runs differently twice is refused here too; with `segments = N` or `ckpt::cut!()` markers a kept statement runs once)"
                )
            } else {
                message
            };
            self.cx.error_spanned_by(tokens, message);
        }
    }

    /// Rule `inplace`: an in-place op (`relu_`) on a value from outside the segment.
    pub(super) fn check_inplace(
        &mut self,
        method: &str,
        receiver: &Expr,
        node: impl quote::ToTokens,
    ) {
        if !is_inplace_name(method) {
            return;
        }
        if let Some(root) = self.outer_root(receiver, Reach::Inplace, method) {
            let out_of_place = method.trim_end_matches('_');
            let message = format!(
                "in-place `{method}` on `{root}`, which enters this checkpointed {segment} of `{f}`: the recompute in backward would see the modified value; use the out-of-place `{out_of_place}`, or lift the rule with `#[ckpt::allow(inplace)]` on the statement",
                segment = self.segment,
                f = self.fn_name,
            );
            self.violation(Rule::Inplace, node, message);
        }
    }

    /// Rules `mutation` and `rng`: interior mutability, collection mutation, or a
    /// random generator's method on a value from outside the segment.
    pub(super) fn check_mutation(
        &mut self,
        method: &str,
        args: usize,
        receiver: &Expr,
        node: impl quote::ToTokens,
    ) {
        let interior = (INTERIOR_METHODS.contains(&method) || method.starts_with("fetch_"))
            && mutating_arity(method, args);
        let collection = COLLECTION_METHODS.contains(&method) && mutating_arity(method, args);
        let rng = RNG_METHODS.contains(&method);
        let reach = match (rng, interior, collection) {
            (true, _, _) | (_, true, _) => Reach::Interior,
            (_, _, true) => Reach::Collection,
            _ => return,
        };
        let Some((root, movable)) = self.outer_root_of(receiver, reach, method) else {
            return;
        };
        if movable && collection && !rng && !matches!(method, "set") {
            // The segment's own copy of a function-local value (`skips.push(x)`,
            // `state.take()`): it leaves the segment as an output.
            return;
        }
        if rng {
            let message = format!(
                "`{method}` on `{root}` draws from a random generator outside libtorch: the recompute of {segment} in backward would draw different numbers (`preserve_rng_state` covers libtorch's generators only); use libtorch's random ops (`Tensor::rand`, `dropout`), or lift the rule with `#[ckpt::allow(rng)]`",
                segment = self.segment,
            );
            self.violation(Rule::Rng, node, message);
        } else {
            let message = format!(
                "`{method}` on `{root}`, which is not bound inside this checkpointed {segment}: interior mutability and collection mutation would happen again when backward replays the segment; build a new value inside the segment, or lift the rule with `#[ckpt::allow(mutation)]`",
                segment = self.segment,
            );
            self.violation(Rule::Mutation, node, message);
        }
    }

    /// `h += x` with `h` a shallow clone of a tensor from outside: tch's `op=` on a
    /// tensor is in place.
    pub(super) fn check_op_assign_on_handle(
        &mut self,
        target: &Expr,
        op: &syn::BinOp,
        node: impl quote::ToTokens,
    ) {
        let Expr::Path(p) = target else { return };
        let Some(local) = p.path.get_ident().map(ToString::to_string) else {
            return;
        };
        let Some(alias) = self
            .alias_of(&local)
            .filter(|a| a.kind == AliasKind::Handle)
        else {
            return;
        };
        let Some(root) = alias.root.name().map(str::to_string) else {
            return;
        };
        self.record_mutated(&alias.root);
        let op = quote::ToTokens::to_token_stream(op).to_string();
        let message = format!(
            "`{op}` on `{local}`, a shallow clone of `{root}`, which enters this checkpointed {segment} of `{f}`: on a tensor `{op}` is in place, so the recompute in backward would see the modified value; write `let {local} = &{local} {bin} ..` instead, or lift the rule with `#[ckpt::allow(inplace)]` on the statement",
            segment = self.segment,
            f = self.fn_name,
            bin = op.trim_end_matches('='),
        );
        self.violation(Rule::Inplace, node, message);
    }

    /// Rule `assign`: `=` (`compound` false) or `op=` to a place outside the segment.
    pub(super) fn check_assign(
        &mut self,
        target: &Expr,
        compound: bool,
        node: impl quote::ToTokens,
    ) {
        if let Some((root, movable)) = self.outer_root_of(target, Reach::Assign, "") {
            if movable && !compound {
                // `x = block.forward(&x)`, `state.0 = ..` on a function-local value: the
                // segment takes it in and gives it back (a loop's carried value).
                return;
            }
            if compound && matches!(target, Expr::Path(_)) {
                // The segment takes a value of the function in and gives it back, so a
                // plain assignment of a new value is fine; `op=` is in place on a tensor.
                let fix = if movable {
                    format!(
                        "assign a new value with `{root} = {root} + ..` (or the matching operator), which the segment takes in and gives back"
                    )
                } else {
                    format!(
                        "bind a new value with `let {root} = {root} + ..` (or the matching operator) instead"
                    )
                };
                let message = format!(
                    "compound assignment to `{root}`, a binding from before this checkpointed {segment}: on a tensor `op=` is in place, changing the value the segment stashed, and the segment runs again in backward, so it must not change what it did not create; {fix}, or lift the rule with `#[ckpt::allow(assign)]` for a number",
                    segment = self.segment,
                );
                self.violation(Rule::Assign, node, message);
                return;
            }
            if matches!(target, Expr::Path(_)) {
                // `xs = ..` on a parameter taken by reference (or a reference `let`).
                let message = format!(
                    "assignment to `{root}`, a reference from outside this checkpointed {segment}: the segment takes a copy of what it refers to, so the new value would not be seen after the segment; bind a new value with `let {root} = ..` instead, or lift the rule with `#[ckpt::allow(assign)]`",
                    segment = self.segment,
                );
                self.violation(Rule::Assign, node, message);
                return;
            }
            let message = format!(
                "assignment to `{root}`, which is not bound inside this checkpointed {segment}: the segment runs again in backward, so the assignment would happen twice; bind a new value with `let` instead, or lift the rule with `#[ckpt::allow(assign)]`",
                segment = self.segment,
            );
            self.violation(Rule::Assign, node, message);
        }
    }

    /// Rule `rng`: a path through a crate of randomness outside libtorch, or one of its
    /// functions under a bare name ([`RNG_FUNCTIONS`]: `thread_rng`, imported by `use`).
    pub(super) fn check_rng_path(&mut self, path: &syn::Path) {
        let first = path.segments.first().map(|s| s.ident.to_string());
        let hit = (path.segments.len() > 1
            && first.as_deref().is_some_and(|f| RNG_CRATES.contains(&f)))
            || path
                .segments
                .iter()
                .any(|s| RNG_FUNCTIONS.iter().any(|f| s.ident == f));
        if hit {
            let message = format!(
                "`{}` is randomness outside libtorch: the recompute of {} in backward would draw different numbers (`preserve_rng_state` covers libtorch's generators only); use libtorch's random ops (`Tensor::rand`, `dropout`), or lift the rule with `#[ckpt::allow(rng)]`",
                path_string(path),
                self.segment
            );
            self.violation(Rule::Rng, path, message);
        }
    }

    /// `break`, `continue` or `return` (`what`) that would leave the segment's closure.
    pub(super) fn control_flow(&mut self, node: impl quote::ToTokens, what: &str) {
        if self.check && self.runtime {
            let message = format!(
                "{what} in {segment} of `{f}` would leave the statement's stage closure, not `{f}`: with `segments = auto`, `budget`, or `segments = N` over a layer loop, any statement but the last may be checkpointed; move it into the last statement, which runs inline, or use `ckpt::cut!()` markers{kept}",
                segment = self.segment,
                f = self.fn_name,
                kept = kept_note(self.once || self.kept_profiled),
            );
            self.cx.error_spanned_by(node, message);
        } else if self.check {
            let message = format!(
                "{what} in checkpointed {segment} would leave the segment's closure, not `{f}`; control flow that leaves a segment is allowed only in the last segment, which runs inline: put a `ckpt::cut!();` marker before this statement, or restructure",
                segment = self.segment,
                f = self.fn_name,
            );
            self.cx.error_spanned_by(node, message);
        }
    }

    /// Rules `unsafe`, `rng` and control flow on the tokens of a macro whose arguments
    /// are not expressions, and its `?`.
    pub(super) fn scan_flags(&mut self, mac: &syn::Macro, tokens: TokenStream) {
        for tt in tokens {
            match &tt {
                TokenTree::Ident(id) if id == "unsafe" => {
                    let message = format!(
                        "`unsafe` in a macro in checkpointed {}: the macro cannot check unsafe code for side effects, and the segment runs again in backward; move it out of the segment, or lift the rule with `#[ckpt::allow(unsafe)]` once you have checked it is pure",
                        self.segment
                    );
                    self.violation(Rule::Unsafe, mac, message);
                }
                TokenTree::Ident(id)
                    if id == "return" && self.closure_depth == 0 && !self.whole =>
                {
                    self.control_flow(mac, "`return` (inside a macro)");
                }
                TokenTree::Ident(id) if RNG_FUNCTIONS.iter().chain(RNG_CRATES).any(|c| id == c) => {
                    let message = format!(
                        "`{id}` is randomness outside libtorch: the recompute of {} in backward would draw different numbers; use libtorch's random ops, or lift the rule with `#[ckpt::allow(rng)]`",
                        self.segment
                    );
                    self.violation(Rule::Rng, mac, message);
                }
                TokenTree::Punct(p) if p.as_char() == '?' && self.closure_depth == 0 => {
                    self.fallible.get_or_insert(p.span());
                }
                TokenTree::Group(g) => self.scan_flags(mac, g.stream()),
                _ => {}
            }
        }
    }

    /// Rule `unsafe`: an `unsafe` block.
    pub(super) fn check_unsafe_block(&mut self, e: &syn::ExprUnsafe) {
        let message = format!(
            "`unsafe` block in checkpointed {}: the macro cannot check unsafe code for side effects, and the segment runs again in backward; move it out of the segment, or lift the rule with `#[ckpt::allow(unsafe)]` once you have checked it is pure",
            self.segment
        );
        self.violation(Rule::Unsafe, e.unsafe_token, message);
    }

    /// Rule `io`: a macro named `name` that does I/O ([`IO_MACROS`]).
    pub(super) fn check_io_macro(&mut self, mac: &syn::Macro, name: &str) {
        if IO_MACROS.contains(&name) {
            let message = format!(
                "`{name}!` in checkpointed {segment} runs again when backward replays the segment; move it out of the segment, or lift the rule with `#[ckpt::allow(io)]` (`ckpt::is_recomputing()` tells the replay apart)",
                segment = self.segment,
            );
            self.violation(Rule::Io, mac, message);
        }
    }

    /// A `ckpt::cut!()` nested in a block or an expression (checked in every group).
    pub(super) fn nested_cut(&mut self, mac: &syn::Macro) {
        self.cx.error_spanned_by(
            mac,
            "`ckpt::cut!()` must be a statement of the function body itself; nested in a block or an expression it would do nothing",
        );
    }
}

/// `?` (or `bail!`/`ensure!`) at `q` in checkpointed group `g` of `count`: with cuts chosen
/// at run time there is no segment to return the error from; on a function returning
/// `Option`, a segment's early exit is an error `Option` cannot carry.
pub(super) fn check_fallible(
    q: Span,
    (layout, kept): (Layout, bool),
    g: usize,
    count: usize,
    sig: &syn::Signature,
    cx: &mut Ctxt,
) {
    let fn_name = &sig.ident;
    match layout {
        Layout::Runtime(_) => cx.error_at(
            q,
            format!(
                "`?` in statement {} of {count} of `{fn_name}`: with `segments = auto`, `budget`, or `segments = N` over a layer loop, the cuts are chosen at run time and any statement but the last may be checkpointed, leaving no segment to return the error from; move the `?` into the last statement, which runs inline, or use `ckpt::cut!()` markers, which support `?`{}",
                g + 1,
                kept_note(kept),
            ),
        ),
        Layout::Whole | Layout::Static if returns_option(sig) => {
            let whole = matches!(layout, Layout::Whole);
            cx.error_at(
                q,
                format!(
                    "`?` on an `Option` in checkpointed {} of `{fn_name}`: a segment returns early with an error, which `Option` cannot carry; use `Result` (`.ok_or(..)?`){}",
                    if whole {
                        "segment (the whole function)".to_owned()
                    } else {
                        format!("segment {} of {count}", g + 1)
                    },
                    if whole {
                        ""
                    } else {
                        ", or move the `?` after the last cut (the last segment runs inline)"
                    }
                ),
            );
        }
        Layout::Whole | Layout::Static => {}
    }
}

/// A `&mut` parameter `name`, used at `span`, entering checkpointed group `g` of `count`:
/// the segment runs again in backward and must not mutate what it did not create.
pub(super) fn ref_mut_enters(
    name: &str,
    span: Span,
    (layout, kept): (Layout, bool),
    g: usize,
    count: usize,
    cx: &mut Ctxt,
) {
    let message = match layout {
        Layout::Runtime(_) => format!(
            "`&mut` parameter `{name}` in statement {} of {count}: with `segments = auto`, `budget`, or `segments = N` over a layer loop, any statement but the last may be checkpointed, and a checkpointed statement runs again in backward, so it must not mutate what it did not create; use `{name}` in the last statement only, which runs inline, or pass `&{name}`{}",
            g + 1,
            kept_note(kept),
        ),
        Layout::Whole => format!(
            "`&mut` parameter `{name}` cannot enter the checkpointed function: it runs again in backward and must not mutate what it did not create; pass `&{name}`, or use `segments = N` or `ckpt::cut!()` markers so that `{name}` is used in the last segment, which runs inline"
        ),
        Layout::Static => format!(
            "`&mut` parameter `{name}` cannot enter checkpointed segment {} of {count}: the segment runs again in backward and must not mutate what it did not create; use `{name}` after the last cut (the last segment runs inline), or pass `&{name}`",
            g + 1
        ),
    };
    cx.error_at(span, message);
}

/// The end of a structural rule's message on a `#[ckpt::keep]` statement of a run-time
/// chain (`kept`), which is never recomputed but is still a stage closure.
fn kept_note(kept: bool) -> &'static str {
    if kept {
        " (the statement is marked `#[ckpt::keep]` and is never recomputed, but in a function whose cuts are chosen at run time it still runs as a stage closure, between the segments; with `ckpt::cut!()` markers a kept statement runs inline in the function)"
    } else {
        ""
    }
}

/// Whether the function is written to return `Option<..>` (syntactically).
fn returns_option(sig: &syn::Signature) -> bool {
    match &sig.output {
        syn::ReturnType::Type(_, ty) => matches!(
            &**ty,
            syn::Type::Path(p) if p.path.segments.last().is_some_and(|s| s.ident == "Option")
        ),
        syn::ReturnType::Default => false,
    }
}
