"""The PyTorch side of ckpt's frontier benchmark (bench/src/frontier/, bench/frontier.sh).

One process of one round: builds the seed transformer (torch_side.Classifier, the main
program's encoder stage for stage) once per point, trains every point on the same batch
with the points taking turns step by step, and prints one JSON object on its last line:
per point the median step seconds, every measured step and its minor page faults, the
warm-up steps, and the peak tensor bytes above the step's baseline from ckpt's counter
(libckpt_bench.so installs it into this process's libtorch). After the shape's warm-up
steps the process writes and frees a HEAP_RESERVE_BYTES block on top of its heap, then
warms up, at most MAX_EXTRA_WARMUP more steps, until a cycle (one step of every point)
in which no step faulted HEAP_STEADY_FAULTS pages (the Rust side's rule,
bench/src/frontier/side.rs).
Points:

- plain;
- full/N: the blocks cut as checkpoint_sequential(blocks, N) cuts them, each segment but
  the last through checkpoint(.., use_reentrant=False);
- selective/N: the same cuts, each checkpointed segment under selective activation
  checkpointing (torch.utils.checkpoint.create_selective_checkpoint_contexts) with the
  policy "save every Linear output, recompute the rest": MUST_SAVE for aten.addmm (the
  op nn.Linear with a bias runs on a contiguous 2-d or 3-d input), PREFER_RECOMPUTE for
  everything else.
"""

import functools
import json
import os
import resource
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_side import Classifier, parse_side_args  # noqa: E402

SAVED_OPS = {torch.ops.aten.addmm.default}

# The same constants as bench/src/frontier/side.rs.
HEAP_STEADY_FAULTS = 1024
MAX_EXTRA_WARMUP = 4
HEAP_RESERVE_BYTES = 1 << 30


def reserve_heap():
    """Writes a page-touched HEAP_RESERVE_BYTES block and frees it (side.rs's reserve_heap)."""
    block = bytearray(HEAP_RESERVE_BYTES)
    block[::4096] = b"\x01" * (HEAP_RESERVE_BYTES // 4096)
    del block


def minor_faults():
    """Minor page faults of this process so far, all threads (getrusage's ru_minflt)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def save_linear_outputs(ctx, op, *args, **kwargs):
    """The selective policy: keep Linear outputs, recompute the rest."""
    return CheckpointPolicy.MUST_SAVE if op in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def forward(model, ids, segments, selective):
    """Classifier.forward with an optional selective policy on each checkpointed segment."""
    context_fn = (
        functools.partial(create_selective_checkpoint_contexts, save_linear_outputs)
        if selective
        else None
    )
    return model(ids, segments, context_fn=context_fn)


def point_name(p):
    if p["kind"] == "plain":
        return "plain"
    return f"{p['kind']}/{p['segments']}"


def main():
    meter, request = parse_side_args(__doc__, "JSON: {shape, points}")
    shape = request["shape"]
    c = {"d": 256, "layers": 6, "seq": shape["seq"], "hidden": 1024}
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 20, (shape["batch"], shape["seq"]), generator=gen)
    labels = torch.randint(0, 10, (shape["batch"],), generator=gen)
    runs = []
    for p in request["points"]:
        if p["kind"] not in ("plain", "full", "selective"):
            raise SystemExit(f"frontier_torch: no PyTorch point {p['kind']}")
        torch.manual_seed(0)
        model = Classifier(c)
        model.train()
        runs.append({
            "name": point_name(p),
            "model": model,
            "opt": torch.optim.AdamW(model.parameters(), lr=1e-4),
            "segments": p.get("segments", 1),
            "selective": p["kind"] == "selective",
            "seconds": [],
            "faults": [],
            "peak": 0,
        })
    warmup = 0
    steady = False
    while runs and len(runs[0]["seconds"]) < shape["steps"]:
        warming = warmup < shape["warmup"] or (
            not steady and warmup < shape["warmup"] + MAX_EXTRA_WARMUP
        )
        most_faults = 0
        for r in runs:
            meter.reset_peak()
            base = meter.current()
            faults = minor_faults()
            start = time.perf_counter()
            loss = F.cross_entropy(forward(r["model"], ids, r["segments"], r["selective"]), labels)
            r["opt"].zero_grad(set_to_none=False)
            loss.backward()
            r["opt"].step()
            del loss
            seconds = time.perf_counter() - start
            faults = minor_faults() - faults
            most_faults = max(most_faults, faults)
            if not warming:
                r["seconds"].append(seconds)
                r["faults"].append(faults)
                r["peak"] = max(r["peak"], meter.peak() - base)
        if warming:
            warmup += 1
            steady = warmup > shape["warmup"] and most_faults < HEAP_STEADY_FAULTS
            if warmup == shape["warmup"]:
                reserve_heap()
    print(json.dumps({
        "points": [
            {
                "name": r["name"],
                "step_seconds_median": statistics.median(r["seconds"]),
                "step_seconds": r["seconds"],
                "peak_bytes": r["peak"],
                "warmup_steps": warmup,
                "step_faults": r["faults"],
            }
            for r in runs
        ],
        "torch_version": torch.__version__,
    }))


if __name__ == "__main__":
    main()
