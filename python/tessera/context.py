"""``tessera.context``: MindSpore's older ``mindspore.context`` module, for scripts written as
``from mindspore import context; context.set_context(mode=context.GRAPH_MODE)`` or
``from mindspore.context import ParallelMode``: the same functions and names as ``tessera``'s
own (see ``tessera._context``)."""

from ._context import (GRAPH_MODE, PYNATIVE_MODE, ParallelMode, get_auto_parallel_context,
                       reset_auto_parallel_context, set_auto_parallel_context, set_context)

__all__ = ["GRAPH_MODE", "PYNATIVE_MODE", "ParallelMode", "get_auto_parallel_context",
           "reset_auto_parallel_context", "set_auto_parallel_context", "set_context"]
