//! trybuild UI tests of `model!`.
//!
//! `ui/model-fail/*.rs` must fail to compile with exactly the diagnostics of the
//! `.stderr` beside each (the specification of the messages; regenerate with
//! `TRYBUILD=overwrite cargo test -p ckpt-ui-tests --test model_ui` and review the diff);
//! `ui/model-pass/*.rs` must compile and run. Edition 2021, as the rest of this package.

#[test]
fn model_ui() {
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
    t.compile_fail("ui/model-fail/*.rs");
    t.pass("ui/model-pass/*.rs");
}
