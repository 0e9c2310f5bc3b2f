//! The trait impls of a model: `Module` or `ModuleT` (exactly one: tch implements
//! `ModuleT` for every `Module`), `ShallowClone` and `Debug`; each also as the stub
//! emitted next to errors (`stub`), so that code using the model reports no follow-on
//! errors.

use proc_macro2::TokenStream;
use quote::quote;
use syn::Generics;

use super::{
    dropout_field, dropouts, fields, located_at, needs_train, tensor, type_span, with_bounds,
};
use crate::model::ast::{FieldItem, FieldKind, Model};

/// `Module::forward` or `ModuleT::forward_t` on `generics`: the forward chain, or
/// (`stub`) `unimplemented!()`.
pub(super) fn module_impl(model: &Model, generics: &Generics, stub: bool) -> TokenStream {
    let ident = &model.ident;
    let t = tensor();
    let (impl_g, ty_g, where_g) = generics.split_for_impl();
    let (tr, method, params, blanks, args) = if needs_train(model) {
        (
            quote!(ModuleT),
            quote!(forward_t),
            quote!(xs: &#t, train: bool),
            quote!(_: &#t, _: bool),
            quote!(xs, train),
        )
    } else {
        (
            quote!(Module),
            quote!(forward),
            quote!(xs: &#t),
            quote!(_: &#t),
            quote!(xs, false),
        )
    };
    let (attr, params, body) = if stub {
        (None, blanks, quote!(::core::unimplemented!()))
    } else {
        (
            Some(quote!(#[automatically_derived])),
            params,
            quote!(self.__ckpt_forward(#args)),
        )
    };
    quote! {
        #attr
        impl #impl_g ::ckpt::__private::tch::nn::#tr for #ident #ty_g #where_g {
            fn #method(&self, #params) -> #t {
                #body
            }
        }
    }
}

/// `ShallowClone`: stages by `ShallowClone`, `#[field]`s by `Clone` when they are not
/// `ShallowClone` (plain configuration values), the hidden fields copied.
pub(super) fn shallow_clone_impl(model: &Model, stub: bool) -> TokenStream {
    let ident = &model.ident;
    if stub {
        let (impl_g, ty_g, where_g) = model.generics.split_for_impl();
        return quote! {
            impl #impl_g ::ckpt::__private::ShallowClone for #ident #ty_g #where_g {
                fn shallow_clone(&self) -> Self {
                    ::core::unimplemented!()
                }
            }
        };
    }
    let sc = with_bounds(&model.generics, quote!(::ckpt::__private::ShallowClone));
    let (sc_impl, ty_g, sc_where) = sc.split_for_impl();
    // Errors about a field's type (not `ShallowClone`) point at the type, once.
    let field_span = |f: &FieldItem| match &f.kind {
        FieldKind::Repeated { elem, .. } => type_span(elem),
        _ => type_span(&f.ty),
    };
    let sc_fields = fields(model).map(|f| {
        let ident = &f.ident;
        let span = field_span(f);
        // Stages hold tensors: `ShallowClone` (its message suggests the derive or
        // `ckpt::Shared`); `#[field]`s may be plain configuration values: `Clone` then.
        let value = if matches!(f.kind, FieldKind::Plain) {
            located_at(
                quote!((&&&::ckpt::__private::Dup(&self.#ident)).__ckpt_dup()),
                span,
            )
        } else {
            located_at(
                quote!(::ckpt::__private::ShallowClone::shallow_clone(&self.#ident)),
                span,
            )
        };
        quote!(#ident: #value)
    });
    let sc_visits = fields(model).map(|f| {
        let ident = &f.ident;
        let visit = if matches!(f.kind, FieldKind::Plain) {
            quote!((&&::ckpt::__private::Visit(&self.#ident)).__ckpt_visit(__ckpt_f))
        } else {
            quote!(::ckpt::__private::ShallowClone::visit_tensors(&self.#ident, __ckpt_f))
        };
        let visit = located_at(visit, field_span(f));
        quote!(#visit;)
    });
    let sc_hidden = dropouts(model)
        .map(|(k, _)| {
            let f = dropout_field(k);
            quote!(#f: self.#f)
        })
        .chain(
            model
                .checkpoint
                .is_some()
                .then(|| quote!(__ckpt_plans: ::core::clone::Clone::clone(&self.__ckpt_plans))),
        );
    quote! {
        #[automatically_derived]
        impl #sc_impl ::ckpt::__private::ShallowClone for #ident #ty_g #sc_where {
            fn shallow_clone(&self) -> Self {
                #[allow(unused_imports)]
                use ::ckpt::__private::{ViaClone as _, ViaNeither as _, ViaShallowClone as _};
                Self {
                    #(#sc_fields,)*
                    #(#sc_hidden,)*
                }
            }

            fn visit_tensors(&self, __ckpt_f: &mut dyn ::core::ops::FnMut(&::ckpt::__private::tch::Tensor)) {
                #[allow(unused_imports)]
                use ::ckpt::__private::{VisitOther as _, VisitShallowClone as _};
                #(#sc_visits)*
            }
        }
    }
}

/// `Debug`: the struct with its fields (`..` for the hidden ones), or (`stub`) its name.
pub(super) fn debug_impl(model: &Model, stub: bool) -> TokenStream {
    let ident = &model.ident;
    let name = ident.to_string();
    if stub {
        let (impl_g, ty_g, where_g) = model.generics.split_for_impl();
        return quote! {
            impl #impl_g ::core::fmt::Debug for #ident #ty_g #where_g {
                fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                    f.write_str(#name)
                }
            }
        };
    }
    let dbg = with_bounds(&model.generics, quote!(::core::fmt::Debug));
    let (dbg_impl, ty_g, dbg_where) = dbg.split_for_impl();
    let dbg_fields = fields(model).map(|f| {
        let ident = &f.ident;
        let s = ident.to_string();
        quote!(.field(#s, &self.#ident))
    });
    let finish = if dropouts(model).next().is_some() || model.checkpoint.is_some() {
        quote!(finish_non_exhaustive)
    } else {
        quote!(finish)
    };
    quote! {
        #[automatically_derived]
        impl #dbg_impl ::core::fmt::Debug for #ident #ty_g #dbg_where {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                f.debug_struct(#name) #(#dbg_fields)* .#finish()
            }
        }
    }
}
