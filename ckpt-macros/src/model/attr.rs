//! Attributes: `#[checkpointed(..)]` on the declaration, and `#[train]` / `#[field]` on
//! items. Unknown and duplicate keys are errors that list the valid ones; every error is
//! collected, and parsing recovers at the next comma.

use proc_macro2::{Span, TokenStream};
use syn::ext::IdentExt;
use syn::parse::{ParseStream, Parser};
use syn::spanned::Spanned;
use syn::{Attribute, Ident, LitBool, LitInt, LitStr, Meta, Token};

use super::ast::{Checkpoint, Segments};
use crate::budget::{self, Objective};
use crate::ctxt::Ctxt;

mod kw {
    syn::custom_keyword!(segments);
    syn::custom_keyword!(preserve_rng_state);
    syn::custom_keyword!(determinism_check);
    syn::custom_keyword!(budget);
    syn::custom_keyword!(auto);
}

const VALID_KEYS: &str = "`segments = N`, `segments = auto`, `budget = \"..\"`, `preserve_rng_state = bool`, `determinism_check = bool`";

/// Whether `attr` is `#[checkpointed]` / `#[ckpt::checkpointed]`.
pub(crate) fn is_checkpointed(attr: &Attribute) -> bool {
    let path = attr.path();
    let n = path.segments.len();
    path.segments
        .last()
        .is_some_and(|s| s.ident == "checkpointed")
        && (n == 1 || (n == 2 && path.segments[0].ident == "ckpt"))
}

/// Parses `#[checkpointed(..)]`; `None` (with the errors in `cx`) when it is not usable.
pub(crate) fn parse_checkpointed(attr: &Attribute, cx: &mut Ctxt) -> Option<Checkpoint> {
    let tokens = match &attr.meta {
        Meta::List(list) => list.tokens.clone(),
        Meta::Path(_) => TokenStream::new(),
        Meta::NameValue(nv) => {
            cx.error_spanned_by(
                nv,
                "expected `#[checkpointed(segments = N)]`, with arguments in parentheses",
            );
            return None;
        }
    };
    let mut args = Args::default();
    let mut local = Ctxt::default();
    let cx_outer = cx;
    let cx = &mut local;
    let parser = |input: ParseStream| -> syn::Result<()> {
        while !input.is_empty() {
            if let Err(e) = parse_one(input, &mut args, cx) {
                cx.push(e);
                skip_to_comma(input)?;
            }
            if input.is_empty() {
                break;
            }
            if let Err(e) = input.parse::<Token![,]>() {
                cx.push(e);
                skip_to_comma(input)?;
                if !input.is_empty() {
                    input.parse::<Token![,]>()?;
                }
            }
        }
        Ok(())
    };
    if let Err(e) = parser.parse2(tokens) {
        cx.push(e);
    }
    let had_errors = !local.is_ok();
    if let Err(e) = local.finish() {
        cx_outer.push(e);
    }
    let segments = match (args.segments, args.budget, args.auto) {
        (Some(Segments::Fixed(_)), Some((_, span)), _) => {
            cx_outer.error_at(
                span,
                "`budget` chooses the cuts itself, so it cannot be combined with `segments = N`; remove `segments = N` (or write `segments = auto, budget = ..`)",
            );
            return None;
        }
        (Some(s), None, _) => s,
        (_, Some((objective, _)), _) => Segments::Auto(objective),
        (None, None, true) => Segments::Auto(Objective::MinPeak),
        (None, None, false) => {
            if !had_errors && !args.segments_seen {
                cx_outer.error_spanned_by(
                    attr,
                    "`#[checkpointed]` on a `model!` needs `segments = N` (the number of segments the chain of stages is cut into; `segments = 1` checkpoints nothing), `segments = auto` (the planner chooses the cuts for the least peak memory) or `budget = \"..\"` (the least recompute within a memory budget)",
                );
            }
            return None;
        }
    };
    Some(Checkpoint {
        segments,
        preserve_rng_state: args.preserve_rng_state,
        determinism_check: args.determinism_check,
    })
}

#[derive(Default)]
struct Args {
    segments: Option<Segments>,
    /// `segments = auto` was given.
    auto: bool,
    /// `budget = ".."`, parsed, with the span of the string.
    budget: Option<(Objective, Span)>,
    budget_seen: bool,
    /// `segments` was given, with a value rejected by an error already reported.
    segments_seen: bool,
    preserve_rng_state: Option<bool>,
    determinism_check: Option<bool>,
}

fn skip_to_comma(input: ParseStream) -> syn::Result<()> {
    input.step(|cursor| {
        let mut rest = *cursor;
        while let Some((tt, next)) = rest.token_tree() {
            if let proc_macro2::TokenTree::Punct(p) = &tt
                && p.as_char() == ','
            {
                return Ok(((), rest));
            }
            rest = next;
        }
        Ok(((), rest))
    })
}

fn parse_one(input: ParseStream, args: &mut Args, cx: &mut Ctxt) -> syn::Result<()> {
    let lookahead = input.lookahead1();
    if lookahead.peek(kw::segments) {
        let key: kw::segments = input.parse()?;
        input.parse::<Token![=]>()?;
        if args.segments_seen {
            cx.error_spanned_by(key, "duplicate argument `segments`");
            // Consume the value so that recovery does not report it again.
            let _: TokenStream = input.step(|c| {
                let mut rest = *c;
                let mut out = TokenStream::new();
                while let Some((tt, next)) = rest.token_tree() {
                    if matches!(&tt, proc_macro2::TokenTree::Punct(p) if p.as_char() == ',') {
                        break;
                    }
                    out.extend([tt]);
                    rest = next;
                }
                Ok((out, rest))
            })?;
            return Ok(());
        }
        args.segments_seen = true;
        if input.peek(kw::auto) {
            input.parse::<kw::auto>()?;
            args.auto = true;
            return Ok(());
        }
        let n: LitInt = input.parse().map_err(|e| {
            syn::Error::new(
                e.span(),
                "`segments` takes a positive integer or `auto`: `segments = 3`, `segments = auto`",
            )
        })?;
        let value: usize = n.base10_parse()?;
        if value == 0 {
            cx.error_spanned_by(
                &n,
                "`segments = 0`: the chain is cut into at least one segment; use `segments = 1` (nothing checkpointed) or more (every segment but the last is checkpointed)",
            );
        } else {
            args.segments = Some(Segments::Fixed(value));
        }
        Ok(())
    } else if lookahead.peek(kw::budget) {
        let key: kw::budget = input.parse()?;
        input.parse::<Token![=]>()?;
        let lit: LitStr = input.parse().map_err(|e| {
            syn::Error::new(
                e.span(),
                "`budget` takes a string: `budget = \"512 MiB\"` or `budget = \"40%\"`",
            )
        })?;
        if std::mem::replace(&mut args.budget_seen, true) {
            cx.error_spanned_by(key, "duplicate argument `budget`");
            return Ok(());
        }
        match budget::parse(&lit.value()) {
            Ok(objective) => args.budget = Some((objective, lit.span())),
            Err(message) => cx.error_spanned_by(&lit, message),
        }
        Ok(())
    } else if lookahead.peek(kw::preserve_rng_state) {
        let key: kw::preserve_rng_state = input.parse()?;
        let value = parse_bool(input, "preserve_rng_state")?;
        if args.preserve_rng_state.replace(value).is_some() {
            cx.error_spanned_by(key, "duplicate argument `preserve_rng_state`");
        }
        Ok(())
    } else if lookahead.peek(kw::determinism_check) {
        let key: kw::determinism_check = input.parse()?;
        let value = parse_bool(input, "determinism_check")?;
        if args.determinism_check.replace(value).is_some() {
            cx.error_spanned_by(key, "duplicate argument `determinism_check`");
        }
        Ok(())
    } else if input.peek(Ident::peek_any) {
        let key = input.call(Ident::parse_any)?;
        Err(syn::Error::new(
            key.span(),
            format!("unknown argument `{key}`; expected one of {VALID_KEYS}"),
        ))
    } else {
        Err(lookahead.error())
    }
}

fn parse_bool(input: ParseStream, key: &str) -> syn::Result<bool> {
    input.parse::<Token![=]>()?;
    let value: LitBool = input.parse().map_err(|e| {
        syn::Error::new(
            e.span(),
            format!("`{key}` takes `true` or `false`: `{key} = false`"),
        )
    })?;
    Ok(value.value)
}

/// What the attributes of an item say.
#[derive(Default)]
pub(crate) struct ItemAttrs {
    /// Doc comments, kept on fields.
    pub docs: Vec<Attribute>,
    /// `#[train]`.
    pub train: Option<Span>,
    /// `#[field]`.
    pub field: Option<Span>,
}

/// Sorts an item's attributes; anything but doc comments, `#[train]` and `#[field]` is an
/// error.
pub(crate) fn item_attrs(attrs: Vec<Attribute>, cx: &mut Ctxt) -> ItemAttrs {
    let mut out = ItemAttrs::default();
    for attr in attrs {
        let path = attr.path();
        if path.is_ident("doc") {
            out.docs.push(attr);
        } else if path.is_ident("train") || path.is_ident("field") {
            let slot = if path.is_ident("train") {
                &mut out.train
            } else {
                &mut out.field
            };
            let name = if path.is_ident("train") {
                "train"
            } else {
                "field"
            };
            if !matches!(attr.meta, Meta::Path(_)) {
                cx.error_spanned_by(&attr, format!("`#[{name}]` takes no arguments"));
            } else if slot.is_some() {
                cx.error_spanned_by(&attr, format!("duplicate `#[{name}]`"));
            } else {
                *slot = Some(attr.span());
            }
        } else {
            cx.error_spanned_by(
                attr.path(),
                format!(
                    "unknown attribute `#[{}]` on a `model!` item; expected `#[train]` (the stage takes the train flag), `#[field]` (a field that is not a stage) or doc comments",
                    quote::ToTokens::to_token_stream(path).to_string().replace(' ', "")
                ),
            );
        }
    }
    out
}
