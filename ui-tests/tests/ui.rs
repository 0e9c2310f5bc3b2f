//! trybuild UI tests of `#[checkpointed]` and `#[derive(ShallowClone)]`.
//!
//! `ui/fail/*.rs` must fail to compile with exactly the diagnostics of the `.stderr` beside
//! each (the specification of the messages; regenerate with `TRYBUILD=overwrite` and
//! review the diff); `ui/pass/*.rs` must compile and run. This package is edition 2021 on
//! purpose: the facade's own tests are edition 2024.

#[test]
fn ui() {
    // The pass cases run as programs linked to libtorch (`cargo run` in trybuild's
    // project, which inherits this process's environment).
    if let Some(lib) = option_env!("CKPT_LIBTORCH_LIB") {
        let path = match std::env::var("LD_LIBRARY_PATH") {
            Ok(old) if !old.is_empty() => format!("{lib}:{old}"),
            _ => lib.to_owned(),
        };
        std::env::set_var("LD_LIBRARY_PATH", path);
    }
    let t = trybuild::TestCases::new();
    t.compile_fail("ui/fail/*.rs");
    t.pass("ui/pass/*.rs");
}
