"""``mindspore.parallel.strategy``: MindSpore's online strategy metadata of a compiled
network (``enable_save_strategy_online``, ``get_strategy_metadata``,
``get_current_strategy_metadata``, ``clear_strategy_metadata``). Tessera compiles no network
into a process-wide graph cache that these could read; each function exists with MindSpore's
signature and raises ``NotImplementedError`` naming what to use instead: the strategy file
``AutoParallel.save_param_strategy_file`` writes after ``Model.train``, read with
``tessera.parallel.build_searched_strategy`` (per parameter) or ``reshard_plan`` /
``layout_slices`` (per rank)."""

__all__ = ["clear_strategy_metadata", "enable_save_strategy_online",
           "get_current_strategy_metadata", "get_strategy_metadata"]

_INSTEAD = (
    "Tessera keeps no online strategy metadata of compiled networks. Save the layouts with "
    "AutoParallel(net).save_param_strategy_file(path) before Model.train, then read the file "
    "with tessera.parallel.build_searched_strategy(path) (each parameter's layout) or "
    "tessera.parallel.reshard_plan(path) (each rank's slices).")


def enable_save_strategy_online():
    """MindSpore's ``enable_save_strategy_online()``: raises ``NotImplementedError`` (see the
    module's doc for what to use instead)."""
    raise NotImplementedError(f"enable_save_strategy_online: {_INSTEAD}")


def clear_strategy_metadata():
    """MindSpore's ``clear_strategy_metadata()``: raises ``NotImplementedError`` (see the
    module's doc for what to use instead)."""
    raise NotImplementedError(f"clear_strategy_metadata: {_INSTEAD}")


def get_strategy_metadata(network, rank_id=None):
    """MindSpore's ``get_strategy_metadata(network, rank_id=None)``: raises
    ``NotImplementedError`` (see the module's doc for what to use instead)."""
    raise NotImplementedError(f"get_strategy_metadata: {_INSTEAD}")


def get_current_strategy_metadata(network):
    """MindSpore's ``get_current_strategy_metadata(network)``: raises
    ``NotImplementedError`` (see the module's doc for what to use instead)."""
    raise NotImplementedError(f"get_current_strategy_metadata: {_INSTEAD}")
