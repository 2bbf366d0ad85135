"""``tessera.communication``: MindSpore's ``mindspore.communication`` — ``init``,
``get_rank``, ``get_group_size``, ``get_local_rank``, ``get_local_rank_size``, ``release``.

Under ``tessera launch --nproc N -- python3 script.py`` (msrun's model: one process per rank)
``init()`` joins the job the launcher started (MPI, started by ``tessera rank-env``, which sets
``TESSERA_BACKEND=mpi``), and from then on ``Model.train`` trains this process's rank of an
``N``-device run. ``python3 script.py`` alone is one device: ``init()`` succeeds with rank 0 of
1. ``get_rank()`` and ``get_group_size()`` are MPI's answers once ``init()`` has run.
"""

from .management import (GlobalComm, HCCL_WORLD_COMM_GROUP, NCCL_WORLD_COMM_GROUP, get_group_size,
                         get_local_rank, get_local_rank_size, get_rank, init, release)

__all__ = ["GlobalComm", "HCCL_WORLD_COMM_GROUP", "NCCL_WORLD_COMM_GROUP", "get_group_size",
           "get_local_rank", "get_local_rank_size", "get_rank", "init", "release"]
