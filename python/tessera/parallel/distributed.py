"""``mindspore.parallel.distributed``: ``DistributedDataParallel``, MindSpore's PyNative
data-parallel wrapper for hand-written training steps. Tessera has no PyNative mode and no
hand-written training step (the engine runs every step of ``Model.train``), so the class exists
with MindSpore's signature and raises ``NotImplementedError`` saying what to use instead."""

__all__ = ["DistributedDataParallel"]

_INSTEAD = (
    "DistributedDataParallel: MindSpore's PyNative-mode data-parallel wrapper needs a "
    "hand-written (PyNative) training step, which Tessera does not have: the engine runs every "
    "step of Model.train. For data parallelism train with tessera.train.Model after "
    "tessera.set_auto_parallel_context(parallel_mode='data_parallel', device_num=N), or wrap "
    "the network in tessera.parallel.auto_parallel.AutoParallel (ops without a shard strategy "
    "are data parallel); gradients are all-reduced in buckets by the engine "
    "(AutoParallel.comm_fusion sets the bucket size).")


class DistributedDataParallel:
    """MindSpore's ``DistributedDataParallel(module, init_sync=True, process_group=None,
    bucket_cap_mb=None, find_unused_parameters=False, average_in_collective=False,
    static_graph=False, reducer_mode="CppReducer")``. Constructing one raises
    ``NotImplementedError`` naming what is missing (PyNative hand-written training steps) and
    what to use instead (``Model.train`` with ``parallel_mode="data_parallel"`` or
    ``AutoParallel``)."""

    def __init__(self, module, init_sync=True, process_group=None, bucket_cap_mb=None,
                 find_unused_parameters=False, average_in_collective=False, static_graph=False,
                 reducer_mode="CppReducer"):
        raise NotImplementedError(_INSTEAD)
