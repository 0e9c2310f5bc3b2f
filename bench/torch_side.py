"""The PyTorch side of ckpt's benchmarks (bench/src/main.rs runs it).

It builds the same models as the Rust side (bench/src/models.rs,
ckpt-models/src/classifier.rs),
times the same training steps and measures peak tensor bytes with the same counter:
loading libckpt_bench.so installs ckpt's counting CPU allocator into this process's
libtorch (the same 2.13.0 libraries the Rust side links), so both sides count the same
allocations. Prints one JSON object on its last line.
"""

import argparse
import ctypes
import json
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint, checkpoint_sequential


class Meter:
    """ckpt's byte counter, through the C ABI of libckpt_bench.so."""

    def __init__(self, path):
        # RTLD_GLOBAL is not needed: the library's libtorch dependencies resolve to the
        # copies `import torch` already loaded (same sonames), and its static initialiser
        # installs the counting allocator into them on load.
        self.lib = ctypes.CDLL(path)
        self.lib.ckpt_meter_current_bytes.restype = ctypes.c_int64
        self.lib.ckpt_meter_peak_bytes.restype = ctypes.c_int64

    def current(self):
        return self.lib.ckpt_meter_current_bytes()

    def peak(self):
        return self.lib.ckpt_meter_peak_bytes()

    def reset_peak(self):
        self.lib.ckpt_meter_reset_peak()


def measure(meter, warmup, steps, step):
    """As bench/src/measure.rs: warm-up, then per step the peak above the live bytes."""
    for _ in range(warmup):
        step()
    seconds, peak = [], 0
    for _ in range(steps):
        meter.reset_peak()
        base = meter.current()
        start = time.perf_counter()
        step()
        seconds.append(time.perf_counter() - start)
        peak = max(peak, meter.peak() - base)
    return {"step_seconds_median": statistics.median(seconds), "step_seconds": seconds, "peak_bytes": peak}


class ResidualBlock(nn.Module):
    """x + l2(gelu(l1(x))), as models.rs."""

    def __init__(self, d, hidden):
        super().__init__()
        self.l1 = nn.Linear(d, hidden)
        self.l2 = nn.Linear(hidden, d)

    def forward(self, x):
        return x + self.l2(F.gelu(self.l1(x)))


class Block(nn.Module):
    """The pre-LN encoder block of ckpt-models/src/classifier.rs."""

    def __init__(self, c):
        super().__init__()
        d = c["d"]
        self.heads, self.p = 4, 0.1
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.out = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.ff1, self.ff2 = nn.Linear(d, c["hidden"]), nn.Linear(c["hidden"], d)

    def forward(self, x, key_bias):
        # Each intermediate is released right after its last use (`del`), as the Rust
        # block drops it: Python would otherwise hold every local to the end of the
        # call, which costs the attention scores and q/k/v on top of what autograd saves.
        b, s, d = x.shape
        h, p = self.heads, self.p
        dh = d // h
        qkv = self.qkv(self.ln1(x)).view(b, s, 3, h, dh).permute(2, 0, 3, 1, 4)
        q, k, v = (qkv[i].reshape(b * h, s, dh) for i in range(3))
        del qkv
        scores = torch.baddbmm(key_bias, q, k.transpose(1, 2), beta=1.0, alpha=1.0 / math.sqrt(dh))
        del q, k
        probs = scores.softmax(-1)
        del scores
        weights = F.dropout(probs, p, self.training)
        del probs
        ctx = weights.bmm(v)
        del weights, v
        attn = F.dropout(self.out(ctx.view(b, h, s, dh).transpose(1, 2).reshape(b, s, d)), p, self.training)
        del ctx
        x = x + attn
        del attn
        hidden = F.relu(self.ff1(self.ln2(x)))
        ff = F.dropout(self.ff2(F.dropout(hidden, p, self.training)), p, self.training)
        del hidden
        return x + ff


def key_bias(ids, heads):
    """0 for real keys, -inf for padding, [batch * heads, 1, seq] (model.rs `key_bias`)."""
    b, s = ids.shape
    bias = torch.zeros(b, 1, 1, s).masked_fill(ids.eq(0).view(b, 1, 1, s), float("-inf"))
    return bias.expand(b, heads, 1, s).reshape(b * heads, 1, s)


class Classifier(nn.Module):
    """The model! declaration of ckpt-models/src/classifier.rs, stage for stage:
    tok (+ pos), dropout, blocks, ln_f, mean pooling over real tokens, head."""

    def __init__(self, c):
        super().__init__()
        d = c["d"]
        self.layers = c["layers"]
        self.tok = nn.Embedding(20, d, padding_idx=0)
        self.pos = nn.Parameter(torch.randn(c["seq"], d) * 0.02)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c["layers"]))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, 10)

    def stages(self, ids):
        """The chain of model!'s stages, with its per-call values (`key_bias`, `keep`)."""
        bias = key_bias(ids, 4)
        keep = ids.ne(0).to(torch.float).unsqueeze(-1)
        stages = [
            lambda x: self.tok(x) + self.pos[: x.shape[1]],
            lambda x: F.dropout(x, 0.1, self.training),
        ]
        stages += [(lambda blk: lambda x: blk(x, bias))(blk) for blk in self.blocks]
        stages += [
            self.ln_f,
            lambda x: (x * keep).sum(1) / keep.sum(1).clamp_min(1.0),
            self.head,
        ]
        return stages

    def forward(self, ids, segments, context_fn=None):
        """`segments` over the blocks as `Strategy::Checkpointed` cuts them: PyTorch's
        `checkpoint_sequential(blocks, segments)` grouping, the embedding and dropout
        joining the first segment, norm, pooling and head the last (plain) one.
        `context_fn`, when given, goes to every checkpointed segment (a selective
        policy: frontier_torch.py)."""
        kwargs = {} if context_fn is None else {"context_fn": context_fn}
        stages = self.stages(ids)
        size = self.layers // min(segments, self.layers)
        starts = [2 + k * size for k in range(1, min(segments, self.layers))]
        bounds = [0] + starts + [len(stages)]
        x = ids
        for k in range(len(bounds) - 1):
            a, b = bounds[k], bounds[k + 1]

            def run(x, a=a, b=b):
                for f in stages[a:b]:
                    x = f(x)
                return x

            x = run(x) if k == len(bounds) - 2 else checkpoint(run, x, use_reentrant=False, **kwargs)
        return x


def run_config(meter, c):
    torch.manual_seed(0)
    if c["model"] == "mlp":
        blocks = nn.ModuleList(ResidualBlock(c["d"], c["hidden"]) for _ in range(c["layers"]))
        x = torch.randn(c["batch"], c["d"])

        def step_with(segments):
            opt = torch.optim.AdamW(blocks.parameters(), lr=1e-4)

            def step():
                opt.zero_grad(set_to_none=False)
                if segments == 0:
                    y = x
                    for b in blocks:
                        y = b(y)
                else:
                    y = checkpoint_sequential(list(blocks), segments, x, use_reentrant=False)
                y.square().mean().backward()
                opt.step()

            return step

        return {
            "plain": measure(meter, c["warmup"], c["steps"], step_with(0)),
            "checkpointed": measure(meter, c["warmup"], c["steps"], step_with(c["segments"])),
        }
    model = Classifier(c)
    model.train()
    ids = torch.randint(1, 20, (c["batch"], c["seq"]))
    labels = torch.randint(0, 10, (c["batch"],))

    def step_with(segments):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step():
            opt.zero_grad(set_to_none=False)
            F.cross_entropy(model(ids, segments), labels).backward()
            opt.step()

        return step

    return {
        "plain": measure(meter, c["warmup"], c["steps"], step_with(1)),
        "checkpointed": measure(meter, c["warmup"], c["steps"], step_with(c["segments"])),
    }


def run_overhead(rounds, calls):
    """Per-call cost of checkpoint() on a 4-element tensor, as main.rs's `overhead`."""
    x = torch.randn(4, requires_grad=True)

    def timed(checkpointed):
        per_call = []
        for _ in range(rounds):
            start = time.perf_counter()
            for _ in range(calls):
                y = checkpoint(lambda t: t * 2.0 + 1.0, x, use_reentrant=False) if checkpointed else x * 2.0 + 1.0
                y.sum().backward()
            per_call.append((time.perf_counter() - start) * 1e6 / calls)
        return statistics.median(per_call)

    plain = timed(False)
    return {"plain_us": plain, "checkpointed_us": timed(True)}


def parse_side_args(description, request_help):
    """Parses what both PyTorch sides take (--meter, --threads, --request), sets the
    intra-op thread count, and returns the byte meter and the decoded request."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--meter", required=True, help="path of libckpt_bench.so")
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--request", required=True, help=request_help)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    return Meter(args.meter), json.loads(args.request)


def main():
    meter, request = parse_side_args(__doc__, "JSON: {kind: config|overhead, ...}")
    if request["kind"] == "config":
        result = run_config(meter, request["config"])
    else:
        result = run_overhead(request["rounds"], request["calls"])
    result["torch_version"] = torch.__version__
    print(json.dumps(result))


if __name__ == "__main__":
    main()
