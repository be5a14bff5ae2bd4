"""relaxcc for PyTorch users.

``import relaxcc`` registers the torch.distributed backend "relaxcc":

    import relaxcc, torch.distributed as dist
    dist.init_process_group("relaxcc", init_method="env://")

Processes are started by torchrun (or any launcher that gives torch's
rendezvous a store: ``env://``, ``tcp://``, ``file://``) or by mpirun. The
world communicator runs on one of relaxcc's two transports ("wings"):

- under an MPI launcher (mpirun; Open MPI's, PMIx's or PMI's variables set,
  as relaxcc's LaunchEnvironment reads them): the MPI wing, over
  MPI_COMM_WORLD;
- otherwise: the UCX wing, which exchanges its worker addresses through the
  c10d store that torch hands the backend, with torch's rank and world size.

``RELAXCC_PYTHON_WING=mpi`` or ``ucx`` overrides the choice (``ucx`` under
mpirun works too). Under mpirun with ``env://``, RANK, WORLD_SIZE and
LOCAL_RANK default to the launcher's rank, size and local rank; MASTER_ADDR and
MASTER_PORT are torch's, as always. ``tcp://`` and ``file://`` need
``rank`` and ``world_size`` (torch's rendezvous reads them from the
arguments): under mpirun, ``relaxcc.mpi_rank()`` and
``relaxcc.mpi_world_size()`` give them.

Errors from relaxcc are Python exceptions with relaxcc's message:
``relaxcc.Error`` (a RuntimeError) and its subclasses ``Timeout``,
``PeerMismatch``, ``CommunicatorPoisoned``, ``InvalidArgument`` (also a
ValueError), ``Unsupported`` (also a NotImplementedError), ...

Comm hooks for torch's DistributedDataParallel are in ``relaxcc.hooks``;
every relaxcc algorithm module runs under ``relaxcc.DistributedDataParallel``
with an algorithm of ``relaxcc.algorithms``.
"""
import atexit
import os
from datetime import timedelta

import torch.distributed as dist

from . import _C
from ._C import (CommunicationError, CommunicatorPoisoned, CorruptPayload, DeviceError, Error,
                 InternalError, InvalidArgument, InvalidType, PeerMismatch, ProcessGroupRelaxcc, Timeout,
                 Unsupported)

from . import algorithms  # noqa: E402
from .ddp import DistributedDataParallel  # noqa: E402

BACKEND = "relaxcc"

__all__ = ["BACKEND", "Error", "InvalidArgument", "Unsupported", "CorruptPayload", "InternalError",
           "CommunicationError", "Timeout", "PeerMismatch", "DeviceError", "CommunicatorPoisoned",
           "ProcessGroupRelaxcc", "InvalidType", "DistributedDataParallel", "algorithms", "mpi_rank", "mpi_world_size", "is_relaxcc_group",
           "launched_by_mpirun", "wing"]


def _mpi_launch(what):
    launch = _C.launch_environment()
    if launch["launcher"] != "mpi" or launch[what] < 0:
        raise RuntimeError(f"relaxcc: not started by mpirun (no {what} from an MPI launcher; "
                           f"launcher: {launch['launcher']})")
    return launch[what]


def mpi_rank():
    """This process's rank in mpirun's job (relaxcc's LaunchEnvironment)."""
    return _mpi_launch("rank")


def mpi_world_size():
    """The number of processes mpirun started (relaxcc's LaunchEnvironment)."""
    return _mpi_launch("size")


def is_relaxcc_group(group=None):
    """Whether `group` (None: the default group) is a relaxcc process group."""
    if group is None:
        if not dist.is_initialized():
            return False
        group = dist.distributed_c10d._get_default_group()
    return isinstance(group, ProcessGroupRelaxcc)


def _create_process_group(store, rank, world_size, timeout):
    # c10d's creation callback. The default group (the first one) makes the
    # world communicator; later groups are relaxcc groups of it.
    parent = None
    if dist.is_initialized():
        default = dist.distributed_c10d._get_default_group()
        if not isinstance(default, ProcessGroupRelaxcc):
            raise InvalidArgument(
                "relaxcc: new_group(backend='relaxcc') needs init_process_group('relaxcc') "
                "as the default group (its groups share its communicator)")
        parent = default
    if not isinstance(timeout, timedelta):
        timeout = timedelta(seconds=float(timeout))
    return ProcessGroupRelaxcc.create(store, rank, world_size, timeout, parent, wing=wing(),
                                      store_address=_store_address(store))


def launched_by_mpirun():
    """Whether an MPI launcher started this process (Open MPI's, PMIx's or
    PMI's variables; relaxcc's LaunchEnvironment, as relaxcc-bench asks)."""
    return _C.launch_environment()["launcher"] == "mpi"


def wing():
    """The transport the next world communicator uses: "mpi" or "ucx"
    (RELAXCC_PYTHON_WING, else "mpi" under mpirun and "ucx" otherwise)."""
    return _C.wing()


def _store_address(store):
    # The store, for relaxcc's messages: its type, and where torchrun's or
    # env://'s master lives when the environment says.
    where = ""
    if "MASTER_ADDR" in os.environ:
        where = f" at {os.environ['MASTER_ADDR']}:{os.environ.get('MASTER_PORT', '?')}"
    return f"{type(store).__name__}{where}"


def _default_env_from_mpirun():
    # env:// reads RANK and WORLD_SIZE; under mpirun, the launcher's say the same.
    launch = _C.launch_environment()
    if launch["launcher"] == "mpi" and launch["rank"] >= 0 and launch["size"] >= 1:
        os.environ.setdefault("RANK", str(launch["rank"]))
        os.environ.setdefault("WORLD_SIZE", str(launch["size"]))
        if launch["local_rank"] >= 0:
            os.environ.setdefault("LOCAL_RANK", str(launch["local_rank"]))


_default_env_from_mpirun()
if not hasattr(dist.Backend, BACKEND.upper()):
    dist.Backend.register_backend(BACKEND, _create_process_group)


def _release_at_exit():
    # relaxcc finalizes MPI in a C atexit handler, which runs after Python's:
    # the communicators (held by the process groups) must be gone by then.
    if is_relaxcc_group():
        dist.destroy_process_group()
    import gc
    gc.collect()


atexit.register(_release_at_exit)
