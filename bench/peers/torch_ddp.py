#!/usr/bin/python3
"""PyTorch's own DistributedDataParallel (gloo) on Fashion-MNIST: the peer that
relaxcc-train --compare reports next to relaxcc's algorithms.

Same model (train/relaxcc_train.cc defines the same layers in the same order),
same initial weights (--init: the f32 file relaxcc-train --init-out wrote),
same data order (the splitmix64 Fisher-Yates permutation of relaxcc-train),
same hyper-parameters (SGD, lr, momentum, batch per rank), same rank count.

Variants (--variant): torch_ddp (plain), torch_ddp_fp16 (fp16_compress_hook),
torch_ddp_powersgd (PowerSGD hook, rank 1, error feedback and warm start on,
plain allreduce for the first 10 steps: the default start_powerSGD_iter of 1000
is more than an epoch here).

Ranks come from torchrun or relaxcc-hosts exec (RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT) or from mpirun (OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE; the
master is 127.0.0.1). Needs Debian's python3-torch: run it with /usr/bin/python3.

Writes the same JSON summary as relaxcc-train (--json) and curve (--curve).
Bytes sent per rank: 2 (n - 1) / n of the bytes each step's allreduces reduce
(a ring allreduce's traffic; gloo's own counters are not exposed), counted from
the gradients (plain: 4 bytes per element, fp16: 2) or from PowerSGD's
allreduces.
"""
import argparse
import datetime
import gzip
import json
import math
import os
import sys
import time
import traceback

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel

M64 = (1 << 64) - 1


class InputError(Exception):
    """Bad input (data files, --init): its message is reported without a traceback."""


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(784, 256)
        self.fc2 = nn.Linear(256, 128)
        self.fc3 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.fc1(x.view(x.size(0), 784)))
        return self.fc3(F.relu(self.fc2(x)))


class Cnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.fc1 = nn.Linear(64 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def read_idx(path, dims):
    """An IDX file of unsigned bytes (plain or .gz) as a numpy array; InputError
    for a missing, unreadable or malformed file."""
    if not os.path.exists(path):
        path += ".gz"
    if not os.path.exists(path):
        raise InputError(f"{path} not found (apt-get install dataset-fashion-mnist)")
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError) as e:
        raise InputError(f"{path}: cannot read: {e}") from e
    head = 4 + 4 * dims
    if len(data) < head:
        raise InputError(f"{path}: {len(data)} bytes, shorter than its {head}-byte IDX header")
    magic = int.from_bytes(data[0:4], "big")
    if magic != 0x800 | dims:
        raise InputError(f"{path}: IDX magic {magic:#x}, expected {0x800 | dims:#x}")
    shape = [int.from_bytes(data[4 + 4 * d:8 + 4 * d], "big") for d in range(dims)]
    expected = math.prod(shape)  # Python integers: no overflow
    if len(data) - head != expected:
        raise InputError(f"{path}: {len(data) - head} bytes after the header, expected {expected} "
                         f"(dimensions {shape})")
    return np.frombuffer(data, dtype=np.uint8, offset=head).reshape(shape)


def load_split(data_dir, prefix):
    image_path = os.path.join(data_dir, f"{prefix}-images-idx3-ubyte")
    label_path = os.path.join(data_dir, f"{prefix}-labels-idx1-ubyte")
    images = read_idx(image_path, 3)
    labels = read_idx(label_path, 1)
    if images.shape[1:] != (28, 28):
        raise InputError(f"{image_path}: images are {images.shape[1]}x{images.shape[2]}, expected 28x28")
    if images.shape[0] != labels.shape[0]:
        raise InputError(f"{image_path} holds {images.shape[0]} images, {label_path} {labels.shape[0]} labels")
    if labels.size and labels.max() > 9:
        at = int(np.argmax(labels > 9))
        raise InputError(f"{label_path}: label {labels[at]} at {at} is not a class 0..9")
    x = (images.astype(np.float32) / np.float32(255.0) - np.float32(0.2860)) / np.float32(0.3530)
    return torch.from_numpy(x).unsqueeze(1), torch.from_numpy(labels.astype(np.int64))


def permutation(n, seed, epoch):
    """relaxcc-train's sample order: Fisher-Yates driven by splitmix64."""
    state = (seed * 1000003 + epoch) & M64
    p = list(range(n))
    for i in range(n - 1, 0, -1):
        state = (state + 0x9E3779B97F4A7C15) & M64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
        z ^= z >> 31
        j = z % (i + 1)
        p[i], p[j] = p[j], p[i]
    return torch.tensor(p, dtype=torch.int64)


def rank_from_env():
    return os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0"))


def train():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", default="torch_ddp", choices=["torch_ddp", "torch_ddp_fp16", "torch_ddp_powersgd"])
    ap.add_argument("--model", default="mlp", choices=["mlp", "cnn"])
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--max-steps", type=int, default=0)
    ap.add_argument("--evals-per-epoch", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--init", help="initial weights (f32, parameter order) from relaxcc-train --init-out")
    ap.add_argument("--port", type=int, default=29517, help="the master's port when MASTER_PORT is not set")
    ap.add_argument("--json")
    ap.add_argument("--curve")
    a = ap.parse_args()

    rank = int(rank_from_env())
    world = int(os.environ.get("WORLD_SIZE", os.environ.get("OMPI_COMM_WORLD_SIZE", "1")))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(a.port))
    torch.set_num_threads(a.threads)

    # Every rank reads and checks the same inputs before any rank joins the
    # process group: bad input fails on every rank alike, with no rank left
    # waiting for a peer that exited.
    train_x, train_y = load_split(a.data, "train")
    test_x, test_y = load_split(a.data, "t10k")
    torch.manual_seed(a.seed)
    model = Mlp() if a.model == "mlp" else Cnn()
    if a.init:
        if not os.path.isfile(a.init):
            raise InputError(f"--init {a.init} not found")
        flat = torch.from_numpy(np.fromfile(a.init, dtype=np.float32))
        total = sum(p.numel() for p in model.parameters())
        if flat.numel() != total:
            raise InputError(f"--init {a.init} holds {flat.numel()} floats, "
                             f"expected {total} (the {a.model}'s parameters)")
        at = 0
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(flat[at:at + p.numel()].view_as(p))
                at += p.numel()

    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(minutes=5))
    ddp = DistributedDataParallel(model)
    numel = sum(p.numel() for p in model.parameters())
    reduced = {"bytes": 0}  # bytes the allreduces of this rank reduced
    if a.variant == "torch_ddp_fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif a.variant == "torch_ddp_powersgd":
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                            start_powerSGD_iter=10)
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        original = dist.all_reduce

        def counting_all_reduce(tensor, *args, **kwargs):
            reduced["bytes"] += tensor.numel() * tensor.element_size()
            return original(tensor, *args, **kwargs)
        powerSGD_hook.dist.all_reduce = counting_all_reduce
    opt = torch.optim.SGD(ddp.parameters(), lr=a.lr, momentum=a.momentum)

    def evaluate():
        model.eval()
        with torch.no_grad():
            per = (test_x.size(0) + world - 1) // world
            first = min(test_x.size(0), rank * per)
            count = min(test_x.size(0) - first, per)
            correct = torch.zeros(1, dtype=torch.float64)
            for at in range(0, count, 1000):
                x = test_x[first + at:first + min(count, at + 1000)]
                y = test_y[first + at:first + min(count, at + 1000)]
                correct += (model(x).argmax(1) == y).sum().double()
            dist.all_reduce(correct)
        model.train()
        return correct.item() / test_x.size(0)

    global_batch = a.batch * world
    steps_per_epoch = train_x.size(0) // global_batch
    if a.max_steps > 0:
        steps_per_epoch = min(steps_per_epoch, a.max_steps)
    eval_every = max(1, steps_per_epoch // a.evals_per_epoch)
    curve = [(0.0, 0.0, evaluate())]
    step_ms = []
    train_s = 0.0
    sent = 0.0
    ring = 2.0 * (world - 1) / world
    for epoch in range(a.epochs):
        order = permutation(train_x.size(0), a.seed, epoch)
        for s in range(steps_per_epoch):
            t0 = time.perf_counter()
            idx = order[(s * world + rank) * a.batch:(s * world + rank + 1) * a.batch]
            x, y = train_x[idx], train_y[idx]
            opt.zero_grad()
            loss = F.cross_entropy(ddp(x), y)
            loss.backward()
            opt.step()
            ms = (time.perf_counter() - t0) * 1e3
            step_ms.append(ms)
            train_s += ms / 1e3
            if a.variant == "torch_ddp":
                sent += ring * 4 * numel
            elif a.variant == "torch_ddp_fp16":
                sent += ring * 2 * numel
            else:
                # PowerSGD's first steps allreduce the gradients whole,
                # outside dist.all_reduce.
                sent += ring * (reduced["bytes"] or 4 * numel)
                reduced["bytes"] = 0
            if rank == 0 and (s % max(1, steps_per_epoch // 50) == 0 or s + 1 == steps_per_epoch):
                filled = 30 * (s + 1) // steps_per_epoch
                print(f"\r{a.variant} epoch {epoch + 1}/{a.epochs} [{'#' * filled}{'.' * (30 - filled)}] "
                      f"{s + 1}/{steps_per_epoch} loss {loss.item():.4f}", end="", file=sys.stderr, flush=True)
            if (s + 1) % eval_every == 0 or s + 1 == steps_per_epoch:
                curve.append((train_s, sent, evaluate()))
        if rank == 0:
            print(f"  test accuracy {curve[-1][2]:.4f}", file=sys.stderr)
    steady = sorted(step_ms[min(10, len(step_ms) // 2):])
    median = torch.tensor([steady[len(steady) // 2] if steady else 0.0])
    dist.all_reduce(median, op=dist.ReduceOp.MAX)
    if rank == 0:
        summary = {"algorithm": a.variant, "model": a.model, "ranks": world, "epochs": a.epochs,
                   "seed": a.seed, "steps": len(step_ms), "test_accuracy": curve[-1][2],
                   "wall_s": curve[-1][0], "step_ms": median.item(),
                   "bytes_sent_per_rank": int(curve[-1][1])}
        print(f"torch_ddp.py {a.variant} {a.model}: {world} ranks, {a.epochs} epochs, {len(step_ms)} steps: "
              f"test accuracy {summary['test_accuracy']:.4f}, wall {summary['wall_s']:.2f} s, "
              f"step {summary['step_ms']:.2f} ms (median), {summary['bytes_sent_per_rank'] / 1e6:.1f} MB sent per rank")
        if a.json:
            with open(a.json, "w") as f:
                f.write(json.dumps(summary) + "\n")
        if a.curve:
            with open(a.curve, "w") as f:
                f.write("# wall_s bytes_sent_per_rank test_accuracy\n")
                for p in curve:
                    f.write(f"{p[0]} {p[1]} {p[2]}\n")
    # Every rank is done before any rank leaves (see main for how it leaves).
    dist.barrier()


def main():
    """Runs train() and ends the process with os._exit on every path: 0 on
    success, 1 on an error (its traceback, or an InputError's message, on
    stderr), argparse's own code for --help and usage errors. The process
    never tears torch down: gloo's teardown in torch 1.13 sometimes never
    returns (destroy_process_group) or destroys a joinable thread at
    interpreter exit (std::terminate: "terminate called without an active
    exception", SIGABRT), on success and after errors alike."""
    rc = 1
    try:
        train()
        rc = 0
    except SystemExit as e:  # argparse: --help (0) or a usage error (2)
        if e.code is None or isinstance(e.code, int):
            rc = e.code or 0
        else:
            print(e.code, file=sys.stderr)
    except InputError as e:
        print(f"torch_ddp.py: rank {rank_from_env()}: {e}", file=sys.stderr)
    except BaseException:  # noqa: B902 - KeyboardInterrupt included: never unwind into torch
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(rc)


if __name__ == "__main__":
    main()
