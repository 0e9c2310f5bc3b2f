//! Test-only package: the trybuild UI tests of `#[checkpointed]` and
//! `#[derive(ShallowClone)]` (`tests/ui.rs`, cases in `ui/fail` and `ui/pass`) and the
//! property test on generated programs (`tests/prop.rs`, programs drawn by `build.rs`).
//! Edition 2021 on purpose; the facade's own tests are edition 2024.
