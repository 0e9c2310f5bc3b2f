#!/usr/bin/env bash
# glibc's malloc defaults against the fixed heap that bench/frontier.sh gives both sides
# (bench/README.md, "The allocator"): ckpt's side of the frontier (plain, masks/3, full/6;
# 3 warm-up + 3 measured steps) at seq 256 and seq 1024, PAIRS pairs of processes a shape,
# the order alternating. Prints each process's step times (s), wall time (s) and minor page
# faults (GNU time, /usr/bin/time).
#
#   bench/malloc.sh [PAIRS]      # default 3 pairs: about 8 minutes on 2 cores
set -euo pipefail
cd "$(dirname "$0")/.."

source bench/common.sh
pairs="${1:-3}"
fixed="glibc.malloc.mmap_threshold=4294967296:glibc.malloc.trim_threshold=4294967296:glibc.malloc.arena_max=1"
points='[{"kind":"plain"},{"kind":"masks","segments":3},{"kind":"full","segments":6}]'
for seq_batch in "256 16" "1024 4"; do
    read -r seq batch <<<"$seq_batch"
    shape="{\"seq\":$seq,\"batch\":$batch,\"warmup\":3,\"steps\":3}"
    for pair in $(seq 1 "$pairs"); do
        if [ $((pair % 2)) = 1 ]; then order="default fixed"; else order="fixed default"; fi
        for heap in $order; do
            tunables=""
            [ "$heap" = fixed ] && tunables="$fixed"
            out="$(env GLIBC_TUNABLES="$tunables" /usr/bin/time -f "TIME %e %R" \
                "$target/release/ckpt-frontier" side --shape "$shape" --points "$points" --threads 2 2>&1)"
            "$python" -c '
import json, sys
label, out = sys.argv[1], sys.argv[2]
points, wall, faults = {}, "?", "?"
for line in out.splitlines():
    if line.startswith("{"):
        points = {p["name"]: p["step_seconds"] for p in json.loads(line)["points"]}
    elif line.startswith("TIME"):
        wall, faults = line.split()[1:3]
steps = " ".join(f"{k}={[round(s, 2) for s in v]}" for k, v in points.items())
print(f"{label} {steps} wall {wall} s, {faults} minor faults")
' "seq $seq pair $pair $heap:" "$out"
        done
    done
done
