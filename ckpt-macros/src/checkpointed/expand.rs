//! Code generation, by layout: the whole function as one closure run through
//! `::ckpt::__private::segment`; fixed groups, each checkpointed one such a closure and the
//! last inline; or units over an environment, cut at run time by
//! `::ckpt::__private::run_stages`.
//!
//! Generated locals are named `__ckpt_*` with `Span::mixed_site()`, so they can neither
//! clash with nor be seen by the user's code; the user's own bindings are rebound with
//! the identifiers of their binding sites (same hygiene), so the statements inside a
//! segment resolve as they did before.

use proc_macro2::{Group, Span, TokenStream, TokenTree};
use quote::{ToTokens, format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::visit_mut::VisitMut;
use syn::{Expr, Ident, Pat, Stmt};

use super::advice;
use super::analysis::{Binding, Group as SegmentGroup, Pass, Plan};
use super::body::{self, LoopKind, LoopUnit, Modules};
use super::layout::{Layout, Schedule};
use super::parse::{self, Function, ParamKind};
use crate::args::Args;
use crate::shared::mixed;

/// Tuples of the stash have at most this many elements; longer lists are nested.
const MAX_TUPLE: usize = 12;

/// `(a, b, ..)` with at most [`MAX_TUPLE`] elements per level; nested beyond that. The
/// same nesting is produced for the same length, so patterns match expressions.
fn nest(items: Vec<TokenStream>) -> TokenStream {
    if items.len() <= MAX_TUPLE {
        return quote!((#(#items,)*));
    }
    let chunks: Vec<TokenStream> = items.chunks(MAX_TUPLE).map(|c| nest(c.to_vec())).collect();
    nest(chunks)
}

/// Rewrites `self` (as an expression, and inside macro invocations' tokens) to the
/// segment's hygienic reference to the shared shallow clone of `self`.
struct RewriteSelf;

fn self_ident(at: Span) -> Ident {
    Ident::new("__ckpt_self", Span::mixed_site().located_at(at))
}

fn rewrite_self_tokens(tokens: TokenStream) -> TokenStream {
    let tts: Vec<TokenTree> = tokens.into_iter().collect();
    let mut out = Vec::with_capacity(tts.len());
    for (i, tt) in tts.iter().enumerate() {
        match tt {
            TokenTree::Ident(id) if id == "self" => {
                let before_path =
                    matches!(tts.get(i + 1), Some(TokenTree::Punct(p)) if p.as_char() == ':');
                out.push(if before_path {
                    tt.clone()
                } else {
                    TokenTree::Ident(self_ident(id.span()))
                });
            }
            TokenTree::Group(g) => {
                let mut new = Group::new(g.delimiter(), rewrite_self_tokens(g.stream()));
                new.set_span(g.span());
                out.push(TokenTree::Group(new));
            }
            _ => out.push(tt.clone()),
        }
    }
    out.into_iter().collect()
}

impl VisitMut for RewriteSelf {
    fn visit_expr_mut(&mut self, e: &mut Expr) {
        if let Expr::Path(p) = e
            && p.qself.is_none()
            && p.path.is_ident("self")
        {
            let span = p.path.span();
            p.path = syn::Path::from(self_ident(span));
            return;
        }
        syn::visit_mut::visit_expr_mut(self, e);
    }

    fn visit_macro_mut(&mut self, m: &mut syn::Macro) {
        m.tokens = rewrite_self_tokens(std::mem::take(&mut m.tokens));
    }

    fn visit_item_mut(&mut self, _: &mut syn::Item) {}
}

/// A user statement as emitted: without `#[ckpt::allow]`, with `self` rewritten inside
/// checkpointed segments.
fn emit_stmt(stmt: &Stmt, rewrite_self: bool) -> Stmt {
    let mut stmt = stmt.clone();
    parse::strip_allow_attrs(&mut stmt);
    if rewrite_self {
        RewriteSelf.visit_stmt_mut(&mut stmt);
    }
    stmt
}

/// The function unchanged but for the `#[ckpt::allow]` markers (emitted next to errors).
pub(crate) fn original(func: &Function) -> TokenStream {
    let Function {
        attrs,
        vis,
        sig,
        block,
    } = func;
    let mut block = (**block).clone();
    for stmt in &mut block.stmts {
        parse::strip_allow_attrs(stmt);
    }
    quote!(#(#attrs)* #vis #sig #block)
}

/// The expanded function.
pub(crate) fn expand(func: &Function, args: &Args, plan: &Plan) -> TokenStream {
    let module_params: Vec<String> = plan
        .params
        .iter()
        .filter(|(_, k)| k.captured())
        .map(|(b, _)| b.ident.to_string())
        .collect();
    let modules = Modules {
        params: &module_params,
    };
    let warn = advice::warnings(&advice::advise(plan, &modules, &func.sig.ident.to_string()));
    match plan.layout {
        Layout::Whole => expand_whole(func, args, plan, &warn),
        Layout::Static => expand_static(func, args, plan, &warn),
        Layout::Runtime(schedule) => expand_runtime(func, args, plan, schedule, &warn),
    }
}

/// Groups fixed at compile time: each checkpointed group is a closure run through
/// `::ckpt::__private::segment`; the last group stays inline.
fn expand_static(func: &Function, args: &Args, plan: &Plan, warn: &TokenStream) -> TokenStream {
    let Function {
        attrs, vis, sig, ..
    } = func;
    let sig = &allow_unused_mut_params(sig);
    let count = plan.groups.len();
    let items = plan.items.iter().map(|s| emit_stmt(s, false));

    let options = mixed("__ckpt_options");
    let shared_self = mixed("__ckpt_shared_self");
    let prelude = prelude(
        args,
        plan,
        &plan.groups[..count - 1],
        &options,
        &shared_self,
    );

    let segments = plan.groups[..count - 1]
        .iter()
        .enumerate()
        .map(|(g, group)| segment(func, plan, g, group, &options, &shared_self));
    let last = &plan.groups[count - 1];
    let inline = plan.stmts[last.stmts.clone()]
        .iter()
        .map(|s| emit_stmt(s, false));

    quote! {
        #(#attrs)*
        #vis #sig {
            #warn
            #(#items)*
            #prelude
            #(#segments)*
            #(#inline)*
        }
    }
}

/// `#[checkpointed]` without cuts: the whole body is one checkpointed segment whose value
/// is the function's (`return` leaves the closure with it, `?` leaves it with the error).
fn expand_whole(func: &Function, args: &Args, plan: &Plan, warn: &TokenStream) -> TokenStream {
    let Function {
        attrs, vis, sig, ..
    } = func;
    let sig = &allow_unused_mut_params(sig);
    let items = plan.items.iter().map(|s| emit_stmt(s, false));
    let options = mixed("__ckpt_options");
    let shared_self = mixed("__ckpt_shared_self");
    let prelude = prelude(args, plan, &plan.groups, &options, &shared_self);
    let group = &plan.groups[0];
    let name = segment_name_tokens(func, plan, 0, 1, group);
    let inputs = SegmentInputs::new(func, group);
    let (clones, locks) = module_state(plan, group.uses_self, &group.captures, &shared_self);
    let body = plan.stmts.iter().map(|s| emit_stmt(s, true));
    let SegmentInputs {
        closure_param,
        destructure,
        rebinds,
        value,
    } = inputs;
    let fallible = group.fallible.is_some() || returns_result(&func.sig);
    let run = if fallible {
        quote!(::ckpt::__private::segment_fallible)
    } else {
        quote!(::ckpt::__private::segment)
    };
    quote! {
        #(#attrs)*
        #vis #sig {
            #warn
            #(#items)*
            #prelude
            #(#clones)*
            #run(&#options, #name, move |#closure_param| {
                #destructure
                #(#locks)*
                #(#rebinds)*
                #(#body)*
            }, #value)
        }
    }
}

/// Whether the function is written to return `Result<..>` (syntactically).
fn returns_result(sig: &syn::Signature) -> bool {
    match &sig.output {
        syn::ReturnType::Type(_, ty) => matches!(
            &**ty,
            syn::Type::Path(p) if p.path.segments.last().is_some_and(|s| s.ident == "Result")
        ),
        syn::ReturnType::Default => false,
    }
}

/// The statements both expansions start with: the checkpoint options, and one shared
/// shallow clone per call of `self` and of each module parameter (`capture`) when a
/// checkpointed `group` uses them.
fn prelude(
    args: &Args,
    plan: &Plan,
    groups: &[SegmentGroup],
    options: &Ident,
    shared_self: &Ident,
) -> TokenStream {
    let new_options = crate::args::options_tokens(
        args.preserve_rng_state,
        args.determinism_check,
        args.policy.map(crate::args::PolicyArg::tokens),
    );
    let self_capture = match (groups.iter().any(|g| g.uses_self), plan.self_span) {
        (true, Some(span)) => {
            let self_token = Ident::new("self", span);
            quote_spanned!(span=> let #shared_self = ::ckpt::__private::capture(#self_token);)
        }
        _ => TokenStream::new(),
    };
    let captures = plan.captures.iter().map(|c| {
        let shared = capture_ident(c);
        let capture = match capture_kind(plan, c) {
            ParamKind::OptCapture => quote!(capture_opt),
            ParamKind::CaptureSlice => quote!(capture_slice),
            _ => quote!(capture),
        };
        quote_spanned!(c.span()=> let #shared = ::ckpt::__private::#capture(#c);)
    });
    quote! {
        let #options = #new_options;
        #self_capture
        #(#captures)*
    }
}

/// A `mut` parameter that a segment takes over is rebound (with its `mut`) inside the
/// segment, so the parameter's own `mut` may go unused in the expansion: silence that
/// lint on exactly those parameters, so users with `-D warnings` see no warning that
/// their code does not have.
fn allow_unused_mut_params(sig: &syn::Signature) -> syn::Signature {
    let mut sig = sig.clone();
    for input in &mut sig.inputs {
        if let syn::FnArg::Typed(pat_type) = input
            && let syn::Pat::Ident(pat) = &*pat_type.pat
            && pat.mutability.is_some()
        {
            pat_type.attrs.push(syn::parse_quote!(#[allow(unused_mut)]));
        }
    }
    sig
}

/// How a segment (or an auto-mode stage) reaches module state, `self` and `&Module`
/// parameters, each shared by one `ckpt::Shared` shallow clone per call: the `Arc`
/// clones moved into its closure, and the locks taken inside it that rebind `self` (as
/// `__ckpt_self`) and the parameters by name.
fn module_state(
    plan: &Plan,
    uses_self: bool,
    captures: &[Ident],
    shared_self: &Ident,
) -> (Vec<TokenStream>, Vec<TokenStream>) {
    let mut clones = Vec::new();
    let mut locks = Vec::new();
    if uses_self {
        let guard = mixed("__ckpt_self_guard");
        let self_ref = mixed("__ckpt_self");
        clones.push(quote!(let #shared_self = ::ckpt::__private::ShallowClone::shallow_clone(&#shared_self);));
        locks.push(quote!(let #guard = #shared_self.lock(); let #self_ref = &*#guard;));
    }
    for c in captures {
        let shared = capture_ident(c);
        let guard = format_ident!("{}_guard", shared);
        clones
            .push(quote!(let #shared = ::ckpt::__private::ShallowClone::shallow_clone(&#shared);));
        match capture_kind(plan, c) {
            ParamKind::OptCapture => locks.push(quote! {
                let #guard = #shared.as_ref().map(::ckpt::__private::Shared::lock);
                let #c = #guard.as_deref();
            }),
            ParamKind::CaptureSlice => {
                locks.push(quote!(let #guard = #shared.lock(); let #c: &[_] = &#guard;));
            }
            _ => locks.push(quote!(let #guard = #shared.lock(); let #c = &*#guard;)),
        }
    }
    (clones, locks)
}

/// How the module parameter `c` is captured: [`ParamKind::Capture`],
/// [`ParamKind::OptCapture`] or [`ParamKind::CaptureSlice`].
fn capture_kind(plan: &Plan, c: &Ident) -> ParamKind {
    plan.params
        .iter()
        .find(|(b, _)| &b.ident == c)
        .map_or(ParamKind::Capture, |(_, k)| *k)
}

fn capture_ident(param: &Ident) -> Ident {
    format_ident!(
        "__ckpt_capture_{}",
        param.to_string().trim_start_matches("r#"),
        span = Span::mixed_site()
    )
}

fn binding_pat(b: &Binding) -> TokenStream {
    let ident = &b.ident;
    if b.mutable {
        quote!(mut #ident)
    } else {
        quote!(#ident)
    }
}

/// `Some(short_type_name::<Self>())` for a method, `None` for a free function: the
/// owner part of a segment's name.
fn owner(plan: &Plan) -> TokenStream {
    if plan.self_span.is_some() {
        quote!(::core::option::Option::Some(
            ::ckpt::__private::short_type_name::<Self>()
        ))
    } else {
        quote!(::core::option::Option::None)
    }
}

/// The name of segment `g` of `count`: "`Type::method` segment 2 of 3 (src/model.rs:42)",
/// built at run time from the owner's type name and the first statement's line.
fn segment_name_tokens(
    func: &Function,
    plan: &Plan,
    g: usize,
    count: usize,
    group: &SegmentGroup,
) -> TokenStream {
    let first_span = plan.stmts[group.stmts.clone()]
        .first()
        .map_or_else(Span::call_site, |s| s.span());
    let fn_name = func.sig.ident.to_string();
    let owner = owner(plan);
    let index = g + 1;
    let line = quote_spanned!(first_span=> ::core::line!());
    quote! {
        ::ckpt::__private::segment_name(#owner, #fn_name, #index, #count, ::core::file!(), #line)
    }
}

/// The `T` of a parameter `name: impl Borrow<T>` of `func`.
fn borrowed_type(func: &Function, name: &Ident) -> Option<syn::Type> {
    func.sig.inputs.iter().find_map(|arg| match arg {
        syn::FnArg::Typed(pt) if matches!(&*pt.pat, Pat::Ident(p) if &p.ident == name) => {
            let syn::Type::ImplTrait(it) = &*pt.ty else {
                return None;
            };
            it.bounds.iter().find_map(|b| match b {
                syn::TypeParamBound::Trait(t) => {
                    let last = t.path.segments.last()?;
                    let syn::PathArguments::AngleBracketed(a) = &last.arguments else {
                        return None;
                    };
                    match a.args.first()? {
                        syn::GenericArgument::Type(ty) if last.ident == "Borrow" => {
                            Some(ty.clone())
                        }
                        _ => None,
                    }
                }
                _ => None,
            })
        }
        _ => None,
    })
}

/// What goes into the stash for `ident`, a reference to data of `kind`
/// ([`ParamKind::by_ref`]): a shallow clone of what it refers to.
fn ref_to_stash(func: &Function, kind: ParamKind, ident: &Ident) -> TokenStream {
    let sp = ident.span();
    match kind {
        ParamKind::RefSlice => quote_spanned!(sp=> ::ckpt::__private::slice_to_vec(#ident)),
        ParamKind::RefStr => {
            quote_spanned!(sp=> ::ckpt::__private::stash(::std::string::String::from(#ident)))
        }
        ParamKind::OptRefData => quote_spanned!(sp=> ::ckpt::__private::dup_opt(#ident)),
        ParamKind::Borrowed => {
            let ty = borrowed_type(func, ident).map_or_else(|| quote!(_), |t| quote!(#t));
            quote_spanned!(sp=> ::ckpt::__private::dup(::core::borrow::Borrow::<#ty>::borrow(&#ident)))
        }
        _ => quote_spanned!(sp=> ::ckpt::__private::dup(#ident)),
    }
}

/// `let ident = ..;` rebinding `ident` as the reference of `kind` it was, to `from`, the
/// owned shallow clone that crossed the cut. An `impl Borrow<T>` parameter stays the owned
/// `T` (itself `Borrow<T>`, so `xs.borrow()` reads as before).
fn ref_rebind(kind: ParamKind, ident: &Ident, from: &Ident) -> TokenStream {
    match kind {
        ParamKind::RefSlice => quote!(let #ident: &[_] = &#from;),
        ParamKind::RefStr => quote!(let #ident: &str = &#from;),
        ParamKind::OptRefData => quote!(let #ident = #from.as_ref();),
        ParamKind::Borrowed if ident == from => TokenStream::new(),
        ParamKind::Borrowed => quote!(let #ident = #from;),
        _ => quote!(let #ident = &#from;),
    }
}

/// What goes into a segment's stash and how it is rebound inside its closure.
struct SegmentInputs {
    /// The closure's parameter (`__ckpt_input`, or `_: ()` without inputs).
    closure_param: TokenStream,
    /// `let (a, mut b, ..) = __ckpt_input;`
    destructure: TokenStream,
    /// `let xs = &xs;` for the values that were references outside.
    rebinds: Vec<TokenStream>,
    /// The stash value: `(stash(a), dup(&b), ..)`.
    value: TokenStream,
}

impl SegmentInputs {
    fn new(func: &Function, group: &SegmentGroup) -> Self {
        let mut in_exprs = Vec::new();
        let mut in_pats = Vec::new();
        let mut rebinds = Vec::new();
        for input in &group.inputs {
            let ident = &input.binding.ident;
            let sp = ident.span();
            in_exprs.push(match input.pass {
                Pass::Move => quote_spanned!(sp=> ::ckpt::__private::stash(#ident)),
                Pass::Dup => quote_spanned!(sp=> ::ckpt::__private::dup(&#ident)),
                Pass::ByRef(kind) => ref_to_stash(func, kind, ident),
            });
            match input.pass {
                Pass::Move | Pass::Dup => in_pats.push(binding_pat(&input.binding)),
                Pass::ByRef(kind) => {
                    in_pats.push(quote!(#ident));
                    rebinds.push(ref_rebind(kind, ident, ident));
                }
            }
        }
        let input = mixed("__ckpt_input");
        let any_mut_in = group
            .inputs
            .iter()
            .any(|i| i.binding.mutable && matches!(i.pass, Pass::Move | Pass::Dup));
        let allow_mut_in = any_mut_in.then(|| quote!(#[allow(unused_mut)]));
        let (closure_param, destructure) = if in_pats.is_empty() {
            (quote!(_: ()), TokenStream::new())
        } else {
            let pat = nest(in_pats);
            (quote!(#input), quote!(#allow_mut_in let #pat = #input;))
        };
        SegmentInputs {
            closure_param,
            destructure,
            rebinds,
            value: nest(in_exprs),
        }
    }
}

/// How a binding leaves a segment (or a stage, into its slot): by value, or, for a `let`
/// that holds a reference to data, as a shallow clone (`dup`, `slice_to_vec`, an owned
/// `String`) that is rebound as a reference afterwards.
fn out_value(func: &Function, b: &Binding, plan: &Plan) -> TokenStream {
    let ident = &b.ident;
    match plan.ref_lets.get(&b.id) {
        Some(kind) => ref_to_stash(func, *kind, ident),
        None => quote_spanned!(ident.span()=> ::ckpt::__private::stash(#ident)),
    }
}

/// The owner of the shallow clone a reference `let` is rebound to after a segment.
fn owner_ident(b: &Binding) -> Ident {
    format_ident!(
        "__ckpt_own_{}",
        b.ident.to_string().trim_start_matches("r#"),
        span = Span::mixed_site().located_at(b.ident.span())
    )
}

/// The pattern an output is received with, and, for a reference `let`, the statement
/// that rebinds its name to the received owner.
fn out_pattern(b: &Binding, plan: &Plan) -> (TokenStream, Option<TokenStream>) {
    let ident = &b.ident;
    match plan.ref_lets.get(&b.id) {
        None => (binding_pat(b), None),
        Some(kind) => {
            let own = owner_ident(b);
            let rebind = ref_rebind(*kind, ident, &own);
            (quote!(#own), Some(rebind))
        }
    }
}

/// One checkpointed group.
fn segment(
    func: &Function,
    plan: &Plan,
    g: usize,
    group: &SegmentGroup,
    options: &Ident,
    shared_self: &Ident,
) -> TokenStream {
    let count = plan.groups.len();
    let stmts = &plan.stmts[group.stmts.clone()];
    let name = segment_name_tokens(func, plan, g, count, group);
    let SegmentInputs {
        closure_param,
        destructure,
        rebinds,
        value: input_value,
    } = SegmentInputs::new(func, group);

    // Module state: `self` and `&Module` parameters, one shared shallow clone per call.
    let (clones, locks) = module_state(plan, group.uses_self, &group.captures, shared_self);

    // Outputs: bindings defined here and used later.
    let out_exprs: Vec<TokenStream> = group
        .outputs
        .iter()
        .map(|b| out_value(func, b, plan))
        .collect();
    let (out_pats, out_rebinds): (Vec<TokenStream>, Vec<Option<TokenStream>>) =
        group.outputs.iter().map(|b| out_pattern(b, plan)).unzip();
    let has_outputs = !out_exprs.is_empty();
    // Without outputs the closure returns `()` by its last statement; a `()` written
    // after it would be clippy's `unused_unit` in the user's code.
    let out_value = if has_outputs {
        nest(out_exprs)
    } else {
        TokenStream::new()
    };
    let ok_value = if has_outputs {
        out_value.clone()
    } else {
        quote!(())
    };
    let body_stmts = stmts.iter().map(|s| emit_stmt(s, true));

    let call = match group.fallible {
        None => quote! {
            ::ckpt::__private::segment(&#options, #name, move |#closure_param| {
                #destructure
                #(#locks)*
                #(#rebinds)*
                #(#body_stmts)*
                #out_value
            }, #input_value)
        },
        Some(q) => {
            let out = mixed("__ckpt_out");
            let err = mixed("__ckpt_err");
            let exit = quote_spanned!(q=> return ::core::result::Result::Err(#err));
            quote! {
                match ::ckpt::__private::segment_fallible(&#options, #name, move |#closure_param| {
                    #destructure
                    #(#locks)*
                    #(#rebinds)*
                    #(#body_stmts)*
                    ::core::result::Result::Ok(#ok_value)
                }, #input_value) {
                    ::core::result::Result::Ok(#out) => #out,
                    ::core::result::Result::Err(#err) => #exit,
                }
            }
        }
    };

    if has_outputs {
        let pat = nest(out_pats);
        let allow_mut = group
            .outputs
            .iter()
            .any(|b| b.mutable)
            .then(|| quote!(#[allow(unused_mut)]));
        let out_rebinds = out_rebinds.into_iter().flatten();
        quote! {
            #allow_mut
            let #pat = {
                #(#clones)*
                #call
            };
            #(#out_rebinds)*
        }
    } else {
        quote! {
            {
                #(#clones)*
                #call
            };
        }
    }
}

/// The witness of a slot's type (see `ckpt::plan`'s `statements` module).
fn witness(slot: usize) -> Ident {
    format_ident!("__ckpt_w{}", slot, span = Span::mixed_site())
}

/// [`witness`] located at `at` (a use of it whose type errors should point there).
fn witness_at(slot: usize, at: Span) -> Ident {
    format_ident!("__ckpt_w{}", slot, span = Span::mixed_site().located_at(at))
}

/// Cuts chosen at run time (`segments = auto`, `budget`, `segments = N` over a layer
/// loop): every statement but the last is a unit closure over a type-erased environment
/// of slots (one per binding that a later statement uses); a layer loop's closure runs a
/// range of its iterations. `::ckpt::__private::run_stages` cuts the chain of stages at
/// run time as the schedule says, and the last statement runs inline on what is left.
fn expand_runtime(
    func: &Function,
    args: &Args,
    plan: &Plan,
    schedule: Schedule,
    warn: &TokenStream,
) -> TokenStream {
    let Function {
        attrs, vis, sig, ..
    } = func;
    let sig = &allow_unused_mut_params(sig);
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
        let (out_value, out_pat) = (nest(puts), nest(witnesses));
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
        units_table.push(quote! {
            ::ckpt::__private::Unit {
                name: #name,
                first_uses: &[#(#first_slots),*],
                uses: &[#(#later_slots),*],
                defs: &[#(#out_slots),*],
                looped: #looped,
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
    let schedule = match schedule {
        Schedule::Segments(k) => quote!(::ckpt::__private::ChainSchedule::Segments(#k)),
        Schedule::Auto(objective) => {
            let objective = objective.tokens();
            quote!(::ckpt::__private::ChainSchedule::Auto(#objective))
        }
    };
    let tail_counts = plan.tail_counts;
    let tail_out_slot = tail_out.iter();
    let tail_name = unit_label(plan, plan.stmts.len() - 1);
    quote! {
        #(#attrs)*
        #vis #sig {
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
fn mentions_impl(tokens: &TokenStream) -> bool {
    tokens.clone().into_iter().any(|tt| match tt {
        TokenTree::Ident(id) => id == "impl",
        TokenTree::Group(g) => mentions_impl(&g.stream()),
        _ => false,
    })
}

/// The accumulator of the `fold` that unit `i` is: the binding its `let` defines.
fn fold_acc(plan: &Plan, i: usize) -> Option<Binding> {
    plan.fold_accs.get(i).cloned().flatten()
}

/// The body of a layer loop's unit closure for the iterations `range` (a local of the
/// closure): the `for` over `iter_range(ITER, range)`; or, for a `fold`, the accumulator
/// taken back (or, at the first iteration, its initial value, with the takes only it
/// needs) and folded over `iter_range(ITER, range)`.
fn loop_body(
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
fn unit_label(plan: &Plan, i: usize) -> String {
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
