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

    let (body, visit) = match &input.data {
        Data::Struct(s) => {
            let Copy { pat, build, visit } = fields(quote!(Self), &s.fields);
            (
                quote!(let #pat = self; #build),
                quote!(let #pat = self; #visit),
            )
        }
        Data::Enum(e) => {
            let (arms, visit_arms): (Vec<_>, Vec<_>) = e
                .variants
                .iter()
                .map(|v| {
                    let ident = &v.ident;
                    let Copy { pat, build, visit } = fields(quote!(Self::#ident), &v.fields);
                    (quote!(#pat => #build,), quote!(#pat => { #visit }))
                })
                .unzip();
            if e.variants.is_empty() {
                (quote!(match *self {}), quote!(match *self {}))
            } else {
                (
                    quote!(match self { #(#arms)* }),
                    quote!(match self { #(#visit_arms)* }),
                )
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

            fn visit_tensors(&self, __ckpt_f: &mut dyn ::core::ops::FnMut(&::ckpt::__private::tch::Tensor)) {
                #[allow(unused_imports)]
                use ::ckpt::__private::{VisitOther as _, VisitShallowClone as _};
                #visit
            }
        }
    })
}

/// What the derive generates for one struct or variant.
struct Copy {
    /// A pattern binding every field by reference.
    pat: TokenStream,
    /// The expression rebuilding the value from shallow clones of the fields.
    build: TokenStream,
    /// The statements visiting the fields' tensors (`ShallowClone::visit_tensors`).
    visit: TokenStream,
}

/// The pattern, copy and visit of `fields`.
fn fields(path: TokenStream, fields: &Fields) -> Copy {
    let dup = |binding: &syn::Ident, span| quote_spanned!(span=> (&&&::ckpt::__private::Dup(#binding)).__ckpt_dup());
    let visit = |names: &[syn::Ident]| {
        quote! { #( (&&::ckpt::__private::Visit(#names)).__ckpt_visit(__ckpt_f); )* }
    };
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
            Copy {
                pat: quote!(#path { #(#names),* }),
                build: quote!(#path { #(#names: #values),* }),
                visit: visit(&names),
            }
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
            Copy {
                pat: quote!(#path( #(#names),* )),
                build: quote!(#path( #(#values),* )),
                visit: visit(&names),
            }
        }
        Fields::Unit => Copy {
            pat: path.clone(),
            build: path,
            visit: TokenStream::new(),
        },
    }
}
