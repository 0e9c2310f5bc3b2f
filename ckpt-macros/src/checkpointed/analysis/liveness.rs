//! Liveness: which bindings cross each cut, and how. From what the walker found in each
//! group (its uses and definitions, `walker.rs`), liveness at group granularity gives the
//! values live after each group; a checkpointed group then takes its inputs in through
//! its stash (moved, shallow-cloned, or by reference) and hands its live definitions out.

use std::collections::{HashMap, HashSet};

use proc_macro2::Ident;
use syn::Stmt;

use super::walker::Walk;
use super::{Binding, Bound, Group, Input, Pass, pat_bindings, rules, segment_label};
use crate::checkpointed::layout::Cut;
use crate::checkpointed::parse::ParamKind;
use crate::ctxt::Ctxt;

/// What the walks of a function's groups found.
pub(super) struct Walked {
    /// One per group.
    pub walks: Vec<Walk>,
    /// Per group, the bindings visible before it.
    pub bound_before: Vec<Bound>,
    /// Top-level `let`s that refer to module state, by binding id, with their
    /// initializer's text.
    pub module_lets: HashMap<usize, String>,
}

/// A `let` without a value, assigned in a later group: the cut between them would move
/// an uninitialised binding.
pub(super) fn check_deferred_lets(cut: &Cut, stmts: &[Stmt], walked: &Walked, cx: &mut Ctxt) {
    let Walked {
        walks,
        bound_before,
        ..
    } = walked;
    let count = cut.ranges.len();
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
                            segment_label(cut, h, count)
                        ),
                    );
                }
            }
        }
    }
}

/// The names live on entry to each group, and (last) after the last one, computed
/// backwards: `live_in(g) = uses(g) ∪ (live_in(g + 1) − defs(g))`.
pub(super) fn live_in(walks: &[Walk]) -> Vec<HashSet<String>> {
    let count = walks.len();
    let mut live_in: Vec<HashSet<String>> = vec![HashSet::new(); count + 1];
    for g in (0..count).rev() {
        let defs: HashSet<String> = walks[g].defs.iter().map(|b| b.ident.to_string()).collect();
        let mut live: HashSet<String> = live_in[g + 1].difference(&defs).cloned().collect();
        live.extend(walks[g].uses.iter().map(|(n, _)| n.clone()));
        live_in[g] = live;
    }
    live_in
}

/// The groups with what crosses their cuts, and the module parameters some checkpointed
/// group captures (in parameter order). Errors (a `&mut` parameter or a reference to
/// module state crossing a cut) go to `cx`.
pub(super) fn stash(
    cut: &Cut,
    walked: &Walked,
    params: &[(Binding, ParamKind)],
    cx: &mut Ctxt,
) -> (Vec<Group>, Vec<Ident>) {
    let Walked {
        walks,
        bound_before,
        module_lets,
    } = walked;
    let count = cut.ranges.len();
    let live_in = live_in(walks);
    let mut groups = Vec::with_capacity(count);
    let mut captures: Vec<Ident> = Vec::new();
    for (g, range) in cut.ranges.iter().cloned().enumerate() {
        let walk = &walks[g];
        let live_out = &live_in[g + 1];
        let mutated = carried(walk, &bound_before[g], live_out);
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
            checkpointed: cut.checkpointed(g),
        };
        if cut.closure(g) {
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
                    Some(ParamKind::RefMut) => {
                        rules::ref_mut_enters(
                            name,
                            *span,
                            (cut.layout, !cut.checkpointed(g)),
                            g,
                            count,
                            cx,
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
                            segment_label(cut, g, count),
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
                            segment_label(cut, g, count),
                            text.trim_start_matches('&')
                        ),
                    );
                }
            }
            group.outputs = outputs;
        }
        groups.push(group);
    }
    captures.sort_by_key(|c| params.iter().position(|(b, _)| &b.ident == c));
    (groups, captures)
}

/// The outer bindings a group takes in and gives back ([`Group::carried`]).
///
/// Outer bindings (not parameters taken by reference) that the group assigns or mutates
/// are moved in and rebound after it, like a redefinition. So is every outer `mut`
/// binding the group uses and later code reads: a `mut` binding can be changed in ways
/// the syntax does not show (`v.sort()`, `f(&mut n)`, a macro), and a copy passed in
/// would leave the change behind. (The segment gets its input from the stash on
/// recompute, so changing it inside is not a side effect.)
fn carried(walk: &Walk, bound: &Bound, live_out: &HashSet<String>) -> Vec<Binding> {
    let mut mutated: Vec<Binding> = walk
        .mutated
        .iter()
        .filter_map(|name| match bound.get(name) {
            Some((b, None | Some(ParamKind::Owned))) => Some(b.clone()),
            _ => None,
        })
        .collect();
    // (The name is live after the group only as this binding when the group does not
    // define it again.)
    let redefined: HashSet<String> = walk.defs.iter().map(|b| b.ident.to_string()).collect();
    for (name, _) in &walk.uses {
        if let Some((b, None | Some(ParamKind::Owned))) = bound.get(name)
            && b.mutable
            && live_out.contains(name)
            && !redefined.contains(name)
            && !mutated.iter().any(|m| m.id == b.id)
        {
            mutated.push(b.clone());
        }
    }
    mutated
}
