"""``mindspore.parallel``'s functions on a network: ``parameter_broadcast`` and
``sync_pipeline_shared_parameters``."""


def parameter_broadcast(net, layout, cur_rank=0, initial_rank=0):
    """MindSpore's ``parameter_broadcast(net, layout, cur_rank=0, initial_rank=0)``: before the
    first step of ``net``'s next ``Model.train`` (after its initialisation or resume), every
    parameter shard is broadcast from the first rank of its replica group, so ranks that loaded
    differing values start equal (the engine's ``train.parameter_broadcast``). The replica
    groups come from the engine's own placement, so ``layout`` (MindSpore's
    ``parameter_layout_dict``) is only checked to be a dict or None; ``initial_rank`` must be 0
    (the first rank of the job)."""
    from ..nn.cell import Cell
    if not isinstance(net, Cell):
        raise TypeError(f"parameter_broadcast: net must be a Cell, got {type(net).__name__}")
    if layout is not None and not isinstance(layout, dict):
        raise TypeError(f"parameter_broadcast: layout must be a dict, got {type(layout).__name__}")
    for name, value in (("cur_rank", cur_rank), ("initial_rank", initial_rank)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"parameter_broadcast: {name} must be an int >= 0, got {value!r}")
    if initial_rank != 0:
        raise ValueError(f"parameter_broadcast: initial_rank={initial_rank}: Tessera broadcasts "
                         "from the first rank of each replica group (initial_rank=0)")
    object.__setattr__(net, "_parameter_broadcast", True)


def sync_pipeline_shared_parameters(net):
    """MindSpore's ``sync_pipeline_shared_parameters(net)``: makes the copies of a parameter
    that several pipeline stages read (a tied embedding) equal. The engine keeps them equal
    itself — one initial value, their gradients summed before every update — so there is
    nothing left to synchronise; ``net`` is checked to be a Cell."""
    from ..nn.cell import Cell
    if not isinstance(net, Cell):
        raise TypeError(f"sync_pipeline_shared_parameters: net must be a Cell, got "
                        f"{type(net).__name__}")
