//! Records libtorch's directory as an rpath in this package's own binaries (tests,
//! examples, benches), so they run without `LD_LIBRARY_PATH`, and passes the directory
//! on to crates that depend on `ckpt` as `DEP_CKPT_LIBTORCH_LIB` (see the README, "Using
//! ckpt in your crate").

fn main() {
    // Reported by ckpt-runtime (`links = "ckpt_runtime"`), which got it from torch-sys.
    let lib = std::env::var("DEP_CKPT_RUNTIME_LIBTORCH_LIB")
        .expect("ckpt-runtime reports the libtorch directory");
    println!("cargo:libtorch_lib={lib}");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    if std::path::Path::new(&lib).join("libtorch_cuda.so").exists() {
        // Keep libtorch_cuda linked although no Rust code names its symbols.
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed,-ltorch_cuda,--as-needed");
    }
}
