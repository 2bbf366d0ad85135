"""``mindspore.parallel.function``: ``reshard`` inside ``construct``."""

from .. import _trace

__all__ = ["reshard"]


def reshard(tensor, layout):
    """MindSpore's ``reshard(tensor, layout)`` in GRAPH mode: ``tensor`` brought to ``layout`` (a
    ``Layout`` with its tensor map, or a tuple of split factors) at this point of the network.
    Traced as an identity node (``<cell path>.reshard``, a ``Reshape`` to the same shape) whose
    input and output strategies are ``layout``: the engine moves the value into that layout
    there, and the ops after it read it from there (moving it again if their own strategies ask
    for another)."""
    from ..ops import _check_strategy, _dims
    trace = _trace.require("reshard")
    if not isinstance(tensor, _trace.Tensor):
        raise TypeError(f"reshard: tensor must be a traced tensor, got {type(tensor).__name__}")
    (entry,) = _check_strategy("reshard", (layout,), "layout")
    if _dims(entry) != tensor.ndim:
        raise ValueError(f"Cell {trace.cell()}: reshard: layout {layout!r} has {_dims(entry)} "
                         f"dim(s) but the tensor has shape {tensor.shape}")
    name = trace.node_name(None, "reshard")
    (out,) = trace.add("reshape", name, [tensor], shape=list(tensor.shape))
    trace.strategies[name] = ((entry,), (entry,))
    return out
