"""pytest under mpirun or torchrun: every rank runs the same tests in the
same order. The session starts the default group on the backend "relaxcc"
(under mpirun: a file:// store named after the mpirun job, on the MPI wing;
under torchrun: env://, on the UCX wing) and a gloo group beside it, for
tests that compare with gloo."""
import os
import re
from datetime import timedelta

import pytest
import torch.distributed as dist

import relaxcc


@pytest.fixture(scope="session", autouse=True)
def relaxcc_default_group():
    if not relaxcc.launched_by_mpirun():
        dist.init_process_group("relaxcc", init_method="env://", timeout=timedelta(seconds=60))
        yield dist.distributed_c10d._get_default_group()
        return
    job = re.sub(r"[^A-Za-z0-9]", "_", os.environ.get("PMIX_NAMESPACE", str(os.getppid())))
    path = f"/tmp/relaxcc_pytest_{job}"
    dist.init_process_group("relaxcc", init_method=f"file://{path}",
                            rank=relaxcc.mpi_rank(), world_size=relaxcc.mpi_world_size(),
                            timeout=timedelta(seconds=60))
    yield dist.distributed_c10d._get_default_group()
    if dist.get_rank() == 0:
        try:
            os.remove(path)
        except FileNotFoundError:
            pass


@pytest.fixture(scope="session")
def gloo(relaxcc_default_group):
    return dist.new_group(backend="gloo")
