"""Every collective of the backend "relaxcc" against gloo's result on the
same inputs: exact for integers; float32 sums bitwise on 2 ranks (one
addition, the same in any order), within a few ulps on more ranks (relaxcc's
and gloo's summation orders differ).

mpirun -np 2|4 --oversubscribe /usr/bin/python3 -m pytest -q python/tests/test_vs_gloo.py
(PYTHONPATH=<build>/python).
"""
import os
import pytest
import torch
import torch.distributed as dist

import relaxcc

# Under mpirun, `import relaxcc` sets RANK and WORLD_SIZE from Open MPI's.
RANK, N = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
NUMEL = 1000
DTYPES = [torch.int32, torch.int64, torch.float32]
# relaxcc has no PRODUCT (test_backend checks its clear error).
OPS = {"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}


def inputs(dtype, numel=NUMEL, rank=RANK):
    # Rank and index in the values; floats with full mantissas.
    g = torch.Generator().manual_seed(1000 * rank + numel)
    if dtype.is_floating_point:
        return torch.randn(numel, generator=g).to(dtype)
    return torch.randint(-50, 50, (numel,), generator=g).to(dtype) + rank


def same(got, want, dtype, op=dist.ReduceOp.SUM):
    if dtype.is_floating_point and N > 2 and op == dist.ReduceOp.SUM:
        assert torch.allclose(got, want, rtol=1e-6, atol=1e-6), f"rank {RANK}"
    else:
        assert torch.equal(got, want), f"rank {RANK}: {got[:8]} vs gloo {want[:8]}"


def both(fn):
    # fn(group) run on relaxcc's default group and on gloo's.
    return fn(None), fn(pytest.gloo_group)


@pytest.fixture(autouse=True)
def _gloo(gloo):
    pytest.gloo_group = gloo


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", OPS.values(), ids=OPS.keys())
def test_allreduce(dtype, op):
    def run(group):
        t = inputs(dtype)
        dist.all_reduce(t, op=op, group=group)
        return t
    got, want = both(run)
    same(got, want, dtype, op)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_reduce_and_broadcast(dtype):
    def run(group):
        r, b = inputs(dtype), inputs(dtype)
        dist.reduce(r, dst=N - 1, group=group)
        dist.broadcast(b, src=N - 1, group=group)
        return r, b
    (r1, b1), (r2, b2) = both(run)
    if RANK == N - 1:
        same(r1, r2, dtype)
    assert torch.equal(b1, b2)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_allgather_gather_scatter(dtype):
    def run(group):
        out = [torch.empty(NUMEL, dtype=dtype) for _ in range(N)]
        dist.all_gather(out, inputs(dtype), group=group)
        gathered = [torch.empty(NUMEL, dtype=dtype) for _ in range(N)] if RANK == 0 else None
        dist.gather(inputs(dtype), gathered, dst=0, group=group)
        scattered = torch.empty(NUMEL, dtype=dtype)
        parts = [inputs(dtype, rank=r) * 3 for r in range(N)] if RANK == 0 else None
        dist.scatter(scattered, parts, src=0, group=group)
        return out, gathered, scattered
    (a1, g1, s1), (a2, g2, s2) = both(run)
    assert all(torch.equal(x, y) for x, y in zip(a1, a2))
    if RANK == 0:
        assert all(torch.equal(x, y) for x, y in zip(g1, g2))
    assert torch.equal(s1, s2)


@pytest.mark.parametrize("dtype", [torch.int64, torch.float32], ids=str)
def test_alltoall_base_with_splits(dtype):
    # Rank r sends r + j + 1 elements to rank j.
    send_splits = [RANK + j + 1 for j in range(N)]
    recv_splits = [j + RANK + 1 for j in range(N)]

    def run(group):
        out = torch.empty(sum(recv_splits), dtype=dtype)
        dist.all_to_all_single(out, inputs(dtype, sum(send_splits)), recv_splits, send_splits,
                               group=group)
        return out
    got, want = both(run)
    assert torch.equal(got, want)


@pytest.mark.parametrize("dtype", [torch.int64, torch.float32], ids=str)
def test_reduce_scatter(dtype):
    # gloo 1.13 has no reduce_scatter: its result is an allreduce's slice.
    t = inputs(dtype, NUMEL * N)
    want = t.clone()
    dist.all_reduce(want, group=pytest.gloo_group)
    got = torch.empty(NUMEL, dtype=dtype)
    dist.reduce_scatter(got, list(t.chunk(N)))
    same(got, want.chunk(N)[RANK], dtype)


def test_send_recv():
    # A ring: each rank sends its data to the next, on each backend.
    def run(group):
        out = torch.empty(NUMEL, dtype=torch.float32)
        reqs = [dist.isend(inputs(torch.float32), (RANK + 1) % N, group=group),
                dist.irecv(out, (RANK - 1) % N, group=group)]
        for r in reqs:
            r.wait()
        return out
    got, want = both(run)
    assert torch.equal(got, want)
