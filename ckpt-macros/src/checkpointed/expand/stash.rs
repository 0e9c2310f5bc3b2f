//! What crosses a segment's cut in the generated code: the stash tuple (nested beyond
//! [`MAX_TUPLE`] elements), how each input enters it (moved, shallow-cloned, a reference
//! as a shallow clone of what it refers to) and is rebound inside, and how outputs leave.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::{Ident, Pat};

use crate::checkpointed::analysis::{Binding, Group as SegmentGroup, Pass, Plan};
use crate::checkpointed::parse::{Function, ParamKind};
use crate::shared::mixed;

/// Tuples of the stash have at most this many elements; longer lists are nested.
pub(super) const MAX_TUPLE: usize = 12;

/// `(a, b, ..)` with at most [`MAX_TUPLE`] elements per level; nested beyond that. The
/// same nesting is produced for the same length, so patterns match expressions.
pub(super) fn nest(items: Vec<TokenStream>) -> TokenStream {
    if items.len() <= MAX_TUPLE {
        return quote!((#(#items,)*));
    }
    let chunks: Vec<TokenStream> = items.chunks(MAX_TUPLE).map(|c| nest(c.to_vec())).collect();
    nest(chunks)
}

pub(super) fn binding_pat(b: &Binding) -> TokenStream {
    let ident = &b.ident;
    if b.mutable {
        quote!(mut #ident)
    } else {
        quote!(#ident)
    }
}

/// The `T` of a parameter `name: impl Borrow<T>` of `func`.
pub(super) fn borrowed_type(func: &Function, name: &Ident) -> Option<syn::Type> {
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
pub(super) fn ref_to_stash(func: &Function, kind: ParamKind, ident: &Ident) -> TokenStream {
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
pub(super) fn ref_rebind(kind: ParamKind, ident: &Ident, from: &Ident) -> TokenStream {
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
pub(super) struct SegmentInputs {
    /// The closure's parameter (`__ckpt_input`, or `_: ()` without inputs).
    pub(super) closure_param: TokenStream,
    /// `let (a, mut b, ..) = __ckpt_input;`
    pub(super) destructure: TokenStream,
    /// `let xs = &xs;` for the values that were references outside.
    pub(super) rebinds: Vec<TokenStream>,
    /// The stash value: `(stash(a), dup(&b), ..)`.
    pub(super) value: TokenStream,
}

impl SegmentInputs {
    pub(super) fn new(func: &Function, group: &SegmentGroup) -> Self {
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
pub(super) fn out_value(func: &Function, b: &Binding, plan: &Plan) -> TokenStream {
    let ident = &b.ident;
    match plan.ref_lets.get(&b.id) {
        Some(kind) => ref_to_stash(func, *kind, ident),
        None => quote_spanned!(ident.span()=> ::ckpt::__private::stash(#ident)),
    }
}

/// The owner of the shallow clone a reference `let` is rebound to after a segment.
pub(super) fn owner_ident(b: &Binding) -> Ident {
    format_ident!(
        "__ckpt_own_{}",
        b.ident.to_string().trim_start_matches("r#"),
        span = Span::mixed_site().located_at(b.ident.span())
    )
}

/// The pattern an output is received with, and, for a reference `let`, the statement
/// that rebinds its name to the received owner.
pub(super) fn out_pattern(b: &Binding, plan: &Plan) -> (TokenStream, Option<TokenStream>) {
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
