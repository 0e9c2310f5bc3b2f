#!/usr/bin/env bash
# The memory/time frontier of checkpointing policies, ckpt against PyTorch's selective
# activation checkpointing, in interleaved rounds (bench/FRONTIER.md): builds the Rust
# side and the byte meter (release), finds the Python of the PyTorch 2.13.0 venv that
# scripts/setup.sh installed, and writes bench/FRONTIER.md, bench/frontier.json and
# bench/frontier.png. Extra arguments go to `ckpt-frontier run` (--rounds N, --quick).
#
#   bench/frontier.sh            # 5 rounds of 2 configurations, 3+ warm-up + 3 steps: about 40 minutes on 2 cores
#   bench/frontier.sh --quick    # one configuration, 2 short rounds
set -euo pipefail
cd "$(dirname "$0")/.."

source bench/common.sh
# glibc's malloc maps every block above its mmap threshold (32 MiB at most) with mmap and
# unmaps it on free, so at seq 1024 each step page-faults its attention scores afresh (12
# million faults a process, bench/MALLOC.md): a cost that follows the host's load, not the
# model, and dwarfs the differences measured here. Both sides get the same fixed heap
# instead: no mapping, no trimming, one arena (a second thread's arena maps large blocks
# anyway); CKPT_FRONTIER_MALLOC=default measures with glibc's defaults.
case "${CKPT_FRONTIER_MALLOC:-fixed}" in
    fixed) export GLIBC_TUNABLES="glibc.malloc.mmap_threshold=4294967296:glibc.malloc.trim_threshold=4294967296:glibc.malloc.arena_max=1" ;;
    default) unset GLIBC_TUNABLES ;;
    *)
        echo "bench/frontier.sh: CKPT_FRONTIER_MALLOC is 'fixed' (the default) or 'default', not '$CKPT_FRONTIER_MALLOC'" >&2
        exit 1
        ;;
esac
exec "$target/release/ckpt-frontier" run \
    --python "$python" \
    --meter "$target/release/libckpt_bench.so" \
    --script bench/frontier_torch.py \
    --out "${CKPT_FRONTIER_OUT:-bench}" \
    --machine "$machine" \
    --date "$(date -u +%Y-%m-%d)" \
    --malloc "${GLIBC_TUNABLES:-}" \
    "$@"
