#!/usr/bin/env bash
# ckpt's side-by-side benchmarks in one command (./x.sh bench [--quick]): builds the
# Rust side and the byte meter (release), finds the Python of the PyTorch 2.13.0 venv
# that scripts/setup.sh installed, runs everything and writes bench/results.json,
# bench/README.md and bench/*.png. Extra arguments go to ckpt-bench (see --help).
set -euo pipefail
cd "$(dirname "$0")/.."

# The venv's python: .libtorch is <venv>/lib/pythonX.Y/site-packages/torch.
torch_dir="$(readlink -f .libtorch)"
python="${CKPT_BENCH_PYTHON:-$(cd "$torch_dir/../../../.." 2>/dev/null && pwd)/bin/python}"
if ! "$python" -c 'import torch, sys; sys.exit(0 if torch.__version__.startswith("2.13.0") else 1)' 2>/dev/null; then
    echo "bench: the PyTorch side needs Python with torch 2.13.0; $python is not one." >&2
    echo "bench: with your own LIBTORCH, set CKPT_BENCH_PYTHON to such a Python." >&2
    exit 1
fi

cargo build --release --locked -p ckpt-bench
target="${CARGO_TARGET_DIR:-target}"
machine="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), $(nproc) cores, $(free -g | awk '/Mem:/{print $2}') GiB"
exec "$target/release/ckpt-bench" \
    --python "$python" \
    --meter "$target/release/libckpt_bench.so" \
    --script bench/torch_side.py \
    --out bench \
    --machine "$machine" \
    --date "$(date -u +%Y-%m-%d)" \
    "$@"
