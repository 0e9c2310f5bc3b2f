//! The constructor `new(p, ..)`: each stage built under the path named after its field
//! (so that `VarStore` names match a hand-written tch model), the dropout probabilities,
//! and the declared schedule.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::Ident;
use syn::spanned::Spanned;

use super::{dropout_field, fields, nn_path};
use crate::model::ast::{Builtin, FieldKind, Item, Model};
use crate::model::parse::tokens_text;
use crate::shared::mixed;

/// The local holding a field's value in the constructor.
fn field_local(ident: &Ident) -> Ident {
    format_ident!(
        "__ckpt_f_{}",
        ident.to_string().trim_start_matches("r#"),
        span = Span::mixed_site()
    )
}

/// The constructor's signature: `fn new<'p, P: Borrow<nn::Path<'p>>>(p: P, ..) -> Self`.
pub(super) fn new_signature(model: &Model) -> (TokenStream, TokenStream) {
    let path = nn_path();
    let p = &model.path.ident;
    let params = model.params.iter().map(|param| {
        let (pat, ty) = (&param.pat, &param.ty);
        quote!(#pat: #ty)
    });
    let vis = &model.vis;
    let lt = syn::Lifetime::new("'__ckpt_p", Span::mixed_site());
    let tp = mixed("__CkptP");
    let root = mixed("__ckpt_root");
    match &model.path.ty {
        None => (
            quote! {
                #vis fn new<#lt, #tp>(#p: #tp, #(#params),*) -> Self
                where
                    #tp: ::core::borrow::Borrow<#path<#lt>>
            },
            quote!(let #root: &#path<'_> = ::core::borrow::Borrow::borrow(&#p);),
        ),
        Some(ty) => (
            quote!(#vis fn new(#p: #ty, #(#params),*) -> Self),
            quote!(let #root: &#path<'_> = <_ as ::core::borrow::Borrow<#path<'_>>>::borrow(&#p);),
        ),
    }
}

/// The doc comment of `new`.
fn new_doc(model: &Model) -> TokenStream {
    let p = model.path.ident.to_string();
    let paths: Vec<String> = fields(model)
        .filter(|f| !matches!(f.kind, FieldKind::Plain))
        .map(|f| match f.kind {
            FieldKind::Repeated { .. } => format!("`{}/{{i}}`", f.ident),
            _ => format!("`{}`", f.ident),
        })
        .collect();
    let first = format!(" Builds the model with its variables under `{p}`.");
    let second = if paths.is_empty() {
        String::new()
    } else {
        format!(
            " Each stage is built under its own path, named after its field: {}.",
            paths.join(", ")
        )
    };
    quote!(#[doc = #first] #[doc = ""] #[doc = #second])
}

/// The constructor.
pub(super) fn constructor(model: &Model) -> TokenStream {
    let (sig, root_binding) = new_signature(model);
    let p = &model.path.ident;
    let root = mixed("__ckpt_root");
    let path = nn_path();
    let mut inits = Vec::new();
    let mut assigns = Vec::new();
    for (k, item) in model.items.iter().enumerate() {
        match item {
            Item::Field(f) => {
                let local = field_local(&f.ident);
                let ident = &f.ident;
                let ty = f.field_type();
                let init = f.init.as_ref().expect("checked before expansion");
                let name = ident.to_string();
                let name = name.trim_start_matches("r#");
                let value = match &f.kind {
                    FieldKind::Layer => quote! {{
                        #[allow(unused_variables)]
                        let #p = #root / #name;
                        #init
                    }},
                    FieldKind::Plain => quote! {{
                        #[allow(unused_variables)]
                        let #p: #path<'_> = ::core::clone::Clone::clone(#root);
                        #init
                    }},
                    FieldKind::Repeated { count, .. } => {
                        let n = mixed("__ckpt_n");
                        let base = mixed("__ckpt_base");
                        let i = mixed("__ckpt_i");
                        let body = match init {
                            syn::Expr::Closure(c) => {
                                let pat = &c.inputs[0];
                                let body = &c.body;
                                quote!(let #pat = #i; #body)
                            }
                            other => quote!(#other),
                        };
                        let msg = format!(
                            "model!: the count of `{name}: {}` must be a non-negative integer that fits in `usize`",
                            tokens_text(&f.ty)
                        );
                        quote_spanned! {count.span()=> {
                            #[allow(clippy::useless_conversion)]
                            let #n: usize = match <usize as ::core::convert::TryFrom<_>>::try_from(#count) {
                                ::core::result::Result::Ok(n) => n,
                                ::core::result::Result::Err(_) => ::core::panic!(#msg),
                            };
                            let #base = #root / #name;
                            (0..#n)
                                .map(|#i: usize| {
                                    #[allow(unused_variables)]
                                    let #p = &#base / #i;
                                    #body
                                })
                                .collect()
                        }}
                    }
                };
                inits.push(quote!(let #local: #ty = #value;));
                assigns.push(quote!(#ident: #local));
            }
            Item::Builtin(b) if b.kind == Builtin::Dropout => {
                let field = dropout_field(k);
                let local = mixed(&format!("__ckpt_dropout_{k}"));
                let arg = b.arg.as_ref().expect("parsed with its argument");
                inits.push(quote!(let #local: f64 = #arg;));
                assigns.push(quote!(#field: #local));
            }
            _ => {}
        }
    }
    if let Some(c) = &model.checkpoint {
        let schedule = c.schedule.tokens(quote!(::ckpt::plan::Schedule));
        let policy = c.policy.map(|p| {
            let p = p.tokens();
            quote!(.with_policy(#p))
        });
        assigns.push(quote!(__ckpt_plans: ::ckpt::__private::ModelPlans::new(#schedule) #policy));
    }
    let doc = new_doc(model);
    quote! {
        #doc
        #sig {
            #root_binding
            #(#inits)*
            Self { #(#assigns),* }
        }
    }
}
