#!/usr/bin/python3
"""The torch.distributed backend "relaxcc" against gloo, in one run (the same
processes, the two groups alternating, so both see the same load):

  allreduce   dist.all_reduce of float32, 1 KiB - 64 MiB per rank: median
              seconds per call on relaxcc and on gloo, and gloo / relaxcc
              (the throughput ratio: the target is >= 2 from 1 MiB up, >= 1
              below);
  ddp         torch's DistributedDataParallel step (forward, backward,
              SGD step) of relaxcc-train's MLP (784-256-128-10, batch 64 per
              rank), 1 thread per rank: relaxcc / gloo (target <= 0.8);
  overhead    an 8-byte allreduce through torch.distributed against relaxcc's
              own allreduce on the same communicator, timed in C++
              (relaxcc._C.allreduce_seconds; target: <= 2x + 10 us).

    mpirun -np 2 --bind-to none -x PYTHONPATH=build/ci/python \\
        /usr/bin/python3 bench/peers/python_backend.py [--parts allreduce,ddp,overhead]
"""
import argparse
import os
import re
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import relaxcc


def timed(fn, reps, group):
    # Seconds per fn() over a loop of reps calls, started together (a
    # barrier) after 3 warm-up calls.
    for _ in range(3):
        fn()
    dist.barrier(group=group)
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - start) / reps


def allreduce(gloo, rank):
    sizes = [1 << k for k in range(10, 27, 2)]  # 1 KiB .. 64 MiB
    rows = []
    for size in sizes:
        t = torch.ones(size // 4)
        reps = max(5, min(200, (64 << 20) // size // 4))
        secs = {}
        for _ in range(5):  # alternate; the best loop of each
            for name, group in (("relaxcc", None), ("gloo", gloo)):
                s = timed(lambda: dist.all_reduce(t, group=group), reps, group)
                secs[name] = min(secs.get(name, s), s)
        rows.append((size, secs["relaxcc"], secs["gloo"]))
    if rank == 0:
        print("| bytes per rank | relaxcc us | gloo us | gloo / relaxcc |")
        print("|---:|---:|---:|---:|")
        for size, r, g in rows:
            print(f"| {size} | {r * 1e6:.1f} | {g * 1e6:.1f} | {g / r:.2f} |")


def ddp(gloo, rank):
    from torch.nn.parallel import DistributedDataParallel as DDP
    x = torch.randn(64, 784, generator=torch.Generator().manual_seed(rank))
    y = torch.randint(0, 10, (64,), generator=torch.Generator().manual_seed(rank))
    models = {}
    for name, group in (("relaxcc", None), ("gloo", gloo)):
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(),
                                  torch.nn.Linear(256, 128), torch.nn.ReLU(),
                                  torch.nn.Linear(128, 10))
        model = DDP(net, process_group=group)
        models[name] = (model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9), group)

    def step(name):
        model, opt, _ = models[name]
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    secs = {}
    for _ in range(3):
        for name in ("relaxcc", "gloo"):
            s = timed(lambda: step(name), 100, models[name][2])
            secs[name] = min(secs.get(name, s), s)
    if rank == 0:
        r, g = secs["relaxcc"], secs["gloo"]
        print(f"ddp step ms: relaxcc {r * 1e3:.3f} gloo {g * 1e3:.3f} relaxcc/gloo {r / g:.2f}")


def overhead(rank):
    pg = dist.distributed_c10d._get_default_group()
    t = torch.ones(2)  # 8 bytes
    py, cc = [], []
    for _ in range(5):
        n = 2000
        dist.barrier()
        start = time.perf_counter()
        for _ in range(n):
            dist.all_reduce(t)
        py.append((time.perf_counter() - start) / n)
        dist.barrier()
        cc.append(relaxcc._C.allreduce_seconds(pg, 2, n))
    p, c = min(py) * 1e6, min(cc) * 1e6
    if rank == 0:
        print(f"8 B allreduce us: torch.distributed {p:.2f} relaxcc C++ {c:.2f} "
              f"bound 2x+10 = {2 * c + 10:.2f} ({'met' if p <= 2 * c + 10 else 'missed'})")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--parts", default="allreduce,ddp,overhead")
    args = parser.parse_args()
    torch.set_num_threads(1)
    job = re.sub(r"[^A-Za-z0-9]", "_", os.environ.get("PMIX_NAMESPACE", str(os.getppid())))
    dist.init_process_group("relaxcc", init_method=f"file:///tmp/relaxcc_bench_{job}",
                            rank=relaxcc.mpi_rank(), world_size=relaxcc.mpi_world_size(),
                            timeout=timedelta(seconds=120))
    gloo = dist.new_group(backend="gloo")
    rank = dist.get_rank()
    parts = args.parts.split(",")
    if "overhead" in parts:
        overhead(rank)
    if "ddp" in parts:
        ddp(gloo, rank)
    if "allreduce" in parts:
        allreduce(gloo, rank)
    dist.barrier()
    if rank == 0:
        os.remove(f"/tmp/relaxcc_bench_{job}")


if __name__ == "__main__":
    main()
