//! Records libtorch's directory as an rpath in this package's own binaries (tests,
//! examples, benches), so they run without `LD_LIBRARY_PATH`. `ckpt-runtime` reports the
//! directory as `DEP_CKPT_LIBTORCH_LIB`. Crates that depend on `ckpt` set their own
//! (see the README, "Using ckpt in your crate").

fn main() {
    if let Ok(lib) = std::env::var("DEP_CKPT_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
        if std::path::Path::new(&lib).join("libtorch_cuda.so").exists() {
            println!("cargo:rustc-link-arg=-Wl,--no-as-needed,-ltorch_cuda,--as-needed");
        }
    }
}
