"""relaxcc.DistributedDataParallel with every algorithm module: the loss
goes down on a fixed problem; a checkpoint (state_dict) resumes bit for bit;
options checked at construction; models that differ across ranks; a rank
that never calls (Timeout or the poison error on the others, within the
timeout plus 2 s).

mpirun -np 2|4 --oversubscribe /usr/bin/python3 -m pytest -q python/tests/test_algorithms.py
(PYTHONPATH=<build>/python).
"""
import os
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import relaxcc
from relaxcc import algorithms as A

# Under mpirun, `import relaxcc` sets RANK and WORLD_SIZE from Open MPI's.
RANK, N = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
ROWS = 96
# Several buckets (the plan is rebuilt after the first step).
SMALL_BUCKETS = {"reducer": {"plan": {"cap_bytes": 512, "first_cap_bytes": 256}}}

# (name, algorithm factory, bit-for-bit resume promised). No deadlines: a
# deadline makes rounds depend on timing; async_model_average's averages land
# by timing, so its resume is not bit for bit.
CASES = [
    ("gradient_allreduce", lambda: A.GradientAllreduce(), True),
    ("bytegrad", lambda: A.ByteGrad(hierarchical=False, error_feedback=True), True),
    ("qadam", lambda: A.QAdam(warmup_steps=2), True),
    ("cocktail_sgd", lambda: A.CocktailSGD(warmup_steps=1), True),
    ("local_sgd", lambda: A.LocalSGD(period=2, warmup_steps=1), True),
    ("decentralized_sgd", lambda: A.DecentralizedSGD(mode="shift_one"), True),
    ("low_precision_decentralized_sgd", lambda: A.LowPrecisionDecentralizedSGD(), True),
    ("async_model_average", lambda: A.AsyncModelAverage(), False),
    ("moshpit_sgd", lambda: A.MoshpitSGD(deadline={"adaptive": False}), True),
    ("diloco", lambda: A.DiLoCo(inner_steps=2), True),
    ("diloco_streaming_8bit",
     lambda: A.DiLoCo(inner_steps=2, fragments=2, overlap_steps=1, codec={}), True),
    ("diloco_eager_4bit", lambda: A.DiLoCo(inner_steps=2, eager=True, codec={"bits": 4}), True),
    ("sparseloco", lambda: A.DiLoCo.sparseloco(2), True),
]
IDS = [c[0] for c in CASES]


def problem():
    # One fixed regression problem; rank r trains on rows r, r + N, ...
    g = torch.Generator().manual_seed(7)
    x = torch.randn(ROWS, 8, generator=g)
    y = 0.3 * (x @ torch.randn(8, 1, generator=g))
    return x, y


def make_model(hidden=16, dtype=torch.float32):
    torch.manual_seed(42)
    return torch.nn.Sequential(torch.nn.Linear(8, hidden), torch.nn.Tanh(),
                               torch.nn.Linear(hidden, 1)).to(dtype)


def train(ddp, optimizer, steps):
    x, y = problem()
    xs, ys = x[RANK::N], y[RANK::N]
    for _ in range(steps):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(ddp(xs), ys).backward()
        ddp.step()


def full_loss(model):
    x, y = problem()
    with torch.no_grad():
        return torch.nn.functional.mse_loss(model(x), y).item()


def wrap(algorithm, **options):
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
    return model, optimizer, relaxcc.DistributedDataParallel(model, optimizer, algorithm,
                                                             **options)


@pytest.mark.parametrize("name,make,_", CASES, ids=IDS)
def test_loss_goes_down(name, make, _):
    model, optimizer, ddp = wrap(make(), **SMALL_BUCKETS)
    before = full_loss(model)
    train(ddp, optimizer, 40)
    averaged = []
    ddp.with_averaged_model(lambda: averaged.append(full_loss(model)))
    assert averaged[0] < 0.5 * before, f"rank {RANK} {name}: loss {before} -> {averaged[0]}"
    assert ddp.steps == 40


@pytest.mark.parametrize("name,make,bit_for_bit", CASES, ids=IDS)
def test_resume_bit_for_bit(name, make, bit_for_bit):
    model, optimizer, ddp = wrap(make(), **SMALL_BUCKETS)
    train(ddp, optimizer, 3)
    saved = ddp.state_dict()
    train(ddp, optimizer, 3)
    straight = [p.detach().clone() for p in model.parameters()]
    del ddp
    model2, optimizer2, ddp2 = wrap(make(), **SMALL_BUCKETS)
    ddp2.load_state_dict(saved)
    assert ddp2.steps == 3
    train(ddp2, optimizer2, 3)
    resumed = list(model2.parameters())
    if bit_for_bit:
        for a, b in zip(straight, resumed):
            assert torch.equal(a, b), f"rank {RANK} {name}: resumed run differs"
    else:
        for a, b in zip(straight, resumed):
            assert torch.allclose(a, b, atol=0.5), f"rank {RANK} {name}: resumed run far off"


def test_no_sync_accumulates(gloo):
    model, optimizer, ddp = wrap(A.GradientAllreduce())
    x, y = problem()
    xs, ys = x[RANK::N], y[RANK::N]
    optimizer.zero_grad()
    with ddp.no_sync():
        torch.nn.functional.mse_loss(ddp(xs[:4]), ys[:4]).backward()
    with pytest.raises(relaxcc.InvalidArgument, match="no_sync"):
        ddp.step()
    torch.nn.functional.mse_loss(ddp(xs[4:]), ys[4:]).backward()
    ddp.step()
    # The same model on every rank (the accumulated gradients were averaged).
    for p in model.parameters():
        got = [torch.empty_like(p) for _ in range(N)]
        dist.all_gather(got, p.detach(), group=gloo)
        assert all(torch.equal(got[0], g) for g in got)


def test_options_checked():
    with pytest.raises(relaxcc.InvalidArgument, match="unknown option 'inner_step'"):
        A.DiLoCo(inner_step=3)
    with pytest.raises(TypeError, match="inner_steps: expected an int, got str"):
        A.DiLoCo(inner_steps="3")
    with pytest.raises(relaxcc.InvalidType):
        A.LocalSGD(period=2.5)
    with pytest.raises(ValueError, match="inner_steps"):
        A.DiLoCo(inner_steps=0)
    with pytest.raises(relaxcc.InvalidArgument, match="'sometimes' is none of"):
        A.ByteGrad(rounding="sometimes")
    with pytest.raises(relaxcc.InvalidArgument, match="out of the range"):
        A.LocalSGD(period=2**40)
    assert A.DiLoCo.defaults()["inner_steps"] == 500
    assert A.DiLoCo(codec={"bits": 4}).options["codec"]["kind"] == "minmax"
    assert A.MoshpitSGD.defaults()["deadline"]["adaptive"] is True
    with pytest.raises(TypeError, match="algorithm must be one of relaxcc.algorithms"):
        relaxcc.DistributedDataParallel(make_model(), None, "diloco")


def test_models_that_differ():
    # A shape on rank 0 alone: PeerMismatch on every rank at construction.
    model = make_model(hidden=17 if RANK == 0 else 16)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(relaxcc.PeerMismatch):
        relaxcc.DistributedDataParallel(model, optimizer)
    # A dtype on rank 0 alone: every rank fails, naming rank 0.
    model = make_model(dtype=torch.float64 if RANK == 0 else torch.float32)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(relaxcc.Unsupported, match="rank 0"):
        relaxcc.DistributedDataParallel(model, optimizer)
    # The communicator is usable after.
    _, optimizer, ddp = wrap(A.GradientAllreduce())
    train(ddp, optimizer, 1)


def test_missing_rank_times_out(gloo):
    # Last in this file: the communicator is poisoned afterwards. The last
    # rank never calls backward; every other rank fails within the timeout
    # plus 2 s, with Timeout or the poison error.
    timeout = 2.0
    model, optimizer, ddp = wrap(A.GradientAllreduce(),
                                 reducer={"timeout": timedelta(seconds=timeout)},
                                 check_uneven_inputs=False)
    dist.barrier(group=gloo)
    if RANK != N - 1:
        x, y = problem()
        start = time.monotonic()
        with pytest.raises(RuntimeError) as info:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(ddp(x[RANK::N]), y[RANK::N]).backward()
            ddp.step()
        elapsed = time.monotonic() - start
        message = str(info.value)
        assert isinstance(info.value, (relaxcc.Timeout, relaxcc.CommunicatorPoisoned)) or (
            "Timeout" in message or "CommunicatorPoisoned" in message), message
        assert elapsed < timeout + 2, f"rank {RANK}: failed after {elapsed:.1f} s: {message}"
    dist.barrier(group=gloo)
