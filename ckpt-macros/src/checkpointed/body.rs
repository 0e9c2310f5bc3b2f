//! The body as the macro cuts it: items hoisted, `ckpt::cut!()` markers noted, method
//! chains split into links at their layer calls, and layer loops (`for` over layers, a
//! `fold` over layers) recognised as units whose iterations are stages.
//!
//! # Method chains
//!
//! tch code writes whole forwards as one chain (`xs.view(..).apply(&self.conv1)
//! .max_pool2d_default(2).apply(&self.conv2) ..`). In a `let` initializer or the tail
//! expression, a chain is split *before each layer call but the first*: the value flowing
//! into a layer is the cut's stash, as with `checkpoint_sequential` over modules, and the
//! cheap calls after a layer (activation, pooling, view, dropout) stay with it. A call
//! applies a layer when it is `.apply(..)`, `.apply_t(..)`, `.forward(..)` or
//! `.forward_t(..)`, or when one of its arguments refers to module state (`&self.w`,
//! `&self.blocks[i]`, a module parameter); a `.fold(..)` over layers counts as one too,
//! and a chain is also split after it, so that the fold becomes a layer loop of its own.
//! Each piece becomes a `let` of a hygienic temporary, moved into the next piece (so it is
//! dropped where the chain would have dropped it).
//!
//! # Layer loops
//!
//! A top-level `for PAT in ITER { .. }` statement, a top-level `let NAME =
//! ITER.fold(INIT, |ACC, ITEM| ..);`, and a tail `ITER.fold(..)` (rewritten as a `let` of a
//! hygienic name and that name as the tail) are layer loops: every iteration is a stage of
//! the run-time chain. The recompute re-derives an iteration's items from `ITER`, so the
//! iterable may use only `self` and the function's parameters (checked in
//! `analysis/loops.rs`).

use proc_macro2::{Span, TokenStream};
use quote::ToTokens;
use syn::spanned::Spanned;
use syn::{Expr, ExprMethodCall, Ident, Pat, Stmt};

use super::parse;
use crate::ctxt::Ctxt;

/// The function body's statements, ready to be grouped.
pub(crate) struct Body {
    /// Items (`use`, `fn`, `const`): hoisted before the segments.
    pub items: Vec<Stmt>,
    /// The statements to cut, in order (chains split into links where that was asked).
    pub stmts: Vec<Stmt>,
    /// `ckpt::cut!()` markers: the index in `stmts` of the statement after each, and the
    /// marker's span.
    pub markers: Vec<(usize, Span)>,
    /// One entry per statement: the layer loop it is, when loops are recognised.
    pub loops: Vec<Option<LoopUnit>>,
    /// Whether the last statement counts as a stage for `segments = N` (not when it is the
    /// name a tail `fold` was bound to).
    pub tail_counts: bool,
    /// One entry per statement: marked `#[ckpt::keep]` (runs once, outside the segments;
    /// the links of a split chain inherit their statement's mark).
    pub kept: Vec<bool>,
    /// The first `#[ckpt::keep]`, for errors about the layout.
    pub first_keep: Option<syn::Attribute>,
}

/// A layer loop: a statement whose iterations are stages.
#[derive(Clone)]
pub(crate) struct LoopUnit {
    /// The iterable as written (`self.blocks.iter()`, `&self.blocks`, `0..n`).
    pub iter: Expr,
    /// `for` or `fold`.
    pub kind: LoopKind,
    /// `for b in self.blocks.iter()` or `self.blocks.iter().fold(..)`, for names and
    /// messages.
    pub label: String,
}

/// The two forms of a layer loop.
#[derive(Clone)]
pub(crate) enum LoopKind {
    /// `for PAT in ITER BODY` (the loop, to re-emit with its iterable replaced).
    For(Box<syn::ExprForLoop>),
    /// `let NAME = ITER.fold(INIT, CLOSURE);`: `NAME` (with `mut`) is the accumulator.
    Fold {
        /// The bound name.
        name: Ident,
        /// The accumulator's initial value.
        init: Box<Expr>,
        /// The fold closure `|acc, item| ..`.
        closure: Box<Expr>,
    },
}

/// Collects the body's items, statements and cut markers (`macro_rules!` is an error:
/// hoisted, its local names would refer to other bindings).
pub(crate) fn collect(block: &syn::Block, cx: &mut Ctxt) -> Body {
    let mut body = Body {
        items: Vec::new(),
        stmts: Vec::new(),
        markers: Vec::new(),
        loops: Vec::new(),
        tail_counts: true,
        kept: Vec::new(),
        first_keep: None,
    };
    for stmt in &block.stmts {
        match stmt {
            Stmt::Item(syn::Item::Macro(m)) if m.mac.path.is_ident("macro_rules") => {
                cx.error_spanned_by(
                    &m.mac.path,
                    "`macro_rules!` in the body of a `#[checkpointed]` function: items are moved before the segments, and a macro's local names would then refer to other bindings; define the macro outside the function",
                );
            }
            Stmt::Item(_) => body.items.push(stmt.clone()),
            _ if parse::as_cut_marker(stmt).is_some() => {
                let mac = parse::as_cut_marker(stmt).expect("checked");
                if !mac.tokens.is_empty() {
                    cx.error_spanned_by(mac, "`ckpt::cut!()` takes no arguments");
                }
                body.markers.push((body.stmts.len(), mac.span()));
            }
            Stmt::Expr(Expr::Verbatim(ts), _) if ts.is_empty() => {}
            _ => {
                let mut stmt = stmt.clone();
                let mark = keep_attr(&stmt);
                let kept = parse::take_keep(&mut stmt, cx);
                if kept && body.first_keep.is_none() {
                    body.first_keep = mark;
                }
                body.stmts.push(stmt);
                body.kept.push(kept);
            }
        }
    }
    body.loops = vec![None; body.stmts.len()];
    body
}

/// A `let`'s `#[ckpt::keep]`.
fn keep_attr(stmt: &Stmt) -> Option<syn::Attribute> {
    match stmt {
        Stmt::Local(local) => local.attrs.iter().find(|a| parse::is_keep_attr(a)).cloned(),
        _ => None,
    }
}

/// What the macro knows of module state, to tell layer calls apart: the names of the
/// module parameters (`&T` captured like `self`).
pub(crate) struct Modules<'a> {
    /// Module parameter names.
    pub params: &'a [String],
}

impl Modules<'_> {
    /// Whether `e` refers to module state: `self` or a module parameter, through fields,
    /// indexing and references (`&self.conv1`, `&self.blocks[i]`, `m`, `&m.fc`).
    pub(crate) fn refers_to(&self, e: &Expr) -> bool {
        match e {
            Expr::Reference(r) => self.refers_to(&r.expr),
            Expr::Paren(p) => self.refers_to(&p.expr),
            Expr::Field(f) => self.refers_to(&f.base),
            Expr::Index(i) => self.refers_to(&i.expr),
            Expr::Path(p) if p.qself.is_none() => p
                .path
                .get_ident()
                .is_some_and(|id| id == "self" || self.params.iter().any(|m| id == m)),
            _ => false,
        }
    }

    /// Whether a method call of a chain applies a layer (see the module docs).
    pub(crate) fn is_layer_call(&self, m: &ExprMethodCall) -> bool {
        is_layer_method(&m.method) || is_fold(m) || m.args.iter().any(|a| self.refers_to(a))
    }
}

fn is_layer_method(method: &Ident) -> bool {
    method == "apply" || method == "apply_t" || method == "forward" || method == "forward_t"
}

/// `.fold(init, |acc, item| ..)`.
fn is_fold(m: &ExprMethodCall) -> bool {
    m.method == "fold"
        && m.args.len() == 2
        && matches!(&m.args[1], Expr::Closure(c) if c.inputs.len() == 2)
}

/// One call of a chain: the call itself (its receiver is the previous link), and the `?`
/// right after it, if any.
struct Link {
    call: ExprMethodCall,
    tried: Option<syn::token::Question>,
}

/// The links of a method chain, innermost first, and its base (the receiver of the first
/// call); `None` when `e` is not a method call.
fn chain_links(e: &Expr) -> Option<(Expr, Vec<Link>)> {
    let mut links = Vec::new();
    let mut cur = e;
    loop {
        match cur {
            Expr::MethodCall(m) => {
                links.push(Link {
                    call: m.clone(),
                    tried: None,
                });
                cur = &m.receiver;
            }
            Expr::Try(t) if matches!(&*t.expr, Expr::MethodCall(_)) => {
                let Expr::MethodCall(m) = &*t.expr else {
                    unreachable!()
                };
                links.push(Link {
                    call: m.clone(),
                    tried: Some(t.question_token),
                });
                cur = &m.receiver;
            }
            _ => break,
        }
    }
    if links.is_empty() {
        return None;
    }
    links.reverse();
    Some((cur.clone(), links))
}

/// Rebuilds `receiver.link` (with its `?`).
fn apply_link(receiver: Expr, link: &Link) -> Expr {
    let mut call = link.call.clone();
    call.receiver = Box::new(receiver);
    let e = Expr::MethodCall(call);
    match link.tried {
        Some(q) => Expr::Try(syn::ExprTry {
            attrs: Vec::new(),
            expr: Box::new(e),
            question_token: q,
        }),
        None => e,
    }
}

/// Where a chain is split: the indices of the links that start a new piece.
fn split_points(links: &[Link], modules: &Modules<'_>) -> Vec<usize> {
    let mut out = Vec::new();
    let mut seen_layer = false;
    for (k, link) in links.iter().enumerate() {
        let after_fold = k > 0 && is_fold(&links[k - 1].call);
        if (modules.is_layer_call(&link.call) && seen_layer) || after_fold {
            out.push(k);
        }
        seen_layer |= modules.is_layer_call(&link.call);
    }
    out
}

/// The hygienic name of link `k` of the chain of statement `stmt`, located at `at` (so a
/// type error about it points at the call).
fn link_ident(stmt: usize, k: usize, at: Span) -> Ident {
    Ident::new(
        &format!("__ckpt_link{stmt}_{k}"),
        Span::mixed_site().located_at(at),
    )
}

/// `{ name }`: the previous piece, moved into the next one.
fn moved(name: &Ident) -> Expr {
    syn::parse_quote!({ #name })
}

/// The pieces of a chain expression: `lets` (name, initializer) and the last piece.
fn split_expr(e: &Expr, stmt: usize, modules: &Modules<'_>) -> Option<(Vec<(Ident, Expr)>, Expr)> {
    let (base, links) = chain_links(e)?;
    let points = split_points(&links, modules);
    if points.is_empty() {
        return None;
    }
    let mut lets = Vec::new();
    let mut cur = base;
    let mut start = 0;
    for (piece, &end) in points.iter().enumerate() {
        for link in &links[start..end] {
            cur = apply_link(cur, link);
        }
        let name = link_ident(stmt, piece, links[end - 1].call.method.span());
        lets.push((name.clone(), cur));
        cur = moved(&name);
        start = end;
    }
    for link in &links[start..] {
        cur = apply_link(cur, link);
    }
    Some((lets, cur))
}

/// Splits the method chains of `let` initializers and of the tail expression into links
/// (see the module docs). The attributes of a split `let` (`#[ckpt::allow(..)]`) go on
/// every piece; its pattern and type on the last.
pub(crate) fn split_chains(body: &mut Body, modules: &Modules<'_>) {
    let n = body.stmts.len();
    let mut out = Vec::with_capacity(n);
    let mut kept = Vec::with_capacity(n);
    for (i, stmt) in std::mem::take(&mut body.stmts).into_iter().enumerate() {
        let before = out.len();
        match &stmt {
            Stmt::Local(local)
                if local
                    .init
                    .as_ref()
                    .is_some_and(|init| init.diverge.is_none()) =>
            {
                let init = local.init.as_ref().expect("checked");
                match split_expr(&init.expr, i, modules) {
                    Some((lets, last)) => {
                        let attrs = &local.attrs;
                        for (name, value) in lets {
                            out.push(syn::parse_quote!(#(#attrs)* let #name = #value;));
                        }
                        let mut last_local = local.clone();
                        *last_local.init.as_mut().expect("checked").expr = last;
                        out.push(Stmt::Local(last_local));
                    }
                    None => out.push(stmt),
                }
            }
            Stmt::Expr(e, None) if i + 1 == n => match split_expr(e, i, modules) {
                Some((lets, last)) => {
                    for (name, value) in lets {
                        out.push(syn::parse_quote!(let #name = #value;));
                    }
                    out.push(Stmt::Expr(last, None));
                }
                None => out.push(stmt),
            },
            _ => out.push(stmt),
        }
        kept.resize(out.len(), body.kept[i]);
        debug_assert!(out.len() > before);
    }
    // Markers point at statement indices; chains are split only where markers are not
    // used, so there are none to move.
    debug_assert!(body.markers.is_empty());
    body.loops = vec![None; out.len()];
    body.stmts = out;
    body.kept = kept;
}

/// `tokens` as a short source label, spaced as a person writes Rust, at most `max`
/// characters (then cut with `..`).
pub(crate) fn short_text(tokens: impl ToTokens, max: usize) -> String {
    let mut text = String::new();
    render(tokens.to_token_stream(), &mut text);
    let text = text.trim().trim_end_matches(';').trim_end().to_owned();
    if text.chars().count() > max {
        let cut: String = text.chars().take(max.saturating_sub(2)).collect();
        format!("{}..", cut.trim_end())
    } else {
        text
    }
}

/// What the last rendered token was, for spacing.
#[derive(Clone, Copy, PartialEq)]
enum Last {
    /// Nothing yet, or an opening delimiter, `.`, `::`, a unary `&`/`*`/`!`/`-`.
    Tight,
    /// An identifier, literal or closing delimiter.
    Word,
    /// A keyword after which a delimiter is not a call (`let (a, b)`, `in [..]`).
    Keyword,
    /// A binary operator, `=`, `,`, `;`, `=>`.
    Op,
}

fn render(tokens: TokenStream, out: &mut String) {
    use proc_macro2::{Delimiter, TokenTree};
    let mut last = Last::Tight;
    let mut joint_colon = false;
    // The previous token was a punct joint with this one (`&` of `&&`, `=` of `==`).
    let mut after_joint = false;
    for tt in tokens {
        match tt {
            TokenTree::Ident(id) => {
                after_joint = false;
                if last != Last::Tight {
                    out.push(' ');
                }
                let word = id.to_string();
                last = if matches!(
                    &*word,
                    "let"
                        | "in"
                        | "if"
                        | "match"
                        | "while"
                        | "for"
                        | "return"
                        | "move"
                        | "mut"
                        | "else"
                ) {
                    Last::Keyword
                } else {
                    Last::Word
                };
                out.push_str(&word);
            }
            TokenTree::Literal(lit) => {
                after_joint = false;
                if last != Last::Tight {
                    out.push(' ');
                }
                out.push_str(&lit.to_string());
                last = Last::Word;
            }
            TokenTree::Group(g) => {
                after_joint = false;
                let (open, close) = match g.delimiter() {
                    Delimiter::Parenthesis => ("(", ")"),
                    Delimiter::Bracket => ("[", "]"),
                    Delimiter::Brace => ("{ ", " }"),
                    Delimiter::None => ("", ""),
                };
                let call_like = last == Last::Word && g.delimiter() != Delimiter::Brace;
                if !(call_like || last == Last::Tight) {
                    out.push(' ');
                }
                out.push_str(open);
                render(g.stream(), out);
                out.push_str(close);
                last = Last::Word;
            }
            TokenTree::Punct(p) => {
                let c = p.as_char();
                let joint = p.spacing() == proc_macro2::Spacing::Joint;
                let continues = after_joint && c != ':' && c != '.';
                after_joint = joint;
                if continues {
                    out.push(c);
                    if !joint {
                        out.push(' ');
                    }
                    last = Last::Tight;
                    continue;
                }
                match c {
                    '.' => {
                        out.push('.');
                        last = Last::Tight;
                    }
                    ',' | ';' => {
                        out.push(c);
                        last = Last::Op;
                    }
                    '?' => {
                        out.push('?');
                        last = Last::Word;
                    }
                    ':' if joint || joint_colon => {
                        out.push(':');
                        last = Last::Tight;
                    }
                    ':' => {
                        out.push(':');
                        last = Last::Op;
                    }
                    '&' | '*' | '-' | '!' if !matches!(last, Last::Word) => {
                        if matches!(last, Last::Op | Last::Keyword) {
                            out.push(' ');
                        }
                        out.push(c);
                        last = Last::Tight;
                    }
                    '!' => {
                        // A macro call: `vec!`.
                        out.push('!');
                        last = Last::Tight;
                    }
                    _ => {
                        // A binary operator.
                        if !out.is_empty() && !out.ends_with([' ', '(', '[']) {
                            out.push(' ');
                        }
                        out.push(c);
                        if !joint {
                            out.push(' ');
                        }
                        last = Last::Tight;
                    }
                }
                joint_colon = c == ':' && joint;
            }
        }
    }
}

/// Recognises the layer loops among the statements (see the module docs); a tail `fold`
/// becomes `let __ckpt_fold = ..;` followed by `__ckpt_fold`.
pub(crate) fn find_loops(body: &mut Body) {
    let n = body.stmts.len();
    if let Some(Stmt::Expr(Expr::MethodCall(m), None)) = body.stmts.last()
        && is_fold(m)
    {
        let name = Ident::new(
            "__ckpt_fold",
            Span::mixed_site().located_at(m.method.span()),
        );
        let value = Expr::MethodCall(m.clone());
        body.stmts[n - 1] = syn::parse_quote!(let #name = #value;);
        body.stmts.push(Stmt::Expr(syn::parse_quote!(#name), None));
        body.kept.push(false);
        body.tail_counts = false;
    }
    body.loops = body.stmts.iter().map(loop_unit).collect();
}

fn loop_unit(stmt: &Stmt) -> Option<LoopUnit> {
    match stmt {
        Stmt::Expr(Expr::ForLoop(f), _) => Some(LoopUnit {
            iter: (*f.expr).clone(),
            label: format!(
                "for {} in {}",
                short_text(&f.pat, 20),
                short_text(&f.expr, 40)
            ),
            kind: LoopKind::For(Box::new(f.clone())),
        }),
        Stmt::Local(local) => {
            let init = local.init.as_ref()?;
            if init.diverge.is_some() {
                return None;
            }
            let Expr::MethodCall(m) = &*init.expr else {
                return None;
            };
            if !is_fold(m) {
                return None;
            }
            let Pat::Ident(p) = strip_type(&local.pat) else {
                return None;
            };
            if p.subpat.is_some() || p.by_ref.is_some() {
                return None;
            }
            Some(LoopUnit {
                iter: (*m.receiver).clone(),
                label: format!("{}.fold(..)", short_text(&m.receiver, 50)),
                kind: LoopKind::Fold {
                    name: p.ident.clone(),
                    init: Box::new(m.args[0].clone()),
                    closure: Box::new(m.args[1].clone()),
                },
            })
        }
        _ => None,
    }
}

/// The pattern under a type ascription (`x: Tensor` → `x`).
fn strip_type(pat: &Pat) -> &Pat {
    match pat {
        Pat::Type(t) => strip_type(&t.pat),
        _ => pat,
    }
}

/// A `let` with a fold initializer whose pattern is not one name: it stays one statement;
/// the caller reports it when loops are cut.
pub(crate) fn unsupported_fold(stmt: &Stmt) -> Option<TokenStream> {
    let Stmt::Local(local) = stmt else {
        return None;
    };
    let init = local.init.as_ref()?;
    let Expr::MethodCall(m) = &*init.expr else {
        return None;
    };
    (is_fold(m) && !matches!(strip_type(&local.pat), Pat::Ident(p) if p.subpat.is_none() && p.by_ref.is_none()))
        .then(|| local.pat.to_token_stream())
}

#[cfg(test)]
mod tests {
    use super::short_text;
    use quote::quote;

    #[test]
    fn labels_read_like_source() {
        let cases = [
            (
                quote!(let h = self.block1.forward_t(xs, train);),
                "let h = self.block1.forward_t(xs, train)",
            ),
            (
                quote!(let (a, b) = (h.relu(), h.tanh());),
                "let (a, b) = (h.relu(), h.tanh())",
            ),
            (
                quote!(xs.view([-1, 1, 28, 28]).apply(&self.conv1)),
                "xs.view([-1, 1, 28, 28]).apply(&self.conv1)",
            ),
            (quote!(a + &b * 2.0 - c), "a + &b * 2.0 - c"),
            (quote!(x == y && !z), "x == y && !z"),
            (quote!(Tensor::cat(&[a, b], 1)), "Tensor::cat(&[a, b], 1)"),
            (quote!(let x = -y?;), "let x = -y?"),
            (quote!(vec![1, 2]), "vec![1, 2]"),
            (
                quote!(x = block.forward(&x, freqs_cis)),
                "x = block.forward(&x, freqs_cis)",
            ),
        ];
        for (tokens, want) in cases {
            assert_eq!(short_text(tokens, 80), want);
        }
        assert_eq!(short_text(quote!(aaaa.bbbb.cccc), 8), "aaaa.b..");
    }
}
