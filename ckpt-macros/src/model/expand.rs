//! Code generation: the struct, its constructor, the stage functions, `Module` or
//! `ModuleT` (exactly one: tch implements `ModuleT` for every `Module`), `ShallowClone`
//! and `Debug`; and, on error, the same items as stubs next to the errors.
//!
//! The run-time shape of a model (the seam for the planner, issue 7):
//!
//! - `__ckpt_len(&self) -> usize`: the number of stages of the expanded chain (repeated
//!   layers counted one by one, known at run time);
//! - `__ckpt_context(&self, xs, train) -> (T1, ..)`: the per-call values (`let` items);
//! - `__ckpt_stage(&self, i, xs, train, &ctx) -> Tensor`: runs stage `i`;
//! - `__ckpt_stage_name(&self, i) -> String`: `fc1`, `relu`, `blocks[3]`;
//! - `__ckpt_forward(&self, xs, train)`: the chain, cut by `ckpt::sequential_segments`;
//!   every range but the last runs through `::ckpt::__private::segment` with one
//!   `ShallowClone` of `self` per call, shared by the segments through `ckpt::Shared`,
//!   and the per-call values entering each segment's stash with the chain's tensor.
//!
//! Generated locals are `__ckpt_*` with `Span::mixed_site()`: the user's expressions can
//! neither see nor shadow them. What the user's expressions must see (the path `p`, the
//! constructor's parameters, `xs` and `train` in per-call values, `self`) is bound with
//! the user's own identifiers or at the call site.

use proc_macro2::{Group, Span, TokenStream, TokenTree};
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{ExprClosure, GenericParam, Generics, Ident, WherePredicate, parse_quote};

use super::ast::{Builtin, FieldItem, FieldKind, Item, LetItem, Model, Segments};
use super::parse::{mentions, tokens_text};
use crate::shared::mixed;

/// Where errors about a type go: the last segment of a path (`BatchNorm` in
/// `nn::BatchNorm`; stable Rust cannot join spans), else the type's first token.
fn type_span(ty: &syn::Type) -> Span {
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
fn located_at(tokens: TokenStream, at: Span) -> TokenStream {
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

/// Paths into tch and the runtime.
fn tensor() -> TokenStream {
    quote!(::ckpt::__private::tch::Tensor)
}

fn nn_path() -> TokenStream {
    quote!(::ckpt::__private::tch::nn::Path)
}

/// The hidden field that keeps the probability of the `dropout(p)` at item `index`.
fn dropout_field(index: usize) -> Ident {
    format_ident!("__ckpt_dropout_{}", index)
}

/// The local holding a field's value in the constructor.
fn field_local(ident: &Ident) -> Ident {
    format_ident!(
        "__ckpt_f_{}",
        ident.to_string().trim_start_matches("r#"),
        span = Span::mixed_site()
    )
}

/// Whether the model takes the train flag (then it implements `ModuleT`, else `Module`).
pub(crate) fn needs_train(model: &Model) -> bool {
    model.items.iter().any(Item::needs_train)
}

fn fields(model: &Model) -> impl Iterator<Item = &FieldItem> {
    model.items.iter().filter_map(|i| match i {
        Item::Field(f) => Some(&**f),
        _ => None,
    })
}

fn lets(model: &Model) -> impl Iterator<Item = &LetItem> {
    model.items.iter().filter_map(|i| match i {
        Item::Let(l) => Some(&**l),
        _ => None,
    })
}

/// Indices (in `model.items`) and probabilities of the `dropout(p)` stages.
fn dropouts(model: &Model) -> impl Iterator<Item = (usize, &syn::Expr)> {
    model.items.iter().enumerate().filter_map(|(k, i)| match i {
        Item::Builtin(b) if b.kind == Builtin::Dropout => b.arg.as_ref().map(|a| (k, a)),
        _ => None,
    })
}

/// `generics` with `extra` added to the where clause for every type parameter.
fn with_bounds(generics: &Generics, extra: TokenStream) -> Generics {
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

/// The struct definition (`stub`: without the hidden fields, with a `PhantomData` for
/// the generics in case their fields failed to parse).
fn struct_def(model: &Model, stub: bool) -> TokenStream {
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
        Some(c) => match c.segments {
            Segments::Fixed(n) => format!(
                " Checkpointed: the stages are cut into {n} segment{} (`ckpt::sequential_segments`), every one but the last recomputed in backward; `set_schedule` changes the cuts at run time.",
                if n == 1 { "" } else { "s" }
            ),
            Segments::Auto(objective) => format!(
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

/// The constructor's signature: `fn new<'p, P: Borrow<nn::Path<'p>>>(p: P, ..) -> Self`.
fn new_signature(model: &Model) -> (TokenStream, TokenStream) {
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
fn constructor(model: &Model) -> TokenStream {
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
        let schedule = schedule_tokens(&c.segments);
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

/// The declared `ckpt::plan::Schedule`.
fn schedule_tokens(segments: &Segments) -> TokenStream {
    match segments {
        Segments::Fixed(n) => quote!(::ckpt::plan::Schedule::Segments(#n)),
        Segments::Auto(objective) => {
            let o = objective.tokens();
            quote!(::ckpt::plan::Schedule::Auto(#o))
        }
    }
}

/// Per-call values bound inside a stage that mentions them.
fn ctx_bindings(model: &Model, tokens: &TokenStream, ctx: &Ident) -> TokenStream {
    let binds = lets(model).enumerate().filter_map(|(k, l)| {
        if !mentions(tokens, &l.ident.to_string()) {
            return None;
        }
        let (ident, ty) = (&l.ident, &l.ty);
        let k = syn::Index::from(k);
        let value = located_at(
            quote!(::ckpt::__private::ShallowClone::shallow_clone(&#ctx.#k)),
            type_span(ty),
        );
        Some(quote! {
            #[allow(unused_variables)]
            let #ident: #ty = #value;
        })
    });
    quote!(#(#binds)*)
}

/// Which closure helpers the stage function needs.
#[derive(Default)]
struct Helpers {
    module: bool,
    module_t: bool,
    call1: bool,
    call2: bool,
    apply2: bool,
    apply3: bool,
}

impl Helpers {
    fn items(&self) -> TokenStream {
        let t = tensor();
        let mut out = TokenStream::new();
        // `Module::forward` / `ModuleT::forward_t` through local traits, so that a layer
        // that does not implement them gets a message that says what to do.
        if self.module {
            let (tr, xs) = (mixed("__CkptModule"), mixed("xs"));
            out.extend(quote! {
                #[diagnostic::on_unimplemented(
                    message = "`{Self}` does not implement `tch::nn::Module`, which applies a stage without `#[train]`",
                    label = "this stage is applied with `Module::forward(&layer, &xs)`",
                    note = "a layer that takes the train flag (`ModuleT` only: dropout, batch norm, your blocks) needs `#[train]` before the stage's name",
                    note = "or apply it yourself: `name: Type = init => |layer, xs| layer.forward(xs, ..)`"
                )]
                trait #tr {
                    fn __ckpt_forward(&self, #xs: &#t) -> #t;
                }
                impl<M: ::ckpt::__private::tch::nn::Module + ?Sized> #tr for M {
                    fn __ckpt_forward(&self, #xs: &#t) -> #t {
                        ::ckpt::__private::tch::nn::Module::forward(self, #xs)
                    }
                }
            });
        }
        if self.module_t {
            let (tr, xs, train) = (mixed("__CkptModuleT"), mixed("xs"), mixed("train"));
            out.extend(quote! {
                #[diagnostic::on_unimplemented(
                    message = "`{Self}` does not implement `tch::nn::ModuleT`, which applies a `#[train]` stage",
                    label = "this stage is applied with `ModuleT::forward_t(&layer, &xs, train)`",
                    note = "or apply it yourself: `name: Type = init => |layer, xs, train| layer.forward(xs, .., train)`"
                )]
                trait #tr {
                    fn __ckpt_forward_t(&self, #xs: &#t, #train: bool) -> #t;
                }
                impl<M: ::ckpt::__private::tch::nn::ModuleT + ?Sized> #tr for M {
                    fn __ckpt_forward_t(&self, #xs: &#t, #train: bool) -> #t {
                        ::ckpt::__private::tch::nn::ModuleT::forward_t(self, #xs, #train)
                    }
                }
            });
        }
        if self.call1 {
            let (f, xs, name) = (mixed("f"), mixed("xs"), mixed("__ckpt_call1"));
            out.extend(quote! {
                fn #name<F: ::core::ops::FnOnce(&#t) -> #t>(#f: F, #xs: &#t) -> #t { #f(#xs) }
            });
        }
        if self.call2 {
            let (f, xs, tr, name) = (
                mixed("f"),
                mixed("xs"),
                mixed("train"),
                mixed("__ckpt_call2"),
            );
            out.extend(quote! {
                fn #name<F: ::core::ops::FnOnce(&#t, bool) -> #t>(#f: F, #xs: &#t, #tr: bool) -> #t {
                    #f(#xs, #tr)
                }
            });
        }
        if self.apply2 {
            let (f, l, xs, name) = (
                mixed("f"),
                mixed("layer"),
                mixed("xs"),
                mixed("__ckpt_apply2"),
            );
            out.extend(quote! {
                fn #name<L: ?Sized, F: ::core::ops::FnOnce(&L, &#t) -> #t>(#f: F, #l: &L, #xs: &#t) -> #t {
                    #f(#l, #xs)
                }
            });
        }
        if self.apply3 {
            let (f, l, xs, tr, name) = (
                mixed("f"),
                mixed("layer"),
                mixed("xs"),
                mixed("train"),
                mixed("__ckpt_apply3"),
            );
            out.extend(quote! {
                fn #name<L: ?Sized, F: ::core::ops::FnOnce(&L, &#t, bool) -> #t>(
                    #f: F, #l: &L, #xs: &#t, #tr: bool,
                ) -> #t {
                    #f(#l, #xs, #tr)
                }
            });
        }
        out
    }
}

/// How a layer (`layer`: an expression of type `&T`) is applied to `xs`.
fn apply_layer(
    f: &FieldItem,
    layer: TokenStream,
    xs: &Ident,
    train: &Ident,
    helpers: &mut Helpers,
) -> TokenStream {
    let span = match &f.kind {
        FieldKind::Repeated { elem, .. } => type_span(elem),
        _ => type_span(&f.ty),
    };
    match &f.apply {
        Some(c) if c.inputs.len() == 3 => {
            helpers.apply3 = true;
            let h = mixed("__ckpt_apply3");
            quote!(#h(#c, #layer, &#xs, #train))
        }
        Some(c) => {
            helpers.apply2 = true;
            let h = mixed("__ckpt_apply2");
            quote!(#h(#c, #layer, &#xs))
        }
        None if f.train.is_some() => {
            helpers.module_t = true;
            let tr = mixed("__CkptModuleT");
            located_at(quote!(#tr::__ckpt_forward_t(#layer, &#xs, #train)), span)
        }
        None => {
            helpers.module = true;
            let tr = mixed("__CkptModule");
            located_at(quote!(#tr::__ckpt_forward(#layer, &#xs)), span)
        }
    }
}

/// The tokens of a stage that may mention per-call values.
fn stage_tokens(item: &Item) -> TokenStream {
    match item {
        Item::Field(f) => f
            .apply
            .as_ref()
            .map(quote::ToTokens::to_token_stream)
            .unwrap_or_default(),
        Item::Closure(c) => quote::ToTokens::to_token_stream(&c.closure),
        _ => TokenStream::new(),
    }
}

/// The hidden inherent methods: length, names, context, stage, forward.
fn hidden_methods(model: &Model) -> TokenStream {
    let t = tensor();
    let (i, xs, train, ctx, at, n, layer) = (
        mixed("__ckpt_i"),
        mixed("__ckpt_xs"),
        mixed("__ckpt_train"),
        mixed("__ckpt_ctx"),
        mixed("__ckpt_at"),
        mixed("__ckpt_n"),
        mixed("__ckpt_layer"),
    );
    let let_tys: Vec<&syn::Type> = lets(model).map(|l| &l.ty).collect();
    let ctx_ty = quote!((#(#let_tys,)*));

    // __ckpt_len
    let fixed = model
        .items
        .iter()
        .filter(|it| it.is_stage() && !is_repeated(it))
        .count();
    let repeated: Vec<&Ident> = fields(model)
        .filter(|f| matches!(f.kind, FieldKind::Repeated { .. }))
        .map(|f| &f.ident)
        .collect();

    // __ckpt_stage and __ckpt_stage_name arms
    let mut helpers = Helpers::default();
    let mut arms = Vec::new();
    let mut name_arms = Vec::new();
    for (k, item) in model.items.iter().enumerate() {
        if !item.is_stage() {
            continue;
        }
        let binds = ctx_bindings(model, &stage_tokens(item), &ctx);
        if let Item::Field(f) = item
            && let FieldKind::Repeated { .. } = f.kind
        {
            let ident = &f.ident;
            let call = apply_layer(f, quote!(#layer), &xs, &train, &mut helpers);
            arms.push(quote! {
                let #n = self.#ident.len();
                if #i < #at + #n {
                    let #layer = &self.#ident[#i - #at];
                    #binds
                    return #call;
                }
                #at += #n;
            });
            let fmt = format!("{ident}[{{}}]");
            name_arms.push(quote! {
                let #n = self.#ident.len();
                if #i < #at + #n {
                    return ::std::format!(#fmt, #i - #at);
                }
                #at += #n;
            });
            continue;
        }
        let (call, name) = match item {
            Item::Field(f) => {
                let ident = &f.ident;
                (
                    apply_layer(f, quote!(&self.#ident), &xs, &train, &mut helpers),
                    ident.to_string(),
                )
            }
            Item::Builtin(b) => {
                let span = b.ident.span();
                let call = match b.kind {
                    Builtin::Relu => quote_spanned!(span=> #t::relu(&#xs)),
                    Builtin::Gelu => quote_spanned!(span=> #t::gelu(&#xs, "none")),
                    Builtin::Tanh => quote_spanned!(span=> #t::tanh(&#xs)),
                    Builtin::Sigmoid => quote_spanned!(span=> #t::sigmoid(&#xs)),
                    Builtin::Silu => quote_spanned!(span=> #t::silu(&#xs)),
                    Builtin::Dropout => {
                        let field = dropout_field(k);
                        quote_spanned!(span=> #t::dropout(&#xs, self.#field, #train))
                    }
                };
                (call, b.kind.name().to_owned())
            }
            Item::Function(f) => {
                let path = &f.path;
                let call = if f.train.is_some() {
                    quote_spanned!(path.span()=> #path(&#xs, #train))
                } else {
                    quote_spanned!(path.span()=> #path(&#xs))
                };
                (call, tokens_text(path))
            }
            Item::Closure(c) => (closure_call(&c.closure, &xs, &train, &mut helpers), {
                "closure".to_owned()
            }),
            Item::Let(_) => unreachable!("not a stage"),
        };
        arms.push(quote! {
            if #i == #at {
                #binds
                return #call;
            }
            #at += 1;
        });
        name_arms.push(quote! {
            if #i == #at {
                return ::std::string::String::from(#name);
            }
            #at += 1;
        });
    }
    let helper_items = helpers.items();

    // __ckpt_context
    let (ctx_xs, ctx_train) = (
        Ident::new("xs", Span::call_site()),
        Ident::new("train", Span::call_site()),
    );
    let let_stmts = lets(model).map(|l| {
        let (ident, ty, expr) = (&l.ident, &l.ty, &l.expr);
        quote!(let #ident: #ty = #expr;)
    });
    let let_names: Vec<&Ident> = lets(model).map(|l| &l.ident).collect();
    // Without per-call values the context is `()`: written as an empty body, which
    // `clippy::unused_unit` accepts.
    let (ctx_ret, ctx_tail) = if let_names.is_empty() {
        (TokenStream::new(), TokenStream::new())
    } else {
        (quote!(-> #ctx_ty), quote!((#(#let_names,)*)))
    };

    let forward = forward_body(model, &ctx_ty);
    quote! {
        /// The number of stages of the chain, repeated layers counted one by one.
        #[allow(dead_code)]
        fn __ckpt_len(&self) -> usize {
            #fixed #(+ self.#repeated.len())*
        }

        /// The name of stage `i` (`fc1`, `relu`, `blocks[3]`).
        #[allow(dead_code, unused_assignments)]
        fn __ckpt_stage_name(&self, #i: usize) -> ::std::string::String {
            let mut #at: usize = 0;
            #(#name_arms)*
            ::std::format!("stage {} (out of range)", #i)
        }

        /// The per-call values, computed from the model's input.
        #[allow(unused_variables, clippy::let_and_return)]
        fn __ckpt_context(&self, #ctx_xs: &#t, #ctx_train: bool) #ctx_ret {
            #(#let_stmts)*
            #ctx_tail
        }

        /// Runs stage `i` of the chain on `xs`.
        #[allow(unused_variables)]
        fn __ckpt_stage(&self, #i: usize, #xs: #t, #train: bool, #ctx: &#ctx_ty) -> #t {
            #helper_items
            let mut #at: usize = 0;
            #(#arms)*
            ::core::panic!(
                "{}: stage {} out of range (the chain has {} stages)",
                ::core::any::type_name::<Self>(),
                #i,
                #at
            )
        }

        /// The forward chain, checkpointed as declared.
        fn __ckpt_forward(&self, #xs: &#t, #train: bool) -> #t {
            #forward
        }
    }
}

fn is_repeated(item: &Item) -> bool {
    matches!(item, Item::Field(f) if matches!(f.kind, FieldKind::Repeated { .. }))
}

fn closure_call(c: &ExprClosure, xs: &Ident, train: &Ident, helpers: &mut Helpers) -> TokenStream {
    if c.inputs.len() == 2 {
        helpers.call2 = true;
        let h = mixed("__ckpt_call2");
        quote!(#h(#c, &#xs, #train))
    } else {
        helpers.call1 = true;
        let h = mixed("__ckpt_call1");
        quote!(#h(#c, &#xs))
    }
}

/// The body of `__ckpt_forward(&self, __ckpt_xs, __ckpt_train)`.
fn forward_body(model: &Model, ctx_ty: &TokenStream) -> TokenStream {
    let t = tensor();
    let (xs, train, ctx, h, i) = (
        mixed("__ckpt_xs"),
        mixed("__ckpt_train"),
        mixed("__ckpt_ctx"),
        mixed("__ckpt_h"),
        mixed("__ckpt_i"),
    );
    let Some(checkpoint) = &model.checkpoint else {
        return quote! {
            let #ctx = self.__ckpt_context(#xs, #train);
            let mut #h = #t::shallow_clone(#xs);
            for #i in 0..self.__ckpt_len() {
                #h = self.__ckpt_stage(#i, #h, #train, &#ctx);
            }
            #h
        };
    };
    let (ranges, last, ckpt, options, shared, k, range, name, count, guard, this, x, c) = (
        mixed("__ckpt_ranges"),
        mixed("__ckpt_last"),
        mixed("__ckpt_checkpointed"),
        mixed("__ckpt_options"),
        mixed("__ckpt_shared"),
        mixed("__ckpt_k"),
        mixed("__ckpt_range"),
        mixed("__ckpt_name"),
        mixed("__ckpt_count"),
        mixed("__ckpt_guard"),
        mixed("__ckpt_this"),
        mixed("__ckpt_x"),
        mixed("__ckpt_c"),
    );
    let new_options = crate::args::options_tokens(
        checkpoint.preserve_rng_state,
        checkpoint.determinism_check,
        Some(quote!(self.__ckpt_plans.policy())),
    );
    let method = if needs_train(model) {
        "forward_t"
    } else {
        "forward"
    };
    let line = quote_spanned!(model.ident.span()=> ::core::line!());
    let key_train = if needs_train(model) {
        quote!(::core::option::Option::Some(#train))
    } else {
        quote!(::core::option::Option::None)
    };
    let (len, p_x, planned, r, e) = (
        mixed("__ckpt_len"),
        mixed("__ckpt_px"),
        mixed("__ckpt_planned"),
        mixed("__ckpt_r"),
        mixed("__ckpt_e"),
    );
    let ranges_expr = quote! {{
        let #len = self.__ckpt_len();
        let #planned = self.__ckpt_plans.ranges(#len, #xs, #key_train, || {
            ::ckpt::__private::profile_stages(&#options, #len, #xs, |#i: usize, #p_x: &#t| {
                self.__ckpt_stage(#i, #t::shallow_clone(#p_x), #train, &#ctx)
            })
        });
        match #planned {
            ::core::result::Result::Ok(#r) => #r,
            ::core::result::Result::Err(#e) => ::core::panic!(
                "{}::{}: {}",
                ::ckpt::__private::short_type_name::<Self>(),
                #method,
                #e
            ),
        }
    }};
    let ctx_in = lets(model).enumerate().map(|(n, l)| {
        let n = syn::Index::from(n);
        located_at(quote!(::ckpt::__private::dup(&#ctx.#n)), type_span(&l.ty))
    });
    quote! {
        let #ctx = self.__ckpt_context(#xs, #train);
        let #options = #new_options;
        let #ranges: ::std::vec::Vec<::core::ops::Range<usize>> = #ranges_expr;
        let (#last, #ckpt) = #ranges
            .split_last()
            .expect("a schedule gives at least one range");
        let mut #h = #t::shallow_clone(#xs);
        if !#ckpt.is_empty() {
            let #shared = ::ckpt::__private::capture(self);
            let #count = #ranges.len();
            for (#k, #range) in #ckpt.iter().enumerate() {
                let #name = ::std::format!(
                    "{}::{} segment {} of {}: stages {}..{}, `{}` to `{}` ({}:{})",
                    ::ckpt::__private::short_type_name::<Self>(),
                    #method,
                    #k + 1,
                    #count,
                    #range.start,
                    #range.end,
                    self.__ckpt_stage_name(#range.start),
                    self.__ckpt_stage_name(#range.end - 1),
                    ::core::file!(),
                    #line,
                );
                let #shared = ::ckpt::__private::ShallowClone::shallow_clone(&#shared);
                let #range = ::core::clone::Clone::clone(#range);
                #h = ::ckpt::__private::segment(
                    &#options,
                    #name,
                    move |(#x, #c): (#t, #ctx_ty)| -> #t {
                        let #guard = #shared.lock();
                        let #this = &*#guard;
                        let mut #x = #x;
                        for #i in ::core::clone::Clone::clone(&#range) {
                            #x = #this.__ckpt_stage(#i, #x, #train, &#c);
                        }
                        #x
                    },
                    (#h, (#(#ctx_in,)*)),
                );
            }
        }
        for #i in ::core::clone::Clone::clone(#last) {
            #h = self.__ckpt_stage(#i, #h, #train, &#ctx);
        }
        #h
    }
}

/// The full expansion of a valid declaration.
pub(crate) fn expand(model: &Model) -> TokenStream {
    let ident = &model.ident;
    let t = tensor();
    let struct_def = struct_def(model, false);
    let (impl_g, ty_g, where_g) = model.generics.split_for_impl();
    let constructor = constructor(model);

    let rt = with_bounds(&model.generics, runtime_bounds(model));
    let (rt_impl, _, rt_where) = rt.split_for_impl();
    let hidden = hidden_methods(model);
    let schedule_methods = schedule_methods(model, &rt);

    let module_impl = if needs_train(model) {
        quote! {
            #[automatically_derived]
            impl #rt_impl ::ckpt::__private::tch::nn::ModuleT for #ident #ty_g #rt_where {
                fn forward_t(&self, xs: &#t, train: bool) -> #t {
                    self.__ckpt_forward(xs, train)
                }
            }
        }
    } else {
        quote! {
            #[automatically_derived]
            impl #rt_impl ::ckpt::__private::tch::nn::Module for #ident #ty_g #rt_where {
                fn forward(&self, xs: &#t) -> #t {
                    self.__ckpt_forward(xs, false)
                }
            }
        }
    };

    let sc = with_bounds(&model.generics, quote!(::ckpt::__private::ShallowClone));
    let (sc_impl, _, sc_where) = sc.split_for_impl();
    let sc_fields = fields(model).map(|f| {
        let ident = &f.ident;
        let span = match &f.kind {
            FieldKind::Repeated { elem, .. } => type_span(elem),
            _ => type_span(&f.ty),
        };
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

    let dbg = with_bounds(&model.generics, quote!(::core::fmt::Debug));
    let (dbg_impl, _, dbg_where) = dbg.split_for_impl();
    let name = ident.to_string();
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
        }

        #[automatically_derived]
        impl #dbg_impl ::core::fmt::Debug for #ident #ty_g #dbg_where {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                f.debug_struct(#name) #(#dbg_fields)* .#finish()
            }
        }
    }
}

/// The public methods of a checkpointed model that change and show its schedule.
fn schedule_methods(model: &Model, rt: &Generics) -> TokenStream {
    if model.checkpoint.is_none() {
        return TokenStream::new();
    }
    let ident = &model.ident;
    let vis = &model.vis;
    let (rt_impl, ty_g, rt_where) = rt.split_for_impl();
    let t = tensor();
    let (schedule, plan, err, result) = (
        quote!(::ckpt::plan::Schedule),
        quote!(::ckpt::plan::Plan),
        quote!(::ckpt::CkptError),
        quote!(::core::result::Result),
    );
    let method = if needs_train(model) {
        "forward_t"
    } else {
        "forward"
    };
    let (train_param, train_arg, key_train) = if needs_train(model) {
        let train = mixed("train");
        (
            quote!(, #train: bool),
            quote!(#train),
            quote!(::core::option::Option::Some(#train)),
        )
    } else {
        (
            TokenStream::new(),
            quote!(false),
            quote!(::core::option::Option::None),
        )
    };
    let c = model.checkpoint.as_ref().expect("checked");
    let new_options = crate::args::options_tokens(
        c.preserve_rng_state,
        c.determinism_check,
        Some(quote!(self.__ckpt_plans.policy())),
    );
    let (xs, len, ctx, options, i, p_x) = (
        mixed("xs"),
        mixed("__ckpt_len"),
        mixed("__ckpt_ctx"),
        mixed("__ckpt_options"),
        mixed("__ckpt_i"),
        mixed("__ckpt_px"),
    );
    let plan_doc = format!(
        " The plan the chain is cut with for inputs like `xs` (and the train flag): the cuts, \
         the predicted peak memory and extra time (`Plan::explain`, or `Display`). For \
         `segments = auto` and `budget` schedules it is the planner's plan, cached per input \
         shape, dtype, device and train flag, which the next `{method}` uses; for fixed \
         schedules, their cuts evaluated on the profile. Profiles the stages on first sight \
         of the input (two extra forwards and one backward of each stage; the random \
         generators' states are saved and restored around it, so seeded runs stay \
         reproducible, but running statistics such as batch norm's are updated by it)."
    );
    quote! {
        #[allow(dead_code)]
        impl #rt_impl #ident #ty_g #rt_where {
            /// The schedule the chain is cut with: the one `#[checkpointed(..)]` declares,
            /// or the last `set_schedule`.
            #vis fn schedule(&self) -> #schedule {
                ::core::clone::Clone::clone(self.__ckpt_plans.schedule())
            }

            /// Cuts the chain as `schedule` says from the next forward call on
            /// (`Schedule::Segments(n)`, `Schedule::Cuts(..)`, `Schedule::Auto(..)`).
            /// Plans cached for the old schedule are forgotten; profiles are kept.
            ///
            /// # Errors
            ///
            /// `CkptError::InvalidArgument` for `Segments(0)`, cuts that are not strictly
            /// increasing within `1..stages`, or a budget fraction that is not positive
            /// and finite; the schedule is unchanged then.
            #vis fn set_schedule(&mut self, schedule: #schedule) -> #result<(), #err> {
                let #len = self.__ckpt_len();
                self.__ckpt_plans.set(schedule, #len)
            }

            /// `set_schedule(Schedule::Segments(segments))`: `segments` groups as
            /// `ckpt::sequential_segments` makes them (1 checkpoints nothing).
            ///
            /// # Errors
            ///
            /// `CkptError::InvalidArgument` for `segments = 0`.
            #vis fn set_segments(&mut self, segments: usize) -> #result<(), #err> {
                self.set_schedule(#schedule::Segments(segments))
            }

            /// What each checkpointed segment keeps from its forward: the one
            /// `#[checkpointed(policy = ..)]` declares (default `Policy::RECOMPUTE_ALL`),
            /// or the last `set_policy`.
            #vis fn policy(&self) -> ::ckpt::Policy {
                self.__ckpt_plans.policy()
            }

            /// Sets what each checkpointed segment keeps from its forward, from the next
            /// forward call on (selective checkpointing: `ckpt::Policy::selective()` keeps
            /// linear outputs and dropout masks; gradients are unchanged).
            #vis fn set_policy(&mut self, policy: ::ckpt::Policy) {
                self.__ckpt_plans.set_policy(policy);
            }

            /// `set_schedule(Schedule::Cuts(plan.cuts()))`: the cuts of a plan (of
            /// `plan_for`, or of `ChainCost::evaluate` on this model's profile).
            ///
            /// # Errors
            ///
            /// `CkptError::InvalidArgument` when the plan is for a chain of another length.
            #vis fn set_plan(&mut self, plan: &#plan) -> #result<(), #err> {
                let #len = self.__ckpt_len();
                if plan.len() != #len {
                    return #result::Err(::ckpt::CkptError::InvalidArgument(::std::format!(
                        "the plan is for a chain of {} stages, but `{}` has {}",
                        plan.len(),
                        ::ckpt::__private::short_type_name::<Self>(),
                        #len
                    )));
                }
                self.set_schedule(#schedule::Cuts(::std::vec::Vec::from(plan.cuts())))
            }

            /// `set_schedule(Schedule::Auto(Objective::MinPeak))`: `segments = auto`, the
            /// planner's cuts for the least predicted peak.
            ///
            /// # Errors
            ///
            /// None in practice; `Result` for symmetry with the other setters.
            #vis fn set_auto(&mut self) -> #result<(), #err> {
                self.set_schedule(#schedule::Auto(::ckpt::plan::Objective::MinPeak))
            }

            /// `set_schedule(Schedule::Auto(Objective::Budget(budget)))`: the planner's
            /// cuts for the least recompute within `budget` (`"512 MiB".parse()?`,
            /// `"40%".parse()?`, `Budget::Bytes(..)`). A budget below the least feasible
            /// peak makes the next training forward panic with `CkptError::BudgetTooSmall`,
            /// which states the smallest feasible budget; `plan_for` returns it as an error.
            ///
            /// # Errors
            ///
            /// `CkptError::InvalidArgument` for a fraction that is not positive and finite.
            #vis fn set_budget(&mut self, budget: ::ckpt::plan::Budget) -> #result<(), #err> {
                self.set_schedule(#schedule::Auto(::ckpt::plan::Objective::Budget(budget)))
            }

            #[doc = #plan_doc]
            ///
            /// # Errors
            ///
            /// `CkptError::BudgetTooSmall` when no plan fits the budget; as
            /// `ckpt::memory::f_stats` for an unsupported device.
            #vis fn plan_for(&self, #xs: &#t #train_param) -> #result<#plan, #err> {
                let #len = self.__ckpt_len();
                let #ctx = self.__ckpt_context(#xs, #train_arg);
                let #options = #new_options;
                self.__ckpt_plans.plan(#len, #xs, #key_train, || {
                    ::ckpt::__private::profile_stages(&#options, #len, #xs, |#i: usize, #p_x: &#t| {
                        self.__ckpt_stage(#i, #t::shallow_clone(#p_x), #train_arg, &#ctx)
                    })
                })
                .map(|plan| plan.with_stage_names(self.stage_names()))
            }

            /// The names of the stages of the chain, in order (`fc1`, `relu`,
            /// `blocks[3]`); their number is the length of the chain.
            #vis fn stage_names(&self) -> ::std::vec::Vec<::std::string::String> {
                (0..self.__ckpt_len()).map(|#i| self.__ckpt_stage_name(#i)).collect()
            }

            /// Forgets the profiles and plans cached for every input: the next training
            /// call (or `plan_for`) profiles again.
            #vis fn clear_plans(&self) {
                self.__ckpt_plans.clear();
            }
        }
    }
}

/// What is emitted next to the errors: the struct (with the fields that parsed) and
/// stub implementations of everything the expansion would generate, so that code using
/// the model reports no follow-on errors.
pub(crate) fn stubs(model: &Model) -> TokenStream {
    let ident = &model.ident;
    let t = tensor();
    let struct_def = struct_def(model, true);
    let (impl_g, ty_g, where_g) = model.generics.split_for_impl();
    let (sig, _) = new_signature(model);
    let send = with_bounds(&model.generics, quote!(::core::marker::Send));
    let (send_impl, _, send_where) = send.split_for_impl();
    let module_impl = if needs_train(model) {
        quote! {
            impl #send_impl ::ckpt::__private::tch::nn::ModuleT for #ident #ty_g #send_where {
                fn forward_t(&self, _: &#t, _: bool) -> #t {
                    ::core::unimplemented!()
                }
            }
        }
    } else {
        quote! {
            impl #send_impl ::ckpt::__private::tch::nn::Module for #ident #ty_g #send_where {
                fn forward(&self, _: &#t) -> #t {
                    ::core::unimplemented!()
                }
            }
        }
    };
    let name = ident.to_string();
    let schedule_stubs = model.checkpointed.then(|| {
        let vis = &model.vis;
        let (schedule, plan, err, result) = (
            quote!(::ckpt::plan::Schedule),
            quote!(::ckpt::plan::Plan),
            quote!(::ckpt::CkptError),
            quote!(::core::result::Result),
        );
        let train = needs_train(model).then(|| quote!(, _: bool));
        quote! {
            #[allow(dead_code, unused_variables, clippy::all)]
            impl #impl_g #ident #ty_g #where_g {
                #vis fn schedule(&self) -> #schedule { ::core::unimplemented!() }
                #vis fn set_schedule(&mut self, _: #schedule) -> #result<(), #err> { ::core::unimplemented!() }
                #vis fn set_segments(&mut self, _: usize) -> #result<(), #err> { ::core::unimplemented!() }
                #vis fn policy(&self) -> ::ckpt::Policy { ::core::unimplemented!() }
                #vis fn set_policy(&mut self, _: ::ckpt::Policy) { ::core::unimplemented!() }
                #vis fn set_plan(&mut self, _: &#plan) -> #result<(), #err> { ::core::unimplemented!() }
                #vis fn set_auto(&mut self) -> #result<(), #err> { ::core::unimplemented!() }
                #vis fn set_budget(&mut self, _: ::ckpt::plan::Budget) -> #result<(), #err> { ::core::unimplemented!() }
                #vis fn plan_for(&self, _: &#t #train) -> #result<#plan, #err> { ::core::unimplemented!() }
                #vis fn stage_names(&self) -> ::std::vec::Vec<::std::string::String> { ::core::unimplemented!() }
                #vis fn clear_plans(&self) { ::core::unimplemented!() }
            }
        }
    });
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

        impl #impl_g ::ckpt::__private::ShallowClone for #ident #ty_g #where_g {
            fn shallow_clone(&self) -> Self {
                ::core::unimplemented!()
            }
        }

        impl #impl_g ::core::fmt::Debug for #ident #ty_g #where_g {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                f.write_str(#name)
            }
        }
    }
}
