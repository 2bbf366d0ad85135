"""``nn.Cell``: the base of every network; names Parameters and primitives after their
attribute path."""

from .. import _trace, ops
from ..common.parameter import Parameter


def _join(prefix, name):
    return f"{prefix}.{name}" if prefix else name


class Cell:
    """MindSpore's ``nn.Cell``: subclass it, set sub-Cells, Parameters and primitives as
    attributes in ``__init__`` and apply them in ``construct``."""

    _single_op = None  # the attribute of a Cell that is one primitive, named by the Cell's path

    def __init__(self, auto_prefix=True, flags=None):
        object.__setattr__(self, "_cells", {})
        object.__setattr__(self, "_params", {})
        object.__setattr__(self, "_prims", {})
        object.__setattr__(self, "_auto_prefix", auto_prefix)
        object.__setattr__(self, "_path", "")

    def __setattr__(self, name, value):
        if "_cells" not in self.__dict__:
            raise AttributeError(f"{type(self).__name__}: call super().__init__() before setting "
                                 "attributes")
        for table in (self._cells, self._params, self._prims):
            table.pop(name, None)
        if isinstance(value, Cell):
            self._cells[name] = value
        elif isinstance(value, Parameter):
            self._params[name] = value
        elif isinstance(value, ops.Primitive):
            self._prims[name] = value
        object.__setattr__(self, name, value)

    @property
    def pipeline_stage(self):
        """MindSpore's ``Cell.pipeline_stage``: the pipeline stage of this Cell's ops (-1, the
        default: none given). Read by ``parallel.nn.Pipeline`` as a ``stage_config`` entry
        for the Cell's name."""
        return self.__dict__.get("_pipeline_stage", -1)

    @pipeline_stage.setter
    def pipeline_stage(self, value):
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError("For 'Cell', the property 'pipeline_stage' must be int type, but got "
                            f"type {type(value).__name__}")
        if value < 0:
            raise ValueError("For 'Cell', the property 'pipeline_stage' can not be less than 0, "
                             f"but got {value}")
        object.__setattr__(self, "_pipeline_stage", value)

    def construct(self, *inputs):
        """The forward computation; subclasses define it."""
        raise NotImplementedError(f"{type(self).__name__} defines no construct")

    def _name_tree(self, prefix=""):
        """Names every Parameter and primitive below this Cell after its attribute path."""
        object.__setattr__(self, "_path", prefix)
        for attr, p in self._params.items():
            if p.name is None or getattr(p, "_auto_named", False):
                p.name = _join(prefix, attr)
                p._auto_named = True
        for attr, prim in self._prims.items():
            prim._name = prefix if (attr == self._single_op and prefix) else _join(prefix, attr)
        for attr, cell in self._cells.items():
            cell._name_tree(_join(prefix, attr) if self._auto_prefix else prefix)

    def cells_and_names(self, cells=None, name_prefix=""):
        """This Cell and every Cell below it with its attribute path."""
        yield name_prefix, self
        for attr, cell in self._cells.items():
            yield from cell.cells_and_names(name_prefix=_join(name_prefix, attr))

    def name_cells(self):
        """The direct sub-Cells by attribute name."""
        return dict(self._cells)

    def _name_params(self, prefix):
        """Names the Parameters (and primitives) below this Cell that have no name yet after
        their attribute path from here; named ones keep theirs (the network's own naming, at trace time, is
        ``_name_tree`` from the top)."""
        for attr, p in self._params.items():
            if p.name is None:
                p.name = _join(prefix, attr)
                p._auto_named = True
        for attr, prim in self._prims.items():
            if prim._name is None:
                prim._name = prefix if (attr == self._single_op and prefix) else _join(prefix, attr)
        for attr, cell in self._cells.items():
            cell._name_params(_join(prefix, attr) if self._auto_prefix else prefix)

    def parameters_and_names(self, name_prefix="", expand=True):
        """Every Parameter below this Cell with its name (a sub-Cell's keep the names the
        whole network gives them)."""
        self._name_params(name_prefix)
        seen = set()
        for _, cell in self.cells_and_names():
            for p in cell._params.values():
                if id(p) not in seen:
                    seen.add(id(p))
                    yield p.name, p

    def get_parameters(self, expand=True):
        """Every Parameter below this Cell."""
        return [p for _, p in self.parameters_and_names()]

    def trainable_params(self, recurse=True):
        """The trainable Parameters (``requires_grad``) below this Cell; ``recurse=False``:
        only this Cell's own (its direct attributes), as in MindSpore."""
        if not isinstance(recurse, bool):
            raise TypeError(f"For 'trainable_params', the type of 'recurse' must be bool, but got "
                            f"{type(recurse).__name__}.")
        params = self.get_parameters()  # names them all, as the whole network does
        if not recurse:
            own = {id(p) for p in self._params.values()}
            params = [p for p in params if id(p) in own]
        return [p for p in params if p.requires_grad]

    def __call__(self, *inputs):
        trace = _trace.current()
        if trace is None:
            raise RuntimeError(f"{type(self).__name__}: Cells run inside Model.train, which traces "
                               "construct once (there is no eager mode yet)")
        trace.cells.append((self._path, type(self).__name__))
        spec = self.__dict__.get("_shard_spec")
        try:
            if spec is None:
                return self.construct(*inputs)
            spec.anchor_inputs(inputs)
            spec.anchor_parameters(self)
            return spec.lay_out(self.construct(*inputs))
        finally:
            trace.cells.pop()

    def shard(self, in_strategy, out_strategy=None, parameter_plan=None, device="Ascend",
              level=0):
        """MindSpore's ``Cell.shard``: fixes the splits of this Cell's inputs (one entry per
        input: a tuple of split factors, a ``Layout`` or None) and of the parameters
        ``parameter_plan`` names; the ops reading them get the engine's cheapest strategy that
        splits them so (see ``tessera.parallel._shard``). Returns the Cell."""
        from ..parallel._shard import ShardSpec
        object.__setattr__(self, "_shard_spec", ShardSpec(
            self._path or type(self).__name__, in_strategy, out_strategy, parameter_plan))
        return self
