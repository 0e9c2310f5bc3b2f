//! Code generation of `#[checkpointed]`, by layout: the whole function as one closure
//! run through `::ckpt::__private::segment`, or fixed groups, each checkpointed one such
//! a closure and the last inline (`fixed.rs`); or units over an environment, cut at run
//! time by `::ckpt::__private::run_stages` (`runtime.rs`). Both build on the stash
//! (`stash.rs`) and the prelude of options and module-state captures (`prelude.rs`);
//! this file dispatches on the layout and emits the user's statements.
//!
//! Generated locals are named `__ckpt_*` with `Span::mixed_site()`, so they can neither
//! clash with nor be seen by the user's code; the user's own bindings are rebound with
//! the identifiers of their binding sites (same hygiene), so the statements inside a
//! segment resolve as they did before.

mod fixed;
mod prelude;
mod runtime;
mod stash;

use proc_macro2::{Group, Span, TokenStream, TokenTree};
use quote::quote;
use syn::spanned::Spanned;
use syn::visit_mut::VisitMut;
use syn::{Expr, Ident, Stmt};

use super::advice;
use super::analysis::Plan;
use super::body::Modules;
use super::layout::Layout;
use super::parse::{self, Function};
use crate::args::Args;
use fixed::{expand_static, expand_whole};
use runtime::expand_runtime;

/// The expanded function.
pub(crate) fn expand(func: &Function, args: &Args, plan: &Plan) -> TokenStream {
    let module_params: Vec<String> = plan
        .params
        .iter()
        .filter(|(_, k)| k.captured())
        .map(|(b, _)| b.ident.to_string())
        .collect();
    let modules = Modules {
        params: &module_params,
    };
    let warn = advice::warnings(&advice::advise(plan, &modules, &func.sig.ident.to_string()));
    match plan.layout {
        Layout::Whole => expand_whole(func, args, plan, &warn),
        Layout::Static => expand_static(func, args, plan, &warn),
        Layout::Runtime(schedule) => expand_runtime(func, args, plan, schedule, &warn),
    }
}

/// The function unchanged but for the `#[ckpt::allow]` markers (emitted next to errors).
pub(crate) fn original(func: &Function) -> TokenStream {
    let Function {
        attrs,
        vis,
        sig,
        block,
    } = func;
    let mut block = (**block).clone();
    for stmt in &mut block.stmts {
        parse::strip_marker_attrs(stmt);
    }
    quote!(#(#attrs)* #vis #sig #block)
}

/// A user statement as emitted: without `#[ckpt::allow]`, with `self` rewritten inside
/// checkpointed segments.
fn emit_stmt(stmt: &Stmt, rewrite_self: bool) -> Stmt {
    let mut stmt = stmt.clone();
    parse::strip_marker_attrs(&mut stmt);
    if rewrite_self {
        RewriteSelf.visit_stmt_mut(&mut stmt);
    }
    stmt
}

/// The function's attributes, visibility and signature, as every layout emits them
/// ([`allow_unused_mut_params`]).
fn head(func: &Function) -> TokenStream {
    let Function {
        attrs, vis, sig, ..
    } = func;
    let sig = allow_unused_mut_params(sig);
    quote!(#(#attrs)* #vis #sig)
}

/// A `mut` parameter that a segment takes over is rebound (with its `mut`) inside the
/// segment, so the parameter's own `mut` may go unused in the expansion: silence that
/// lint on exactly those parameters, so users with `-D warnings` see no warning that
/// their code does not have.
fn allow_unused_mut_params(sig: &syn::Signature) -> syn::Signature {
    let mut sig = sig.clone();
    for input in &mut sig.inputs {
        if let syn::FnArg::Typed(pat_type) = input
            && let syn::Pat::Ident(pat) = &*pat_type.pat
            && pat.mutability.is_some()
        {
            pat_type.attrs.push(syn::parse_quote!(#[allow(unused_mut)]));
        }
    }
    sig
}

/// Rewrites `self` (as an expression, and inside macro invocations' tokens) to the
/// segment's hygienic reference to the shared shallow clone of `self`.
struct RewriteSelf;

fn self_ident(at: Span) -> Ident {
    Ident::new("__ckpt_self", Span::mixed_site().located_at(at))
}

fn rewrite_self_tokens(tokens: TokenStream) -> TokenStream {
    let tts: Vec<TokenTree> = tokens.into_iter().collect();
    let mut out = Vec::with_capacity(tts.len());
    for (i, tt) in tts.iter().enumerate() {
        match tt {
            TokenTree::Ident(id) if id == "self" => {
                let before_path =
                    matches!(tts.get(i + 1), Some(TokenTree::Punct(p)) if p.as_char() == ':');
                out.push(if before_path {
                    tt.clone()
                } else {
                    TokenTree::Ident(self_ident(id.span()))
                });
            }
            TokenTree::Group(g) => {
                let mut new = Group::new(g.delimiter(), rewrite_self_tokens(g.stream()));
                new.set_span(g.span());
                out.push(TokenTree::Group(new));
            }
            _ => out.push(tt.clone()),
        }
    }
    out.into_iter().collect()
}

impl VisitMut for RewriteSelf {
    fn visit_expr_mut(&mut self, e: &mut Expr) {
        if let Expr::Path(p) = e
            && p.qself.is_none()
            && p.path.is_ident("self")
        {
            let span = p.path.span();
            p.path = syn::Path::from(self_ident(span));
            return;
        }
        syn::visit_mut::visit_expr_mut(self, e);
    }

    fn visit_macro_mut(&mut self, m: &mut syn::Macro) {
        m.tokens = rewrite_self_tokens(std::mem::take(&mut m.tokens));
    }

    fn visit_item_mut(&mut self, _: &mut syn::Item) {}
}
