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
  hook        DDP's step with relaxcc.hooks.CompressedAllreduce(bits=8) on
              the backend against DDP's plain step on gloo, same MLP (target
              at 100 Mbit/s between 2 emulated hosts: <= 0.35);
  overhead    an 8-byte allreduce through torch.distributed against relaxcc's
              own allreduce on the same communicator, timed in C++
              (relaxcc._C.allreduce_seconds; target: <= 2x + 10 us).

    mpirun -np 2 --bind-to none -x PYTHONPATH=build/ci/python \\
        /usr/bin/python3 bench/peers/python_backend.py [--parts allreduce,ddp,overhead]

Without mpirun (torchrun, relaxcc-hosts exec: RANK, WORLD_SIZE, MASTER_ADDR
and MASTER_PORT set) it starts on env://, and the backend on the UCX wing:

    flock /tmp/relaxcc-hosts.lock bench/relaxcc-hosts exec --hosts 2 --rate 100 -- \\
        env PYTHONPATH=build/ci/python /usr/bin/python3 bench/peers/python_backend.py --parts hook
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


def mlp_models(groups, rank):
    # relaxcc-train's MLP under torch's DDP on each of `groups` (name: group,
    # hook or None), the same initial weights; and a step function.
    from torch.nn.parallel import DistributedDataParallel as DDP
    x = torch.randn(64, 784, generator=torch.Generator().manual_seed(rank))
    y = torch.randint(0, 10, (64,), generator=torch.Generator().manual_seed(rank))
    models = {}
    for name, (group, hook) in groups.items():
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(),
                                  torch.nn.Linear(256, 128), torch.nn.ReLU(),
                                  torch.nn.Linear(128, 10))
        model = DDP(net, process_group=group)
        if hook is not None:
            relaxcc.hooks.register(model, hook)
        models[name] = (model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9), group)

    def step(name):
        model, opt, _ = models[name]
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return models, step


def compare_steps(models, step, reps):
    # The best of 3 alternating rounds of `reps` steps per model: seconds.
    secs = {}
    for _ in range(3):
        for name in models:
            s = timed(lambda: step(name), reps, models[name][2])
            secs[name] = min(secs.get(name, s), s)
    return secs


def ddp(gloo, rank):
    models, step = mlp_models({"relaxcc": (None, None), "gloo": (gloo, None)}, rank)
    secs = compare_steps(models, step, 100)
    if rank == 0:
        r, g = secs["relaxcc"], secs["gloo"]
        print(f"ddp step ms: relaxcc {r * 1e3:.3f} gloo {g * 1e3:.3f} relaxcc/gloo {r / g:.2f}")


def hook(gloo, rank):
    import relaxcc.hooks
    models, step = mlp_models({"relaxcc_8bit": (None, relaxcc.hooks.CompressedAllreduce(bits=8)),
                               "gloo": (gloo, None)}, rank)
    secs = compare_steps(models, step, 20)
    if rank == 0:
        r, g = secs["relaxcc_8bit"], secs["gloo"]
        print(f"ddp step ms: relaxcc 8-bit hook {r * 1e3:.3f} gloo plain {g * 1e3:.3f} "
              f"hook/gloo {r / g:.2f} (target <= 0.35: {'met' if r / g <= 0.35 else 'missed'})")


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
    store_file = f"/tmp/relaxcc_bench_{job}" if relaxcc.launched_by_mpirun() else None
    if store_file:
        dist.init_process_group("relaxcc", init_method=f"file://{store_file}",
                                rank=relaxcc.mpi_rank(), world_size=relaxcc.mpi_world_size(),
                                timeout=timedelta(seconds=120))
    else:
        dist.init_process_group("relaxcc", init_method="env://", timeout=timedelta(seconds=120))
    gloo = dist.new_group(backend="gloo")
    rank = dist.get_rank()
    parts = args.parts.split(",")
    if "overhead" in parts:
        overhead(rank)
    if "ddp" in parts:
        ddp(gloo, rank)
    if "hook" in parts:
        hook(gloo, rank)
    if "allreduce" in parts:
        allreduce(gloo, rank)
    dist.barrier()
    if rank == 0 and store_file:
        os.remove(store_file)


if __name__ == "__main__":
    main()
