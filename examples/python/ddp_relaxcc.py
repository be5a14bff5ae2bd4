"""Fashion-MNIST with torch's DistributedDataParallel on the relaxcc backend.

    cmake --build build/ci --target relaxcc_python
    mpirun -np 2 -x PYTHONPATH=build/ci/python -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT=29500 \
        /usr/bin/python3 examples/python/ddp_relaxcc.py [--hook minmax8|topk|randomk|cocktail|auto]
        [--diloco H] [--backend gloo]

The plain PyTorch script differs in two lines: `import relaxcc` and the
backend's name. A comm hook is two more (--hook). DiLoCo (--diloco H) is
relaxcc's own DistributedDataParallel with an algorithm module: the wrapper
takes the optimizer, and ddp.step() replaces opt.step(). Data: Debian's
dataset-fashion-mnist (/usr/share/datasets/fashion-mnist).
"""
import argparse
import gzip
import time

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import relaxcc  # registers the "relaxcc" backend
import relaxcc.hooks

DATA = "/usr/share/datasets/fashion-mnist"


def load(split):
    with gzip.open(f"{DATA}/{split}-images-idx3-ubyte.gz") as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 784)
    with gzip.open(f"{DATA}/{split}-labels-idx1-ubyte.gz") as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8)
    return torch.from_numpy(x.astype(np.float32) / 255.0), torch.from_numpy(y.astype(np.int64))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--hook", choices=["none", "minmax8", "topk", "randomk", "cocktail", "auto"],
                        default="none")
    parser.add_argument("--backend", default="relaxcc", help="gloo: the plain PyTorch run")
    parser.add_argument("--diloco", type=int, default=0,
                        help="H > 0: relaxcc.DistributedDataParallel with DiLoCo, H inner steps")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=0, help="0: one epoch")
    args = parser.parse_args()
    if args.diloco and args.hook != "none":
        parser.error("--hook is for torch's DDP; --diloco runs relaxcc's")
    torch.set_num_threads(1)

    dist.init_process_group(args.backend, init_method="env://")  # the plain script: "gloo"
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(),
                              torch.nn.Linear(256, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    if args.diloco:  # relaxcc's DDP: any algorithm module; ddp.step() in place of opt.step()
        model = relaxcc.DistributedDataParallel(
            net, opt, relaxcc.algorithms.DiLoCo(inner_steps=args.diloco))
        stepper = model
    else:
        model, stepper = DDP(net), opt
    if args.hook != "none":
        state = {"minmax8": lambda: relaxcc.hooks.CompressedAllreduce(bits=8),
                 "topk": lambda: relaxcc.hooks.TopK(ratio=0.01),
                 "randomk": lambda: relaxcc.hooks.RandomK(ratio=0.25),
                 "cocktail": lambda: relaxcc.hooks.Cocktail(),
                 "auto": lambda: relaxcc.hooks.AutoCodec()}[args.hook]()
        relaxcc.hooks.register(model, state)

    x, y = load("train")
    x, y = x[rank::world], y[rank::world]
    steps = args.steps or len(x) // args.batch
    start = time.perf_counter()
    for step in range(steps):
        i = (step * args.batch) % (len(x) - args.batch)
        loss = torch.nn.functional.cross_entropy(model(x[i:i + args.batch]), y[i:i + args.batch])
        opt.zero_grad()
        loss.backward()
        stepper.step()
    elapsed = time.perf_counter() - start

    tx, ty = load("t10k")
    with torch.no_grad():
        accuracy = (net(tx).argmax(1) == ty).float().mean().item()
    if rank == 0:
        print(f"backend={args.backend} hook={args.hook} diloco={args.diloco} steps={steps} loss={loss.item():.4f} "
              f"test_accuracy={accuracy:.4f} step_ms={1000 * elapsed / steps:.2f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
