"""``mindspore.parallel.nn``: the wrappers that say how a network is cut into micro-batches and
pipeline stages — ``Pipeline``, ``PipelineGradReducer``, ``GradAccumulation``,
``MicroBatchInterleaved``. Each wraps a Cell ending in its loss; ``tessera.train.Model`` reads
them when it builds the engine's configuration."""

from .. import _checks
from ..nn.cell import Cell

__all__ = ["GradAccumulation", "MicroBatchInterleaved", "Pipeline", "PipelineGradReducer"]


def _positive_int(cls, name, value):
    value = _checks.plain(value)  # a numpy int as its value
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{cls}: {name} must be an int, but got {type(value).__name__}")
    if value <= 0:
        raise ValueError(f"{cls}: {name} must be > 0, but got {value}")
    return value


class _Wrapper(Cell):
    """A Cell around ``network`` that adds no name prefix and computes what it computes."""

    def __init__(self, network):
        super().__init__(auto_prefix=False)
        if not isinstance(network, Cell):
            raise TypeError(f"{type(self).__name__}: network must be a Cell, but got "
                            f"{type(network).__name__}")
        self.network = network

    def construct(self, *inputs):
        return self.network(*inputs)


class Pipeline(_Wrapper):
    """MindSpore's ``Pipeline(network, micro_size, stage_config=None, segment_config=None)``:
    each step's batch is
    cut into ``micro_size`` micro-batches (``parallel.pipeline.micro_batches``), and
    ``stage_config`` maps cell names, as ``network.cells_and_names()`` gives them
    (``"_backbone.layer1"``), to their stage — at any depth, a loss cell of one's own's
    ``"net.fc1"`` too — as does a cell's ``pipeline_stage`` attribute; a cell neither names
    runs on the stage of the cell before it. The stage count is
    ``AutoParallel.pipeline(stages=...)``."""

    def __init__(self, network, micro_size, stage_config=None, segment_config=None):
        super().__init__(network)
        if segment_config is not None:
            raise ValueError("Pipeline: segment_config (MindSpore's virtual-pipeline segments) is "
                             "not supported; use AutoParallel.pipeline(interleave=True)")
        self.micro_size = _positive_int("Pipeline", "micro_size", micro_size)
        if stage_config is not None and not isinstance(stage_config, dict):
            raise TypeError("Pipeline: stage_config must be a dict of cell name -> stage, but "
                            f"got {type(stage_config).__name__}")
        stage_config = {name: _checks.plain(stage) for name, stage in (stage_config or {}).items()}
        for name, stage in stage_config.items():
            if not isinstance(name, str):
                raise TypeError(f"Pipeline: stage_config key {name!r} is not a str")
            if not isinstance(stage, int) or isinstance(stage, bool) or stage < 0:
                raise ValueError(f"Pipeline: stage_config[{name!r}] = {stage!r}: a stage is an "
                                 "int >= 0")
        self.stage_config = dict(stage_config or {})

    def _engine_stage_config(self, node_names=None):
        """``stage_config`` with each cell name turned into the prefix of its ops' node names
        (the wrappers' own names, such as ``_backbone``, add none). With ``node_names`` (the
        traced graph's), a cell that added no op (it computes nothing, such as
        ``nn.Dropout(p=0)``) is left out with a ``UserWarning`` naming it: nothing of it runs on
        a stage, and as in MindSpore, where a stage colours a cell's ops, its stage has no
        effect (the cells after it take the stage of the cell before them); when no other cell
        is given its stage, that stage would run nothing, a ``ValueError`` naming the cell."""
        import warnings

        self.network._name_tree("")
        paths = {name: cell._path for name, cell in self.network.cells_and_names() if name}
        # MindSpore's `cell.pipeline_stage = k`: an entry for the cell's name.
        stage_config = dict(self.stage_config)
        for name, cell in self.network.cells_and_names():
            if not name or cell.pipeline_stage < 0:
                continue
            given = stage_config.setdefault(name, cell.pipeline_stage)
            if given != cell.pipeline_stage:
                raise ValueError(f"Pipeline: the cell {name!r} has pipeline_stage = "
                                 f"{cell.pipeline_stage} but stage_config[{name!r}] = {given}; "
                                 "give its stage once")
        out, opless = {}, {}
        for name, stage in stage_config.items():
            if name not in paths:
                known = ", ".join(sorted(paths)) or "(none)"
                raise ValueError(f"Pipeline: stage_config names the cell {name!r}, which the "
                                 f"network does not have (its cells: {known})")
            if not paths[name]:
                raise ValueError(f"Pipeline: stage_config names {name!r}, a wrapper that holds "
                                 "every op; name the cells inside it")
            path = paths[name]
            if node_names is not None and not any(
                    n == path or n.startswith(path + ".") for n in node_names):
                opless[name] = stage
                continue
            out[path] = stage
        for name, stage in opless.items():
            if stage not in out.values():
                raise ValueError(f"Pipeline: stage_config[{name!r}] = {stage}: the cell adds no "
                                 "op to the traced network (it computes nothing) and no other "
                                 f"cell is given stage {stage}, so stage {stage} would run "
                                 "nothing; give that stage a cell with ops")
            warnings.warn(f"Pipeline: stage_config[{name!r}] = {stage} has no effect: the cell "
                          "adds no op to the traced network (it computes nothing), so nothing "
                          "of it runs on a stage", UserWarning, stacklevel=4)
        return out


class PipelineGradReducer(Cell):
    """MindSpore's ``PipelineGradReducer(parameters, scale_sense=1.0, opt_shard=None)``: in a
    hand-written training step it sums the micro-batches' gradients across stages. Under
    ``Model.train`` the engine does this itself, so the object is accepted and its parameters
    are checked; calling it is an error (Tessera has no hand-written training step)."""

    def __init__(self, parameters, scale_sense=1.0, opt_shard=None):
        super().__init__()
        object.__setattr__(self, "parameters", list(parameters))
        object.__setattr__(self, "scale_sense", scale_sense)
        object.__setattr__(self, "opt_shard", opt_shard)

    def construct(self, grads):
        raise NotImplementedError(
            "PipelineGradReducer: Tessera has no hand-written training step; Model.train reduces "
            "the pipeline's gradients itself")


class GradAccumulation(_Wrapper):
    """MindSpore's ``GradAccumulation(network, micro_size)``: each step's batch is cut into
    ``micro_size`` micro-batches whose gradients are summed before one update
    (``train.grad_accumulation_steps``)."""

    def __init__(self, network, micro_size):
        super().__init__(network)
        self.micro_size = _positive_int("GradAccumulation", "micro_size", micro_size)


class MicroBatchInterleaved(_Wrapper):
    """MindSpore's ``MicroBatchInterleaved(network, interleave_num=2)``: each batch is cut into
    ``interleave_num`` parts run side by side, so one part's communication overlaps another's
    computation (``parallel.micro_batch_interleave``); on one device the parts are accumulated
    (one update), which several devices' deterministic run matches bit for bit."""

    def __init__(self, network, interleave_num=2):
        super().__init__(network)
        self.interleave_num = _positive_int("MicroBatchInterleaved", "interleave_num",
                                            interleave_num)
