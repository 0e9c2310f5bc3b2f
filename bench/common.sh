# Sourced by the benchmark scripts (run from the repository root): sets `python` to the
# Python of the PyTorch 2.13.0 venv that scripts/setup.sh installed (.libtorch is
# <venv>/lib/pythonX.Y/site-packages/torch), or CKPT_BENCH_PYTHON; builds ckpt-bench
# (release: the Rust sides and the byte meter); sets `target` and `machine`.
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
