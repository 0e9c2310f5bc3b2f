//! Procedural macros of `ckpt`; use them through the `ckpt` crate, which documents them
//! (`ckpt::checkpointed`, `ckpt::ShallowClone`).
//!
//! The entry points below only convert between `proc_macro` and `proc_macro2` token
//! streams; everything else is plain Rust on `proc_macro2`, testable without a compiler
//! session (the expansion snapshots in `checkpointed/snapshots/` are such tests).

mod args;
mod budget;
mod checkpointed;
mod ctxt;
#[cfg(test)]
mod fuzz;
mod model;
mod shallow_clone;
mod shared;

use proc_macro::TokenStream;

/// Cuts a forward function into checkpointed segments; see `ckpt::checkpointed` for the
/// guide (arguments, cut markers, liveness, side-effect rules and their escape hatches).
#[proc_macro_attribute]
pub fn checkpointed(args: TokenStream, item: TokenStream) -> TokenStream {
    checkpointed::expand(args.into(), item.into()).into()
}

/// Implements `ckpt::ShallowClone` for a struct or an enum: tensor-carrying fields by
/// `ShallowClone`, other fields by `Clone`; see `ckpt::ShallowClone`.
#[proc_macro_derive(ShallowClone)]
pub fn derive_shallow_clone(input: TokenStream) -> TokenStream {
    shallow_clone::expand(input.into()).into()
}

/// Declares a model — struct, constructor and forward chain — in one place, optionally
/// checkpointed; see `ckpt::model` for the syntax and examples.
#[proc_macro]
pub fn model(input: TokenStream) -> TokenStream {
    model::expand(input.into()).into()
}
