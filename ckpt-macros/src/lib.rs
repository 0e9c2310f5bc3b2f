//! Procedural macros of `ckpt`; use them through the `ckpt` crate.
