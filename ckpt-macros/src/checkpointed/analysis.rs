//! Analysis: grouping the body's statements into segments, liveness of bindings across
//! each cut (shadowing-aware, scope-aware), and the side-effect rules of a checkpointed
//! segment.
//!
//! The macro has no type information. A *binding* is a name introduced by a parameter or
//! a top-level `let` of the body; a *use* is a single-identifier path expression that is
//! not bound by an enclosing scope inside the statement (block, closure parameter, match
//! arm, `if let`, `for`), an identifier inside a macro invocation (conservatively), or a
//! `{name}` captured by a format string.

use std::collections::{HashMap, HashSet};
use std::ops::Range;

use proc_macro2::{Span, TokenStream, TokenTree};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::visit::Visit;
use syn::{Expr, FnArg, Ident, Pat, Stmt, Token};

use super::body::{self, Body, LoopKind, LoopUnit, Modules};
use super::layout::{self, Cut, Layout};
use super::parse::{self, ParamKind, Rule};
use crate::args::Args;
use crate::ctxt::Ctxt;

/// A name bound by a parameter or a top-level `let`.
#[derive(Debug, Clone)]
pub(crate) struct Binding {
    /// The identifier as written at the binding site (its span and hygiene are reused for
    /// rebindings inside and after segments).
    pub ident: Ident,
    /// `mut` at the binding site.
    pub mutable: bool,
    /// Which binding this is, among the parameters and top-level `let`s of the function
    /// (shadowing makes new ones): parameters first, in order, then definitions.
    pub id: usize,
}

/// How a value enters a checkpointed segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pass {
    /// Moved into the stash: it is not used after the segment (or the segment redefines
    /// its name).
    Move,
    /// A shallow clone goes into the stash; the original stays for later statements.
    Dup,
    /// A reference to data (a parameter or a reference `let` of this kind,
    /// [`ParamKind::by_ref`]): a shallow clone goes in, rebound as the reference inside.
    ByRef(ParamKind),
}

/// A value entering a checkpointed segment through its stash.
#[derive(Debug, Clone)]
pub(crate) struct Input {
    pub binding: Binding,
    pub pass: Pass,
}

/// One group of statements.
#[derive(Debug, Clone)]
pub(crate) struct Group {
    /// Indices into [`Plan::stmts`].
    pub stmts: Range<usize>,
    /// Values entering through the stash, in order of first use.
    pub inputs: Vec<Input>,
    /// Bindings defined in the group and used after it, in order of definition.
    pub outputs: Vec<Binding>,
    /// Whether the group uses `self`.
    pub uses_self: bool,
    /// Module parameters (`&T`, captured by shallow clone) the group uses.
    pub captures: Vec<Ident>,
    /// The first `?` (or `bail!`/`ensure!`) that would leave the segment.
    pub fallible: Option<Span>,
    /// Bindings from before the group that it changes (taken in and given back); a layer
    /// loop's carried values, which its later iterations use.
    pub carried: Vec<Binding>,
}

/// The result of the analysis.
pub(crate) struct Plan {
    /// The body's statements to cut (items and cut markers removed, chains split where
    /// the macro chooses the cuts).
    pub stmts: Vec<Stmt>,
    /// Items of the body, hoisted before the segments (they are visible in the whole
    /// body anyway).
    pub items: Vec<Stmt>,
    /// How the function is cut.
    pub layout: Layout,
    /// The groups (see [`Cut::ranges`](super::layout::Cut)).
    pub groups: Vec<Group>,
    /// One entry per statement: the layer loop it is ([`Layout::Runtime`] only).
    pub loops: Vec<Option<LoopUnit>>,
    /// Per statement of a [`Layout::Runtime`] chain that is a `fold`: the bindings only
    /// its initial value uses (they are inputs of its first iteration only).
    pub init_only: Vec<Vec<usize>>,
    /// Per statement of a [`Layout::Runtime`] chain that is a `fold`: the binding of its
    /// accumulator (the name its `let` binds).
    pub fold_accs: Vec<Option<Binding>>,
    /// Whether the last statement counts as a stage for `segments = N`.
    pub tail_counts: bool,
    /// Whether the last statement of a [`Layout::Runtime`] chain may run again in the
    /// profile of `segments = auto` (it passes the side-effect rules, has no `?` and takes
    /// no `&mut` parameter).
    pub tail_pure: bool,
    /// The span of `self` in the receiver, for a `&self` method.
    pub self_span: Option<Span>,
    /// Module parameters captured by some checkpointed segment, in parameter order.
    pub captures: Vec<Ident>,
    /// The bindings the last group uses that were defined before it, with the kind of
    /// the parameters among them (`segments = auto` takes them out of its environment).
    pub tail_uses: Vec<(Binding, Option<ParamKind>)>,
    /// The parameters, in order, with their kinds.
    pub params: Vec<(Binding, ParamKind)>,
    /// Top-level `let` bindings that hold a reference (`let r = xs;` of a `&Tensor`
    /// parameter, `let r = &h;`), by binding id, with how they cross a cut.
    pub ref_lets: HashMap<usize, ParamKind>,
}

/// Analyzes `func`. Errors go to `cx`; `None` when the function cannot be cut at all.
pub(crate) fn analyze(func: &parse::Function, args: &Args, cx: &mut Ctxt) -> Option<Plan> {
    let self_span = parse::check_signature(&func.sig, cx);

    // Parameters, in order.
    let mut params: Vec<(Binding, ParamKind)> = Vec::new();
    for arg in &func.sig.inputs {
        if let FnArg::Typed(pt) = arg {
            let kind = parse::param_kind(&pt.pat, &pt.ty);
            let mut bs = Vec::new();
            pat_bindings(&pt.pat, &mut bs);
            params.extend(bs.into_iter().map(|b| (b, kind)));
        }
    }
    for (id, (b, _)) in params.iter_mut().enumerate() {
        b.id = id;
    }
    let module_params: Vec<String> = params
        .iter()
        .filter(|(_, k)| k.captured())
        .map(|(b, _)| b.ident.to_string())
        .collect();

    // Statements: items are hoisted, cut markers split; the layout decides whether
    // chains and layer loops are cut.
    let mut body = body::collect(&func.block, cx);
    let cut = layout::resolve(
        args,
        &mut body,
        &Modules {
            params: &module_params,
        },
        cx,
    )?;
    let Body {
        items,
        stmts,
        loops,
        tail_counts,
        ..
    } = body;
    let runtime = matches!(cut.layout, Layout::Runtime(_));
    let whole = matches!(cut.layout, Layout::Whole);
    let count = cut.ranges.len();

    // Walk each group: uses, definitions, side-effect rules.
    let mut bound: HashMap<String, (Binding, Option<ParamKind>)> = params
        .iter()
        .map(|(b, k)| (b.ident.to_string(), (b.clone(), Some(*k))))
        .collect();
    let fn_name = func.sig.ident.to_string();
    let mut walks = Vec::with_capacity(count);
    let mut bound_before = Vec::with_capacity(count);
    let mut ref_lets: HashMap<usize, ParamKind> = HashMap::new();
    // `let`s that refer to module state, by id, with their initializer's text.
    let mut module_lets: HashMap<usize, String> = HashMap::new();
    let mut init_only = vec![Vec::new(); stmts.len()];
    let mut fold_accs = vec![None; stmts.len()];
    let mut next_id = params.len();
    for (g, range) in cut.ranges.iter().enumerate() {
        let checkpointed = cut.checkpointed(g);
        let label = match cut.layout {
            Layout::Runtime(_) => format!("statement {} of {count}", g + 1),
            Layout::Whole => "segment (the whole function)".to_owned(),
            Layout::Static => format!("segment {} of {count}", g + 1),
        };
        let mut walker = Walker::new(cx, checkpointed, label, &fn_name);
        walker.runtime = runtime;
        walker.whole = whole;
        walker.outer = bound.iter().map(|(n, (_, k))| (n.clone(), *k)).collect();
        for stmt in &stmts[range.clone()] {
            walker.walk_stmt(stmt, true);
        }
        let mut walk = walker.finish();
        if let (true, true, Some(q)) = (runtime, checkpointed, walk.fallible) {
            cx.error_at(
                q,
                format!(
                    "`?` in statement {} of {count} of `{fn_name}`: with `segments = auto`, `budget`, or `segments = N` over a layer loop, the cuts are chosen at run time and any statement but the last may be checkpointed, leaving no segment to return the error from; move the `?` into the last statement, which runs inline, or use `ckpt::cut!()` markers, which support `?`",
                    g + 1
                ),
            );
        }
        if let (true, Some(q)) = (checkpointed, walk.fallible)
            && !runtime
            && returns_option(&func.sig)
        {
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
        if runtime
            && checkpointed
            && let Some(unit) = &loops[g]
        {
            check_loop(unit, &bound, params.len(), &fn_name, cx);
            if let LoopKind::Fold { init, .. } = &unit.kind {
                init_only[g] = fold_init_only(unit, init, &bound);
            }
        }
        bound_before.push(bound.clone());
        for b in &mut walk.defs {
            b.id = next_id;
            next_id += 1;
            if let Some(Some(LoopUnit {
                kind: LoopKind::Fold { name, .. },
                ..
            })) = loops.get(g)
                && runtime
                && name == &b.ident
            {
                fold_accs[g] = Some(b.clone());
            }
            let kind = walk.ref_defs.get(&b.ident.to_string()).copied();
            if let Some(kind) = kind {
                ref_lets.insert(b.id, kind);
            }
            if let Some(text) = walk.module_defs.get(&b.ident.to_string()) {
                module_lets.insert(b.id, text.clone());
            }
            bound.insert(b.ident.to_string(), (b.clone(), kind));
        }
        walks.push(walk);
    }

    // A `let` without a value, assigned in a later group: the cut between them would move
    // an uninitialised binding.
    for (g, range) in cut.ranges.iter().enumerate() {
        for stmt in &stmts[range.clone()] {
            let Stmt::Local(local @ syn::Local { init: None, .. }) = stmt else {
                continue;
            };
            let mut bs = Vec::new();
            pat_bindings(&local.pat, &mut bs);
            for b in bs {
                let name = b.ident.to_string();
                let later = (g + 1..count).find(|&h| {
                    walks[h].mutated.contains(&name)
                        && bound_before[h]
                            .get(&name)
                            .is_some_and(|(x, _)| walks[g].defs.iter().any(|d| d.id == x.id))
                });
                if let Some(h) = later {
                    cx.error_spanned_by(
                        local,
                        format!(
                            "`let {name};` declares `{name}` without a value, and a cut separates it from its assignment in {}: declare it with its value (`let {name} = ..;`)",
                            segment_label(&cut, h, count)
                        ),
                    );
                }
            }
        }
    }

    // Liveness at group granularity, backwards: live_in(g) = uses(g) ∪ (live_in(g+1) − defs(g)).
    let mut live_in: Vec<HashSet<String>> = vec![HashSet::new(); count + 1];
    for g in (0..count).rev() {
        let defs: HashSet<String> = walks[g].defs.iter().map(|b| b.ident.to_string()).collect();
        let mut live: HashSet<String> = live_in[g + 1].difference(&defs).cloned().collect();
        live.extend(walks[g].uses.iter().map(|(n, _)| n.clone()));
        live_in[g] = live;
    }

    let mut groups = Vec::with_capacity(count);
    let mut captures: Vec<Ident> = Vec::new();
    for (g, range) in cut.ranges.iter().cloned().enumerate() {
        let walk = &walks[g];
        let live_out = &live_in[g + 1];
        let checkpointed = cut.checkpointed(g);
        // Outer bindings (not parameters taken by reference) that the group assigns or
        // mutates are moved in and rebound after it, like a redefinition. So is every
        // outer `mut` binding the group uses and later code reads: a `mut` binding can be
        // changed in ways the syntax does not show (`v.sort()`, `f(&mut n)`, a macro), and
        // a copy passed in would leave the change behind. (The segment gets its input
        // from the stash on recompute, so changing it inside is not a side effect.)
        let mut mutated: Vec<Binding> = walk
            .mutated
            .iter()
            .filter_map(|name| match bound_before[g].get(name) {
                Some((b, None | Some(ParamKind::Owned))) => Some(b.clone()),
                _ => None,
            })
            .collect();
        // (The name is live after the group only as this binding when the group does not
        // define it again.)
        let redefined: HashSet<String> = walk.defs.iter().map(|b| b.ident.to_string()).collect();
        for (name, _) in &walk.uses {
            if let Some((b, None | Some(ParamKind::Owned))) = bound_before[g].get(name)
                && b.mutable
                && live_out.contains(name)
                && !redefined.contains(name)
                && !mutated.iter().any(|m| m.id == b.id)
            {
                mutated.push(b.clone());
            }
        }
        let mut defined: HashSet<String> = walk.defs.iter().map(|b| b.ident.to_string()).collect();
        defined.extend(mutated.iter().map(|b| b.ident.to_string()));
        let mut group = Group {
            stmts: range,
            inputs: Vec::new(),
            outputs: Vec::new(),
            uses_self: walk.uses.iter().any(|(n, _)| n == "self"),
            captures: Vec::new(),
            fallible: walk.fallible,
            carried: mutated.clone(),
        };
        if checkpointed {
            for (name, span) in &walk.uses {
                let Some((binding, kind)) = bound_before[g].get(name) else {
                    continue; // not a binding of this function (a function, a constant, ..)
                };
                let pass = match kind {
                    Some(k) if k.captured() => {
                        group.captures.push(binding.ident.clone());
                        if !captures.iter().any(|c| c == &binding.ident) {
                            captures.push(binding.ident.clone());
                        }
                        continue;
                    }
                    Some(ParamKind::RefMut) if runtime => {
                        cx.error_at(
                            *span,
                            format!(
                                "`&mut` parameter `{name}` in statement {} of {count}: with `segments = auto`, `budget`, or `segments = N` over a layer loop, any statement but the last may be checkpointed, and a checkpointed statement runs again in backward, so it must not mutate what it did not create; use `{name}` in the last statement only, which runs inline, or pass `&{name}`",
                                g + 1
                            ),
                        );
                        continue;
                    }
                    Some(ParamKind::RefMut) if whole => {
                        cx.error_at(
                            *span,
                            format!(
                                "`&mut` parameter `{name}` cannot enter the checkpointed function: it runs again in backward and must not mutate what it did not create; pass `&{name}`, or use `segments = N` or `ckpt::cut!()` markers so that `{name}` is used in the last segment, which runs inline"
                            ),
                        );
                        continue;
                    }
                    Some(ParamKind::RefMut) => {
                        cx.error_at(
                            *span,
                            format!(
                                "`&mut` parameter `{name}` cannot enter checkpointed segment {} of {count}: the segment runs again in backward and must not mutate what it did not create; use `{name}` after the last cut (the last segment runs inline), or pass `&{name}`",
                                g + 1
                            ),
                        );
                        continue;
                    }
                    Some(k) if k.by_ref() => Pass::ByRef(*k),
                    Some(_) | None => {
                        if live_out.contains(name) && !defined.contains(name) {
                            Pass::Dup
                        } else {
                            Pass::Move
                        }
                    }
                };
                if let Some(text) = module_lets.get(&binding.id) {
                    cx.error_at(
                        *span,
                        format!(
                            "`{name}` refers to module state (`{text}`) and enters {}: a segment captures module state itself and cannot take a reference to it; use `{}` where it is needed instead of `{name}`",
                            segment_label(&cut, g, count),
                            text.trim_start_matches('&')
                        ),
                    );
                    continue;
                }
                group.inputs.push(Input {
                    binding: binding.clone(),
                    pass,
                });
            }
            // The last definition of each name is the one visible after the group.
            let mut seen = HashSet::new();
            let mut outputs: Vec<Binding> = mutated
                .iter()
                .chain(&walk.defs)
                .rev()
                .filter(|b| {
                    let name = b.ident.to_string();
                    live_out.contains(&name) && seen.insert(name)
                })
                .cloned()
                .collect();
            outputs.reverse();
            for b in &outputs {
                if let Some(text) = module_lets.get(&b.id) {
                    cx.error_spanned_by(
                        &b.ident,
                        format!(
                            "`{}` refers to module state (`{text}`) and leaves {}: a segment cannot hand out a reference to module state; use `{}` where it is needed",
                            b.ident,
                            segment_label(&cut, g, count),
                            text.trim_start_matches('&')
                        ),
                    );
                }
            }
            group.outputs = outputs;
        }
        groups.push(group);
    }
    // Captures in parameter order.
    captures.sort_by_key(|c| params.iter().position(|(b, _)| &b.ident == c));
    let tail_uses: Vec<(Binding, Option<ParamKind>)> = walks[count - 1]
        .uses
        .iter()
        .filter_map(|(name, _)| bound_before[count - 1].get(name).cloned())
        .collect();
    // Whether the last statement of a run-time chain may also run in the profile (it
    // then is the chain's last stage for the planner): it passes the side-effect rules,
    // has no `?`, and takes no `&mut` parameter.
    let tail_pure = runtime && walks[count - 1].fallible.is_none() && {
        let mut scratch = Ctxt::default();
        let mut walker = Walker::new(&mut scratch, true, String::new(), &fn_name);
        walker.runtime = true;
        walker.outer = bound_before[count - 1]
            .iter()
            .map(|(n, (_, k))| (n.clone(), *k))
            .collect();
        for stmt in &stmts[cut.ranges[count - 1].clone()] {
            walker.walk_stmt(stmt, true);
        }
        drop(walker);
        scratch.is_ok()
            && !tail_uses
                .iter()
                .any(|(_, k)| matches!(k, Some(ParamKind::RefMut)))
    };

    cx.is_ok().then_some(Plan {
        stmts,
        items,
        layout: cut.layout,
        groups,
        loops: if runtime { loops } else { Vec::new() },
        init_only,
        fold_accs,
        tail_counts,
        tail_pure,
        self_span,
        captures,
        tail_uses,
        params,
        ref_lets,
    })
}

/// "checkpointed segment 2 of 3", "statement 2 of 5", "the checkpointed function".
fn segment_label(cut: &Cut, g: usize, count: usize) -> String {
    match cut.layout {
        Layout::Whole => "the checkpointed function".to_owned(),
        Layout::Static => format!("checkpointed segment {} of {count}", g + 1),
        Layout::Runtime(_) => format!("statement {} of {count}", g + 1),
    }
}

/// The checks of a layer loop whose iterations are cut at run time: its iterable is
/// evaluated again in backward to re-derive an iteration's items, so it may use only
/// `self` and the parameters; and a `break` would end the loop at a point the run-time
/// cuts cannot know.
fn check_loop(
    unit: &LoopUnit,
    bound: &HashMap<String, (Binding, Option<ParamKind>)>,
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
fn expr_uses(e: &Expr) -> Vec<(String, Span)> {
    let mut cx = Ctxt::default();
    let mut walker = Walker::new(&mut cx, false, String::new(), "");
    walker.visit_expr(e);
    walker.finish().uses
}

/// The bindings (by id) that only a `fold`'s initial value uses: its first iteration
/// takes them, later ones do not need them. A `mut` binding is not one of them: the unit
/// may change it (it is then taken in and given back by every iteration).
fn fold_init_only(
    unit: &LoopUnit,
    init: &Expr,
    bound: &HashMap<String, (Binding, Option<ParamKind>)>,
) -> Vec<usize> {
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

/// Adds the names a pattern binds to `out`.
pub(crate) fn pat_bindings(pat: &Pat, out: &mut Vec<Binding>) {
    match pat {
        Pat::Ident(p) => {
            out.push(Binding {
                ident: p.ident.clone(),
                mutable: p.mutability.is_some(),
                id: 0,
            });
            if let Some((_, sub)) = &p.subpat {
                pat_bindings(sub, out);
            }
        }
        Pat::Or(p) => {
            // Every alternative binds the same names.
            if let Some(first) = p.cases.first() {
                pat_bindings(first, out);
            }
        }
        Pat::Paren(p) => pat_bindings(&p.pat, out),
        Pat::Reference(p) => pat_bindings(&p.pat, out),
        Pat::Slice(p) => p.elems.iter().for_each(|e| pat_bindings(e, out)),
        Pat::Struct(p) => p.fields.iter().for_each(|f| pat_bindings(&f.pat, out)),
        Pat::Tuple(p) => p.elems.iter().for_each(|e| pat_bindings(e, out)),
        Pat::TupleStruct(p) => p.elems.iter().for_each(|e| pat_bindings(e, out)),
        Pat::Type(p) => pat_bindings(&p.pat, out),
        _ => {}
    }
}

/// What a walk over a group found.
struct Walk {
    /// Names used before any definition in the group, with their first span, in order.
    uses: Vec<(String, Span)>,
    /// Top-level definitions, in order (shadowed ones included).
    defs: Vec<Binding>,
    /// The first `?` at the top level of the segment (not inside a closure).
    fallible: Option<Span>,
    /// Outer bindings the group assigns or mutates (function-local values, or others with
    /// an escape hatch or in the inline group): they leave the group as outputs, so the
    /// change is seen after it.
    mutated: Vec<String>,
    /// The last top-level definition of each name, when it holds a reference to data.
    ref_defs: HashMap<String, ParamKind>,
    /// Top-level definitions that refer to module state (`let lin = &self.head;`), which
    /// cannot cross a cut, with the initializer's text.
    module_defs: HashMap<String, String>,
}

const IO_MACROS: &[&str] = &[
    "println", "print", "eprintln", "eprint", "dbg", "write", "writeln",
];
const EARLY_EXIT_MACROS: &[&str] = &["bail", "ensure"];
/// Interior mutability: changes a value through a shared reference (with `fetch_*`).
/// Taking a lock or a `RefCell` borrow is not in the list: reading through it is fine
/// (a `ckpt::Shared` module's `lock()`), and a change through it is seen on what it
/// locks ([`GUARD_METHODS`]).
const INTERIOR_METHODS: &[&str] = &[
    "set",
    "store",
    "compare_exchange",
    "compare_exchange_weak",
    "replace",
    "take",
    "swap",
];
/// Collection and `Option` mutation: changes a value through `&mut` (the receiver itself,
/// or what an `&mut` alias points to).
const COLLECTION_METHODS: &[&str] = &[
    "replace",
    "take",
    "swap",
    "get_mut",
    "push",
    "push_back",
    "push_front",
    "pop",
    "pop_back",
    "pop_front",
    "insert",
    "remove",
    "clear",
    "extend",
    "append",
    "truncate",
    "retain",
    "drain",
    "entry",
];

/// Whether a call of `method` with `args` arguments (the receiver not counted) can
/// mutate: tch's out-of-place `Tensor::take(&index)` and `Tensor::set()`, and
/// `str::replace(from, to)`, share their names with `Option::take()`, `Cell::set(v)` and
/// `Option::replace(v)`.
fn mutating_arity(method: &str, args: usize) -> bool {
    match method {
        "take" => args == 0,
        "set" => args >= 1,
        "replace" => args == 1,
        _ => true,
    }
}
const RNG_CRATES: &[&str] = &["rand", "fastrand", "getrandom"];
const RNG_METHODS: &[&str] = &[
    "gen",
    "gen_range",
    "gen_bool",
    "random",
    "random_range",
    "random_bool",
    "sample",
    "shuffle",
    "fill_bytes",
    "next_u32",
    "next_u64",
];

/// The root of a place expression (`a` in `a.b[i]`, `*a`, `(a)`, `a.as_ref()`).
#[derive(Clone)]
enum Root {
    /// A single identifier.
    Name(String),
    /// A longer path (`crate::COUNTER`): never local.
    Path(String),
    /// Something else (a call's result, a temporary).
    Unknown,
}

fn root(e: &Expr) -> Root {
    match e {
        Expr::Path(p) if p.qself.is_none() => match p.path.get_ident() {
            Some(id) => Root::Name(id.to_string()),
            None => Root::Path(path_string(&p.path)),
        },
        Expr::Field(f) => root(&f.base),
        Expr::Index(i) => root(&i.expr),
        Expr::Paren(p) => root(&p.expr),
        Expr::Group(g) => root(&g.expr),
        Expr::Reference(r) => root(&r.expr),
        Expr::Unary(u) if matches!(u.op, syn::UnOp::Deref(_)) => root(&u.expr),
        // A shallow clone shares storage with what it was cloned from; the others
        // return a reference into their receiver.
        Expr::MethodCall(m)
            if (m.args.is_empty() && ALIASING_METHODS.contains(&&*m.method.to_string()))
                || is_guard(m) =>
        {
            root(&m.receiver)
        }
        _ => Root::Unknown,
    }
}

/// Methods whose result refers to their receiver (`clone` is not one: on a `Vec` it is
/// a copy; an `Arc` cloned out of `self` is not followed).
const ALIASING_METHODS: &[&str] = &["shallow_clone", "as_ref", "as_deref", "borrow", "deref"];

/// Methods (without arguments) that give mutable access to what their receiver holds: a
/// change through their result (`self.cache.lock().push(x)`, `*last.lock().unwrap() =
/// ..`, `let g = log.borrow_mut(); g.clear()`) is a change of the receiver.
const GUARD_METHODS: &[&str] = &["lock", "try_lock", "borrow_mut", "write", "get_mut"];

/// Whether `m` is a guard method call, or `unwrap` / `expect` of one.
fn is_guard(m: &syn::ExprMethodCall) -> bool {
    let name = m.method.to_string();
    match &*name {
        "unwrap" | "expect" => matches!(&*m.receiver, Expr::MethodCall(r) if is_guard(r)),
        _ => m.args.is_empty() && GUARD_METHODS.contains(&&*name),
    }
}

/// How a local refers to a value from outside the segment, which decides the rules that
/// follow it there.
#[derive(Clone, Copy, PartialEq, Eq)]
enum AliasKind {
    /// The value itself (moved in: `let mut v = outer;`) or `&mut place`: every rule.
    Full,
    /// A shared reference (`&place`, `.as_ref()`, `.borrow()`, `.deref()`, the parameter
    /// of a closure given to a method of the value): in-place ops and interior
    /// mutability reach the value; collection mutation changes only the local.
    Shared,
    /// A tensor handle (`.shallow_clone()`): only in-place ops (and `op=`) reach the
    /// storage; anything else changes the local handle.
    Handle,
}

impl AliasKind {
    /// An alias of an alias: the narrower of the two.
    fn then(self, next: AliasKind) -> AliasKind {
        use AliasKind::*;
        match (self, next) {
            (Handle, _) | (_, Handle) => Handle,
            (Shared, _) | (_, Shared) => Shared,
            (Full, Full) => Full,
        }
    }
}

/// What a local aliases outside the segment.
#[derive(Clone)]
struct Alias {
    root: Root,
    kind: AliasKind,
    /// The local is `mut`: a shared alias's `take()` / `replace(v)` / `swap` then change
    /// the local (an `Option<&T>`), not the value.
    mutable: bool,
}

/// Which side-effect rule asks whether a place is outside the segment.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Reach {
    Inplace,
    Interior,
    Collection,
    Assign,
}

impl Reach {
    fn through(self, alias: &Alias, method: &str) -> bool {
        match (self, alias.kind) {
            (Reach::Inplace | Reach::Assign, _) | (_, AliasKind::Full) => true,
            (Reach::Interior, AliasKind::Shared) => {
                !(alias.mutable && ["take", "replace", "swap"].contains(&method))
            }
            _ => false,
        }
    }
}

impl Root {
    fn name(&self) -> Option<&str> {
        match self {
            Root::Name(n) | Root::Path(n) => Some(n),
            Root::Unknown => None,
        }
    }
}

fn path_string(p: &syn::Path) -> String {
    p.segments
        .iter()
        .map(|s| s.ident.to_string())
        .collect::<Vec<_>>()
        .join("::")
}

fn is_inplace_name(name: &str) -> bool {
    name.len() > 1 && name.ends_with('_') && !name.starts_with('_')
}

/// The scope-aware walker of one group.
struct Walker<'c> {
    cx: &'c mut Ctxt,
    /// Whether side-effect rules apply (checkpointed group).
    check: bool,
    /// "segment 2 of 3", for messages.
    segment: String,
    fn_name: &'c str,
    /// Innermost last; `scopes[0]` holds the group's top-level definitions so far. Each
    /// local maps to what it aliases when that is a value from outside the segment
    /// (`let s = &self.x;`, `let t = x.shallow_clone();`, `let u = x;`, the parameter of
    /// a closure given to a method of an outside value, `TL.with(|c| ..)`): the
    /// side-effect rules follow it there.
    scopes: Vec<HashMap<String, Option<Alias>>>,
    /// What the parameters of the closure about to be visited alias.
    closure_alias: Option<Alias>,
    uses: Vec<(String, Span)>,
    seen: HashSet<String>,
    defs: Vec<Binding>,
    fallible: Option<Span>,
    mutated: Vec<String>,
    /// Rules lifted by `#[ckpt::allow(..)]` on the enclosing statements.
    allowed: Vec<Rule>,
    /// Closure / async-block nesting: `return` and `?` there belong to it.
    closure_depth: usize,
    /// Enclosing loops and labeled blocks of the current closure level: (label, is_loop).
    loops: Vec<(Option<String>, bool)>,
    /// The cuts are chosen at run time (`segments = auto`, `budget`, a layer loop): every
    /// statement but the last is a stage (messages differ).
    runtime: bool,
    /// The whole function is the segment: `return` leaves it as it leaves the function.
    whole: bool,
    /// The bindings of the function defined before this group (parameters and top-level
    /// `let`s), with the kind of the parameters and reference `let`s among them.
    outer: HashMap<String, Option<ParamKind>>,
    /// Top-level `let`s of this group that hold a reference to data, with how they
    /// cross a cut (`let r = xs;` of a `&Tensor` parameter, `let r = &h;`).
    ref_defs: HashMap<String, ParamKind>,
    /// Top-level `let`s of this group that refer to module state.
    module_defs: HashMap<String, String>,
}

impl<'c> Walker<'c> {
    fn new(cx: &'c mut Ctxt, check: bool, segment: String, fn_name: &'c str) -> Self {
        Walker {
            cx,
            check,
            segment,
            fn_name,
            scopes: vec![HashMap::new()],
            closure_alias: None,
            uses: Vec::new(),
            seen: HashSet::new(),
            defs: Vec::new(),
            fallible: None,
            mutated: Vec::new(),
            allowed: Vec::new(),
            closure_depth: 0,
            loops: Vec::new(),
            runtime: false,
            whole: false,
            outer: HashMap::new(),
            ref_defs: HashMap::new(),
            module_defs: HashMap::new(),
        }
    }

    fn finish(self) -> Walk {
        Walk {
            uses: self.uses,
            defs: self.defs,
            fallible: self.fallible,
            mutated: self.mutated,
            ref_defs: self.ref_defs,
            module_defs: self.module_defs,
        }
    }

    /// Whether `init` is a reference to module state: `&self.head`, `&self.blocks[i]`, `&m`
    /// of a module parameter.
    fn module_ref(&self, init: &Expr) -> bool {
        match init {
            Expr::Paren(p) => self.module_ref(&p.expr),
            Expr::Reference(r) => match root(&r.expr) {
                Root::Name(n) if !self.is_local(&n) => {
                    n == "self" || matches!(self.outer.get(&n), Some(Some(k)) if k.captured())
                }
                _ => false,
            },
            _ => false,
        }
    }

    /// Whether `name` is a value of the function itself (a top-level `let` or a parameter
    /// taken by value) from before this group: a segment takes it in through its stash and
    /// gives it back, so assigning to it or mutating it as a collection inside is not a
    /// side effect (the recompute starts again from the stashed value).
    fn movable(&self, name: &str) -> bool {
        !self.is_local(name) && matches!(self.outer.get(name), Some(None | Some(ParamKind::Owned)))
    }

    /// How a top-level `let name = init;` holds a reference to data that can cross a cut
    /// as a shallow clone: an alias of a reference parameter or reference `let`
    /// (`let residual = xs;`), or a shared reference to a value of the function
    /// (`let residual = &xs;`).
    fn ref_kind_of(&self, init: &Expr) -> Option<ParamKind> {
        match init {
            Expr::Paren(p) => self.ref_kind_of(&p.expr),
            Expr::Path(p) if p.qself.is_none() => {
                let name = p.path.get_ident()?.to_string();
                if self.scopes[0].contains_key(&name) && self.scopes.len() == 1 {
                    return self.ref_defs.get(&name).copied();
                }
                if self.is_local(&name) {
                    return None;
                }
                match self.outer.get(&name)? {
                    Some(k) if k.by_ref() => Some(*k),
                    _ => None,
                }
            }
            Expr::Reference(r) if r.mutability.is_none() => match &*r.expr {
                Expr::Path(p) if p.qself.is_none() => {
                    let name = p.path.get_ident()?.to_string();
                    let own = (self.scopes[0].contains_key(&name)
                        && self.scopes.len() == 1
                        && !self.ref_defs.contains_key(&name))
                        || (!self.is_local(&name)
                            && matches!(
                                self.outer.get(&name),
                                Some(None | Some(ParamKind::Owned))
                            ));
                    (own && name != "self").then_some(ParamKind::RefData)
                }
                _ => None,
            },
            _ => None,
        }
    }

    fn is_local(&self, name: &str) -> bool {
        self.scopes.iter().any(|s| s.contains_key(name))
    }

    fn use_name(&mut self, name: String, span: Span) {
        if !self.is_local(&name) && self.seen.insert(name.clone()) {
            self.uses.push((name, span));
        }
    }

    fn bind(&mut self, pat: &Pat) {
        let mut bs = Vec::new();
        pat_bindings(pat, &mut bs);
        let scope = self.scopes.last_mut().expect("a scope");
        scope.extend(bs.into_iter().map(|b| (b.ident.to_string(), None)));
    }

    fn scoped(&mut self, f: impl FnOnce(&mut Self)) {
        self.scopes.push(HashMap::new());
        f(self);
        self.scopes.pop();
    }

    fn in_closure(&mut self, f: impl FnOnce(&mut Self)) {
        let loops = std::mem::take(&mut self.loops);
        self.closure_depth += 1;
        self.scoped(f);
        self.closure_depth -= 1;
        self.loops = loops;
    }

    fn with_allow(&mut self, attrs: &[&syn::Attribute], f: impl FnOnce(&mut Self)) {
        let rules = parse::allowed_rules(attrs, self.cx);
        let n = self.allowed.len();
        self.allowed.extend(rules);
        f(self);
        self.allowed.truncate(n);
    }

    fn violation(&mut self, rule: Rule, tokens: impl quote::ToTokens, message: String) {
        if self.check && !self.allowed.contains(&rule) {
            self.cx.error_spanned_by(tokens, message);
        }
    }

    /// What the local `name` aliases outside the segment, if anything.
    fn alias_of(&self, name: &str) -> Option<Alias> {
        let scope = self.scopes.iter().rev().find(|s| s.contains_key(name))?;
        scope[name].clone()
    }

    /// Sets what the innermost local `name` aliases (after `name = ..`).
    fn realias(&mut self, name: &str, alias: Option<Alias>) {
        if let Some(scope) = self.scopes.iter_mut().rev().find(|s| s.contains_key(name)) {
            scope.insert(name.to_string(), alias);
        }
    }

    /// The outside value a place refers to: its root when that is outside the segment
    /// (the value itself), or what a local root aliases.
    fn outside(&self, place: &Expr) -> Option<Alias> {
        match root(place) {
            Root::Name(n) if self.is_local(&n) => self.alias_of(&n),
            Root::Unknown => None,
            root => Some(Alias {
                root,
                kind: AliasKind::Full,
                mutable: false,
            }),
        }
    }

    /// What a value makes the local it is bound to alias: a reference to an outside
    /// place, an aliasing method on one, or an outside value (or alias) moved in. A
    /// field read (`let n = self.n;`) copies; other expressions make new values.
    fn alias_target(&self, init: &Expr) -> Option<Alias> {
        let (inner, kind) = match init {
            Expr::Paren(p) => return self.alias_target(&p.expr),
            Expr::Group(g) => return self.alias_target(&g.expr),
            Expr::Path(_) => return self.outside(init),
            Expr::Reference(r) if r.mutability.is_some() => (&*r.expr, AliasKind::Full),
            Expr::Reference(r) => (&*r.expr, AliasKind::Shared),
            Expr::MethodCall(m) if m.method == "shallow_clone" && m.args.is_empty() => {
                (&*m.receiver, AliasKind::Handle)
            }
            // A lock's or a `RefCell`'s guard: mutable access to what it locks.
            Expr::MethodCall(m) if is_guard(m) && !matches!(root(init), Root::Unknown) => {
                (init, AliasKind::Full)
            }
            Expr::MethodCall(_) if !matches!(root(init), Root::Unknown) => {
                (init, AliasKind::Shared)
            }
            _ => return None,
        };
        let mut alias = self.outside(inner)?;
        alias.kind = alias.kind.then(kind);
        Some(alias)
    }

    /// Binds a `let` pattern in the innermost scope (or, `top`, in the group's), with
    /// the alias its initializer makes when the pattern is one name.
    fn bind_let(&mut self, pat: &Pat, init: Option<&Expr>, top: bool) {
        let alias = init.and_then(|e| self.alias_target(e));
        let mut bs = Vec::new();
        pat_bindings(pat, &mut bs);
        let alias = match (&bs[..], alias) {
            ([b], Some(a)) => Some(Alias {
                mutable: b.mutable,
                ..a
            }),
            _ => None,
        };
        if top {
            let reference = match (&bs[..], init) {
                ([b], Some(e)) if !b.mutable => self.ref_kind_of(e),
                _ => None,
            };
            let module = match (&bs[..], init) {
                ([_], Some(e)) if self.module_ref(e) => Some(body::short_text(e, 40)),
                _ => None,
            };
            for b in &bs {
                match reference {
                    Some(kind) => self.ref_defs.insert(b.ident.to_string(), kind),
                    None => self.ref_defs.remove(&b.ident.to_string()),
                };
                match &module {
                    Some(text) => self.module_defs.insert(b.ident.to_string(), text.clone()),
                    None => self.module_defs.remove(&b.ident.to_string()),
                };
            }
        }
        let scope = if top {
            &mut self.scopes[0]
        } else {
            self.scopes.last_mut().expect("a scope")
        };
        for b in &bs {
            scope.insert(b.ident.to_string(), alias.clone());
        }
        if top {
            self.defs.extend(bs);
        }
    }

    /// Whether a place is outside the segment for the rule `reach` (`self`, a
    /// parameter, an earlier binding, a static, or a local that aliases one of those in
    /// a way that rule follows), as the name to report; `None` when it is not, or cannot
    /// be told (a temporary). A bare local is followed only for calls on it (`method`):
    /// assigning to the local itself rebinds it. An outer binding found here is
    /// recorded as mutated.
    fn outer_root(&mut self, e: &Expr, reach: Reach, method: &str) -> Option<String> {
        self.outer_root_of(e, reach, method).map(|(name, _)| name)
    }

    /// [`Walker::outer_root`], and whether the place is (a part of) a value of the function
    /// that the segment takes in and gives back ([`Walker::movable`]).
    fn outer_root_of(&mut self, e: &Expr, reach: Reach, method: &str) -> Option<(String, bool)> {
        let (target, via) = match root(e) {
            Root::Name(n) if self.is_local(&n) => {
                if reach == Reach::Assign && matches!(e, Expr::Path(_)) {
                    return None;
                }
                let alias = self.alias_of(&n)?;
                if !reach.through(&alias, method) {
                    return None;
                }
                (alias.root, Some(n))
            }
            Root::Unknown => return None,
            r => (r, None),
        };
        self.record_mutated(&target);
        let movable = matches!(&target, Root::Name(n) if self.movable(n));
        let name = target.name()?;
        let name = match via {
            Some(local) => format!("{name}` through `{local}"),
            None => name.to_string(),
        };
        Some((name, movable))
    }

    /// Records an outer binding the group changes (it is then moved in and rebound).
    fn record_mutated(&mut self, root: &Root) {
        if let Root::Name(n) = root
            && !self.mutated.contains(n)
        {
            self.mutated.push(n.clone());
        }
    }

    /// A statement; `top`: one of the group's own (not nested), whose bindings are the
    /// group's definitions.
    fn walk_stmt(&mut self, stmt: &Stmt, top: bool) {
        self.with_allow(&parse::stmt_attrs(stmt), |w| match stmt {
            Stmt::Local(local) => {
                if let Some(init) = &local.init {
                    w.visit_expr(&init.expr);
                    if let Some((_, diverge)) = &init.diverge {
                        w.visit_expr(diverge);
                    }
                }
                w.bind_let(&local.pat, local.init.as_ref().map(|i| &*i.expr), top);
            }
            Stmt::Expr(e, _) => w.visit_expr(e),
            Stmt::Macro(m) => w.visit_macro(&m.mac),
            Stmt::Item(_) => {}
        });
    }

    fn check_inplace(&mut self, method: &str, receiver: &Expr, node: impl quote::ToTokens) {
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

    fn check_mutation(
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
    fn check_op_assign_on_handle(
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

    /// `=` (`compound` false) or `op=` to a place.
    fn check_assign(&mut self, target: &Expr, compound: bool, node: impl quote::ToTokens) {
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

    fn check_rng_path(&mut self, path: &syn::Path) {
        let first = path.segments.first().map(|s| s.ident.to_string());
        let hit = (path.segments.len() > 1
            && first.as_deref().is_some_and(|f| RNG_CRATES.contains(&f)))
            || path.segments.iter().any(|s| s.ident == "thread_rng");
        if hit {
            let message = format!(
                "`{}` is randomness outside libtorch: the recompute of {} in backward would draw different numbers (`preserve_rng_state` covers libtorch's generators only); use libtorch's random ops (`Tensor::rand`, `dropout`), or lift the rule with `#[ckpt::allow(rng)]`",
                path_string(path),
                self.segment
            );
            self.violation(Rule::Rng, path, message);
        }
    }

    fn control_flow(&mut self, node: impl quote::ToTokens, what: &str) {
        if self.check && self.runtime {
            let message = format!(
                "{what} in {segment} of `{f}` would leave the statement's stage closure, not `{f}`: with `segments = auto`, `budget`, or `segments = N` over a layer loop, any statement but the last may be checkpointed; move it into the last statement, which runs inline, or use `ckpt::cut!()` markers",
                segment = self.segment,
                f = self.fn_name,
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

    /// Conservative uses inside a macro's tokens: identifiers (not after `.`, not before
    /// `::`), `self`, and format-string captures.
    fn scan_tokens(&mut self, tokens: TokenStream, idents: bool) {
        let tts: Vec<TokenTree> = tokens.into_iter().collect();
        for (i, tt) in tts.iter().enumerate() {
            match tt {
                TokenTree::Ident(id) if idents => {
                    let after_dot =
                        i > 0 && matches!(&tts[i - 1], TokenTree::Punct(p) if p.as_char() == '.');
                    let before_path =
                        matches!(tts.get(i + 1), Some(TokenTree::Punct(p)) if p.as_char() == ':');
                    if !after_dot && !before_path {
                        self.use_name(id.to_string(), id.span());
                    }
                }
                TokenTree::Group(g) => self.scan_tokens(g.stream(), idents),
                TokenTree::Literal(lit) => {
                    for name in format_captures(&lit.to_string()) {
                        self.use_name(name, lit.span());
                    }
                }
                _ => {}
            }
        }
    }

    /// Flags from the tokens of a macro whose arguments are not expressions.
    fn scan_flags(&mut self, mac: &syn::Macro, tokens: TokenStream) {
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
                TokenTree::Ident(id)
                    if id == "thread_rng" || RNG_CRATES.iter().any(|c| id == c) =>
                {
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
}

/// Identifiers captured by a format string literal: `"{x}"`, `"{x:?}"` (not `"{{x}}"`).
fn format_captures(lit: &str) -> Vec<String> {
    if !(lit.starts_with('"') || lit.starts_with('r')) {
        return Vec::new();
    }
    let mut out = Vec::new();
    let b = lit.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'{' {
            if b.get(i + 1) == Some(&b'{') {
                i += 2;
                continue;
            }
            let start = i + 1;
            let mut j = start;
            while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_') {
                j += 1;
            }
            let name = &lit[start..j];
            let valid = !name.is_empty() && !name.as_bytes()[0].is_ascii_digit();
            if valid && matches!(b.get(j), Some(b'}') | Some(b':')) {
                out.push(name.to_owned());
            }
            i = j;
        } else {
            i += 1;
        }
    }
    out
}

impl<'ast> Visit<'ast> for Walker<'_> {
    fn visit_block(&mut self, b: &'ast syn::Block) {
        self.scoped(|w| {
            for stmt in &b.stmts {
                w.visit_stmt(stmt);
            }
        });
    }

    fn visit_stmt(&mut self, stmt: &'ast Stmt) {
        self.walk_stmt(stmt, false);
    }

    fn visit_item(&mut self, _: &'ast syn::Item) {
        // Items cannot capture locals; their bodies are not part of the segment.
    }

    fn visit_expr_path(&mut self, e: &'ast syn::ExprPath) {
        if e.qself.is_none() {
            if let Some(id) = e.path.get_ident() {
                self.use_name(id.to_string(), id.span());
            } else {
                self.check_rng_path(&e.path);
            }
        }
    }

    fn visit_expr_closure(&mut self, e: &'ast syn::ExprClosure) {
        let alias = self.closure_alias.take();
        self.in_closure(|w| {
            for input in &e.inputs {
                w.bind(input);
                let mut bs = Vec::new();
                pat_bindings(input, &mut bs);
                if let (Some(alias), [b]) = (&alias, &bs[..]) {
                    let scope = w.scopes.last_mut().expect("a scope");
                    let alias = Alias {
                        mutable: b.mutable,
                        ..alias.clone()
                    };
                    scope.insert(b.ident.to_string(), Some(alias));
                }
            }
            w.visit_expr(&e.body);
        });
    }

    fn visit_expr_async(&mut self, e: &'ast syn::ExprAsync) {
        self.in_closure(|w| w.visit_block(&e.block));
    }

    fn visit_arm(&mut self, arm: &'ast syn::Arm) {
        self.scoped(|w| {
            w.bind(&arm.pat);
            if let Some((_, guard)) = &arm.guard {
                w.visit_expr(guard);
            }
            w.visit_expr(&arm.body);
        });
    }

    fn visit_expr_if(&mut self, e: &'ast syn::ExprIf) {
        self.scoped(|w| {
            w.visit_expr(&e.cond);
            w.visit_block(&e.then_branch);
        });
        if let Some((_, else_branch)) = &e.else_branch {
            self.visit_expr(else_branch);
        }
    }

    fn visit_expr_let(&mut self, e: &'ast syn::ExprLet) {
        self.visit_expr(&e.expr);
        self.bind(&e.pat);
    }

    fn visit_expr_while(&mut self, e: &'ast syn::ExprWhile) {
        let label = e.label.as_ref().map(|l| l.name.ident.to_string());
        self.scoped(|w| {
            w.visit_expr(&e.cond);
            w.loops.push((label, true));
            w.visit_block(&e.body);
            w.loops.pop();
        });
    }

    fn visit_expr_for_loop(&mut self, e: &'ast syn::ExprForLoop) {
        self.visit_expr(&e.expr);
        let label = e.label.as_ref().map(|l| l.name.ident.to_string());
        self.scoped(|w| {
            w.bind(&e.pat);
            w.loops.push((label, true));
            w.visit_block(&e.body);
            w.loops.pop();
        });
    }

    fn visit_expr_loop(&mut self, e: &'ast syn::ExprLoop) {
        let label = e.label.as_ref().map(|l| l.name.ident.to_string());
        self.loops.push((label, true));
        self.visit_block(&e.body);
        self.loops.pop();
    }

    fn visit_expr_block(&mut self, e: &'ast syn::ExprBlock) {
        let labeled = e.label.is_some();
        if let Some(l) = &e.label {
            self.loops.push((Some(l.name.ident.to_string()), false));
        }
        self.visit_block(&e.block);
        if labeled {
            self.loops.pop();
        }
    }

    fn visit_expr_break(&mut self, e: &'ast syn::ExprBreak) {
        let inside = match &e.label {
            Some(l) => self
                .loops
                .iter()
                .any(|(name, _)| name.as_deref() == Some(&*l.ident.to_string())),
            None => self.loops.iter().any(|(_, is_loop)| *is_loop),
        };
        if !inside {
            self.control_flow(e, "`break`");
        }
        if let Some(x) = &e.expr {
            self.visit_expr(x);
        }
    }

    fn visit_expr_continue(&mut self, e: &'ast syn::ExprContinue) {
        let inside = match &e.label {
            Some(l) => self
                .loops
                .iter()
                .any(|(name, is_loop)| *is_loop && name.as_deref() == Some(&*l.ident.to_string())),
            None => self.loops.iter().any(|(_, is_loop)| *is_loop),
        };
        if !inside {
            self.control_flow(e, "`continue`");
        }
    }

    fn visit_expr_return(&mut self, e: &'ast syn::ExprReturn) {
        // The whole function is one closure: `return` leaves it with the function's value.
        if self.closure_depth == 0 && !self.whole {
            self.control_flow(e, "`return`");
        }
        if let Some(x) = &e.expr {
            self.visit_expr(x);
        }
    }

    fn visit_expr_try(&mut self, e: &'ast syn::ExprTry) {
        if self.closure_depth == 0 {
            self.fallible.get_or_insert(e.question_token.span);
        }
        self.visit_expr(&e.expr);
    }

    fn visit_expr_unsafe(&mut self, e: &'ast syn::ExprUnsafe) {
        let message = format!(
            "`unsafe` block in checkpointed {}: the macro cannot check unsafe code for side effects, and the segment runs again in backward; move it out of the segment, or lift the rule with `#[ckpt::allow(unsafe)]` once you have checked it is pure",
            self.segment
        );
        self.violation(Rule::Unsafe, e.unsafe_token, message);
        self.visit_block(&e.block);
    }

    fn visit_expr_assign(&mut self, e: &'ast syn::ExprAssign) {
        self.check_assign(&e.left, false, e);
        syn::visit::visit_expr_assign(self, e);
        // `h = b.forward(&h)`: the local now holds what the right side aliases.
        if let Expr::Path(p) = &*e.left
            && let Some(id) = p.path.get_ident()
            && self.is_local(&id.to_string())
        {
            let alias = self
                .alias_target(&e.right)
                .map(|a| Alias { mutable: true, ..a });
            self.realias(&id.to_string(), alias);
        }
    }

    fn visit_expr_binary(&mut self, e: &'ast syn::ExprBinary) {
        use syn::BinOp::*;
        let compound = matches!(
            e.op,
            AddAssign(_)
                | SubAssign(_)
                | MulAssign(_)
                | DivAssign(_)
                | RemAssign(_)
                | BitXorAssign(_)
                | BitAndAssign(_)
                | BitOrAssign(_)
                | ShlAssign(_)
                | ShrAssign(_)
        );
        if compound {
            self.check_assign(&e.left, true, e);
            self.check_op_assign_on_handle(&e.left, &e.op, e);
        }
        syn::visit::visit_expr_binary(self, e);
    }

    fn visit_expr_method_call(&mut self, e: &'ast syn::ExprMethodCall) {
        let method = e.method.to_string();
        self.check_inplace(&method, &e.receiver, e);
        self.check_mutation(&method, e.args.len(), &e.receiver, e);
        // A closure given to a method of an outside value (`TL.with(|c| ..)`,
        // `self.bias.as_ref().map(|b| ..)`) gets that value: its parameters alias it.
        let outside = self.outside(&e.receiver).map(|a| Alias {
            kind: a.kind.then(AliasKind::Shared),
            mutable: false,
            ..a
        });
        self.visit_expr(&e.receiver);
        for arg in &e.args {
            self.closure_alias = match arg {
                Expr::Closure(_) => outside.clone(),
                _ => None,
            };
            self.visit_expr(arg);
        }
        self.closure_alias = None;
    }

    fn visit_expr_call(&mut self, e: &'ast syn::ExprCall) {
        // `Tensor::relu_(&mut xs)`, `Vec::push(&mut v, x)`: the first argument is the receiver.
        if let (Expr::Path(p), Some(first)) = (&*e.func, e.args.first())
            && p.path.segments.len() > 1
            && let Some(last) = p.path.segments.last()
        {
            let method = last.ident.to_string();
            self.check_inplace(&method, first, e);
            self.check_mutation(&method, e.args.len() - 1, first, e);
        }
        syn::visit::visit_expr_call(self, e);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        if parse::is_cut_macro(mac) {
            self.cx.error_spanned_by(
                mac,
                "`ckpt::cut!()` must be a statement of the function body itself; nested in a block or an expression it would do nothing",
            );
            return;
        }
        let name = mac
            .path
            .segments
            .last()
            .map(|s| s.ident.to_string())
            .unwrap_or_default();
        if IO_MACROS.contains(&name.as_str()) {
            let message = format!(
                "`{name}!` in checkpointed {segment} runs again when backward replays the segment; move it out of the segment, or lift the rule with `#[ckpt::allow(io)]` (`ckpt::is_recomputing()` tells the replay apart)",
                segment = self.segment,
            );
            self.violation(Rule::Io, mac, message);
        }
        if EARLY_EXIT_MACROS.contains(&name.as_str()) && self.closure_depth == 0 {
            self.fallible.get_or_insert(mac.path.span());
        }
        self.check_rng_path(&mac.path);
        match mac.parse_body_with(Punctuated::<Expr, Token![,]>::parse_terminated) {
            Ok(args) => {
                for arg in &args {
                    self.visit_expr(arg);
                }
                self.scan_tokens(mac.tokens.clone(), false);
            }
            Err(_) => {
                self.scan_tokens(mac.tokens.clone(), true);
                self.scan_flags(mac, mac.tokens.clone());
            }
        }
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

#[cfg(test)]
mod tests {
    use super::format_captures;

    #[test]
    fn format_captures_are_found() {
        assert_eq!(
            format_captures(r#""{x} {y:?} {{z}} {0} {}""#),
            vec!["x", "y"]
        );
        assert!(format_captures("42").is_empty());
    }
}
