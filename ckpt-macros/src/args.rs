//! The arguments of `#[checkpointed(..)]`, on a function and on a `model!` declaration
//! alike: `segments = N | auto`, `budget = ".."`, `preserve_rng_state = bool`,
//! `determinism_check = bool`, `policy = full | masks | narrowing | selective`. Unknown and duplicate keys are errors that list the valid
//! ones; every error is collected in the caller's [`Ctxt`], and parsing recovers at the
//! next comma.

use proc_macro2::{Span, TokenStream};
use syn::ext::IdentExt;
use syn::parse::{ParseStream, Parser};
use syn::spanned::Spanned;
use syn::{Ident, LitBool, LitInt, LitStr, Token};

use crate::budget::{self, Objective};
use crate::ctxt::Ctxt;
use crate::shared;

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
                "`segments = 0`: `segments = N` cuts a function into at least 2 segments (the last one runs inline, not checkpointed); use `segments = 2` or more, or `#[checkpointed]` without arguments to checkpoint the whole function as one segment",
            ),
            (Target::Function, 1) => Some(
                "`segments = 1` would checkpoint nothing: with `segments = N` the last segment runs inline, not checkpointed (as PyTorch's `checkpoint_sequential`); to checkpoint the whole function as one segment write `#[checkpointed]` without `segments`, or use `segments = 2` or more",
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
    syn::custom_keyword!(policy);
}

/// `policy = full | masks | narrowing | selective`: what a checkpointed segment keeps from its
/// forward (`ckpt::Policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PolicyArg {
    /// `Policy::RECOMPUTE_ALL`: only the segment's inputs.
    Full,
    /// `Policy::masks()`: also dropout masks (1 bit an element), the main program's
    /// `--policy masks`.
    Masks,
    /// `Policy::narrowing()`: dropout masks and the outputs of narrowing linears
    /// (`out_features < in_features`).
    Narrowing,
    /// `Policy::selective()`: also linear outputs and dropout masks.
    Selective,
}

impl PolicyArg {
    /// The `ckpt::Policy` expression.
    pub fn tokens(self) -> TokenStream {
        match self {
            PolicyArg::Full => quote::quote!(::ckpt::Policy::RECOMPUTE_ALL),
            PolicyArg::Masks => quote::quote!(::ckpt::Policy::masks()),
            PolicyArg::Narrowing => quote::quote!(::ckpt::Policy::narrowing()),
            PolicyArg::Selective => quote::quote!(::ckpt::Policy::selective()),
        }
    }
}

/// The `CheckpointOptions` a generated segment runs with: the one place both macros
/// build them. `policy` is an expression of type `ckpt::Policy` (the default when none).
pub(crate) fn options_tokens(
    preserve_rng_state: Option<bool>,
    determinism_check: Option<bool>,
    policy: Option<TokenStream>,
) -> TokenStream {
    let preserve = preserve_rng_state.map(|b| quote::quote!(.preserve_rng_state(#b)));
    let determinism = determinism_check.map(|b| quote::quote!(.determinism_check(#b)));
    let policy = policy.map(|p| quote::quote!(.policy(#p)));
    quote::quote!(::ckpt::__private::CheckpointOptions::new() #preserve #determinism #policy)
}

/// How a chain of stages is cut, as `segments` / `budget` say: the same on a function and
/// on a `model!`, where it becomes the runtime's schedule ([`Schedule::tokens`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Schedule {
    /// `segments = N`: `N` groups as `ckpt_budget::sequential_ranges` makes them (PyTorch's
    /// `checkpoint_sequential`: 8 stages in 3 segments are 2, 2 and 4).
    Segments(usize),
    /// `segments = auto` and/or `budget = ".."`: the planner's cuts for the objective.
    Auto(Objective),
}

impl Schedule {
    /// The expression `ty::Segments(N)` or `ty::Auto(objective)`, for the runtime's
    /// schedule type `ty` (`ckpt::plan::Schedule` for a model, the run-time chain's
    /// `ChainSchedule` for a function).
    pub(crate) fn tokens(self, ty: TokenStream) -> TokenStream {
        match self {
            Schedule::Segments(n) => quote::quote!(#ty::Segments(#n)),
            Schedule::Auto(objective) => {
                let objective = objective.tokens();
                quote::quote!(#ty::Auto(#objective))
            }
        }
    }
}

/// What the arguments say about the cuts, resolved once: every later stage (the
/// function's layout, `model!`'s schedule) matches on this value.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) enum CutArg {
    /// No `segments` and no `budget` key: on a function, the `ckpt::cut!()` markers of the
    /// body decide, or (without markers) the whole function is one segment.
    #[default]
    Unspecified,
    /// A schedule, with the span of `N`, of `auto` or of the budget string.
    Given(Schedule, Span),
    /// A cut argument was written but is not usable (the error is in the `Ctxt`).
    Invalid,
}

/// The arguments of `#[checkpointed(..)]`.
#[derive(Debug, Default)]
pub(crate) struct Args {
    /// The cuts.
    pub cut: CutArg,
    /// `preserve_rng_state = bool` (default `true`).
    pub preserve_rng_state: Option<bool>,
    /// `determinism_check = bool` (default `true`).
    pub determinism_check: Option<bool>,
    /// `policy = full | masks | narrowing | selective` (default `full`).
    pub policy: Option<PolicyArg>,
    /// Span of the whole argument list (the macro call when there is none).
    pub span: Option<Span>,
}

/// The cut keys as written, before they are resolved into a [`CutArg`].
#[derive(Default)]
struct Written {
    /// `segments = N` (valid).
    segments: Option<(usize, Span)>,
    /// A `segments` key was written (valid or not).
    segments_key: bool,
    /// `segments = auto` (span of `auto`).
    auto: Option<Span>,
    /// A `budget` key was written (valid or not).
    budget_key: bool,
    /// The parsed budget, with the span of its string.
    budget: Option<(Objective, Span)>,
}

const VALID_KEYS: &str = "`segments = N`, `segments = auto`, `budget = \"..\"`, `preserve_rng_state = bool`, `determinism_check = bool`, `policy = full | masks | narrowing | selective`";

/// Parses `key = value, ..`, collecting every error (unknown and duplicate keys, bad
/// values) in `cx` and recovering at the next comma.
pub(crate) fn parse_args(tokens: TokenStream, target: Target, cx: &mut Ctxt) -> Args {
    let mut args = Args {
        span: (!tokens.is_empty()).then(|| tokens.span()),
        ..Args::default()
    };
    let mut written = Written::default();
    let parser = |input: ParseStream| {
        shared::parse_comma_separated(
            input,
            cx,
            |input, cx| parse_one(input, &mut args, &mut written, target, cx),
            |e| e,
        )
    };
    if let Err(e) = parser.parse2(tokens) {
        cx.push(e);
    }
    args.cut = resolve(&written, cx);
    args
}

/// Whether every cut key written has a usable value (a duplicate key is reported, and the
/// first value is used).
fn written_cut_is_clean(w: &Written) -> bool {
    (!w.segments_key || w.segments.is_some() || w.auto.is_some())
        && (!w.budget_key || w.budget.is_some())
}

/// One [`CutArg`] from the cut keys as written.
fn resolve(w: &Written, cx: &mut Ctxt) -> CutArg {
    if !written_cut_is_clean(w) {
        return CutArg::Invalid;
    }
    match (w.segments, w.auto, w.budget) {
        (Some(_), _, Some((_, span))) => {
            cx.error_at(
                span,
                "`budget` chooses the cuts itself, so it cannot be combined with `segments = N`; remove `segments = N` (or write `segments = auto, budget = ..`)",
            );
            CutArg::Invalid
        }
        (Some((n, span)), _, None) => CutArg::Given(Schedule::Segments(n), span),
        (None, _, Some((objective, span))) => CutArg::Given(Schedule::Auto(objective), span),
        (None, Some(span), None) => CutArg::Given(Schedule::Auto(Objective::MinPeak), span),
        (None, None, None) => CutArg::Unspecified,
    }
}

fn parse_one(
    input: ParseStream,
    args: &mut Args,
    written: &mut Written,
    target: Target,
    cx: &mut Ctxt,
) -> syn::Result<()> {
    let lookahead = input.lookahead1();
    if lookahead.peek(kw::segments) {
        let key: kw::segments = input.parse()?;
        let seen = std::mem::replace(&mut written.segments_key, true);
        input.parse::<Token![=]>()?;
        if input.peek(kw::auto) {
            let auto: kw::auto = input.parse()?;
            if seen {
                cx.error_spanned_by(key, "duplicate argument `segments`");
            } else {
                written.auto = Some(auto.span);
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
            written.segments = Some((value, n.span()));
        }
        Ok(())
    } else if lookahead.peek(kw::budget) {
        let key: kw::budget = input.parse()?;
        let seen = std::mem::replace(&mut written.budget_key, true);
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
            Ok(objective) => written.budget = Some((objective, lit.span())),
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
    } else if lookahead.peek(kw::policy) {
        let key: kw::policy = input.parse()?;
        input.parse::<Token![=]>()?;
        let expected = "`policy` takes `full` (recompute everything, the default), `masks` (keep dropout masks), `narrowing` (keep dropout masks and narrowing linear outputs) or `selective` (keep linear outputs and dropout masks): `policy = masks`";
        let value = input
            .call(Ident::parse_any)
            .map_err(|e| syn::Error::new(e.span(), expected))?;
        let policy = match value.to_string().as_str() {
            "full" => PolicyArg::Full,
            "masks" => PolicyArg::Masks,
            "narrowing" => PolicyArg::Narrowing,
            "selective" => PolicyArg::Selective,
            _ => return Err(syn::Error::new(value.span(), expected)),
        };
        if args.policy.replace(policy).is_some() {
            cx.error_spanned_by(key, "duplicate argument `policy`");
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
