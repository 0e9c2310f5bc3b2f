//! Error accumulation (serde's `Ctxt`): every rule violation of a function is reported in
//! one compile.

use std::fmt::Display;

use quote::ToTokens;

/// Collects `syn::Error`s; [`Ctxt::finish`] combines them into one.
#[derive(Default)]
pub(crate) struct Ctxt {
    errors: Option<syn::Error>,
}

impl Ctxt {
    /// Adds an error.
    pub(crate) fn push(&mut self, error: syn::Error) {
        match &mut self.errors {
            Some(all) => all.combine(error),
            None => self.errors = Some(error),
        }
    }

    /// Adds an error spanning `tokens`.
    pub(crate) fn error_spanned_by(&mut self, tokens: impl ToTokens, message: impl Display) {
        self.push(syn::Error::new_spanned(tokens, message));
    }

    /// Adds an error at `span`.
    pub(crate) fn error_at(&mut self, span: proc_macro2::Span, message: impl Display) {
        self.push(syn::Error::new(span, message));
    }

    /// Whether no error was pushed.
    pub(crate) fn is_ok(&self) -> bool {
        self.errors.is_none()
    }

    /// `Ok` when no error was pushed, else all of them combined.
    pub(crate) fn finish(self) -> syn::Result<()> {
        match self.errors {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}
