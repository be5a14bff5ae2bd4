"""DDP comm hooks on relaxcc's relaxed primitives, for torch's own
DistributedDataParallel:

    state = relaxcc.hooks.CompressedAllreduce(bits=8)        # on the default group
    model.register_comm_hook(state, relaxcc.hooks.hook)
    # or, checking the model's process group: relaxcc.hooks.register(model, state)

Each state runs its primitive on the relaxcc communicator of its process
group (whose backend must be "relaxcc": another one raises InvalidArgument,
naming it), and keeps per DDP bucket the error-feedback residuals and the RNG
position. ``state_dict()`` / ``load_state_dict()`` save and restore them, so a
checkpoint (model, optimizer and hook state) resumes bit for bit.

- CompressedAllreduce: min-max quantization (8, 4, 2 or 1 bits; or f16, bf16,
  sign) with worker- and server-side error feedback
  (relaxcc/relaxed/compressed_allreduce.h).
- AutoCodec: the codec the auto codec's cost model picks per bucket size,
  calibrated on the group at construction (relaxcc/relaxed/auto_codec.h).
- TopK, RandomK: sparse allreduce with error feedback
  (relaxcc/relaxed/sparse_allreduce.h).
- Cocktail: CocktailSGD's composite codec (random-k, top-k, min-max) with
  error feedback, its payloads all-gathered (relaxcc/kernels/compressor.h).

The bucket is averaged (divided by the group size, then summed), as DDP's
default allreduce does; the gradients must be float32 on the CPU.

State and bucket layout: register() lets the state key each bucket's residuals
by the parameters it holds, in the model's order, so a resumed run (whose
first iteration uses DDP's initial layout, and later ones its rebuilt layout)
finds them whatever order DDP puts them in. A bucket whose set of parameters
changes in DDP's rebuild starts with fresh residuals (one bucket: never).
"""
import zlib

import torch
import torch.distributed as dist

from . import _C
from ._C import InvalidArgument, ProcessGroupRelaxcc

__all__ = ["CompressedAllreduce", "AutoCodec", "TopK", "RandomK", "Cocktail", "hook", "register"]


def _relaxcc_group(process_group):
    group = process_group
    if group is None:
        if not dist.is_initialized():
            raise InvalidArgument("relaxcc hooks: torch.distributed is not initialized")
        group = dist.distributed_c10d._get_default_group()
    if not isinstance(group, ProcessGroupRelaxcc):
        raise InvalidArgument(
            "relaxcc hooks run on a process group whose backend is 'relaxcc'; this one's is "
            f"'{dist.get_backend(group)}'")
    return group


class _HookState:
    def __init__(self, process_group, impl):
        self.process_group = process_group
        self._impl = impl

    def state_dict(self):
        """The residuals and RNG positions of every bucket (a dict of bytes)."""
        return {"relaxcc_hook": type(self).__name__, "state": self._impl.state_dict()}

    def load_state_dict(self, state):
        if state.get("relaxcc_hook") != type(self).__name__:
            raise InvalidArgument(f"relaxcc hooks: a state of {state.get('relaxcc_hook')!r} "
                                  f"loaded into {type(self).__name__}")
        self._impl.load_state_dict(state["state"])

    _param_index = None  # id(parameter) -> registration index; set by register()

    def _allreduce(self, bucket):
        # The primitive runs on the bucket's gradients in the model's
        # registration order, keyed by which parameters they are, so its
        # residuals do not depend on DDP's bucket layout (which a rebuild
        # after the first iteration reorders). Without register(), the
        # bucket's own order and index.
        buffer = bucket.buffer()
        grads = bucket.gradients()
        if self._param_index is None:
            order, key = list(range(len(grads))), (bucket.index(),)
        else:
            where = [self._param_index[id(p)] for p in bucket.parameters()]
            order = sorted(range(len(grads)), key=lambda i: where[i])
            key = tuple(where[i] for i in order)
        flat = torch.cat([grads[i].reshape(-1) for i in order])
        flat.div_(self.process_group.size())
        work = self._impl.allreduce(zlib.crc32(repr(key).encode()), flat)

        def done(fut):
            out = fut.value()[0]
            offset = 0
            for i in order:
                g = grads[i]
                g.copy_(out[offset:offset + g.numel()].view_as(g))
                offset += g.numel()
            return buffer
        # A DDP hook's future must hold a Python object: then() makes one.
        return work.get_future().then(done)


class CompressedAllreduce(_HookState):
    """Compressed allreduce with worker- and server-side error feedback.

    codec: "minmax" (with `bits` 8, 4, 2 or 1), "f16", "bf16" or "sign";
    chunk: elements per quantization chunk; rounding: "nearest" or
    "stochastic" (Philox streams from `seed`, the position saved with the
    state); segment_bytes: f32 bytes per pipeline segment.
    """

    def __init__(self, process_group=None, bits=8, codec="minmax", chunk=2048,
                 rounding="nearest", segment_bytes=1 << 20, seed=0):
        if codec == "minmax":
            if bits not in (8, 4, 2, 1):
                raise InvalidArgument(f"relaxcc hooks: bits={bits}; expected 8, 4, 2 or 1")
            codec = f"minmax{bits}"
        group = _relaxcc_group(process_group)
        super().__init__(group, _C.CompressedHook(group, codec, chunk, rounding, segment_bytes,
                                                  seed))


class AutoCodec(_HookState):
    """The auto codec: per bucket, the codec predicted fastest (or the plain
    allreduce), with error feedback. Calibrates at construction, collectively
    over the group (link_bytes, codec_bytes, repetitions: the timed sizes);
    force: "auto", "f32" or a codec name ("minmax8", "f16", ...)."""

    def __init__(self, process_group=None, force="auto", margin=0.8, link_bytes=32 << 20,
                 codec_bytes=16 << 20, repetitions=3, segment_bytes=1 << 20):
        group = _relaxcc_group(process_group)
        super().__init__(group, _C.CompressedHook.auto(group, force, margin, link_bytes,
                                                       codec_bytes, repetitions, segment_bytes))


class TopK(_HookState):
    """Top-k sparse allreduce (a `ratio` of each bucket, or `keep` elements)
    with worker- and server-side error feedback."""

    def __init__(self, process_group=None, ratio=0.01, keep=0, approximate=True):
        group = _relaxcc_group(process_group)
        super().__init__(group, _C.SparseHook(group, "topk", ratio, keep, approximate, 0))


class RandomK(_HookState):
    """Random-k sparse allreduce (the same `ratio` of coordinates on every
    rank, drawn from `seed` and the bucket's step) with error feedback."""

    def __init__(self, process_group=None, ratio=0.01, keep=0, seed=0):
        group = _relaxcc_group(process_group)
        super().__init__(group, _C.SparseHook(group, "randomk", ratio, keep, False, seed))


class Cocktail(_HookState):
    """CocktailSGD's composite on gradients: random-k (CocktailSGD's rolling
    stride round(1 / random_ratio), the same coordinates on every rank), then
    the top `topk_ratio` of those, then min-max quantization of the kept
    values (`bits`, `chunk`), with worker-side error feedback; the payloads
    are all-gathered and every rank sums them alike. Defaults: CocktailSGD's
    (relaxcc/algorithms/cocktail_sgd.h)."""

    def __init__(self, process_group=None, random_ratio=0.5, topk_ratio=0.5, bits=8, chunk=128,
                 seed=0):
        group = _relaxcc_group(process_group)
        super().__init__(group, _C.SparseHook(group, "cocktail", random_ratio, 0, True, seed,
                                              topk_ratio, bits, chunk))


def hook(state, bucket):
    """The DDP comm hook of every state above: model.register_comm_hook(state, hook)."""
    return state._allreduce(bucket)


def register(model, state):
    """model.register_comm_hook(state, hook), after checking that the model's
    process group is the state's relaxcc group."""
    group = getattr(model, "process_group", None)
    _relaxcc_group(group)
    if group is not state.process_group:
        raise InvalidArgument("relaxcc hooks: the state was made for another process group "
                              "than the model's")
    state._param_index = {id(p): i for i, p in enumerate(model.parameters())}
    model.register_comm_hook(state, hook)
    return state
