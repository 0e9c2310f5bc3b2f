#!/usr/bin/env bash
# ckpt's side-by-side benchmarks in one command (./x.sh bench [--quick]): builds the
# Rust side and the byte meter (release), finds the Python of the PyTorch 2.13.0 venv
# that scripts/setup.sh installed, runs everything and writes bench/results.json,
# bench/README.md and bench/*.png. Extra arguments go to ckpt-bench (see --help).
set -euo pipefail
cd "$(dirname "$0")/.."

source bench/common.sh
exec "$target/release/ckpt-bench" \
    --python "$python" \
    --meter "$target/release/libckpt_bench.so" \
    --script bench/torch_side.py \
    --out bench \
    --machine "$machine" \
    --date "$(date -u +%Y-%m-%d)" \
    "$@"
