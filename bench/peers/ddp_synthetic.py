#!/usr/bin/python3
"""PyTorch's DistributedDataParallel (gloo) on relaxcc-bench algorithms'
synthetic model: the baseline of gradient_allreduce on the same links.

The model is ResNet-50's 161 parameter tensors (bench/model_layers.cc's
resnet50_layers, the same order), each of max(1, round(numel x --model-scale))
elements, flat. Backward is emulated as relaxcc-bench algorithms emulates it:
layer i (last first) sleeps its share of --compute-ms, in proportion to its
size, and then its gradient is ready, so DDP's bucket allreduces (25 MiB
buckets, its default) overlap the remaining layers' compute as
gradient_allreduce's do. Then an SGD step (lr 0.01) of the whole model.

Ranks come from relaxcc-hosts exec or torchrun (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT). Timed steps run back to back after the warm-up
steps and one barrier; the step time is the mean over timed steps, the
largest over ranks. Rank 0 prints one JSON row (and appends it to --json).

    bench/relaxcc-hosts exec --hosts 4 --rate 1000 --delay-ms 50 -- \\
        /usr/bin/python3 bench/peers/ddp_synthetic.py --model-scale 0.1 -n 6 -w 2
"""
import argparse
import datetime
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel


def resnet50_numels():
    """Element counts of ResNet-50's parameter tensors, in bench/model_layers.cc's order."""
    sizes = []
    conv = lambda cin, cout, k: sizes.append(cin * cout * k * k)
    bn = lambda c: sizes.extend([c, c])
    conv(3, 64, 7)
    bn(64)
    cin = 64
    for s, blocks in enumerate((3, 4, 6, 3)):
        w = 64 << s
        for b in range(blocks):
            conv(cin, w, 1)
            bn(w)
            conv(w, w, 3)
            bn(w)
            conv(w, 4 * w, 1)
            bn(4 * w)
            if b == 0:
                conv(cin, 4 * w, 1)
                bn(4 * w)
            cin = 4 * w
    sizes.extend([2048 * 1000, 1000])
    return sizes


class SleepLayer(torch.autograd.Function):
    """y = x + sum(p); backward sleeps until the layer's deadline, then hands p
    a gradient (normal, standard deviation 1e-3, like the bench's)."""

    @staticmethod
    def forward(ctx, x, p, clock):
        ctx.clock = clock
        ctx.p_shape = p.shape
        return x + p.sum()

    @staticmethod
    def backward(ctx, grad):
        clock = ctx.clock
        delay = clock["start"] + clock["due"].pop() - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        return grad, torch.randn(ctx.p_shape) * 1e-3, None


class Synthetic(nn.Module):
    def __init__(self, numels, compute_s):
        super().__init__()
        self.params = nn.ParameterList([nn.Parameter(torch.zeros(n)) for n in numels])
        total = float(sum(numels))
        # Deadlines from the start of backward, last layer first.
        done, due = 0, []
        for n in reversed(numels):
            done += n
            due.append(compute_s * done / total)
        self.due = due
        self.clock = {"start": 0.0, "due": []}

    def forward(self, x):
        # Backward pops deadlines from the end: first layer's last.
        self.clock["due"] = list(reversed(self.due))
        for p in self.params:
            x = SleepLayer.apply(x, p, self.clock)
        return x


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-scale", type=float, default=1.0)
    ap.add_argument("--compute-ms", type=float, default=200.0)
    ap.add_argument("-n", "--iters", type=int, default=8)
    ap.add_argument("-w", "--warmup", type=int, default=2)
    ap.add_argument("--rate-mbit", type=float, default=0.0, help="recorded in the row")
    ap.add_argument("--delay-ms", type=float, default=0.0, help="recorded in the row")
    ap.add_argument("--json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
    rank, world = dist.get_rank(), dist.get_world_size()
    numels = [max(1, round(n * args.model_scale)) for n in resnet50_numels()]
    model = Synthetic(numels, args.compute_ms / 1e3)
    ddp = DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x = torch.zeros(())

    def step():
        opt.zero_grad(set_to_none=True)
        y = ddp(x)
        model.clock["start"] = time.perf_counter()
        y.backward()
        opt.step()

    for _ in range(args.warmup):
        step()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(args.iters):
        step()
    step_ms = torch.tensor([(time.perf_counter() - t0) / args.iters * 1e3])
    dist.all_reduce(step_ms, op=dist.ReduceOp.MAX)
    if rank == 0:
        row = {"mode": "ddp_synthetic", "impl": "torch_ddp_gloo", "ranks": world,
               "model": "resnet50", "model_scale": args.model_scale, "params": sum(numels),
               "compute_ms": args.compute_ms, "rate_mbit": args.rate_mbit, "delay_ms": args.delay_ms,
               "iters": args.iters, "warmup": args.warmup, "step_ms": round(step_ms.item(), 3),
               "torch": torch.__version__}
        print(json.dumps(row), flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(row) + "\n")
    # Every rank leaves together: rank 0 holds the store the others' teardown uses.
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
