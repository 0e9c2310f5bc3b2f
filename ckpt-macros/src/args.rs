//! The arguments of `#[checkpointed(..)]`, on a function and on a `model!` declaration
//! alike: `segments = N | auto`, `budget = ".."`, `preserve_rng_state = bool`,
//! `determinism_check = bool`. Unknown and duplicate keys are errors that list the valid
//! ones; every error is collected in the caller's [`Ctxt`], and parsing recovers at the
//! next comma.

use proc_macro2::{Span, TokenStream};
use syn::ext::IdentExt;
use syn::parse::{ParseStream, Parser};
use syn::spanned::Spanned;
use syn::{Ident, LitBool, LitInt, LitStr, Token};

use crate::budget::{self, Objective};
use crate::ctxt::Ctxt;

/// Where the attribute is: the valid segment counts differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target {
    /// On a function: at least 2 (the last segment runs inline, so 1 would checkpoint
    /// nothing and is rejected as a likely mistake).
    Function,
    /// On a `model!`: at least 1 (1 checkpoints nothing, as `checkpoint_sequential`;
    /// the count can be changed at run time).
    Model,
}

impl Target {
    /// The error for `segments = value`, when it is not valid here.
    fn rejects(self, value: usize) -> Option<&'static str> {
        match (self, value) {
            (Target::Function, 0) => Some(
                "`segments = 0`: a function is cut into at least 2 segments (the last one runs inline, not checkpointed); use `segments = 2` or more",
            ),
            (Target::Function, 1) => Some(
                "`segments = 1` would checkpoint nothing: the last segment runs inline, not checkpointed (as PyTorch's `checkpoint_sequential`); use `segments = 2` or more",
            ),
            (Target::Model, 0) => Some(
                "`segments = 0`: the chain is cut into at least one segment; use `segments = 1` (nothing checkpointed) or more (every segment but the last is checkpointed)",
            ),
            _ => None,
        }
    }
}

mod kw {
    syn::custom_keyword!(segments);
    syn::custom_keyword!(preserve_rng_state);
    syn::custom_keyword!(determinism_check);
    syn::custom_keyword!(auto);
    syn::custom_keyword!(budget);
}

/// The arguments of `#[checkpointed(..)]`.
#[derive(Debug, Default)]
pub(crate) struct Args {
    /// `segments = N`, with the span of `N`.
    pub segments: Option<(usize, Span)>,
    /// Whether a `segments` key was written (valid or not).
    pub segments_given: bool,
    /// `segments = auto` and/or `budget = ".."`: the planner chooses the cuts at run time,
    /// with the span of `auto` or of the budget string.
    pub auto: Option<(Objective, Span)>,
    /// `segments = auto` was written (span of `auto`).
    auto_kw: Option<Span>,
    /// `budget = ".."` was written (valid or not).
    pub budget_given: bool,
    /// The parsed budget, with the span of its string.
    budget: Option<(Objective, Span)>,
    /// `preserve_rng_state = bool` (default `true`).
    pub preserve_rng_state: Option<bool>,
    /// `determinism_check = bool` (default `true`).
    pub determinism_check: Option<bool>,
    /// Span of the whole argument list (the macro call when there is none).
    pub span: Option<Span>,
}

const VALID_KEYS: &str = "`segments = N`, `segments = auto`, `budget = \"..\"`, `preserve_rng_state = bool`, `determinism_check = bool`";

/// Parses `key = value, ..`, collecting every error (unknown and duplicate keys, bad
/// values) in `cx` and recovering at the next comma.
pub(crate) fn parse_args(tokens: TokenStream, target: Target, cx: &mut Ctxt) -> Args {
    let mut args = Args {
        span: (!tokens.is_empty()).then(|| tokens.span()),
        ..Args::default()
    };
    let parser = |input: ParseStream| -> syn::Result<()> {
        while !input.is_empty() {
            if let Err(e) = parse_one(input, &mut args, target, cx) {
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
    match (&args.segments, args.budget, args.auto_kw) {
        (Some(_), Some((_, span)), _) => cx.error_at(
            span,
            "`budget` chooses the cuts itself, so it cannot be combined with `segments = N`; remove `segments = N` (or write `segments = auto, budget = ..`)",
        ),
        (None, Some(budget), _) => args.auto = Some(budget),
        (None, None, Some(span)) if !args.budget_given => {
            args.auto = Some((Objective::MinPeak, span));
        }
        _ => {}
    }
    args
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

fn parse_one(
    input: ParseStream,
    args: &mut Args,
    target: Target,
    cx: &mut Ctxt,
) -> syn::Result<()> {
    let lookahead = input.lookahead1();
    if lookahead.peek(kw::segments) {
        let key: kw::segments = input.parse()?;
        let seen = std::mem::replace(&mut args.segments_given, true);
        input.parse::<Token![=]>()?;
        if input.peek(kw::auto) {
            let auto: kw::auto = input.parse()?;
            if seen {
                cx.error_spanned_by(key, "duplicate argument `segments`");
            } else {
                args.auto_kw = Some(auto.span);
            }
            return Ok(());
        }
        let n: LitInt = input.parse().map_err(|e| {
            syn::Error::new(
                e.span(),
                "`segments` takes a positive integer or `auto`: `segments = 4`, `segments = auto`",
            )
        })?;
        let value: usize = n.base10_parse()?;
        if seen {
            cx.error_spanned_by(key, "duplicate argument `segments`");
        } else if let Some(message) = target.rejects(value) {
            cx.error_spanned_by(&n, message);
        } else {
            args.segments = Some((value, n.span()));
        }
        Ok(())
    } else if lookahead.peek(kw::budget) {
        let key: kw::budget = input.parse()?;
        let seen = std::mem::replace(&mut args.budget_given, true);
        input.parse::<Token![=]>()?;
        let lit: LitStr = input.parse().map_err(|e| {
            syn::Error::new(
                e.span(),
                "`budget` takes a string: `budget = \"512 MiB\"` or `budget = \"40%\"`",
            )
        })?;
        if seen {
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
