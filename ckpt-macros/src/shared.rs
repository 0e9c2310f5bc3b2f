//! What both macros (`#[checkpointed]` and `model!`) share in parsing and code
//! generation: hygienic names for generated locals, and the comma-separated list parsing
//! that reports every mistake of a list at once (tokio's recovery: skip to the next
//! comma).

use proc_macro2::{Ident, Span, TokenTree};
use syn::Token;
use syn::parse::ParseStream;

use crate::ctxt::Ctxt;

/// A generated local, type or helper named `name` with `Span::mixed_site()`: the user's
/// code can neither see nor shadow it.
pub(crate) fn mixed(name: &str) -> Ident {
    Ident::new(name, Span::mixed_site())
}

/// Skips to the next top-level comma (not consuming it), or to the end.
pub(crate) fn skip_to_comma(input: ParseStream) -> syn::Result<()> {
    input.step(|cursor| {
        let mut rest = *cursor;
        while let Some((tt, next)) = rest.token_tree() {
            if matches!(&tt, TokenTree::Punct(p) if p.as_char() == ',') {
                return Ok(((), rest));
            }
            rest = next;
        }
        Ok(((), rest))
    })
}

/// Parses all of `input` as `element, element, ..` (a trailing comma allowed) with
/// `element`. An element that fails is reported in `cx` and skipped up to the next
/// top-level comma; a missing comma is reported as `missing_comma` makes it from the
/// parser's error, and skipped the same way; so every mistake of the list is reported in
/// one compile.
///
/// # Errors
///
/// Only when recovery fails, which it cannot: skipping stops at a comma or at the end.
pub(crate) fn parse_comma_separated(
    input: ParseStream,
    cx: &mut Ctxt,
    mut element: impl FnMut(ParseStream, &mut Ctxt) -> syn::Result<()>,
    missing_comma: impl Fn(syn::Error) -> syn::Error,
) -> syn::Result<()> {
    while !input.is_empty() {
        if let Err(e) = element(input, cx) {
            cx.push(e);
            skip_to_comma(input)?;
        }
        if input.is_empty() {
            break;
        }
        if let Err(e) = input.parse::<Token![,]>() {
            cx.push(missing_comma(e));
            skip_to_comma(input)?;
            if !input.is_empty() {
                input.parse::<Token![,]>()?;
            }
        }
    }
    Ok(())
}
