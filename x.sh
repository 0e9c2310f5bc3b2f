#!/usr/bin/env bash
# The project's commands. Each sets up libtorch 2.13.0 first when it is missing
# (scripts/setup.sh), then builds and runs.
#
#   ./x.sh run [ARGS]   train the checkpointed transformer classifier (the main program);
#                       ARGS go to it, e.g. ./x.sh run --quick
#   ./x.sh test         every check: formatting, clippy (warnings are errors), all tests,
#                       the docs (broken links are errors), and the nccl feature's build
#   ./x.sh bench        the side-by-side benchmarks (bench/README.md)
#   ./x.sh setup        only the libtorch set-up (--nccl: also the nccl feature's headers)
set -euo pipefail
cd "$(dirname "$0")"
scripts/setup.sh
export LD_LIBRARY_PATH="$PWD/.libtorch/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

cmd="${1:-}"
[ $# -gt 0 ] && shift
case "$cmd" in
    run)
        exec cargo run --release --example train_classifier -- "$@"
        ;;
    test)
        cargo fmt --all --check
        cargo clippy --workspace --all-targets --locked -- -D warnings
        cargo test --workspace --locked "$@"
        RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked
        # The `nccl` feature: c10d's ProcessGroupNCCL compiled and linked, its errors
        # tested (its GPU test skips without CUDA). One-time cost: the CUDA headers
        # (~20 MB) and a build of ckpt-runtime with the feature (~4 min on 2 cores).
        if [ -n "${LIBTORCH:-}" ] && [ -z "${CUDA_HOME:-}${CKPT_CUDA_INCLUDE:-}" ]; then
            echo "x.sh test: the nccl feature is not built: with your own LIBTORCH, set CUDA_HOME or CKPT_CUDA_INCLUDE to CUDA and NCCL headers" >&2
        else
            scripts/setup.sh --nccl
            cargo test -p ckpt-runtime --features nccl --locked --test nccl
        fi
        ;;
    bench)
        exec bench/run.sh "$@"
        ;;
    setup)
        scripts/setup.sh "$@"
        ;;
    *)
        echo "usage: ./x.sh run [ARGS] | test | bench | setup" >&2
        exit 2
        ;;
esac
