"""``init`` and the rank queries (``mindspore.communication.management``)."""

import atexit
import os
import sys
import traceback

from .. import _context
from .._tessera import mpi_available, mpi_finalize, mpi_init

HCCL_WORLD_COMM_GROUP = "hccl_world_group"
NCCL_WORLD_COMM_GROUP = "nccl_world_group"
_WORLD_GROUPS = (None, HCCL_WORLD_COMM_GROUP, NCCL_WORLD_COMM_GROUP, "world", "mccl_world_group")
_BACKENDS = (None, "hccl", "nccl", "mccl", "mpi")


class GlobalComm:
    """MindSpore's ``GlobalComm``: the world group's name and the backend after ``init``."""

    WORLD_COMM_GROUP = HCCL_WORLD_COMM_GROUP
    BACKEND = "mpi"
    INITED = False


def _launched():
    """Whether a launcher started this process as one rank of an MPI job."""
    return os.environ.get("TESSERA_BACKEND") == "mpi"


def _stop_job_on_uncaught(kind, value, tb):
    """An exception nobody caught on one rank stops the whole job with its traceback: printed
    here, then the process leaves without finalising MPI, and ``mpirun`` ends the other ranks
    (which would otherwise wait for this one in their next collective)."""
    rank = _context._STATE["rank"]
    sys.stderr.write(f"[rank {rank}] uncaught exception; the job stops:\n")
    traceback.print_exception(kind, value, tb)
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(1)


def init(backend_name=None):
    """Joins the job: under ``tessera launch`` this process becomes its rank of the MPI job
    (``backend_name`` is accepted as MindSpore names them and means MPI here); alone, it is
    rank 0 of 1. Calling it again does nothing."""
    if backend_name not in _BACKENDS:
        raise ValueError(f"init: backend_name {backend_name!r} is not one of "
                         f"{', '.join(repr(b) for b in _BACKENDS)}")
    state = _context._STATE
    if state["backend"] is not None:
        return
    if _launched():
        if not mpi_available():
            mpi_init()  # raises, saying how to build a package with MPI
        rank, size = mpi_init()
        expected = os.environ.get("TESSERA_WORLD_SIZE")
        if expected is not None and expected != str(size):
            raise RuntimeError(f"init: TESSERA_WORLD_SIZE={expected} but MPI started {size} "
                               "processes")
        state.update(backend="mpi", rank=rank, group_size=size, device_num=size)
        sys.excepthook = _stop_job_on_uncaught
        atexit.register(mpi_finalize)
    else:
        state.update(backend="local", rank=0, group_size=1)
    GlobalComm.INITED = True


def _check_group(group, fn):
    if group not in _WORLD_GROUPS:
        raise ValueError(f"{fn}: group {group!r}: only the world group exists "
                         f"({HCCL_WORLD_COMM_GROUP!r})")


def _inited(fn):
    if _context._STATE["backend"] is None:
        raise RuntimeError(f"{fn}: call tessera.communication.init() first")


def get_rank(group=HCCL_WORLD_COMM_GROUP):
    """This process's rank in the world group (0 alone)."""
    _check_group(group, "get_rank")
    _inited("get_rank")
    return _context._STATE["rank"]


def get_group_size(group=HCCL_WORLD_COMM_GROUP):
    """The processes of the world group (1 alone)."""
    _check_group(group, "get_group_size")
    _inited("get_group_size")
    return _context._STATE["group_size"]


def get_local_rank(group=HCCL_WORLD_COMM_GROUP):
    """This process's index on its machine (``TESSERA_LOCAL_RANK``; 0 alone)."""
    _check_group(group, "get_local_rank")
    _inited("get_local_rank")
    return int(os.environ.get("TESSERA_LOCAL_RANK", "0")) if _launched() else 0


def get_local_rank_size(group=HCCL_WORLD_COMM_GROUP):
    """The processes of this job on this machine (as the MPI launcher says; 1 alone)."""
    _check_group(group, "get_local_rank_size")
    _inited("get_local_rank_size")
    if not _launched():
        return 1
    for var in ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"):
        if var in os.environ:
            return int(os.environ[var])
    return _context._STATE["group_size"]


def release():
    """Leaves the job: MPI is finalised (once no training holds it)."""
    if _context._STATE["backend"] == "mpi":
        mpi_finalize()
    _context._STATE.update(backend=None, rank=0, group_size=1)
    GlobalComm.INITED = False
