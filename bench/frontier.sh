#!/usr/bin/env bash
# The memory/time frontier of checkpointing policies, ckpt against PyTorch's selective
# activation checkpointing, in interleaved rounds (bench/FRONTIER.md): builds the Rust
# side and the byte meter (release), finds the Python of the PyTorch 2.13.0 venv that
# scripts/setup.sh installed, and writes bench/FRONTIER.md, bench/frontier.json and
# bench/frontier.png. Extra arguments go to `ckpt-frontier run` (--rounds N, --quick).
#
#   bench/frontier.sh            # 5 rounds of 2 configurations, 1 + 2 steps: about 30 minutes on 2 cores
#   bench/frontier.sh --quick    # one configuration, 2 short rounds
set -euo pipefail
cd "$(dirname "$0")/.."

source bench/common.sh
exec "$target/release/ckpt-frontier" run \
    --python "$python" \
    --meter "$target/release/libckpt_bench.so" \
    --script bench/frontier_torch.py \
    --out "${CKPT_FRONTIER_OUT:-bench}" \
    --machine "$machine" \
    --date "$(date -u +%Y-%m-%d)" \
    "$@"
