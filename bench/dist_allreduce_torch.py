"""All-reduce bandwidth of PyTorch's torch.distributed (Gloo) over loopback: the
counterpart of `examples/dist_allreduce.rs`, same measurement, same libtorch.

    torchrun --nproc-per-node 2 bench/dist_allreduce_torch.py [--numel N] [--iters K]
"""

import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--numel", type=int, default=10_000_000)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo")
    t = torch.ones(a.numel, dtype=torch.float32)
    for _ in range(3):
        dist.all_reduce(t)
    secs = []
    for _ in range(a.iters):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(t)
        secs.append(time.perf_counter() - start)
    secs.sort()
    median = secs[len(secs) // 2]
    if dist.get_rank() == 0:
        n = dist.get_world_size()
        algbw = a.numel * 4 / median
        print(json.dumps({
            "side": "pytorch",
            "world_size": n,
            "numel": a.numel,
            "threads": a.threads,
            "median_seconds": median,
            "algbw_bytes_per_second": algbw,
            "busbw_bytes_per_second": algbw * 2 * (n - 1) / n,
        }))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
