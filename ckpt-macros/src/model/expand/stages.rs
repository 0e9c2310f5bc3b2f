//! The hidden inherent methods every model has: the chain's length, its stage names,
//! which stages are kept (`#[keep]`), the per-call values (`let` items), and `__ckpt_stage(i, ..)`, which runs stage `i`
//! (layers through `Module`/`ModuleT` helpers whose errors say what to do, built-ins,
//! functions and closures).

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{ExprClosure, Ident};

use super::forward::forward_body;
use super::{dropout_field, fields, lets, located_at, tensor, type_span};
use crate::model::ast::{Builtin, FieldItem, FieldKind, Item, Model};
use crate::model::parse::{mentions, tokens_text};
use crate::shared::mixed;

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

/// The hidden inherent methods: length, names, kept stages, context, stage, forward.
pub(super) fn hidden_methods(model: &Model) -> TokenStream {
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
    let mut kept_arms = Vec::new();
    for (k, item) in model.items.iter().enumerate() {
        if !item.is_stage() {
            continue;
        }
        let kept = model.keeps[k].is_some();
        kept_arms.push(if is_repeated(item) {
            let Item::Field(f) = item else {
                unreachable!("repeated")
            };
            let ident = &f.ident;
            quote! {
                let #n = self.#ident.len();
                if #i < #at + #n {
                    return #kept;
                }
                #at += #n;
            }
        } else {
            quote! {
                if #i == #at {
                    return #kept;
                }
                #at += 1;
            }
        });
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

    // __ckpt_kept: without `#[keep]` stages, no stage is.
    // (only the checkpointed forward asks).
    let kept_body = if model.kept().next().is_some() {
        quote! {
            let mut #at: usize = 0;
            #(#kept_arms)*
            false
        }
    } else {
        quote!(false)
    };
    let kept_fn = model.checkpoint.is_some().then(|| {
        quote! {
            /// Whether stage `i` is marked `#[keep]` (runs inline, not checkpointed).
            #[allow(unused_assignments, unused_variables)]
            fn __ckpt_kept(&self, #i: usize) -> bool {
                #kept_body
            }
        }
    });

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

        #kept_fn

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
