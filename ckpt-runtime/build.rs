//! Compiles the C++ beside the Rust (`csrc/`) against the libtorch that `torch-sys`
//! found, with the same flags: `ckpt.cpp` (the autograd node), `memory.cpp` (the
//! counting CPU allocator, CUDA statistics), `state.cpp` (the C API of generator and
//! autocast state), `rng.cpp` (generator snapshots), `buffers.cpp` (batch
//! norm statistics frozen in recomputes), `policy.cpp` (selective checkpointing),
//! `bernoulli.cpp` (libtorch's CPU Bernoulli draw, reproduced as bits),
//! `params.cpp` (captured parameters as inputs of the node), and, as a library of its
//! own with Gloo's headers, `dist.cpp` (the c10d binding of `ckpt::dist`). With the
//! `nccl` feature `dist.cpp` also gets c10d's NCCL backend, which needs CUDA headers the
//! libtorch wheel lacks (see [`cuda_includes`]).

use std::env;
use std::path::PathBuf;

/// The translation units, and the headers they share.
const SOURCES: [&str; 8] = [
    "csrc/ckpt.cpp",
    "csrc/memory.cpp",
    "csrc/state.cpp",
    "csrc/rng.cpp",
    "csrc/buffers.cpp",
    "csrc/policy.cpp",
    "csrc/bernoulli.cpp",
    "csrc/params.cpp",
];
const HEADERS: [&str; 5] = [
    "csrc/ffi.h",
    "csrc/common.h",
    "csrc/extra.h",
    "csrc/policy.h",
    "csrc/bernoulli.h",
];

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
    // `at::parallel_for` (policy.cpp's mask kernels) is a template whose OpenMP build
    // runs its body under `#pragma omp parallel`: without `-fopenmp` here it would run
    // on one thread. Link the OpenMP runtime libtorch itself loads, by its file name.
    let openmp = openmp_runtime(&root, &lib);
    if openmp.is_some() {
        build.flag("-fopenmp");
    }
    build
        .flag("-Wall")
        .flag("-Wextra")
        .define("_GLIBCXX_USE_CXX11_ABI", "1")
        .define("GLOG_USE_GLOG_EXPORT", None)
        .files(SOURCES)
        .compile("ckpt_csrc");
    if let Some(file) = openmp {
        println!("cargo:rustc-link-search=native={}", lib.display());
        println!("cargo:rustc-link-lib=dylib:+verbatim={file}");
    }
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
        .define("USE_C10D_GLOO", None);
    let nccl = env::var_os("CARGO_FEATURE_NCCL").is_some();
    if nccl {
        for dir in cuda_includes(&lib) {
            dist.flag("-isystem")
                .flag(dir.to_str().expect("CUDA include path is UTF-8"));
        }
        dist.define("USE_C10D_NCCL", None);
    }
    dist.file("csrc/dist.cpp").compile("ckpt_dist");
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
    if nccl {
        // ProcessGroupNCCL lives in libtorch_cuda, its CUDA streams in libc10_cuda.
        for name in ["torch_cuda", "c10_cuda"] {
            assert!(
                lib.join(format!("lib{name}.so")).exists(),
                "the `nccl` feature needs a CUDA build of libtorch: {} has no lib{name}.so",
                lib.display()
            );
        }
        println!("cargo:rustc-link-search=native={}", lib.display());
        println!("cargo:rustc-link-lib=dylib=torch_cuda");
        println!("cargo:rustc-link-lib=dylib=c10_cuda");
    }
}

/// The file name of the OpenMP runtime in libtorch's `lib/` when libtorch was built with
/// OpenMP (`AT_PARALLEL_OPENMP 1` in `ATen/Config.h`): GNU's `libgomp.so.1` in the wheel
/// (or a hashed `libgomp-*.so.1`), LLVM's `libomp.so`; `None` otherwise (then the mask
/// kernels run on one thread, correctly).
fn openmp_runtime(root: &std::path::Path, lib: &std::path::Path) -> Option<String> {
    let config = std::fs::read_to_string(root.join("include/ATen/Config.h")).ok()?;
    if !config.contains("#define AT_PARALLEL_OPENMP 1") {
        return None;
    }
    let mut names: Vec<String> = std::fs::read_dir(lib)
        .ok()?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("libgomp") && n.contains(".so"))
        .collect();
    names.sort();
    names.into_iter().next()
}

/// Include folders for `ProcessGroupNCCL.hpp`: the CUDA runtime, `crt/`, CCCL and NCCL
/// headers. `CKPT_CUDA_INCLUDE` (folders separated by `:`) wins; else `CUDA_HOME`'s
/// `include`; else the `nvidia/*/include` folders beside the wheel's `torch/`: the wheel
/// brings the runtime's (`nvidia-cuda-runtime`) and NCCL's (`nvidia-nccl`), and
/// `scripts/setup.sh --nccl` adds `nvidia-cuda-crt` and `nvidia-cuda-cccl` of the CUDA
/// version the wheel was built with.
fn cuda_includes(lib: &std::path::Path) -> Vec<PathBuf> {
    for var in ["CKPT_CUDA_INCLUDE", "CUDA_HOME"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    let mut dirs: Vec<PathBuf> = if let Some(v) = env::var_os("CKPT_CUDA_INCLUDE") {
        env::split_paths(&v).collect()
    } else if let Some(home) = env::var_os("CUDA_HOME") {
        vec![PathBuf::from(home).join("include")]
    } else {
        // <site-packages>/torch/lib -> <site-packages>/nvidia/<package>/include
        let site = std::fs::canonicalize(lib)
            .ok()
            .and_then(|l| l.parent()?.parent().map(|p| p.join("nvidia")));
        let mut found: Vec<PathBuf> = site
            .and_then(|n| std::fs::read_dir(n).ok())
            .into_iter()
            .flatten()
            .filter_map(|e| Some(e.ok()?.path().join("include")))
            .filter(|d| d.is_dir())
            .collect();
        found.sort();
        found
    };
    // CUDA 13 keeps CCCL (cuda/std, thrust, cub) in include/cccl.
    let cccl: Vec<PathBuf> = dirs
        .iter()
        .map(|d| d.join("cccl"))
        .filter(|d| d.is_dir())
        .collect();
    dirs.extend(cccl);
    for (header, what) in [
        ("cuda_runtime_api.h", "the CUDA runtime headers"),
        (
            "crt/host_config.h",
            "the CUDA crt headers (PyPI nvidia-cuda-crt)",
        ),
        ("nccl.h", "NCCL's header (PyPI nvidia-nccl)"),
    ] {
        assert!(
            dirs.iter().any(|d| d.join(header).exists()),
            "the `nccl` feature needs {what}: no {header} in {dirs:?}; run \
             `scripts/setup.sh --nccl` (it installs the CUDA headers the libtorch wheel \
             lacks), or set CKPT_CUDA_INCLUDE to the folders that hold them"
        );
    }
    dirs
}
