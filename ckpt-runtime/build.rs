//! Compiles the C++ beside the Rust (`csrc/`) against the libtorch that `torch-sys`
//! found, with the same flags: `ckpt.cpp` (the autograd node, the counting CPU
//! allocator, autocast state), `rng.cpp` (generator snapshots), `buffers.cpp` (batch
//! norm statistics frozen in recomputes), `policy.cpp` (selective checkpointing),
//! `params.cpp` (captured parameters as inputs of the node), and, as a library of its
//! own with Gloo's headers, `dist.cpp` (the c10d binding of `ckpt::dist`).

use std::env;
use std::path::PathBuf;

/// The translation units, and the headers they share.
const SOURCES: [&str; 5] = [
    "csrc/ckpt.cpp",
    "csrc/rng.cpp",
    "csrc/buffers.cpp",
    "csrc/policy.cpp",
    "csrc/params.cpp",
];
const HEADERS: [&str; 2] = ["csrc/extra.h", "csrc/policy.h"];

fn main() {
    for file in SOURCES
        .iter()
        .chain(&HEADERS)
        .chain(&["csrc/dist.cpp", "third_party/gloo/include"])
    {
        println!("cargo:rerun-if-changed={file}");
    }
    // `torch-sys` declares `links = "tch"` and prints `cargo:libtorch_lib=...`, which
    // Cargo hands to its direct dependents as `DEP_TCH_LIBTORCH_LIB`.
    let lib = PathBuf::from(env::var("DEP_TCH_LIBTORCH_LIB").expect(
        "DEP_TCH_LIBTORCH_LIB is not set: torch-sys did not report where libtorch is \
         (run ./x.sh test once, or set LIBTORCH to a libtorch 2.13.0 directory)",
    ));
    let root = lib
        .parent()
        .expect("libtorch lib dir has a parent")
        .to_path_buf();
    let includes = [
        root.join("include"),
        root.join("include/torch/csrc/api/include"),
    ];
    let mut build = cc::Build::new();
    build.cpp(true).pic(true).std("c++17");
    // -isystem: libtorch's headers are not ours to warn about; csrc/ckpt.cpp is.
    for dir in &includes {
        build
            .flag("-isystem")
            .flag(dir.to_str().expect("libtorch path is UTF-8"));
    }
    build
        .flag("-Wall")
        .flag("-Wextra")
        .define("_GLIBCXX_USE_CXX11_ABI", "1")
        .define("GLOG_USE_GLOG_EXPORT", None)
        .files(SOURCES)
        .compile("ckpt_csrc");
    // The c10d binding: ProcessGroupGloo.hpp needs Gloo's headers, which the libtorch
    // wheel does not ship; third_party/gloo/ has those of the revision it was built with.
    let mut dist = cc::Build::new();
    dist.cpp(true).pic(true).std("c++17");
    for dir in includes
        .iter()
        .chain([&PathBuf::from("third_party/gloo/include")])
    {
        dist.flag("-isystem")
            .flag(dir.to_str().expect("libtorch path is UTF-8"));
    }
    dist.flag("-Wall")
        .flag("-Wextra")
        .define("_GLIBCXX_USE_CXX11_ABI", "1")
        .define("GLOG_USE_GLOG_EXPORT", None)
        .define("USE_C10D_GLOO", None)
        .file("csrc/dist.cpp")
        .compile("ckpt_dist");
    // Dependents (the `ckpt` facade) read this as DEP_CKPT_RUNTIME_LIBTORCH_LIB to set an rpath
    // for their own binaries, tests and examples.
    println!("cargo:libtorch_lib={}", lib.display());
    // The loader needs libtorch's directory at run time: record it in this package's own
    // test binaries. `--no-as-needed` keeps libtorch_cuda linked although no Rust code
    // names its symbols, so CUDA works where the machine has it.
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}", lib.display());
    if lib.join("libtorch_cuda.so").exists() {
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed,-ltorch_cuda,--as-needed");
    }
}
