"""PyTorch's DDP side of the data-parallel encoder benchmark (bench/ddp_encoder.sh).

Run under torchrun (Gloo, one intra-op thread a process, like the Rust side): each rank
trains the main program's encoder classifier (torch_side.Classifier: 6 pre-LN blocks,
4 heads, d_model 256, ff 1024, dropout 0.1, seq 256) on its share of a global batch,
wrapped in torch.nn.parallel.DistributedDataParallel(static_graph=True), plain and with
3 segments (`checkpoint(.., use_reentrant=False)`), the two models alive side by side and
taking turns step by step, as `train_classifier --nproc 2` does. A step is measured as
the main program measures it: gradients freed (`zero_grad()`, set to None), then the
peak tensor bytes above the bytes live before forward, backward and the AdamW step,
from ckpt's counter (libckpt_bench.so installs it into this libtorch), and the wall time;
the peak is the largest after the first step, the time the median of all steps.
Rank 0 prints one JSON object on its last line: every rank's figures, by run.
"""

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_side import Classifier, Meter  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--meter", required=True, help="path of libckpt_bench.so")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--global-batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--segments", type=int, default=3)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    meter = Meter(a.meter)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    c = {"d": 256, "layers": 6, "seq": 256, "hidden": 1024}
    per_rank = a.global_batch // world
    runs = {}
    for name, segments in (("plain", 1), ("checkpointed", a.segments)):
        torch.manual_seed(0)
        model = DDP(Classifier(c), static_graph=True)
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
        runs[name] = {"model": model, "opt": opt, "segments": segments, "seconds": [], "peak": 0}
    gen = torch.Generator().manual_seed(1000 + rank)
    for step in range(a.steps):
        ids = torch.randint(1, 20, (per_rank, c["seq"]), generator=gen)
        labels = torch.randint(0, 10, (per_rank,), generator=gen)
        for r in runs.values():
            r["opt"].zero_grad()
            meter.reset_peak()
            base = meter.current()
            start = time.perf_counter()
            F.cross_entropy(r["model"](ids, r["segments"]), labels).backward()
            r["opt"].step()
            r["seconds"].append(time.perf_counter() - start)
            if step > 0 or a.steps == 1:
                r["peak"] = max(r["peak"], meter.peak() - base)
            r["opt"].zero_grad()
    names = list(runs)
    # all_gather (not all_gather_object, which needs NumPy): [peak, seconds] a run.
    mine = torch.tensor(
        [v for n in names for v in (runs[n]["peak"], statistics.median(runs[n]["seconds"]))],
        dtype=torch.float64,
    )
    gathered = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(gathered, mine)
    if rank == 0:
        out = {
            n: [
                {"peak_bytes": int(g[2 * i]), "step_seconds_median": float(g[2 * i + 1])}
                for g in gathered
            ]
            for i, n in enumerate(names)
        }
        out["torch_version"] = torch.__version__
        print(json.dumps(out))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
