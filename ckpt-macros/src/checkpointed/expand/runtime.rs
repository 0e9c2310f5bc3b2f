//! Cuts chosen at run time (`segments = auto`, `budget`, `segments = N` over a layer
//! loop): the statements as unit closures over a type-erased environment of slots, cut
//! by `::ckpt::__private::run_stages`.

use proc_macro2::{Span, TokenStream, TokenTree};
use quote::{ToTokens, format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::visit_mut::VisitMut;
use syn::{Expr, Ident, Pat, Stmt};

use super::prelude::{module_state, owner, prelude};
use super::stash::{binding_pat, nest, out_pattern, out_value, ref_rebind, ref_to_stash};
use super::{RewriteSelf, emit_stmt, head};
use crate::args::Args;
use crate::checkpointed::analysis::{Binding, Plan};
use crate::checkpointed::body::{self, LoopKind, LoopUnit};
use crate::checkpointed::layout::Schedule;
use crate::checkpointed::parse::{Function, ParamKind};
use crate::shared::mixed;

/// The witness of a slot's type (see `ckpt::plan`'s `statements` module).
pub(super) fn witness(slot: usize) -> Ident {
    format_ident!("__ckpt_w{}", slot, span = Span::mixed_site())
}

/// [`witness`] located at `at` (a use of it whose type errors should point there).
pub(super) fn witness_at(slot: usize, at: Span) -> Ident {
    format_ident!("__ckpt_w{}", slot, span = Span::mixed_site().located_at(at))
}

/// Cuts chosen at run time (`segments = auto`, `budget`, `segments = N` over a layer
/// loop): every statement but the last is a unit closure over a type-erased environment
/// of slots (one per binding that a later statement uses); a layer loop's closure runs a
/// range of its iterations. `::ckpt::__private::run_stages` cuts the chain of stages at
/// run time as the schedule says, and the last statement runs inline on what is left.
pub(super) fn expand_runtime(
    func: &Function,
    args: &Args,
    plan: &Plan,
    schedule: Schedule,
    warn: &TokenStream,
) -> TokenStream {
    let head = head(func);
    let stages = &plan.groups[..plan.groups.len() - 1];
    let n = stages.len();
    let n_params = plan.params.len();
    let is_param = |id: usize| id < n_params;

    // Slots: the parameters that units use (in parameter order), then the bindings that
    // units define and later statements use (in order of definition), and each `fold`'s
    // accumulator (its later iterations take it back).
    let mut slot_of: std::collections::HashMap<usize, usize> = std::collections::HashMap::new();
    let mut param_slots: Vec<(usize, &Binding, ParamKind)> = Vec::new();
    for (b, kind) in &plan.params {
        let used = stages
            .iter()
            .any(|g| g.inputs.iter().any(|i| i.binding.id == b.id));
        if used && !kind.captured() && *kind != ParamKind::RefMut {
            let s = slot_of.len();
            slot_of.insert(b.id, s);
            param_slots.push((s, b, *kind));
        }
    }
    let mut unit_outputs: Vec<Vec<Binding>> = Vec::with_capacity(n);
    for (i, g) in stages.iter().enumerate() {
        let mut outs = g.outputs.clone();
        // A layer loop gives back what it carries (its later iterations, maybe in another
        // segment, take it again), and a `fold` its accumulator.
        let carried = plan.loops[i]
            .is_some()
            .then(|| g.carried.iter().cloned().chain(fold_acc(plan, i)))
            .into_iter()
            .flatten();
        for b in carried.collect::<Vec<_>>() {
            if !outs.iter().any(|o| o.id == b.id) {
                outs.push(b);
            }
        }
        for b in &outs {
            let next = slot_of.len();
            slot_of.entry(b.id).or_insert(next);
        }
        unit_outputs.push(outs);
    }
    let slots = slot_of.len();
    let ref_kind = |id: usize| -> Option<ParamKind> {
        match plan.params.iter().find(|(b, _)| b.id == id) {
            Some((_, k)) => Some(*k),
            None => plan.ref_lets.get(&id).copied(),
        }
    };

    // The last statement takes from the environment what units defined, and the owned
    // parameters that units also used; other parameters are used as they are.
    let tail_takes: Vec<(&Binding, usize)> = plan
        .tail_uses
        .iter()
        .filter_map(|(b, kind)| match kind {
            Some(k) if k.captured() || *k == ParamKind::RefMut => None,
            Some(k) if k.by_ref() && is_param(b.id) => None,
            _ => slot_of.get(&b.id).map(|&s| (b, s)),
        })
        .collect();

    // Last use of each slot: a unit index, or `n` for the last statement.
    let mut last_use = vec![None; slots];
    for (i, g) in stages.iter().enumerate() {
        for input in &g.inputs {
            if let Some(&s) = slot_of.get(&input.binding.id) {
                last_use[s] = Some(i);
            }
        }
    }
    for (_, s) in &tail_takes {
        last_use[*s] = Some(n);
    }

    // The last statement as a profiling probe (`segments = auto` and `budget`): when it
    // passes the side-effect rules and everything it uses is in a slot or is module state
    // the units already share, the planner profiles it as the chain's last stage.
    let last = &plan.groups[plan.groups.len() - 1];
    let tail_captures: Vec<Ident> = plan
        .tail_uses
        .iter()
        .filter(|(_, k)| k.is_some_and(ParamKind::captured))
        .map(|(b, _)| b.ident.clone())
        .collect();
    // The probe's value gets the function's return type (its `Ok(..)` would not infer an
    // error type otherwise), which `impl Trait` cannot name.
    let ret_ty = match &func.sig.output {
        syn::ReturnType::Default => Some(quote!(())),
        syn::ReturnType::Type(_, ty) => {
            let tokens = ty.to_token_stream();
            (!mentions_impl(&tokens)).then_some(tokens)
        }
    };
    let probe_ok = matches!(schedule, Schedule::Auto(_))
        && ret_ty.is_some()
        && plan.tail_pure
        && (!last.uses_self || stages.iter().any(|g| g.uses_self))
        && tail_captures.iter().all(|c| plan.captures.contains(c))
        && plan
            .tail_uses
            .iter()
            .all(|(b, kind)| kind.is_some_and(ParamKind::captured) || slot_of.contains_key(&b.id));
    let tail_out: Option<usize> = probe_ok.then_some(slots);
    let slots = slots + usize::from(probe_ok);

    let options = mixed("__ckpt_options");
    let env = mixed("__ckpt_env");
    let shared_self = mixed("__ckpt_shared_self");
    let counts = mixed("__ckpt_counts");
    let prelude = prelude(args, plan, stages, &options, &shared_self);

    // The iteration counts, from the iterables as written (they use only `self` and the
    // parameters, which are still all here).
    // A `fold` runs at least one range (an empty one for an empty iterable), so that its
    // initial value is put as its result.
    let count_exprs = (0..n).map(|i| match &plan.loops[i] {
        Some(unit) => {
            let iter = &unit.iter;
            let at_least = match unit.kind {
                LoopKind::Fold { .. } => quote!(.max(1)),
                LoopKind::For(_) => TokenStream::new(),
            };
            quote_spanned!(iter.span()=> ::ckpt::__private::iter_count(#iter) #at_least)
        }
        None => quote!(1usize),
    });

    // The parameters that units use enter the environment.
    let puts = param_slots.iter().map(|(s, b, kind)| {
        let ident = &b.ident;
        let w = witness(*s);
        let sp = ident.span();
        // The key probe takes a reference: the parameter itself when it is one.
        let (probe, value) = match kind {
            ParamKind::RefData | ParamKind::RefSlice | ParamKind::RefStr => {
                (quote!(#ident), ref_to_stash(func, *kind, ident))
            }
            ParamKind::OptRefData | ParamKind::Borrowed => {
                (quote!(&#ident), ref_to_stash(func, *kind, ident))
            }
            _ => (quote!(&#ident), quote!(#ident)),
        };
        quote_spanned! {sp=>
            let #w = ::ckpt::__private::put_param(
                &mut #env,
                #s,
                (&::ckpt::__private::KeyProbe(#probe)).__ckpt_key_hash(),
                #value,
            );
        }
    });

    // The units.
    let stage_env = mixed("__ckpt_env");
    let range = mixed("__ckpt_range");
    let mut stage_defs = Vec::new();
    let mut stage_names = Vec::new();
    let mut units_table = Vec::new();
    for (i, g) in stages.iter().enumerate() {
        let stage_ident = format_ident!("__ckpt_s{}", i, span = Span::mixed_site());
        stage_names.push(stage_ident.clone());
        let outs = &unit_outputs[i];
        let out_slots: Vec<usize> = outs.iter().map(|b| slot_of[&b.id]).collect();
        let (clones, locks) = module_state(plan, g.uses_self, &g.captures, &shared_self);
        let init_only = &plan.init_only[i];
        let mut takes = Vec::new();
        let mut init_takes = Vec::new();
        let mut first_slots = Vec::new();
        let mut later_slots = Vec::new();
        for input in &g.inputs {
            let s = slot_of[&input.binding.id];
            first_slots.push(s);
            let ident = &input.binding.ident;
            let w = witness_at(s, ident.span());
            // A layer loop's unit may run part of its iterations and leave the rest to
            // a later segment, which takes what it reads again: it never consumes it.
            let looped = plan.loops[i].is_some() && !init_only.contains(&input.binding.id);
            let keep = (looped || last_use[s].is_some_and(|l| l > i)) && !out_slots.contains(&s);
            let pat = binding_pat(&input.binding);
            // Spanned on the binding's definition: a type that cannot be stashed is
            // reported there (by `put`, and again here), not at the attribute.
            let take =
                quote_spanned!(ident.span()=> ::ckpt::__private::take(#stage_env, #s, #w, #keep));
            let stmt = match ref_kind(input.binding.id) {
                Some(k) if k.by_ref() => {
                    let rebind = ref_rebind(k, ident, ident);
                    quote!(let #ident = #take; #rebind)
                }
                _ => quote!(#[allow(unused_mut, unused_variables)] let #pat = #take;),
            };
            if init_only.contains(&input.binding.id) {
                init_takes.push(stmt);
            } else {
                later_slots.push(s);
                takes.push(stmt);
            }
        }
        let mut_out = outs.iter().any(|b| b.mutable);
        let emit = |s: &Stmt| {
            let mut s = emit_stmt(s, true);
            match &mut s {
                // A non-final expression statement without `;` (a block-like `if`,
                // `for`): the unit's own tail follows it.
                Stmt::Expr(e, None) => s = Stmt::Expr(e.clone(), Some(Default::default())),
                // A `let mut` that a later statement mutates: not mutated here.
                Stmt::Local(l) if mut_out => l.attrs.push(syn::parse_quote!(#[allow(unused_mut)])),
                _ => {}
            }
            s
        };
        let (body, looped) = match &plan.loops[i] {
            None => {
                let stmts = plan.stmts[g.stmts.clone()].iter().map(emit);
                (quote!(#(#stmts)*), false)
            }
            Some(unit) => {
                let acc = fold_acc(plan, i).map(|b| slot_of[&b.id]);
                (
                    loop_body(unit, &plan.stmts[i], &stage_env, &range, &init_takes, acc),
                    true,
                )
            }
        };
        if let Some(acc) = fold_acc(plan, i) {
            later_slots.push(slot_of[&acc.id]);
        }
        let puts: Vec<TokenStream> = outs
            .iter()
            .map(|b| {
                let ident = &b.ident;
                let s = slot_of[&b.id];
                let value = match plan.ref_lets.get(&b.id) {
                    Some(_) => out_value(func, b, plan),
                    None => quote!(#ident),
                };
                quote_spanned!(ident.span()=> ::ckpt::__private::put(#stage_env, #s, #value))
            })
            .collect();
        let witnesses: Vec<TokenStream> = out_slots
            .iter()
            .map(|&s| {
                let w = witness(s);
                quote!(#w)
            })
            .collect();
        // A unit that defines nothing a later statement uses returns `()` by its last
        // statement; a `()` written after it would be clippy's `unused_unit` in the
        // user's code (a kept statement run for its side effect, `let _log = ..`).
        let out_value = if puts.is_empty() {
            TokenStream::new()
        } else {
            nest(puts)
        };
        let out_pat = nest(witnesses);
        let range_param = if looped {
            quote!(#range: ::core::ops::Range<usize>)
        } else {
            quote!(_: ::core::ops::Range<usize>)
        };
        stage_defs.push(quote! {
            let (#stage_ident, #out_pat) = {
                #(#clones)*
                ::ckpt::__private::stage(move |#stage_env: &mut ::ckpt::__private::Env, #range_param| {
                    #(#locks)*
                    #(#takes)*
                    #body
                    #out_value
                })
            };
        });
        let name = unit_label(plan, i);
        // A `#[ckpt::keep]` unit: never in a checkpointed segment.
        let kept = !g.checkpointed;
        units_table.push(quote! {
            ::ckpt::__private::Unit {
                name: #name,
                first_uses: &[#(#first_slots),*],
                uses: &[#(#later_slots),*],
                defs: &[#(#out_slots),*],
                looped: #looped,
                kept: #kept,
            }
        });
    }

    let probe = match tail_out {
        Some(out) => {
            let (clones, locks) = module_state(plan, last.uses_self, &tail_captures, &shared_self);
            let takes = plan.tail_uses.iter().filter_map(|(b, _)| {
                let s = *slot_of.get(&b.id)?;
                let ident = &b.ident;
                let w = witness_at(s, ident.span());
                let take = quote_spanned!(ident.span()=> ::ckpt::__private::take(#stage_env, #s, #w, true));
                let pat = binding_pat(b);
                Some(match ref_kind(b.id) {
                    Some(k) if k.by_ref() => {
                        let rebind = ref_rebind(k, ident, ident);
                        quote!(let #ident = #take; #rebind)
                    }
                    _ => quote!(#[allow(unused_mut, unused_variables)] let #pat = #take;),
                })
            });
            let body = plan.stmts[last.stmts.clone()]
                .iter()
                .map(|s| emit_stmt(s, true));
            let value = mixed("__ckpt_value");
            let ret_ty = ret_ty.clone().unwrap_or_default();
            quote! {
                ::core::option::Option::Some({
                    #(#clones)*
                    ::ckpt::__private::stage(move |#stage_env: &mut ::ckpt::__private::Env, _: ::core::ops::Range<usize>| {
                        #(#locks)*
                        #(#takes)*
                        let #value: #ret_ty = { #(#body)* };
                        (&::ckpt::__private::ProbePut(::core::cell::Cell::new(
                            ::core::option::Option::Some(#value),
                        )))
                        .__ckpt_probe_put(#stage_env, #out);
                    })
                    .0
                })
            }
        }
        None => quote!(::core::option::Option::None),
    };

    // The last statement.
    let tail_bind = tail_takes.iter().map(|(b, s)| {
        let w = witness_at(*s, b.ident.span());
        let take =
            quote_spanned!(b.ident.span()=> ::ckpt::__private::take(&mut #env, #s, #w, false));
        match plan.ref_lets.get(&b.id) {
            Some(_) => {
                let (own, rebind) = out_pattern(b, plan);
                quote!(let #own = #take; #rebind)
            }
            None => {
                let pat = binding_pat(b);
                quote!(#[allow(unused_mut)] let #pat = #take;)
            }
        }
    });
    // The slots the last statement reads: those it takes, and (when it is profiled, and
    // the probe takes them from the profile's environment) the parameters by reference
    // it uses as they are.
    let mut tail_slots: Vec<usize> = tail_takes.iter().map(|(_, s)| *s).collect();
    if tail_out.is_some() {
        for (b, _) in &plan.tail_uses {
            if let Some(&s) = slot_of.get(&b.id)
                && !tail_slots.contains(&s)
            {
                tail_slots.push(s);
            }
        }
    }
    let last = &plan.groups[plan.groups.len() - 1];
    let tail = plan.stmts[last.stmts.clone()]
        .iter()
        .map(|s| emit_stmt(s, false));

    let items = plan.items.iter().map(|s| emit_stmt(s, false));
    let fn_name = func.sig.ident.to_string();
    let owner = owner(plan);
    let first_span = plan
        .stmts
        .first()
        .map_or_else(Span::call_site, |s| s.span());
    let line = quote_spanned!(first_span=> ::core::line!());
    // The static lives in a block of its own: an item is not hygienic, and in the
    // function's scope it would collide with a user's `let` of the same name.
    let chain = mixed("__ckpt_chain");
    let schedule = schedule.tokens(quote!(::ckpt::__private::ChainSchedule));
    let tail_counts = plan.tail_counts;
    let tail_out_slot = tail_out.iter();
    let tail_name = unit_label(plan, plan.stmts.len() - 1);
    quote! {
        #head {
            #warn
            #(#items)*
            #[allow(unused_imports)]
            use ::ckpt::__private::{ViaHash as _, ViaNoHash as _, ViaNoPut as _, ViaStashPut as _};
            let #chain: &'static ::ckpt::__private::FnChain = {
                static CHAIN: ::ckpt::__private::FnChain = ::ckpt::__private::FnChain::new(
                    #fn_name,
                    #slots,
                    &[#(#units_table),*],
                    &[#(#tail_slots),*],
                    #tail_counts,
                    &[#(#tail_out_slot),*],
                    #tail_name,
                    #schedule,
                );
                &CHAIN
            };
            let #counts: [usize; #n] = [#(#count_exprs),*];
            #prelude
            #[allow(unused_mut)]
            let mut #env = ::ckpt::__private::Env::new(#slots);
            #(#puts)*
            #(#stage_defs)*
            ::ckpt::__private::run_stages(
                #chain,
                &#options,
                #owner,
                ::core::file!(),
                #line,
                ::std::vec![#(#stage_names),*],
                #probe,
                &#counts,
                &mut #env,
            );
            #(#tail_bind)*
            #(#tail)*
        }
    }
}

/// Whether `tokens` (a type) mentions `impl` (an `impl Trait`, which a `let` cannot name).
pub(super) fn mentions_impl(tokens: &TokenStream) -> bool {
    tokens.clone().into_iter().any(|tt| match tt {
        TokenTree::Ident(id) => id == "impl",
        TokenTree::Group(g) => mentions_impl(&g.stream()),
        _ => false,
    })
}

/// The accumulator of the `fold` that unit `i` is: the binding its `let` defines.
pub(super) fn fold_acc(plan: &Plan, i: usize) -> Option<Binding> {
    plan.fold_accs.get(i).cloned().flatten()
}

/// The body of a layer loop's unit closure for the iterations `range` (a local of the
/// closure): the `for` over `iter_range(ITER, range)`; or, for a `fold`, the accumulator
/// taken back (or, at the first iteration, its initial value, with the takes only it
/// needs) and folded over `iter_range(ITER, range)`.
pub(super) fn loop_body(
    unit: &LoopUnit,
    stmt: &Stmt,
    env: &Ident,
    range: &Ident,
    init_takes: &[TokenStream],
    acc_slot: Option<usize>,
) -> TokenStream {
    match &unit.kind {
        LoopKind::For(_) => {
            let Stmt::Expr(Expr::ForLoop(mut f), _) = emit_stmt(stmt, true) else {
                unreachable!("a `for` unit is a `for` statement")
            };
            let iter = &f.expr;
            *f.expr = syn::parse_quote!(::ckpt::__private::iter_range(#iter, #range));
            quote!(#f)
        }
        LoopKind::Fold {
            name,
            init,
            closure,
            ..
        } => {
            let rewrite = |e: &Expr| {
                let mut e = e.clone();
                RewriteSelf.visit_expr_mut(&mut e);
                e
            };
            let (init, closure, iter) = (rewrite(init), rewrite(closure), rewrite(&unit.iter));
            let acc = acc_slot.expect("a fold's accumulator has a slot");
            // The closure goes straight to `Iterator::fold`, which gives its parameters
            // their types.
            let first = mixed("__ckpt_first");
            quote! {
                let #first = #range.start == 0;
                let #name = ::ckpt::__private::iter_range(#iter, #range).fold(
                    if #first {
                        #(#init_takes)*
                        #init
                    } else {
                        ::ckpt::__private::take(#env, #acc, ::ckpt::__private::Witness::default(), false)
                    },
                    #closure,
                );
            }
        }
    }
}

/// A short source label of unit `i`, for segment names and `explain`: the statement, or
/// for a link of a split method chain its calls (`.apply(&self.conv2).max_pool2d_default(2)`).
pub(super) fn unit_label(plan: &Plan, i: usize) -> String {
    if let Some(unit) = &plan.loops[i] {
        return unit.label.clone();
    }
    let text = match &plan.stmts[i] {
        Stmt::Local(l) => match (&l.pat, &l.init) {
            (Pat::Ident(p), Some(init)) if p.ident.to_string().starts_with("__ckpt_") => {
                body::short_text(&init.expr, 80)
            }
            _ => body::short_text(&plan.stmts[i], 80),
        },
        stmt => body::short_text(stmt, 80),
    };
    // The previous link, moved in as `{ __ckpt_link3_0 }`, reads as a continuation.
    match (text.find("{ __ckpt_link"), text.find(" }.")) {
        (Some(a), Some(b)) if b > a => format!("{}…{}", &text[..a], &text[b + 2..]),
        _ => text,
    }
}
