#!/usr/bin/env bash
# The project's commands. Each sets up libtorch 2.13.0 first when it is missing
# (scripts/setup.sh), then builds and runs.
#
#   ./x.sh run [ARGS]   train the checkpointed transformer classifier (the main program);
#                       ARGS go to it, e.g. ./x.sh run --quick
#   ./x.sh test         every check: formatting, clippy (warnings are errors), all tests,
#                       and the docs (broken links are errors)
#   ./x.sh bench        the side-by-side benchmarks (bench/README.md)
#   ./x.sh setup        only the libtorch set-up
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
        ;;
    bench)
        exec bench/run.sh "$@"
        ;;
    setup)
        ;;
    *)
        echo "usage: ./x.sh run [ARGS] | test | bench | setup" >&2
        exit 2
        ;;
esac
