//! `#[derive(ShallowClone)]`.
//!
//! Each field is copied with `ShallowClone` when its type implements it (tensors, tch
//! layers, other derived modules, numbers, `Vec`/`Option` of those) and with `Clone`
//! otherwise (configuration structs), chosen at compile time by autoref specialization
//! (`::ckpt::__private::{Dup, ViaShallowClone, ViaClone, ViaNeither}`); a field that is
//! neither fails on `FieldCopy`, whose message names the field (its span) and the fix. Type parameters get a
//! `ShallowClone` bound.

use proc_macro2::TokenStream;
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Data, DeriveInput, Fields, parse_quote};

/// Expands `#[derive(ShallowClone)] item`.
pub(crate) fn expand(input: TokenStream) -> TokenStream {
    syn::parse2::<DeriveInput>(input)
        .and_then(|input| derive(&input))
        .unwrap_or_else(syn::Error::into_compile_error)
}

fn derive(input: &DeriveInput) -> syn::Result<TokenStream> {
    let name = &input.ident;
    let mut generics = input.generics.clone();
    let params: Vec<_> = generics.type_params().map(|p| p.ident.clone()).collect();
    let where_clause = generics.make_where_clause();
    for p in params {
        where_clause
            .predicates
            .push(parse_quote!(#p: ::ckpt::__private::ShallowClone));
    }
    let (impl_generics, ty_generics, where_clause) = generics.split_for_impl();

    let body = match &input.data {
        Data::Struct(s) => {
            let (pat, build) = fields(quote!(Self), &s.fields);
            quote!(let #pat = self; #build)
        }
        Data::Enum(e) => {
            let arms = e.variants.iter().map(|v| {
                let ident = &v.ident;
                let (pat, build) = fields(quote!(Self::#ident), &v.fields);
                quote!(#pat => #build,)
            });
            if e.variants.is_empty() {
                quote!(match *self {})
            } else {
                quote!(match self { #(#arms)* })
            }
        }
        Data::Union(u) => {
            return Err(syn::Error::new_spanned(
                u.union_token,
                "`ShallowClone` cannot be derived for a union: which field holds the value is unknown; implement `ckpt::ShallowClone` by hand",
            ));
        }
    };

    Ok(quote! {
        #[automatically_derived]
        impl #impl_generics ::ckpt::__private::ShallowClone for #name #ty_generics #where_clause {
            fn shallow_clone(&self) -> Self {
                #[allow(unused_imports)]
                use ::ckpt::__private::{ViaClone as _, ViaNeither as _, ViaShallowClone as _};
                #body
            }
        }
    })
}

/// A pattern binding every field by reference, and the expression rebuilding the value
/// from shallow clones of them.
fn fields(path: TokenStream, fields: &Fields) -> (TokenStream, TokenStream) {
    let dup = |binding: &syn::Ident, span| quote_spanned!(span=> (&&&::ckpt::__private::Dup(#binding)).__ckpt_dup());
    match fields {
        Fields::Named(named) => {
            let names: Vec<_> = named
                .named
                .iter()
                .map(|f| f.ident.clone().expect("named"))
                .collect();
            let values = named
                .named
                .iter()
                .zip(&names)
                .map(|(f, n)| dup(n, f.span()));
            (
                quote!(#path { #(#names),* }),
                quote!(#path { #(#names: #values),* }),
            )
        }
        Fields::Unnamed(unnamed) => {
            let names: Vec<_> = (0..unnamed.unnamed.len())
                .map(|i| format_ident!("__ckpt_field_{}", i))
                .collect();
            let values = unnamed
                .unnamed
                .iter()
                .zip(&names)
                .map(|(f, n)| dup(n, f.span()));
            (quote!(#path( #(#names),* )), quote!(#path( #(#values),* )))
        }
        Fields::Unit => (path.clone(), path),
    }
}
