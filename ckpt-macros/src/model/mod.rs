//! `model!`: parse (`parse.rs`, `attr.rs`) → validate (`valid.rs`) → expand
//! (`expand/`). The declaration's syntax is documented on the facade's `ckpt::model`.

mod ast;
mod attr;
mod expand;
mod parse;
mod valid;

#[cfg(test)]
mod tests;

use proc_macro2::TokenStream;

use crate::ctxt::Ctxt;

/// Expands `model! { .. }`. On error, every error found is emitted with stubs of the
/// struct and its impls (`expand::stubs`), so that code using the model does not pile
/// follow-on errors on top of them.
pub(crate) fn expand(input: TokenStream) -> TokenStream {
    let mut cx = Ctxt::default();
    let model = match parse::parse_model(input, &mut cx) {
        Ok(model) => model,
        Err(e) => {
            cx.push(e);
            return cx
                .finish()
                .err()
                .map(syn::Error::into_compile_error)
                .unwrap_or_default();
        }
    };
    valid::check(&model, &mut cx);
    match cx.finish() {
        Ok(()) => expand::expand(&model),
        Err(e) => {
            let mut out = expand::stubs(&model);
            out.extend(e.into_compile_error());
            out
        }
    }
}
