"""``shard``: MindSpore's ``Cell.shard`` and the functional ``shard(fn, in_strategy,
out_strategy=None, parameter_plan=None)`` for networks traced in GRAPH mode.

The strategies given fix the splits of a Cell's (or function's) inputs and of the parameters
named in ``parameter_plan``; while ``construct`` is traced they become anchors, and
``Model.train`` asks the engine for the strategy of every op that reads an anchored value
(the cheapest under the cost model that splits it so: ``search::anchored_strategies``). Those
ops run with them (an explicit ``Primitive.shard`` wins); the rest of the network follows the
run's mode — propagated from them under ``AutoParallel(net, "sharding_propagation")``, as
MindSpore requires, or data parallel under ``semi_auto``. A ``Layout`` stands for its split per
dim. ``out_strategy`` brings each output to its entry (``parallel.function.reshard``)."""

from .. import _trace


def _split(what, strategy, ndim):
    """One entry of ``in_strategy`` (a tuple of split factors or a ``Layout``) as splits per dim;
    ``None`` leaves the input free."""
    from ._layout import Layout
    if strategy is None:
        return None
    if isinstance(strategy, Layout):
        if strategy._tensor_map is None:
            raise ValueError(f"{what}: the Layout has no tensor map (layout('dp', 'None'))")
        sizes = dict(zip(strategy._alias_name, strategy._device_shape))
        split = []
        for entry in strategy._tensor_map:
            names = [entry] if isinstance(entry, str) else list(entry)
            factor = 1
            for name in names:
                factor *= 1 if name == "None" else sizes[name]
            split.append(factor)
    elif isinstance(strategy, (tuple, list)) and all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in strategy):
        split = list(strategy)
    else:
        raise TypeError(f"{what}: a strategy is a tuple of positive ints, a Layout or None, got "
                        f"{strategy!r}")
    if len(split) != ndim:
        raise ValueError(f"{what}: strategy {tuple(split)} has {len(split)} dim(s) but the "
                         f"input has {ndim}")
    return split


class ShardSpec:
    """What ``shard`` recorded: the inputs' strategies and the parameter plan."""

    def __init__(self, owner, in_strategy, out_strategy, parameter_plan):
        if out_strategy is not None and not isinstance(out_strategy, tuple):
            raise TypeError(f"{owner}.shard: out_strategy must be a tuple (one entry per "
                            f"output), got {type(out_strategy).__name__}")
        if not isinstance(in_strategy, tuple):
            raise TypeError(f"{owner}.shard: in_strategy must be a tuple (one entry per input), "
                            f"got {type(in_strategy).__name__}")
        if parameter_plan is not None and not isinstance(parameter_plan, dict):
            raise TypeError(f"{owner}.shard: parameter_plan must be a dict of parameter name -> "
                            f"strategy, got {type(parameter_plan).__name__}")
        self.owner = owner
        self.in_strategy = in_strategy
        self.out_strategy = out_strategy
        self.parameter_plan = dict(parameter_plan or {})

    def anchor_inputs(self, inputs):
        """Records the anchors of ``inputs`` (traced tensors) in the current trace."""
        trace = _trace.current()
        if len(self.in_strategy) != len(inputs):
            raise ValueError(f"{self.owner}.shard: in_strategy has {len(self.in_strategy)} "
                             f"entries but it is called with {len(inputs)} input(s)")
        for i, (x, strategy) in enumerate(zip(inputs, self.in_strategy)):
            if strategy is None:
                continue
            if not isinstance(x, _trace.Tensor):
                raise TypeError(f"{self.owner}.shard: input {i} is a {type(x).__name__}, not a "
                                "tensor, but in_strategy gives it a strategy")
            split = _split(f"{self.owner}.shard input {i}", strategy, x.ndim)
            trace.anchors.append((x.id, split, f"{self.owner} input {i}"))

    def lay_out(self, result):
        """``result`` (one traced tensor or a tuple of them) with each output brought to its
        ``out_strategy`` entry by ``reshard`` (None leaves it)."""
        if self.out_strategy is None:
            return result
        from .function import reshard
        outputs = result if isinstance(result, tuple) else (result,)
        if len(outputs) != len(self.out_strategy):
            raise ValueError(f"{self.owner}.shard: out_strategy has {len(self.out_strategy)} "
                             f"entries but it returns {len(outputs)} output(s)")
        laid = tuple(x if s is None else reshard(x, s)
                     for x, s in zip(outputs, self.out_strategy))
        return laid if isinstance(result, tuple) else laid[0]

    def anchor_parameters(self, cell):
        """Records the anchors of the parameters ``parameter_plan`` names (by their full name or
        their name within ``cell``) once they are in the trace."""
        trace = _trace.current()
        # The names the whole network's naming gave (get_parameters would rename from here).
        params = {p.name: p for _, c in cell.cells_and_names() for p in c._params.values()}
        for name, strategy in self.parameter_plan.items():
            matches = [p for full, p in params.items()
                       if full == name or full.endswith("." + name)]
            if len(matches) != 1:
                raise ValueError(f"{self.owner}.shard: parameter_plan names {name!r}, which "
                                 f"matches {len(matches)} of its parameters "
                                 f"({', '.join(sorted(params)) or 'none'})")
            p = matches[0]
            trace.param_anchors.append((p, strategy, f"{self.owner} parameter {p.name}"))


def shard(fn, in_strategy, out_strategy=None, parameter_plan=None, device="Ascend", level=0):
    """MindSpore's ``shard(fn, in_strategy, out_strategy=None, parameter_plan=None)``: ``fn`` (a
    Cell, returned after ``fn.shard(...)``, or a function applied in ``construct``, returned
    wrapped) with its inputs' splits fixed (see the module)."""
    from ..nn.cell import Cell
    if isinstance(fn, Cell):
        return fn.shard(in_strategy, out_strategy, parameter_plan, device, level)
    if not callable(fn):
        raise TypeError(f"shard: fn must be a Cell or a function, got {type(fn).__name__}")
    if parameter_plan:
        raise ValueError("shard: parameter_plan applies to a Cell (a function has none)")
    spec = ShardSpec(getattr(fn, "__name__", "function"), in_strategy, out_strategy, None)

    def sharded(*inputs):
        spec.anchor_inputs(inputs)
        return spec.lay_out(fn(*inputs))

    sharded.__name__ = getattr(fn, "__name__", "sharded")
    sharded.__doc__ = fn.__doc__
    return sharded
