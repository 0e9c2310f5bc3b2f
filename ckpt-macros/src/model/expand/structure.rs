//! The model's struct: the user's fields (stages and `#[field]`s), the hidden ones
//! (dropout probabilities, the schedule's state), and a doc section listing the chain.

use proc_macro2::TokenStream;
use quote::quote;
use syn::GenericParam;

use super::{dropout_field, dropouts, fields, lets, needs_train};
use crate::args::Schedule;
use crate::model::ast::{FieldItem, FieldKind, Item, Model};
use crate::model::parse::tokens_text;

/// The struct definition (`stub`: without the hidden fields, with a `PhantomData` for
/// the generics in case their fields failed to parse).
pub(super) fn struct_def(model: &Model, stub: bool) -> TokenStream {
    let Model {
        attrs,
        vis,
        ident,
        generics,
        ..
    } = model;
    let where_clause = &generics.where_clause;
    let mut seen = std::collections::HashSet::new();
    let user_fields = fields(model)
        .filter(|f| !stub || seen.insert(f.ident.to_string()))
        .map(|f| {
            let FieldItem {
                docs, vis, ident, ..
            } = f;
            let ty = f.field_type();
            quote!(#(#docs)* #vis #ident: #ty,)
        });
    let hidden = if stub {
        // The generics (in case the fields that use them failed to parse) and the types
        // of the per-call values (so that their imports are not reported unused).
        let phantom: Vec<TokenStream> = generics
            .params
            .iter()
            .filter_map(|p| match p {
                GenericParam::Type(t) => {
                    let i = &t.ident;
                    Some(quote!(fn() -> #i))
                }
                GenericParam::Lifetime(l) => {
                    let l = &l.lifetime;
                    Some(quote!(&#l ()))
                }
                GenericParam::Const(_) => None,
            })
            .chain(lets(model).map(|l| {
                let ty = &l.ty;
                quote!(fn() -> #ty)
            }))
            .collect();
        if phantom.is_empty() {
            TokenStream::new()
        } else {
            quote!(__ckpt_phantom: ::core::marker::PhantomData<(#(#phantom,)*)>,)
        }
    } else {
        let d = dropouts(model).map(|(k, _)| {
            let f = dropout_field(k);
            quote!(#f: f64,)
        });
        let plans = model
            .checkpoint
            .is_some()
            .then(|| quote!(__ckpt_plans: ::ckpt::__private::ModelPlans,));
        quote!(#(#d)* #plans)
    };
    let chain_doc = chain_doc(model);
    let allow = stub.then(|| quote!(#[allow(dead_code)]));
    quote! {
        #(#attrs)*
        #chain_doc
        #allow
        #vis struct #ident #generics #where_clause {
            #(#user_fields)*
            #hidden
        }
    }
}

/// A doc section listing the chain, appended to the user's docs.
fn chain_doc(model: &Model) -> TokenStream {
    let names: Vec<String> = model
        .items
        .iter()
        .filter(|i| i.is_stage())
        .map(|i| match i {
            Item::Field(f) => match f.kind {
                FieldKind::Repeated { .. } => format!("`{}[..]`", f.ident),
                _ => format!("`{}`", f.ident),
            },
            Item::Builtin(b) => format!("`{}`", b.kind.usage()),
            Item::Function(f) => format!("`{}`", tokens_text(&f.path)),
            Item::Closure(_) => "a closure".to_owned(),
            Item::Let(_) => unreachable!("not a stage"),
        })
        .collect();
    let module = if needs_train(model) {
        "`ModuleT`"
    } else {
        "`Module`"
    };
    let ckpt = match &model.checkpoint {
        Some(c) => match c.schedule {
            Schedule::Segments(n) => format!(
                " Checkpointed: the stages are cut into {n} segment{} (`ckpt::sequential_segments`), every one but the last recomputed in backward; `set_schedule` changes the cuts at run time.",
                if n == 1 { "" } else { "s" }
            ),
            Schedule::Auto(objective) => format!(
                " Checkpointed: the planner cuts the stages for {}, from a profile of the stages made on the first training call for each input shape; `set_schedule` changes the cuts at run time, `plan_for` shows the plan.",
                objective.describe()
            ),
        },
        None => String::new(),
    };
    let line = format!(
        " Stages (declared with `ckpt::model!`, implements {module}): {}.{ckpt}",
        names.join(" → ")
    );
    quote!(#[doc = ""] #[doc = #line])
}
