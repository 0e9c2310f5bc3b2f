//! Attributes: `#[checkpointed(..)]` on the declaration (its arguments are parsed by
//! `crate::args`, shared with `#[checkpointed]` on functions), and `#[train]` /
//! `#[field]` / `#[keep]` on items.

use proc_macro2::{Span, TokenStream};
use syn::spanned::Spanned;
use syn::{Attribute, Meta};

use super::ast::Checkpoint;
use crate::args::{self, CutArg, Target};
use crate::ctxt::Ctxt;

/// Whether `attr` is `#[checkpointed]` / `#[ckpt::checkpointed]`.
pub(crate) fn is_checkpointed(attr: &Attribute) -> bool {
    let path = attr.path();
    let n = path.segments.len();
    path.segments
        .last()
        .is_some_and(|s| s.ident == "checkpointed")
        && (n == 1 || (n == 2 && path.segments[0].ident == "ckpt"))
}

/// Parses `#[checkpointed(..)]` (the arguments are `crate::args`'s, with `segments = 1`
/// allowed); `None` (with the errors in `cx`) when it is not usable.
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
    let mut local = Ctxt::default();
    let args = args::parse_args(tokens, Target::Model, &mut local);
    let had_errors = !local.is_ok();
    if let Err(e) = local.finish() {
        cx.push(e);
    }
    let schedule = match args.cut {
        CutArg::Given(schedule, _) => schedule,
        CutArg::Invalid => return None,
        // An unknown key that was meant as the cut is reported already.
        CutArg::Unspecified if had_errors => return None,
        CutArg::Unspecified => {
            cx.error_spanned_by(
                attr,
                "`#[checkpointed]` on a `model!` needs `segments = N` (the number of segments the chain of stages is cut into; `segments = 1` checkpoints nothing), `segments = auto` (the planner chooses the cuts for the least peak memory) or `budget = \"..\"` (the least recompute within a memory budget)",
            );
            return None;
        }
    };
    Some(Checkpoint {
        schedule,
        preserve_rng_state: args.preserve_rng_state,
        determinism_check: args.determinism_check,
        policy: args.policy,
    })
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
    /// `#[keep]` (or `#[ckpt::keep]`, as in a `#[checkpointed]` function).
    pub keep: Option<Span>,
}

/// The name of an item attribute `model!` knows (`train`, `field`, `keep`; `keep` also
/// as `ckpt::keep`), or `None`.
fn known(path: &syn::Path) -> Option<&'static str> {
    let n = path.segments.len();
    let last = path.segments.last()?;
    if path.leading_colon.is_some() || last.arguments != syn::PathArguments::None {
        return None;
    }
    ["train", "field", "keep"].into_iter().find(|name| {
        last.ident == name
            && (n == 1 || (*name == "keep" && n == 2 && path.segments[0].ident == "ckpt"))
    })
}

/// Sorts an item's attributes; anything but doc comments, `#[train]`, `#[field]` and
/// `#[keep]` is an error.
pub(crate) fn item_attrs(attrs: Vec<Attribute>, cx: &mut Ctxt) -> ItemAttrs {
    let mut out = ItemAttrs::default();
    for attr in attrs {
        let path = attr.path();
        if path.is_ident("doc") {
            out.docs.push(attr);
        } else if let Some(name) = known(path) {
            let slot = match name {
                "train" => &mut out.train,
                "field" => &mut out.field,
                _ => &mut out.keep,
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
                    "unknown attribute `#[{}]` on a `model!` item; expected `#[train]` (the stage takes the train flag), `#[field]` (a field that is not a stage), `#[keep]` (the stage's output is stored, not recomputed) or doc comments",
                    quote::ToTokens::to_token_stream(path).to_string().replace(' ', "")
                ),
            );
        }
    }
    out
}
