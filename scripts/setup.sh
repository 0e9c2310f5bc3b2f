#!/usr/bin/env bash
# Makes `.libtorch` (in the checkout) point at libtorch 2.13.0, installing it when missing.
#
# - With LIBTORCH set: links to that directory (an unpacked libtorch, or a PyTorch
#   2.13.0 installation's `torch` directory) and installs nothing.
# - Otherwise: the PyTorch 2.13.0 wheel from PyPI, in a venv in a per-user cache keyed by
#   the version ($CKPT_CACHE_DIR, default ${XDG_CACHE_HOME:-~/.cache}/ckpt), so a second
#   clone or a CI run reuses it. Needs python3 (3.10+) with venv and pip; about 5 GB
#   (the wheel brings CUDA libraries, which also make `--device cuda` work on a GPU).
#
# `.cargo/config.toml` points cargo's LIBTORCH and LD_LIBRARY_PATH at `.libtorch`, so plain
# `cargo` commands work in the checkout afterwards. Safe to run again; concurrent runs
# wait for each other.
#
# `scripts/setup.sh --nccl` also installs what the `nccl` cargo feature needs beyond the
# wheel: the CUDA crt and CCCL headers (PyPI `nvidia-cuda-crt`, `nvidia-cuda-cccl`) of
# the CUDA version the wheel was built with, into the same venv (headers only, ~20 MB;
# the wheel already brings the CUDA runtime's and NCCL's headers).
set -euo pipefail

want_nccl=0
[ "${1:-}" = "--nccl" ] && want_nccl=1

TORCH_VERSION=2.13.0
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
link="$root/.libtorch"

say() { printf 'ckpt setup: %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

if [ -n "${LIBTORCH:-}" ]; then
    [ -d "$LIBTORCH/lib" ] && [ -d "$LIBTORCH/include" ] \
        || die "LIBTORCH=$LIBTORCH has no lib/ and include/: point it at an unpacked libtorch $TORCH_VERSION or at a PyTorch $TORCH_VERSION installation's torch/ directory"
    # Link the directory itself: LIBTORCH may be this very link (or point through it),
    # which `ln -sfn "$LIBTORCH"` would turn into a link to itself.
    real="$(cd "$LIBTORCH" && pwd -P)"
    [ "$(readlink "$link" 2>/dev/null)" = "$real" ] || ln -sfn "$real" "$link"
    say "using LIBTORCH=$LIBTORCH"
    [ "$want_nccl" = 0 ] \
        || say "--nccl: nothing installed with LIBTORCH set; point CUDA_HOME (or CKPT_CUDA_INCLUDE) at CUDA and NCCL headers of your libtorch's CUDA version"
    exit 0
fi

cache="${CKPT_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ckpt}"
venv="$cache/torch-$TORCH_VERSION"
mkdir -p "$cache"

torch_dir() { ls -d "$venv"/lib/python3*/site-packages/torch 2>/dev/null | head -n 1; }

if [ ! -f "$venv/.ckpt-complete" ]; then
    command -v python3 >/dev/null || die "python3 is needed to install the PyTorch $TORCH_VERSION wheel (or set LIBTORCH)"
    (
        flock 9
        if [ ! -f "$venv/.ckpt-complete" ]; then
            say "installing PyTorch $TORCH_VERSION (libtorch) into $venv (one time, about 5 GB)"
            [ -x "$venv/bin/python" ] || python3 -m venv "$venv" \
                || die "python3 -m venv failed (on Debian/Ubuntu: apt install python3-venv)"
            "$venv/bin/python" -m pip install --disable-pip-version-check "torch==$TORCH_VERSION" \
                || die "pip install torch==$TORCH_VERSION failed"
            [ -f "$(torch_dir)/lib/libtorch_cpu.so" ] || die "the wheel has no lib/libtorch_cpu.so"
            touch "$venv/.ckpt-complete"
        fi
    ) 9>"$cache/.lock"
fi

dir="$(torch_dir)"
[ -n "$dir" ] || die "no torch/ directory in $venv; remove it and run again"
if [ "$(readlink "$link" 2>/dev/null)" != "$dir" ]; then
    ln -sfn "$dir" "$link"
    say "libtorch $TORCH_VERSION: $dir"
fi

if [ "$want_nccl" = 1 ] && [ ! -f "$venv/.ckpt-nccl-headers" ]; then
    (
        flock 9
        if [ ! -f "$venv/.ckpt-nccl-headers" ]; then
            cuda="$(sed -n "s/^cuda: Optional\[str\] = '\(.*\)'$/\1/p" "$dir/version.py")"
            [ -n "$cuda" ] || die "the wheel in $venv is not a CUDA build: the nccl feature needs one"
            say "installing the CUDA $cuda crt and CCCL headers (nccl feature) into $venv"
            "$venv/bin/python" -m pip install --disable-pip-version-check --no-deps \
                "nvidia-cuda-crt==$cuda.*" "nvidia-cuda-cccl==$cuda.*" \
                || die "pip install nvidia-cuda-crt nvidia-cuda-cccl ($cuda) failed"
            touch "$venv/.ckpt-nccl-headers"
        fi
    ) 9>"$cache/.lock"
fi
