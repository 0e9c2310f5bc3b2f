//! Parsing a declaration: the header (`pub struct Name<G>(p, args..) where ..`) and the
//! items between the braces. Checks local to one item happen here (stage syntax, missing
//! constructors, closure arities, attributes); rules spanning several items are in
//! `valid.rs`. Every error is collected in the [`Ctxt`]; after an error in an item,
//! parsing resumes at the next comma, so one compile reports all of them.

use proc_macro2::{Span, TokenStream, TokenTree};
use syn::parse::{ParseStream, Parser};
use syn::{
    Attribute, Expr, ExprClosure, Generics, Ident, Pat, Token, Type, Visibility, WhereClause,
    braced, parenthesized,
};

use super::ast::{
    Builtin, BuiltinItem, ClosureItem, FieldItem, FieldKind, FunctionItem, Item, LetItem, Model,
    Param, PathParam,
};
use super::attr::{self, ItemAttrs};
use crate::ctxt::Ctxt;
use crate::shared::{self, skip_to_comma};

/// Parses a whole declaration. `Err` only when the header cannot be read (no struct
/// name, no parameter list, no braces); item errors are collected in `cx`.
pub(crate) fn parse_model(tokens: TokenStream, cx: &mut Ctxt) -> syn::Result<Model> {
    let parser = |input: ParseStream| -> syn::Result<Model> {
        let all_attrs = input.call(Attribute::parse_outer)?;
        let mut attrs = Vec::new();
        let mut checkpoint = None;
        let mut seen_checkpointed = false;
        for a in all_attrs {
            if attr::is_checkpointed(&a) {
                if seen_checkpointed {
                    cx.error_spanned_by(&a, "duplicate `#[checkpointed]` attribute");
                    continue;
                }
                seen_checkpointed = true;
                checkpoint = attr::parse_checkpointed(&a, cx);
            } else {
                if a.path().is_ident("derive") {
                    // Without the derives `model!` generates itself (reported).
                    attrs.extend(check_derive(&a, cx));
                } else {
                    attrs.push(a);
                }
            }
        }
        let vis: Visibility = input.parse()?;
        if !input.peek(Token![struct]) {
            return Err(input
                .error("expected `struct`: `model! { pub struct Mlp(p, cfg: &Config) { .. } }`"));
        }
        input.parse::<Token![struct]>()?;
        let ident: Ident = input.parse()?;
        let mut generics: Generics = input.parse()?;
        if !input.peek(syn::token::Paren) {
            return Err(input.error(format!(
                "expected the constructor's parameters after the struct name, the `nn::Path` first: `struct {ident}(p, cfg: &Config) {{ .. }}`"
            )));
        }
        let content;
        let parens = parenthesized!(content in input);
        let (path, params) = parse_params(&content, parens.span.join(), cx)?;
        let where_clause: Option<WhereClause> = input.parse()?;
        generics.where_clause = where_clause;
        if !input.peek(syn::token::Brace) {
            return Err(input.error(format!(
                "expected the stages in braces: `struct {ident}(p, ..) {{ fc1: nn::Linear = nn::linear(p, 4, 8, Default::default()), relu, .. }}`"
            )));
        }
        let body;
        braced!(body in input);
        let (items, keeps) = parse_items(&body, cx).into_iter().unzip();
        if !input.is_empty() {
            return Err(input
                .error("unexpected tokens after the declaration; `model!` declares one struct"));
        }
        Ok(Model {
            attrs,
            checkpoint,
            checkpointed: seen_checkpointed,
            vis,
            ident,
            generics,
            path,
            params,
            items,
            keeps,
        })
    };
    parser.parse2(tokens)
}

/// `(p, cfg: &Config, n: i64)` or `(p: &nn::Path, ..)`.
fn parse_params(
    input: ParseStream,
    span: Span,
    cx: &mut Ctxt,
) -> syn::Result<(PathParam, Vec<Param>)> {
    if input.is_empty() {
        return Err(syn::Error::new(
            span,
            "the constructor takes the `nn::Path` the variables are created under, first: `(p)` or `(p, cfg: &Config)`",
        ));
    }
    let ident: Ident = input.parse().map_err(|e| {
        syn::Error::new(
            e.span(),
            "the first parameter is the `nn::Path` the variables are created under, by name: `p` (or `p: &nn::Path`)",
        )
    })?;
    let ty = if input.peek(Token![:]) {
        input.parse::<Token![:]>()?;
        Some(input.parse::<Type>()?)
    } else {
        None
    };
    let mut params = Vec::new();
    while !input.is_empty() {
        input.parse::<Token![,]>()?;
        if input.is_empty() {
            break;
        }
        let pat = Pat::parse_single(input)?;
        if !input.peek(Token![:]) {
            cx.error_spanned_by(
                &pat,
                format!(
                    "constructor parameter `{}` needs a type: `{}: Type`",
                    tokens_text(&pat),
                    tokens_text(&pat)
                ),
            );
            skip_to_comma(input)?;
            continue;
        }
        input.parse::<Token![:]>()?;
        let ty: Type = input.parse()?;
        params.push(Param { pat, ty });
    }
    Ok((PathParam { ident, ty }, params))
}

/// Tokens as the user would write them: `nn::Linear`, `[Block; n]` (not `nn :: Linear`).
pub(crate) fn tokens_text(t: &impl quote::ToTokens) -> String {
    let mut s = t.to_token_stream().to_string();
    for (from, to) in [
        (" :: ", "::"),
        (":: ", "::"),
        (" ::", "::"),
        ("< ", "<"),
        (" <", "<"),
        (" >", ">"),
        (" ,", ","),
        (" ;", ";"),
        ("& ", "&"),
        ("[ ", "["),
        (" ]", "]"),
        ("( ", "("),
        (" )", ")"),
        (" . ", "."),
        (" (", "("),
        (" ! ", "!"),
    ] {
        s = s.replace(from, to);
    }
    s
}

/// The items, comma-separated, each with its `#[keep]`; an item with an error is skipped
/// up to the next comma.
fn parse_items(input: ParseStream, cx: &mut Ctxt) -> Vec<(Item, Option<Span>)> {
    let mut items = Vec::new();
    // Only fails when recovery itself fails (it cannot: skipping stops at a comma or the
    // end of the braces).
    let result = shared::parse_comma_separated(
        input,
        cx,
        |input, cx| {
            items.extend(parse_item(input, cx)?);
            Ok(())
        },
        |e| syn::Error::new(e.span(), "expected `,` between the items of the chain"),
    );
    if let Err(e) = result {
        cx.push(e);
    }
    items
}

const STAGE_FORMS: &str = "a layer `name: Type = init`, repeated layers `name: [Type; count] = init`, a built-in (`relu`, `gelu`, `tanh`, `sigmoid`, `silu`, `dropout(p)`), a function path (`my_fn`) or a closure (`|xs| ..`)";

/// One item, with its `#[keep]` when it is a stage. `Ok(None)`: an error was reported
/// and the item is dropped.
fn parse_item(input: ParseStream, cx: &mut Ctxt) -> syn::Result<Option<(Item, Option<Span>)>> {
    let raw_attrs = input.call(Attribute::parse_outer)?;
    let attrs = attr::item_attrs(raw_attrs, cx);
    let keep = attrs.keep;
    let item = parse_item_body(input, attrs, cx)?;
    Ok(item.map(|item| {
        let keep = keep.filter(|&span| keep_allowed(&item, span, cx));
        (item, keep)
    }))
}

/// Whether `#[keep]` may mark `item` (a stage); reports it otherwise.
fn keep_allowed(item: &Item, span: Span, cx: &mut Ctxt) -> bool {
    let what = match item {
        Item::Let(_) => {
            "a per-call value `let ..` is computed once per call, outside the checkpointed segments, and never recomputed"
        }
        Item::Field(_) if !item.is_stage() => {
            "a `#[field]` is not a stage of the chain: it has no output to store"
        }
        _ => return true,
    };
    cx.error_at(
        span,
        format!(
            "`#[keep]` marks a stage whose output is stored instead of recomputed; {what}: remove `#[keep]`"
        ),
    );
    false
}

/// The item after its attributes.
fn parse_item_body(
    input: ParseStream,
    attrs: ItemAttrs,
    cx: &mut Ctxt,
) -> syn::Result<Option<Item>> {
    if input.peek(Token![let]) {
        return parse_let(input, attrs, cx).map(Some);
    }

    let vis: Visibility = input.parse()?;
    let named = input.peek(Ident) && input.peek2(Token![:]) && !input.peek2(Token![::]);
    if named {
        return parse_field(input, attrs, vis, cx).map(Some);
    }
    if !matches!(vis, Visibility::Inherited) {
        cx.error_spanned_by(
            &vis,
            "visibility applies to fields (`pub fc1: nn::Linear = ..`); this stage is not a field",
        );
    }
    let expr: Expr = input
        .parse()
        .map_err(|e| syn::Error::new(e.span(), format!("expected a stage: {STAGE_FORMS}")))?;
    if let Some(span) = attrs.field {
        cx.error_at(
            span,
            "`#[field]` declares a named field: `#[field] name: Type = init`",
        );
    }
    classify_expr(expr, attrs, cx)
}

/// A stage written as an expression: built-in, function path or closure.
fn classify_expr(expr: Expr, attrs: ItemAttrs, cx: &mut Ctxt) -> syn::Result<Option<Item>> {
    match expr {
        Expr::Path(p) if p.qself.is_none() && p.attrs.is_empty() => {
            if let Some(ident) = p.path.get_ident()
                && let Some(kind) = Builtin::from_ident(ident)
            {
                if kind == Builtin::Dropout {
                    cx.error_spanned_by(
                        ident,
                        "`dropout` takes the probability of zeroing an element: `dropout(0.1)`",
                    );
                    return Ok(None);
                }
                if let Some(span) = attrs.train {
                    cx.error_at(span, format!("`#[train]` on the built-in `{ident}`, which does not take the train flag"));
                }
                return Ok(Some(Item::Builtin(BuiltinItem {
                    ident: ident.clone(),
                    kind,
                    arg: None,
                })));
            }
            Ok(Some(Item::Function(FunctionItem {
                path: p.path,
                train: attrs.train,
            })))
        }
        Expr::Call(call)
            if matches!(&*call.func, Expr::Path(p) if p.qself.is_none()
                && p.path.get_ident().is_some_and(|i| Builtin::from_ident(i).is_some())) =>
        {
            let Expr::Path(p) = &*call.func else {
                unreachable!()
            };
            let ident = p.path.get_ident().expect("checked").clone();
            let kind = Builtin::from_ident(&ident).expect("checked");
            if kind != Builtin::Dropout {
                cx.error_spanned_by(
                    &call,
                    format!(
                        "the built-in `{ident}` takes no arguments: write `{ident}`; for another variant use a closure (`|xs| xs.{ident}(..)`)"
                    ),
                );
                return Ok(None);
            }
            if call.args.len() != 1 {
                cx.error_spanned_by(
                    &call,
                    "`dropout` takes one argument, the probability of zeroing an element: `dropout(0.1)`",
                );
                return Ok(None);
            }
            if let Some(span) = attrs.train {
                cx.error_at(
                    span,
                    "`dropout(p)` takes the train flag already; remove `#[train]`",
                );
            }
            Ok(Some(Item::Builtin(BuiltinItem {
                ident,
                kind,
                arg: call.args.into_iter().next(),
            })))
        }
        Expr::Closure(closure) => {
            if let Some(span) = attrs.train {
                cx.error_at(
                    span,
                    "a closure says that it takes the train flag by its parameters: `|xs, train| ..`; remove `#[train]`",
                );
            }
            check_closure(&closure, &[1, 2], "`|xs| ..` or `|xs, train| ..`", cx);
            Ok(Some(Item::Closure(ClosureItem { closure })))
        }
        other => {
            let text = tokens_text(&other);
            let hint = match &other {
                Expr::MethodCall(m) if matches!(&*m.receiver, Expr::Path(p) if p.path.is_ident("xs")) =>
                {
                    format!("; a tensor method is a closure: `|xs| {text}`")
                }
                Expr::MethodCall(_) => {
                    "; a stage is applied to the chain's tensor: write a closure, `|xs| ..`"
                        .to_owned()
                }
                Expr::Call(c) => format!(
                    "; to call `{}` with more arguments, write a closure: `|xs| {}(xs, ..)`",
                    tokens_text(&c.func),
                    tokens_text(&c.func)
                ),
                _ => String::new(),
            };
            cx.error_spanned_by(
                &other,
                format!("unknown stage syntax `{text}`: a stage is {STAGE_FORMS}{hint}"),
            );
            Ok(None)
        }
    }
}

/// Checks that a closure has one of the allowed numbers of parameters and no
/// `async`/`move`-incompatible form.
fn check_closure(closure: &ExprClosure, arities: &[usize], expected: &str, cx: &mut Ctxt) -> bool {
    if !arities.contains(&closure.inputs.len()) {
        let n = closure.inputs.len();
        let (or1, inputs, or2) = (&closure.or1_token, &closure.inputs, &closure.or2_token);
        cx.error_spanned_by(
            quote::quote!(#or1 #inputs #or2),
            format!(
                "this closure takes {n} parameter{}; expected {expected}",
                if n == 1 { "" } else { "s" }
            ),
        );
        return false;
    }
    if let Some(a) = &closure.asyncness {
        cx.error_spanned_by(a, "a stage cannot be `async`");
        return false;
    }
    true
}

/// `let name: Type = expr`.
fn parse_let(input: ParseStream, attrs: ItemAttrs, cx: &mut Ctxt) -> syn::Result<Item> {
    let let_token: Token![let] = input.parse()?;
    if let Some(span) = attrs.train.or(attrs.field) {
        cx.error_at(
            span,
            "a per-call value `let ..` takes no `#[train]` or `#[field]`; it sees `xs` and `train` anyway",
        );
    }
    let ident: Ident = input.parse().map_err(|e| {
        syn::Error::new(
            e.span(),
            "expected a name: `let mask: Tensor = xs.ne(0)` (patterns are not supported)",
        )
    })?;
    if !input.peek(Token![:]) {
        return Err(syn::Error::new_spanned(
            quote::quote!(#let_token #ident),
            format!(
                "per-call value `{ident}` needs a type: `let {ident}: Tensor = ..` (it is handed to every stage and checkpointed segment, which need its type)"
            ),
        ));
    }
    input.parse::<Token![:]>()?;
    let ty: Type = input.parse()?;
    if !input.peek(Token![=]) {
        return Err(input.error(format!(
            "per-call value `{ident}` needs a value: `let {ident}: {} = ..`",
            tokens_text(&ty)
        )));
    }
    input.parse::<Token![=]>()?;
    let expr: Expr = input.parse()?;
    let uses_train = mentions(&quote::ToTokens::to_token_stream(&expr), "train");
    Ok(Item::Let(Box::new(LetItem {
        ident,
        ty,
        expr,
        uses_train,
    })))
}

/// Whether `tokens` contain the identifier `name` (at any depth, also inside macro
/// invocations).
pub(crate) fn mentions(tokens: &TokenStream, name: &str) -> bool {
    tokens.clone().into_iter().any(|tt| match tt {
        TokenTree::Ident(i) => i == name,
        TokenTree::Group(g) => mentions(&g.stream(), name),
        _ => false,
    })
}

/// `name: Type = init [=> |layer, xs| ..]`, `name: [Type; count] = init`,
/// `#[field] name: Type = init`.
fn parse_field(
    input: ParseStream,
    attrs: ItemAttrs,
    vis: Visibility,
    cx: &mut Ctxt,
) -> syn::Result<Item> {
    let ident: Ident = input.parse()?;
    input.parse::<Token![:]>()?;
    let ty: Type = input.parse()?;
    let kind = match (&ty, attrs.field) {
        (_, Some(_)) => FieldKind::Plain,
        (Type::Array(a), None) => FieldKind::Repeated {
            elem: a.elem.clone(),
            count: Box::new(a.len.clone()),
        },
        (_, None) => FieldKind::Layer,
    };
    if let (Some(span), Some(_)) = (attrs.train, attrs.field) {
        cx.error_at(
            span,
            "`#[train]` applies to stages; a `#[field]` is not applied in the chain",
        );
    }
    let init = if input.peek(Token![=]) && !input.peek(Token![=>]) {
        input.parse::<Token![=]>()?;
        let init: Expr = input.parse()?;
        if let (FieldKind::Repeated { .. }, Expr::Closure(c)) = (&kind, &init) {
            check_closure(c, &[1], "`|i| ..`, called with the index of the layer", cx);
        }
        Some(init)
    } else {
        let what = match &kind {
            FieldKind::Plain => "field",
            _ => "stage",
        };
        let example = match &kind {
            FieldKind::Repeated { elem, .. } => {
                format!(
                    "{ident}: {} = {}::new(p, ..)",
                    tokens_text(&ty),
                    tokens_text(elem)
                )
            }
            FieldKind::Layer => format!("{ident}: {} = nn::linear(p, ..)", tokens_text(&ty)),
            FieldKind::Plain => format!("#[field] {ident}: {} = ..", tokens_text(&ty)),
        };
        cx.error_spanned_by(
            quote::quote!(#ident),
            format!(
                "{what} `{ident}` has no constructor: write `{example}`{}",
                if what == "stage" {
                    " (`p` is the stage's own path)"
                } else {
                    ""
                }
            ),
        );
        None
    };
    let apply = if input.peek(Token![=>]) {
        let arrow: Token![=>] = input.parse()?;
        let expr: Expr = input.parse()?;
        match expr {
            Expr::Closure(c) if !matches!(kind, FieldKind::Plain) => {
                if attrs.train.is_some() && c.inputs.len() == 2 {
                    // `#[train]` with a two-parameter closure: the closure decides.
                    cx.error_spanned_by(
                        arrow,
                        "with `=> |layer, xs| ..` the closure applies the stage; take the train flag as its third parameter (`|layer, xs, train| ..`) instead of `#[train]`",
                    );
                }
                check_closure(
                    &c,
                    &[2, 3],
                    "`|layer, xs| ..` or `|layer, xs, train| ..`",
                    cx,
                )
                .then_some(c)
            }
            Expr::Closure(_) => {
                cx.error_spanned_by(
                    arrow,
                    "a `#[field]` is not applied in the chain, so it takes no `=> |..| ..`",
                );
                None
            }
            other => {
                cx.error_spanned_by(
                    &other,
                    "expected a closure applying the stage: `=> |layer, xs| layer.forward(xs, ..)` (or `|layer, xs, train| ..`)",
                );
                None
            }
        }
    } else {
        None
    };
    Ok(Item::Field(Box::new(FieldItem {
        docs: attrs.docs,
        vis,
        ident,
        ty,
        kind,
        init,
        train: attrs.train,
        apply,
    })))
}

/// `model!` implements `Debug` and `ShallowClone` itself: deriving them as well would be
/// a conflict that rustc reports without saying why. Each is an error here, on the
/// derive, and the attribute is returned without them (none when nothing is left), so
/// no conflict follows.
fn check_derive(attr: &Attribute, cx: &mut Ctxt) -> Option<Attribute> {
    let Ok(paths) =
        attr.parse_args_with(syn::punctuated::Punctuated::<syn::Path, Token![,]>::parse_terminated)
    else {
        return Some(attr.clone());
    };
    let mut kept = Vec::new();
    for path in paths {
        match path.segments.last() {
            Some(last) if last.ident == "Debug" || last.ident == "ShallowClone" => {
                cx.error_spanned_by(
                    &path,
                    format!(
                        "`model!` implements `{}` itself; remove it from `#[derive(..)]`",
                        last.ident
                    ),
                );
            }
            _ => kept.push(path),
        }
    }
    (!kept.is_empty()).then(|| syn::parse_quote!(#[derive(#(#kept),*)]))
}
