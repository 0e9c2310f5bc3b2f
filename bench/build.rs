//! Records libtorch's directory (reported by `ckpt` as `DEP_CKPT_LIBTORCH_LIB`) as an
//! rpath of the benchmark binary and of the meter library.

fn main() {
    let lib = std::env::var("DEP_CKPT_LIBTORCH_LIB").expect("ckpt reports the libtorch directory");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
}
