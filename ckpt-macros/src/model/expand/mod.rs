//! Code generation of `model!`, by what it generates: the struct (`structure.rs`), its
//! constructor (`constructor.rs`), the stage functions (`stages.rs`), the forward chain
//! (`forward.rs`), the trait impls (`traits.rs`) and, for a checkpointed model, the
//! schedule API (`schedule.rs`); on error, the same items as stubs next to the errors.
//! This file assembles them, with the helpers they share.
//!
//! The run-time shape of a model (what the planner and the schedule API call):
//!
//! - `__ckpt_len(&self) -> usize`: the number of stages of the expanded chain (repeated
//!   layers counted one by one, known at run time);
//! - `__ckpt_context(&self, xs, train) -> (T1, ..)`: the per-call values (`let` items);
//! - `__ckpt_stage(&self, i, xs, train, &ctx) -> Tensor`: runs stage `i`;
//! - `__ckpt_stage_name(&self, i) -> String`: `fc1`, `relu`, `blocks[3]`;
//! - `__ckpt_forward(&self, xs, train)`: the chain, cut as the model's schedule says
//!   (`ModelPlans`: `segments = N` as `ckpt::sequential_segments`, or the planner's cuts);
//!   every range but the last runs through `::ckpt::__private::segment` with one
//!   `ShallowClone` of `self` per call, shared by the segments through `ckpt::Shared`,
//!   and the per-call values entering each segment's stash with the chain's tensor.
//!
//! Generated locals are `__ckpt_*` with `Span::mixed_site()`: the user's expressions can
//! neither see nor shadow them. What the user's expressions must see (the path `p`, the
//! constructor's parameters, `xs` and `train` in per-call values, `self`) is bound with
//! the user's own identifiers or at the call site.

mod constructor;
mod forward;
mod schedule;
mod stages;
mod structure;
mod traits;

use proc_macro2::{Group, Span, TokenStream, TokenTree};
use quote::{format_ident, quote};
use syn::spanned::Spanned;
use syn::{Generics, Ident, WherePredicate, parse_quote};

use super::ast::{Builtin, FieldItem, Item, LetItem, Model};

/// The full expansion of a valid declaration.
pub(crate) fn expand(model: &Model) -> TokenStream {
    let ident = &model.ident;
    let struct_def = structure::struct_def(model, false);
    let (impl_g, ty_g, where_g) = model.generics.split_for_impl();
    let constructor = constructor::constructor(model);
    let rt = with_bounds(&model.generics, runtime_bounds(model));
    let (rt_impl, _, rt_where) = rt.split_for_impl();
    let hidden = stages::hidden_methods(model);
    let module_impl = traits::module_impl(model, &rt, false);
    let schedule_methods = schedule::schedule_methods(model, &rt);
    let shallow_clone = traits::shallow_clone_impl(model, false);
    let debug = traits::debug_impl(model, false);
    quote! {
        #struct_def

        impl #impl_g #ident #ty_g #where_g {
            #constructor
        }

        #[doc(hidden)]
        impl #rt_impl #ident #ty_g #rt_where {
            #hidden
        }

        #module_impl

        #schedule_methods

        #shallow_clone

        #debug
    }
}

/// What is emitted next to the errors: the struct (with the fields that parsed) and
/// stub implementations of everything the expansion would generate, so that code using
/// the model reports no follow-on errors.
pub(crate) fn stubs(model: &Model) -> TokenStream {
    let ident = &model.ident;
    let struct_def = structure::struct_def(model, true);
    let (impl_g, ty_g, where_g) = model.generics.split_for_impl();
    let (sig, _) = constructor::new_signature(model);
    let send = with_bounds(&model.generics, quote!(::core::marker::Send));
    let schedule_stubs = schedule::schedule_stubs(model);
    let module_impl = traits::module_impl(model, &send, true);
    let shallow_clone = traits::shallow_clone_impl(model, true);
    let debug = traits::debug_impl(model, true);
    quote! {
        #struct_def

        impl #impl_g #ident #ty_g #where_g {
            #[allow(unused_variables, clippy::all)]
            #sig {
                ::core::unimplemented!()
            }
        }

        #schedule_stubs

        #module_impl

        #shallow_clone

        #debug
    }
}

/// Where errors about a type go: the last segment of a path (`BatchNorm` in
/// `nn::BatchNorm`; stable Rust cannot join spans), else the type's first token.
pub(super) fn type_span(ty: &syn::Type) -> Span {
    match ty {
        syn::Type::Path(p) => p
            .path
            .segments
            .last()
            .map_or_else(|| ty.span(), |s| s.ident.span()),
        _ => ty.span(),
    }
}

/// `tokens` with every span moved to `at`, each keeping its hygiene: a type error in
/// generated code is then reported on the user's tokens at `at` (a stage's type), not
/// on the whole macro call.
pub(super) fn located_at(tokens: TokenStream, at: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|tt| match tt {
            TokenTree::Group(g) => {
                let mut new = Group::new(g.delimiter(), located_at(g.stream(), at));
                new.set_span(g.span().located_at(at));
                TokenTree::Group(new)
            }
            mut other => {
                other.set_span(other.span().located_at(at));
                other
            }
        })
        .collect()
}

/// `tch::Tensor`, through the facade.
pub(super) fn tensor() -> TokenStream {
    quote!(::ckpt::__private::tch::Tensor)
}

/// `tch::nn::Path`, through the facade.
pub(super) fn nn_path() -> TokenStream {
    quote!(::ckpt::__private::tch::nn::Path)
}

/// The hidden field that keeps the probability of the `dropout(p)` at item `index`.
pub(super) fn dropout_field(index: usize) -> Ident {
    format_ident!("__ckpt_dropout_{}", index)
}

/// Whether the model takes the train flag (then it implements `ModuleT`, else `Module`).
pub(crate) fn needs_train(model: &Model) -> bool {
    model.items.iter().any(Item::needs_train)
}

/// The field items (stages with a layer, and `#[field]`s), in order.
pub(super) fn fields(model: &Model) -> impl Iterator<Item = &FieldItem> {
    model.items.iter().filter_map(|i| match i {
        Item::Field(f) => Some(&**f),
        _ => None,
    })
}

/// The per-call values (`let` items), in order.
pub(super) fn lets(model: &Model) -> impl Iterator<Item = &LetItem> {
    model.items.iter().filter_map(|i| match i {
        Item::Let(l) => Some(&**l),
        _ => None,
    })
}

/// Indices (in `model.items`) and probabilities of the `dropout(p)` stages.
pub(super) fn dropouts(model: &Model) -> impl Iterator<Item = (usize, &syn::Expr)> {
    model.items.iter().enumerate().filter_map(|(k, i)| match i {
        Item::Builtin(b) if b.kind == Builtin::Dropout => b.arg.as_ref().map(|a| (k, a)),
        _ => None,
    })
}

/// `generics` with `extra` added to the where clause for every type parameter.
pub(super) fn with_bounds(generics: &Generics, extra: TokenStream) -> Generics {
    let mut g = generics.clone();
    let params: Vec<Ident> = g.type_params().map(|p| p.ident.clone()).collect();
    if params.is_empty() || extra.is_empty() {
        return g;
    }
    let wc = g.make_where_clause();
    for p in params {
        let pred: WherePredicate = parse_quote!(#p: #extra);
        wc.predicates.push(pred);
    }
    g
}

/// The bounds every generated trait impl and the stage functions need of type
/// parameters: `Debug + Send` (tch's `Module: Debug + Send`), and for checkpointed
/// models `ShallowClone + 'static` (a segment owns a shallow clone of the model).
fn runtime_bounds(model: &Model) -> TokenStream {
    let base = quote!(::core::fmt::Debug + ::core::marker::Send);
    if model.checkpoint.is_some() {
        quote!(#base + ::ckpt::__private::ShallowClone + 'static)
    } else {
        base
    }
}
