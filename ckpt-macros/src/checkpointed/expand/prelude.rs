//! What the segments of a function share: the checkpoint options, one `ckpt::Shared`
//! shallow clone per call of `self` and of each module parameter (cloned into each
//! closure and locked inside it), and the segments' names.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::Ident;
use syn::spanned::Spanned;

use crate::args::Args;
use crate::checkpointed::analysis::{Group as SegmentGroup, Plan};
use crate::checkpointed::parse::{Function, ParamKind};
use crate::shared::mixed;

/// The statements both expansions start with: the checkpoint options, and one shared
/// shallow clone per call of `self` and of each module parameter (`capture`) when a
/// checkpointed `group` uses them.
pub(super) fn prelude(
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
            quote_spanned!(span=> let (#options, #shared_self) = ::ckpt::__private::capture(#options, #self_token);)
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
        quote_spanned!(c.span()=> let (#options, #shared) = ::ckpt::__private::#capture(#options, #c);)
    });
    quote! {
        let #options = #new_options;
        #self_capture
        #(#captures)*
    }
}

/// How a segment (or an auto-mode stage) reaches module state, `self` and `&Module`
/// parameters, each shared by one `ckpt::Shared` shallow clone per call: the `Arc`
/// clones moved into its closure, and the locks taken inside it that rebind `self` (as
/// `__ckpt_self`) and the parameters by name.
pub(super) fn module_state(
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
pub(super) fn capture_kind(plan: &Plan, c: &Ident) -> ParamKind {
    plan.params
        .iter()
        .find(|(b, _)| &b.ident == c)
        .map_or(ParamKind::Capture, |(_, k)| *k)
}

pub(super) fn capture_ident(param: &Ident) -> Ident {
    format_ident!(
        "__ckpt_capture_{}",
        param.to_string().trim_start_matches("r#"),
        span = Span::mixed_site()
    )
}

/// `Some(short_type_name::<Self>())` for a method, `None` for a free function: the
/// owner part of a segment's name.
pub(super) fn owner(plan: &Plan) -> TokenStream {
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
pub(super) fn segment_name_tokens(
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
