"""The engine's configuration of one ``Model.train``: the ``[parallel]``, ``[train]`` and
``[output]`` keys of docs/CONFIG.md, gathered from the wrappers around the network
(``AutoParallel``, ``parallel.nn.Pipeline``, ``GradAccumulation``, ``MicroBatchInterleaved``),
the strategies ``shard`` set, the optimizer, the context and the run's directories. The engine
reads it as it reads a config file (``TrainConfig::for_network``), so every value is checked by
the same rules and errors name the same keys."""

import dataclasses
import math

from .. import _checks, _context, nn

# The context's parallel modes as the engine names them.
_CONTEXT_MODES = {"stand_alone": "stand_alone", "data_parallel": "data_parallel",
                  "semi_auto_parallel": "semi_auto"}


@dataclasses.dataclass
class Parts:
    """A network taken apart: its wrappers (each ``None`` when absent) and the loss cell inside
    them (``loss_cell``, whose ``construct`` takes the dataset's columns and returns the loss):
    an ``nn.WithLossCell`` (then also ``with_loss``, whose backbone's output are the logits) or
    a Cell of the user's own (``with_loss`` is ``None``)."""

    top: object
    with_loss: object
    loss_cell: object = None
    auto_parallel: object = None
    pipeline: object = None
    grad_accumulation: object = None
    interleaved: object = None


def unwrap(network, loss_fn=None):
    """The wrappers around ``network`` and the loss cell they hold: an ``nn.WithLossCell``, or
    (MindSpore's ``Model(NetWithLoss(...), optimizer=opt)``) any other Cell, whose
    ``construct`` takes the dataset's columns positionally and returns the scalar loss; a
    ``TypeError`` naming what was found instead of a Cell. With ``loss_fn`` (``Model``'s), the
    loss goes around the network inside an ``AutoParallel`` given as the network — MindSpore's
    documented ``Model(AutoParallel(net), loss_fn=loss, optimizer=opt)``, whose parallel
    settings are the job's (MindSpore sets its parallel context from the network given to
    ``Model``) — and around the network itself otherwise. A wrapper inside the loss cell (a
    ``Pipeline``, ``AutoParallel``, … under ``nn.WithLossCell``) would be traced as a plain
    cell and its settings lost: that is a ``TypeError`` naming it."""
    from ..parallel.auto_parallel import AutoParallel
    from ..parallel.nn import GradAccumulation, MicroBatchInterleaved, Pipeline

    parts = Parts(top=network, with_loss=None)
    net = network
    if isinstance(net, AutoParallel):
        parts.auto_parallel, net = net, net.network
        if loss_fn is not None:
            net = nn.WithLossCell(net, loss_fn)
    elif loss_fn is not None:
        net = parts.top = nn.WithLossCell(net, loss_fn)
    slots = ((Pipeline, "pipeline"), (GradAccumulation, "grad_accumulation"),
             (MicroBatchInterleaved, "interleaved"))
    while True:
        slot = next((name for cls, name in slots if isinstance(net, cls)), None)
        if slot is None:
            break
        if getattr(parts, slot) is not None:
            raise TypeError(f"Model: the network is wrapped in {type(net).__name__} twice")
        setattr(parts, slot, net)
        net = net.network
    if isinstance(net, nn.TrainOneStepCell):
        raise TypeError(f"Model: a TrainOneStepCell inside {type(parts.top).__name__} is not "
                        "supported; give it to Model as the network itself "
                        "(Model(TrainOneStepCell(net_with_loss, optimizer)))")
    if not isinstance(net, nn.Cell):
        raise TypeError(f"Model: the network must end in its loss: give loss_fn, or wrap it in "
                        f"nn.WithLossCell (inside AutoParallel and Pipeline), or give a Cell "
                        f"whose construct returns its loss; found a {type(net).__name__}")
    wrappers = (AutoParallel, Pipeline, GradAccumulation, MicroBatchInterleaved)
    parts.loss_cell = net
    if isinstance(net, nn.WithLossCell):
        parts.with_loss = net
        _refuse_wrappers_inside([("the backbone", net._backbone)], wrappers,
                                "nn.WithLossCell(net, loss_fn)")
    else:
        _refuse_wrappers_inside([(f"the cell {name!r}", child)
                                 for name, child in net.name_cells().items()], wrappers,
                                f"{type(net).__name__}(...)")
    return parts


def _refuse_wrappers_inside(roots, wrappers, loss_cell):
    """A ``TypeError`` naming the first of ``wrappers`` found in the trees of ``roots``
    (``[(what, cell)]``, each cell included): its settings apply only around the loss cell
    (``loss_cell`` says how it is made, for the advice)."""
    stack = list(roots)
    while stack:
        where, cell = stack.pop()
        if isinstance(cell, wrappers):
            kind = type(cell).__name__
            raise TypeError(
                f"Model: {where} of the loss cell is a {kind}, whose settings apply only around "
                f"the loss: give {kind}({loss_cell}) to Model (without "
                f"loss_fn){', or Model(AutoParallel(net), loss_fn, optimizer)' if kind == 'AutoParallel' else ''}")
        stack.extend((f"{where}'s cell {name!r}", child)
                     for name, child in cell.name_cells().items())


def batch_sizes(parts, batch, devices):
    """``(step batch, micro-batch)`` of a dataset batch of ``batch`` samples: the step batch is
    one micro-step's share of it when ``GradAccumulation`` (or, on one device, ``Pipeline`` and
    ``MicroBatchInterleaved``) cuts it into accumulated micro-steps (the engine's
    ``data.batch_size``, which the pipeline's micro-batches and the interleaved parts cut in
    turn on several devices); the micro-batch is what the traced graph takes. Every cut must
    divide."""
    step, micro = batch, batch
    cuts = []
    if parts.grad_accumulation is not None:
        cuts.append(("GradAccumulation micro_size", parts.grad_accumulation.micro_size, True))
    if parts.pipeline is not None:
        # On one device the micro-batches are accumulated as the stages would (one update).
        cuts.append(("Pipeline micro_size", parts.pipeline.micro_size, devices == 1))
    if parts.interleaved is not None:
        # On one device the interleaved parts are accumulated, as several devices add them in
        # deterministic mode (docs/DETERMINISM.md): the same bits.
        cuts.append(("MicroBatchInterleaved interleave_num", parts.interleaved.interleave_num,
                     devices == 1))
    for what, n, cuts_step in cuts:
        if micro % n:
            raise ValueError(f"Model.train: {what} = {n} does not divide the batch of {micro} "
                             f"samples (dataset batch {batch}); every micro-batch is an equal "
                             "share")
        micro //= n
        if cuts_step:
            step //= n
    return step, micro


def devices_per_stage(parts, devices):
    """The devices of one pipeline stage (all of them without stages)."""
    auto = parts.auto_parallel
    stages = (auto._pipeline or {}).get("stages", 1) if auto is not None else 1
    return max(devices // stages, 1)


#: The integers a configuration value may hold: the engine reads TOML integers, which are
#: signed 64-bit.
_I64 = (-2**63, 2**63 - 1)


def check_values(config, where=""):
    """``config`` (the dict ``engine_config`` builds, after the run's recipe is merged) as the
    engine can read it, returned: a numpy scalar anywhere in it (``np.int64``, ``np.float32``,
    ``np.bool_``, which JSON cannot hold) becomes the Python int, float or bool of its value
    (tuples become lists), and then every number is checked: an int outside the signed 64-bit
    range (it reached the engine as a float, or as "u64 value was too large" naming nothing)
    or a float that is NaN or infinite (JSON has neither) is a ``ValueError`` naming the engine
    key (``where``, e.g. ``parallel.hsdp.threshold``; a list item as ``key[i]``) and the
    value."""
    config = _checks.plain(config)
    if isinstance(config, dict):
        for k, v in config.items():
            config[k] = check_values(v, f"{where}.{k}" if where else str(k))
    elif isinstance(config, (list, tuple)):
        config = [check_values(v, f"{where}[{i}]") for i, v in enumerate(config)]
    elif isinstance(config, bool):
        pass
    elif isinstance(config, int):
        if not _I64[0] <= config <= _I64[1]:
            raise ValueError(f"Model.train: the setting {where} = {config} is outside the "
                             "engine's integers (-2**63 .. 2**63 - 1); give a smaller value to "
                             "the argument that sets it")
    elif isinstance(config, float) and not math.isfinite(config):
        raise ValueError(f"Model.train: the setting {where} = {config} is not a finite number")
    return config


def _strip_none(value):
    """``value`` without ``None`` entries (TOML has no null)."""
    if isinstance(value, dict):
        return {k: _strip_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)):
        return [_strip_none(v) for v in value]
    return value


def _layout_value(layout):
    """A ``Layout`` with its tensor map as the engine's layout item list, and its mesh."""
    entries = layout._tensor_map
    if entries is None:
        raise ValueError(f"{layout!r} has no tensor map: call it with one entry per dim "
                         "(layout('dp', 'None'))")
    mesh = {"device_matrix": list(layout._device_shape), "alias_name": list(layout._alias_name)}
    return entries, mesh


class _Mesh:
    """The one device matrix every ``Layout`` of a run shares (``parallel.mesh``)."""

    def __init__(self):
        self.mesh = None

    def take(self, what, layout):
        entries, mesh = _layout_value(layout)
        if layout._rank_list is not None:
            raise ValueError(f"{what}: a Layout with rank_list is not supported in strategies")
        if self.mesh is None:
            self.mesh = mesh
        elif self.mesh != mesh:
            raise ValueError(f"{what}: its Layout's device matrix {mesh} differs from another "
                             f"Layout's {self.mesh}; every Layout of a network shares one")
        return entries


def _strategy(what, strategy, mesh):
    """One op's strategy (tuples or Layouts, one per operand) as the engine's value."""
    from ..parallel._layout import Layout
    out = []
    for item in strategy:
        if isinstance(item, Layout):
            out.append(mesh.take(what, item))
        else:
            out.append(list(item))
    return out


def engine_config(parts, optimizer, strategies, *, epochs, output_dir, resume_from, devices,
                  deferred_init, node_names=None):
    """The ``{"parallel", "train", "output"}`` document of one run (see the module);
    ``node_names``: the traced graph's (a ``Pipeline``'s stage of a cell without ops is left
    out)."""
    state = _context._STATE
    auto = parts.auto_parallel
    mesh = _Mesh()
    parallel = {"devices": devices}
    train = {}
    output = {"dir": str(output_dir)}
    if auto is not None:
        for section, table in (("parallel", parallel), ("train", train), ("output", output)):
            for key, value in auto._keys[section].items():
                table[key] = value
        parallel["mode"] = auto._parallel_mode
    else:
        parallel["mode"] = _CONTEXT_MODES[state["parallel_mode"]]
        if state.get("gradients_mean") is not None:
            parallel["gradients_mean"] = state["gradients_mean"]
    if devices == 1:
        # One device: what needs several (stages, sharded optimizer, strategies) has nothing
        # to act on; the numbers are one device's, as MindSpore's stand-alone run ignores them.
        parallel = {"mode": "stand_alone", "devices": 1}
    else:
        if strategies and parallel["mode"] != "data_parallel":
            shard, out_shard = {}, {}
            for name, (ins, outs) in strategies.items():
                shard[name] = _strategy(f"{name} in_strategy", ins, mesh)
                if outs is not None:
                    out_shard[name] = _strategy(f"{name} out_strategy", outs, mesh)
            parallel["shard"] = shard
            if out_shard:
                parallel["out_shard"] = out_shard
        ds = parallel.get("dataset_strategy")
        if isinstance(ds, list) and ds and not isinstance(ds[0], list):
            parallel["dataset_strategy"] = [mesh.take("dataset_strategy", item) for item in ds]
        pipeline = _pipeline_table(parts, node_names)
        if pipeline is not None:
            parallel["pipeline"] = pipeline
        if parts.interleaved is not None:
            parallel["micro_batch_interleave"] = parts.interleaved.interleave_num
        if mesh.mesh is not None:
            parallel["mesh"] = mesh.mesh
    if auto is not None and getattr(auto, "_device_local_norm", False) \
            and not train.get("dump_local_norm"):
        raise ValueError("AutoParallel.enable_device_local_norm: the device norms are written "
                         "into the dump_local_norm files; call dump_local_norm(path) too")
    accumulate = parts.grad_accumulation.micro_size if parts.grad_accumulation else 1
    if devices == 1 and parts.pipeline is not None:
        accumulate *= parts.pipeline.micro_size
    if devices == 1 and parts.interleaved is not None:
        accumulate *= parts.interleaved.interleave_num
    if accumulate > 1:
        train["grad_accumulation_steps"] = accumulate
    train.update(_optimizer_keys(optimizer))
    train.update(epochs=epochs, seed=state["seed"], deterministic=state["deterministic"])
    if deferred_init:
        train["lazy_init"] = True
    cells = (parts.top, parts.auto_parallel, parts.pipeline, parts.loss_cell,
             parts.with_loss._backbone if parts.with_loss is not None else None)
    if any(getattr(cell, "_parameter_broadcast", False) for cell in cells if cell is not None):
        train["parameter_broadcast"] = True
    if resume_from is not None:
        output["resume_from"] = str(resume_from)
    return _strip_none({"parallel": parallel, "train": train, "output": output})


def _pipeline_table(parts, node_names=None):
    """``[parallel.pipeline]`` from ``AutoParallel.pipeline`` and the ``Pipeline`` wrapper."""
    auto = parts.auto_parallel
    switch = auto._pipeline if auto is not None else None
    if parts.pipeline is None and switch is None:
        return None
    if parts.pipeline is None:
        staged = [name for name, cell in parts.loss_cell.cells_and_names()
                  if name and cell.pipeline_stage >= 0]
        if staged:
            raise ValueError(f"Model.train: the cell {staged[0]!r} has a pipeline_stage, which "
                             "Tessera reads from a Pipeline(network, micro_size) around the "
                             "network (MindSpore's PipelineCell); wrap it in one")
    table = dict(switch or {"stages": 1})
    if parts.pipeline is not None:
        table["micro_batches"] = parts.pipeline.micro_size
        stage_config = parts.pipeline._engine_stage_config(node_names)
        if stage_config:
            table["stage_config"] = stage_config
    # The defaults are left to the engine, which warns about each key given that has no
    # effect (with one stage, every key but micro_batches): only what the user changed is given.
    for key, default in (("interleave", False), ("output_broadcast", False),
                         ("scheduler", "1f1b")):
        if table.get(key) == default:
            del table[key]
    return table


def _optimizer_keys(optimizer):
    """The optimizer's ``[train]`` keys (its rule by the engine's name, and hyperparameters)."""
    return dict(optimizer._engine_args())
