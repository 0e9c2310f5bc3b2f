//! Analysis of a `#[checkpointed]` function: its parameters, its layout (`layout.rs`),
//! a walk over each group of statements, and from the walks the [`Plan`] that expand
//! reads. The parts:
//!
//! - `walker.rs`: the scope-aware walk of one group (uses, definitions, `?`);
//! - `rules.rs`, `alias.rs`, `names.rs`: the side-effect rules the walk applies, the
//!   alias tracking they follow locals with, and the names they match;
//! - `liveness.rs`: which bindings cross each cut, and how (the stash);
//! - `loops.rs`: the checks of a layer loop cut between its iterations.
//!
//! The macro has no type information. A *binding* is a name introduced by a parameter or
//! a top-level `let` of the body; what counts as a *use* of it is in `walker.rs`.

mod alias;
mod liveness;
mod loops;
mod names;
mod rules;
mod walker;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::ops::Range;

use proc_macro2::Span;
use syn::{FnArg, Ident, Pat, Stmt};

use super::body::{self, Body, LoopKind, LoopUnit, Modules};
use super::layout::{self, Cut, Layout};
use super::parse::{self, ParamKind};
use crate::args::Args;
use crate::ctxt::Ctxt;
use liveness::Walked;
use walker::Walker;

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
    /// Whether the group runs as a checkpointed segment ([`Cut::checkpointed`]); the last
    /// group and groups of `#[ckpt::keep]` statements run inline.
    pub checkpointed: bool,
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

/// The bindings visible at a point of the body, by name: each with its kind when it is
/// a parameter or a reference `let` ([`Plan::ref_lets`]).
type Bound = HashMap<String, (Binding, Option<ParamKind>)>;

/// Analyzes `func`. Errors go to `cx`; `None` when the function cannot be cut at all.
pub(crate) fn analyze(func: &parse::Function, args: &Args, cx: &mut Ctxt) -> Option<Plan> {
    let self_span = parse::check_signature(&func.sig, cx);
    let params = params(&func.sig);
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
    let count = cut.ranges.len();

    // Walk each group: uses, definitions, side-effect rules.
    let mut bound: Bound = params
        .iter()
        .map(|(b, k)| (b.ident.to_string(), (b.clone(), Some(*k))))
        .collect();
    let fn_name = func.sig.ident.to_string();
    let mut walked = Walked {
        walks: Vec::with_capacity(count),
        bound_before: Vec::with_capacity(count),
        module_lets: HashMap::new(),
    };
    let mut ref_lets: HashMap<usize, ParamKind> = HashMap::new();
    let mut init_only = vec![Vec::new(); stmts.len()];
    let mut fold_accs = vec![None; stmts.len()];
    let mut next_id = params.len();
    for (g, range) in cut.ranges.iter().enumerate() {
        let checkpointed = cut.checkpointed(g);
        let label = match cut.layout {
            Layout::Runtime(_) => format!("statement {} of {count}", g + 1),
            Layout::Whole => "segment (the whole function)".to_owned(),
            Layout::Static if !checkpointed => format!("group {} of {count} (inline)", g + 1),
            Layout::Static => format!("segment {} of {count}", g + 1),
        };
        // A kept unit of a run-time chain is a closure (the structural rules apply) that
        // backward never recomputes; it runs once a step (the side-effect rules do not
        // apply) unless the planner profiles it (`auto`, `budget`: the first call for an
        // input runs every statement again for the profile, so they do).
        let closure = cut.closure(g);
        let kept = closure && !checkpointed;
        let profiled = matches!(cut.layout, Layout::Runtime(layout::Schedule::Auto(_)));
        let mut walker = Walker::new(cx, closure, label, &fn_name);
        walker.once = kept && !profiled;
        walker.kept_profiled = kept && profiled;
        walker.runtime = runtime;
        walker.whole = matches!(cut.layout, Layout::Whole);
        walker.outer = bound.iter().map(|(n, (_, k))| (n.clone(), *k)).collect();
        for stmt in &stmts[range.clone()] {
            walker.walk_stmt(stmt, true);
        }
        let mut walk = walker.finish();
        if let (true, Some(q)) = (closure, walk.fallible) {
            rules::check_fallible(q, (cut.layout, !checkpointed), g, count, &func.sig, cx);
        }
        if runtime
            && closure
            && let Some(unit) = &loops[g]
        {
            loops::check_loop(unit, &bound, params.len(), &fn_name, cx);
            if let LoopKind::Fold { init, .. } = &unit.kind {
                init_only[g] = loops::fold_init_only(unit, init, &bound);
            }
        }
        walked.bound_before.push(bound.clone());
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
                walked.module_lets.insert(b.id, text.clone());
            }
            bound.insert(b.ident.to_string(), (b.clone(), kind));
        }
        walked.walks.push(walk);
    }

    liveness::check_deferred_lets(&cut, &stmts, &walked, cx);
    let (groups, captures) = liveness::stash(&cut, &walked, &params, cx);
    let last = &walked.bound_before[count - 1];
    let tail_uses: Vec<(Binding, Option<ParamKind>)> = walked.walks[count - 1]
        .uses
        .iter()
        .filter_map(|(name, _)| last.get(name).cloned())
        .collect();
    // Whether the last statement of a run-time chain may also run in the profile (it
    // then is the chain's last stage for the planner): it passes the side-effect rules,
    // has no `?`, and takes no `&mut` parameter.
    let tail_pure = runtime && walked.walks[count - 1].fallible.is_none() && {
        let mut scratch = Ctxt::default();
        let mut walker = Walker::new(&mut scratch, true, String::new(), &fn_name);
        walker.runtime = true;
        walker.outer = last.iter().map(|(n, (_, k))| (n.clone(), *k)).collect();
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

/// The parameters' bindings, in order (their ids are their positions), with their kinds.
fn params(sig: &syn::Signature) -> Vec<(Binding, ParamKind)> {
    let mut params: Vec<(Binding, ParamKind)> = Vec::new();
    for arg in &sig.inputs {
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
    params
}

/// "checkpointed segment 2 of 3", "statement 2 of 5", "the checkpointed function".
fn segment_label(cut: &Cut, g: usize, count: usize) -> String {
    match cut.layout {
        Layout::Whole => "the checkpointed function".to_owned(),
        Layout::Static => format!("checkpointed segment {} of {count}", g + 1),
        Layout::Runtime(_) => format!("statement {} of {count}", g + 1),
    }
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
