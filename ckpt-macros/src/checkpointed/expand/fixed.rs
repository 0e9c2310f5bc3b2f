//! Layouts fixed at compile time: the whole function as one segment, or groups of
//! statements each run through `::ckpt::__private::segment` (or `segment_fallible` for
//! a group with `?`), the last group inline.

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::Ident;

use super::prelude::{module_state, prelude, segment_name_tokens};
use super::stash::{SegmentInputs, nest, out_pattern, out_value};
use super::{emit_stmt, head};
use crate::args::Args;
use crate::checkpointed::analysis::{Group as SegmentGroup, Plan};
use crate::checkpointed::parse::Function;
use crate::shared::mixed;

/// What both fixed layouts start with: the function's head, its hoisted items, and the
/// names of the options and the shared `self` with the prelude that binds them for the
/// checkpointed `groups`.
fn start(
    func: &Function,
    args: &Args,
    plan: &Plan,
    groups: &[SegmentGroup],
) -> (TokenStream, Vec<syn::Stmt>, Ident, Ident, TokenStream) {
    let options = mixed("__ckpt_options");
    let shared_self = mixed("__ckpt_shared_self");
    let prelude = prelude(args, plan, groups, &options, &shared_self);
    let items = plan.items.iter().map(|s| emit_stmt(s, false)).collect();
    (head(func), items, options, shared_self, prelude)
}

/// Groups fixed at compile time: each checkpointed group is a closure run through
/// `::ckpt::__private::segment`; the last group and groups of `#[ckpt::keep]` statements
/// stay inline, in order between them.
pub(super) fn expand_static(
    func: &Function,
    args: &Args,
    plan: &Plan,
    warn: &TokenStream,
) -> TokenStream {
    let checkpointed: Vec<SegmentGroup> = plan
        .groups
        .iter()
        .filter(|g| g.checkpointed)
        .cloned()
        .collect();
    let (head, items, options, shared_self, prelude) = start(func, args, plan, &checkpointed);

    let groups = plan.groups.iter().enumerate().map(|(g, group)| {
        if group.checkpointed {
            segment(func, plan, g, group, &options, &shared_self)
        } else {
            let inline = plan.stmts[group.stmts.clone()]
                .iter()
                .map(|s| emit_stmt(s, false));
            quote!(#(#inline)*)
        }
    });

    quote! {
        #head {
            #warn
            #(#items)*
            #prelude
            #(#groups)*
        }
    }
}

/// `#[checkpointed]` without cuts: the whole body is one checkpointed segment whose value
/// is the function's (`return` leaves the closure with it, `?` leaves it with the error).
pub(super) fn expand_whole(
    func: &Function,
    args: &Args,
    plan: &Plan,
    warn: &TokenStream,
) -> TokenStream {
    let (head, items, options, shared_self, prelude) = start(func, args, plan, &plan.groups);
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
        #head {
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
pub(super) fn returns_result(sig: &syn::Signature) -> bool {
    match &sig.output {
        syn::ReturnType::Type(_, ty) => matches!(
            &**ty,
            syn::Type::Path(p) if p.path.segments.last().is_some_and(|s| s.ident == "Result")
        ),
        syn::ReturnType::Default => false,
    }
}

/// One checkpointed group.
pub(super) fn segment(
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
