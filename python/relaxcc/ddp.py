"""relaxcc.DistributedDataParallel: relaxcc::torch::DistributedDataParallel
(any relaxcc algorithm module) over a Python model and optimizer::

    ddp = relaxcc.DistributedDataParallel(model, optimizer,
                                          algorithm=relaxcc.algorithms.DiLoCo(inner_steps=500))
    loss = loss_fn(ddp(x), y)
    loss.backward()
    ddp.step()            # in place of optimizer.step()

Construction is collective: models that differ across ranks raise
PeerMismatch on every rank. The communicator is the process group's
(`process_group`, else the default group when its backend is "relaxcc"),
or else one created over mpirun's world.
"""
import contextlib
import os
import tempfile

import torch
import torch.distributed as dist

from . import _C
from .algorithms import Algorithm, GradientAllreduce

__all__ = ["DistributedDataParallel"]


class DistributedDataParallel(torch.nn.Module):
    """Wraps `module` and its `optimizer` (which must hold the module's
    parameters: float32, contiguous, on the CPU). Options (relaxcc::torch::
    DdpOptions): broadcast_buffers, check_uneven_inputs, and the Reducer's as
    a dict, reducer={"plan": {"cap_bytes": ...}, "timeout": timedelta(...)}.
    """

    def __init__(self, module, optimizer, algorithm=None, *, process_group=None, **options):
        super().__init__()
        if algorithm is None:
            algorithm = GradientAllreduce()
        if not isinstance(algorithm, Algorithm):
            raise TypeError("relaxcc.DistributedDataParallel: algorithm must be one of "
                            f"relaxcc.algorithms, got {type(algorithm).__name__}")
        if process_group is None and dist.is_initialized():
            default = dist.distributed_c10d._get_default_group()
            if isinstance(default, _C.ProcessGroupRelaxcc):
                process_group = default
        self.module = module
        self.optimizer = optimizer
        self.algorithm = algorithm
        self._ddp = _C.DistributedDataParallel(
            process_group, list(module.named_parameters()), list(module.named_buffers()),
            optimizer, algorithm.module, algorithm.options, options)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def step(self):
        """The optimizer step with the algorithm's hooks (in place of optimizer.step())."""
        self._ddp.step()

    @contextlib.contextmanager
    def no_sync(self):
        """Backward passes inside communicate nothing; gradients accumulate."""
        self._ddp.enter_no_sync()
        try:
            yield
        finally:
            self._ddp.exit_no_sync()

    def finish(self):
        """This rank has no more data (collective with the others' next backward)."""
        self._ddp.finish()

    def with_averaged_model(self, fn):
        """Runs fn() with the ranks' exact average model, then restores this rank's."""
        self._ddp.with_averaged_model(fn)

    @property
    def steps(self):
        return self._ddp.steps

    @property
    def rank(self):
        return self._ddp.rank

    @property
    def world_size(self):
        return self._ddp.world_size

    def state_dict(self, *args, **kwargs):
        """This rank's checkpoint: parameters, buffers, the optimizer's state,
        the algorithm's state, the bucket plan and the step count (bytes, for
        torch.save). Drains the algorithm first."""
        with tempfile.TemporaryDirectory(prefix="relaxcc") as d:
            prefix = os.path.join(d, "checkpoint")
            self._ddp.save(prefix)
            with open(f"{prefix}.rank{self.rank}", "rb") as f:
                data = f.read()
        return {"relaxcc": data, "rank": self.rank, "world_size": self.world_size}

    def load_state_dict(self, state_dict, strict=True):
        """Collective: every rank loads its own state_dict() or none does
        (InvalidArgument on every rank, naming the ranks that could not);
        then the run goes on bit for bit as the saved one would have."""
        if not isinstance(state_dict, dict) or "relaxcc" not in state_dict:
            raise _C.InvalidArgument("relaxcc.DistributedDataParallel.load_state_dict: expected "
                                     "the dict of state_dict(), with key 'relaxcc'")
        with tempfile.TemporaryDirectory(prefix="relaxcc") as d:
            prefix = os.path.join(d, "checkpoint")
            with open(f"{prefix}.rank{self.rank}", "wb") as f:
                f.write(state_dict["relaxcc"])
            self._ddp.load(prefix)
