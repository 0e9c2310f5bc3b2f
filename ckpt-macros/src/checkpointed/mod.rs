//! `#[checkpointed]`: parse (`parse.rs`) → body (`body.rs`: items, markers, method chains,
//! layer loops) → layout (`layout.rs`: how the function is cut) → analyze
//! (`analysis/`: liveness, side-effect rules) → expand (`expand/`).

mod advice;
mod analysis;
mod body;
mod expand;
mod layout;
mod parse;

#[cfg(test)]
mod tests;

use proc_macro2::TokenStream;

use crate::ctxt::Ctxt;

/// Expands `#[checkpointed(args)] item`. On error, the function is emitted unchanged
/// (less the `#[ckpt::allow]` markers) next to every error found, so IDEs keep working.
pub(crate) fn expand(args: TokenStream, item: TokenStream) -> TokenStream {
    let mut cx = Ctxt::default();
    let args = crate::args::parse_args(args, crate::args::Target::Function, &mut cx);
    let func = match parse::parse_function(item.clone()) {
        Ok(func) => func,
        Err(e) => {
            let mut out = item;
            out.extend(e.into_compile_error());
            return out;
        }
    };
    let plan = analysis::analyze(&func, &args, &mut cx);
    match (cx.finish(), plan) {
        (Ok(()), Some(plan)) => expand::expand(&func, &args, &plan),
        (result, _) => {
            let mut out = expand::original(&func);
            if let Err(e) = result {
                out.extend(e.into_compile_error());
            }
            out
        }
    }
}
