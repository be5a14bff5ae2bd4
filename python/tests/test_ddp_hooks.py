"""torch's DistributedDataParallel on the "relaxcc" backend, and relaxcc's comm
hooks.

- DDP on relaxcc against DDP on gloo (a gloo group of the same processes),
  same model, data and steps: parameters within 1e-6 after 20 steps (and
  equal across ranks), plain, with find_unused_parameters, with no_sync.
- Each hook: the loss goes down; a checkpoint (model, optimizer, hook state)
  taken after N steps and resumed for M steps gives the same bits as the run
  that went on; registering on a gloo group raises.

mpirun -np 2|4 --oversubscribe /usr/bin/python3 -m pytest -q python/tests/test_ddp_hooks.py
(PYTHONPATH=<build>/python; tests/conftest.py starts the groups), or without
pytest: /usr/bin/python3 python/tests/test_ddp_hooks.py (tcp://, an explicit rank).
"""
import io
import os
import zlib

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import relaxcc
import relaxcc.hooks as hooks

# Under mpirun, `import relaxcc` sets RANK and WORLD_SIZE from Open MPI's.
RANK, N = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
torch.set_num_threads(1)


def check(cond, what):
    assert cond, f"rank {RANK}: {what}"


class Net(torch.nn.Module):
    def __init__(self, unused=False):
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(16, 32)
        self.b = torch.nn.Linear(32, 4)
        self.unused = torch.nn.Linear(32, 4) if unused else None

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


def batch(step, rank):
    # A fixed regression problem; each rank's batch depends on (step, rank).
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(8, 16, generator=g)
    w = torch.linspace(-1, 1, 64).view(16, 4)
    return x, x @ w


def run(model, opt, steps, first=0, no_sync_every=0, join=False):
    if join:
        # Uneven inputs: rank r runs r more steps than rank 0.
        with model.join():
            return run(model, opt, steps + RANK, first, no_sync_every)
    losses = []
    for step in range(first, first + steps):
        x, y = batch(step, RANK)
        if no_sync_every and step % no_sync_every != no_sync_every - 1:
            with model.no_sync():
                torch.nn.functional.mse_loss(model(x), y).backward()
            continue
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def params(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def ddp_run(group, steps=20, **kwargs):
    unused = kwargs.pop("find_unused_parameters", False)
    model = DDP(Net(unused), process_group=group, find_unused_parameters=unused)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    run(model, opt, steps, **kwargs)
    return params(model)


def same_across_ranks(p, group):
    out = [torch.zeros_like(p) for _ in range(N)]
    dist.all_gather(out, p, group=group)
    return all(torch.equal(o, out[0]) for o in out)


def test_ddp_against_gloo(gloo):
    for name, kwargs in (("plain", {}), ("find_unused_parameters", {"find_unused_parameters": True}),
                         ("no_sync", {"no_sync_every": 2}), ("join", {"join": True})):
        mine = ddp_run(None, **kwargs)
        ref = ddp_run(gloo, **kwargs)
        diff = (mine - ref).abs().max().item()
        check(diff <= 1e-6, f"DDP {name}: max difference {diff} from gloo")
        check(same_across_ranks(mine, gloo), f"DDP {name}: parameters differ across ranks")
        if RANK == 0:
            print(f"ok ddp {name}: max |relaxcc - gloo| = {diff:.3g}", flush=True)


def hook_run(make_state, steps, checkpoint=None):
    model = DDP(Net())
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    state = make_state()
    first = 0
    if checkpoint is not None:
        saved = torch.load(io.BytesIO(checkpoint))
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        state.load_state_dict(saved["hook"])
        first = saved["step"]
    hooks.register(model, state)
    losses = run(model, opt, steps, first=first)
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                "hook": state.state_dict(), "step": first + steps}, buf)
    return params(model), losses, buf.getvalue()


def test_hooks(gloo):
    makers = {
        "minmax8": lambda: hooks.CompressedAllreduce(bits=8, chunk=64),
        "minmax4": lambda: hooks.CompressedAllreduce(bits=4, chunk=64),
        "minmax2_stochastic": lambda: hooks.CompressedAllreduce(bits=2, chunk=64,
                                                                rounding="stochastic", seed=7),
        "auto": lambda: hooks.AutoCodec(link_bytes=1 << 16, codec_bytes=1 << 16, repetitions=1),
        "topk": lambda: hooks.TopK(ratio=0.25),
        "randomk": lambda: hooks.RandomK(ratio=0.25, seed=3),
        "cocktail": lambda: hooks.Cocktail(random_ratio=0.5, topk_ratio=0.5, bits=8, chunk=64),
    }
    for name, make_new in makers.items():
        # Every run starts from one state's fresh state_dict: for the auto
        # codec, its calibration, so that all runs make the same choices.
        fresh = make_new().state_dict()

        def make():
            state = make_new()
            state.load_state_dict(fresh)
            return state

        _, losses, ckpt = hook_run(make, 12)
        check(sum(losses[-3:]) < 0.7 * sum(losses[:3]),
              f"hook {name}: loss did not go down: {losses}")
        went_on, _, _ = hook_run(make, 6, checkpoint=ckpt)
        # The run that went on: 12 steps, a checkpoint, 6 more, without reloading.
        cont_model = continued(make, 12, 6)
        check(torch.equal(went_on, cont_model),
              f"hook {name}: resumed run differs from the continued one by "
              f"{(went_on - cont_model).abs().max().item()}")
        check(same_across_ranks(went_on, gloo), f"hook {name}: parameters differ across ranks")
        if RANK == 0:
            print(f"ok hook {name}: loss {losses[0]:.4f} -> {losses[-1]:.4f}, resume bitwise",
                  flush=True)
    gloo_model = DDP(Net(), process_group=gloo)
    try:
        hooks.register(gloo_model, hooks.CompressedAllreduce())
        raise AssertionError("registering beside a gloo model did not raise")
    except relaxcc.InvalidArgument as e:
        check("gloo" in str(e), f"message {e}")
    try:
        hooks.TopK(process_group=gloo)
        raise AssertionError("a hook state on a gloo group did not raise")
    except relaxcc.InvalidArgument as e:
        check("gloo" in str(e), f"message {e}")


def continued(make, n, m):
    # N steps, a checkpoint written (state_dict called), then M more steps.
    model = DDP(Net())
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    state = make()
    hooks.register(model, state)
    run(model, opt, n)
    torch.save(state.state_dict(), io.BytesIO())
    run(model, opt, m, first=n)
    return params(model)


def main():
    job = os.environ.get("PMIX_NAMESPACE", str(os.getppid()))
    port = 20000 + zlib.crc32(job.encode()) % 20000
    dist.init_process_group("relaxcc", init_method=f"tcp://127.0.0.1:{port}", rank=RANK,
                            world_size=N)
    gloo = dist.new_group(backend="gloo")
    test_ddp_against_gloo(gloo)
    test_hooks(gloo)
    dist.barrier()


if __name__ == "__main__":
    main()
