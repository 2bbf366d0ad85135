"""``tessera.set_context``, ``tessera.set_auto_parallel_context`` and ``tessera.set_seed``: what
``Model.train`` reads (device count, parallel mode, determinism, seed)."""

from . import _checks

GRAPH_MODE = 0
PYNATIVE_MODE = 1


class ParallelMode:
    """MindSpore's ``ParallelMode``: the names ``set_auto_parallel_context(parallel_mode=...)``
    takes (``ParallelMode.DATA_PARALLEL`` is ``"data_parallel"``). ``AUTO_PARALLEL`` and
    ``HYBRID_PARALLEL`` are named for scripts that test for them; the context refuses them
    (wrap the network in ``AutoParallel(net, "sharding_propagation")`` instead)."""

    STAND_ALONE = "stand_alone"
    DATA_PARALLEL = "data_parallel"
    HYBRID_PARALLEL = "hybrid_parallel"
    SEMI_AUTO_PARALLEL = "semi_auto_parallel"
    AUTO_PARALLEL = "auto_parallel"
    MODE_LIST = [STAND_ALONE, DATA_PARALLEL, HYBRID_PARALLEL, SEMI_AUTO_PARALLEL, AUTO_PARALLEL]

_STATE = {"device_num": 1, "parallel_mode": "stand_alone", "deterministic": False, "seed": 1,
          # set_auto_parallel_context(gradients_mean=...); None: the engine's default (the mean)
          "gradients_mean": None,
          # set by tessera.communication.init(): "local" (one process) or "mpi" (one rank of a
          # launched job), the rank and the job's size
          "backend": None, "rank": 0, "group_size": 1}
_PARALLEL_MODES = ("stand_alone", "data_parallel", "semi_auto_parallel")
_MAX_INT = 2**63 - 1  # the largest count or seed the engine takes (a signed 64-bit int)


def set_context(**kwargs):
    """MindSpore's ``set_context``; this slice takes ``mode=GRAPH_MODE`` (the only mode),
    ``device_target="CPU"`` and ``deterministic="ON"/"OFF"`` (every sum in a canonical order,
    so a run on any number of devices is bitwise one device's)."""
    for key, value in kwargs.items():
        if key == "mode":
            if value != GRAPH_MODE:
                raise ValueError("set_context: only mode=GRAPH_MODE is supported (construct is "
                                 "traced once)")
        elif key == "device_target":
            if value != "CPU":
                raise ValueError(f"set_context: device_target {value!r}: Tessera runs on CPU")
        elif key == "deterministic":
            if value not in ("ON", "OFF"):
                raise ValueError("set_context: deterministic is 'ON' or 'OFF'")
            _STATE["deterministic"] = value == "ON"
        else:
            raise ValueError(f"set_context: {key} is not supported yet")


def set_auto_parallel_context(**kwargs):
    """MindSpore's ``set_auto_parallel_context``: ``device_num`` (the ranks ``Model.train`` runs,
    as threads of this process — the stand-in for ``tessera launch --nproc N``, which this slice
    does not have yet), ``parallel_mode`` (``"stand_alone"``, ``"data_parallel"`` or
    ``"semi_auto_parallel"``; shard strategies apply in ``semi_auto_parallel`` only: in
    ``data_parallel`` ``Model.train`` warns that they have no effect) and ``gradients_mean``
    (``parallel.gradients_mean``: True, the engine's default when not set, trains with the
    gradient of the mean loss over the global batch, one device's; False sums the replicas'
    gradients, as MindSpore does by default). ``AutoParallel``'s switches override these."""
    for key, value in kwargs.items():
        value = _checks.plain(value)  # a numpy scalar as the Python value it holds
        if key == "device_num":
            # A bool is no count (True was one device), and a count beyond 64 bits reached the
            # engine as a float, in a message naming neither this call nor the value given.
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= _MAX_INT:
                raise ValueError(f"set_auto_parallel_context: device_num must be a positive int "
                                 f"(at most 2**63 - 1), got {value!r}")
            _STATE["device_num"] = value
        elif key == "gradients_mean":
            if not isinstance(value, bool):
                raise ValueError(f"set_auto_parallel_context: gradients_mean must be a bool, got "
                                 f"{value!r}")
            _STATE["gradients_mean"] = value
        elif key == "parallel_mode":
            if value not in _PARALLEL_MODES:
                raise ValueError(f"set_auto_parallel_context: parallel_mode {value!r} is not "
                                 f"supported yet (supported: {', '.join(_PARALLEL_MODES)})")
            _STATE["parallel_mode"] = value
        elif key in _INSTEAD:
            raise ValueError(f"set_auto_parallel_context: {key} is not supported; use "
                             f"{_INSTEAD[key]} instead")
        else:
            raise ValueError(f"set_auto_parallel_context: {key} is not supported yet")


#: MindSpore's context keys for pipelines, optimizer parallelism and batches, and the
#: ``AutoParallel`` switch or wrapper that sets each here (the refusal names it).
_INSTEAD = {
    "pipeline_stages": "AutoParallel(net).pipeline(stages=...) with "
                       "parallel.nn.Pipeline(net, micro_size, stage_config)",
    "pipeline_config": "AutoParallel(net).pipeline(scheduler=..., interleave=...)",
    "pipeline_result_broadcast": "AutoParallel(net).pipeline(output_broadcast=...)",
    "enable_parallel_optimizer": "AutoParallel(net).hsdp(shard_size, threshold, "
                                 "optimizer_level)",
    "parallel_optimizer_config": "AutoParallel(net).hsdp(shard_size, threshold, "
                                 "optimizer_level)",
    "optimizer_weight_shard_size": "AutoParallel(net).hsdp(shard_size=...)",
    "grad_accumulation_step": "parallel.nn.GradAccumulation(net, micro_size)",
    "full_batch": "AutoParallel(net).dataset_strategy('full_batch')",
    "dataset_strategy": "AutoParallel(net).dataset_strategy(...)",
}


#: The keys ``set_auto_parallel_context`` takes, which ``get_auto_parallel_context`` reads.
_AUTO_PARALLEL_KEYS = ("device_num", "gradients_mean", "parallel_mode")


def get_auto_parallel_context(attr_key):
    """MindSpore's ``get_auto_parallel_context(attr_key)``: the value ``set_auto_parallel_context``
    set for ``attr_key`` (``"device_num"``, ``"gradients_mean"``, ``"parallel_mode"``), else
    its default: ``1`` (under ``tessera launch``, the job's rank count, which ``Model.train``
    runs), ``"stand_alone"``, and for ``gradients_mean`` ``True``, what the engine then does (the
    gradient of the mean loss; MindSpore's default is ``False``, its sum over replicas, so
    setting back what this returns keeps the run as it is). Any other key is a ``ValueError``
    naming it, as in MindSpore."""
    if not isinstance(attr_key, str):
        raise TypeError(f"get_auto_parallel_context: attr_key must be a str, got "
                        f"{type(attr_key).__name__}")
    if attr_key not in _AUTO_PARALLEL_KEYS:
        raise ValueError(f"get_auto_parallel_context: {attr_key!r} is not a key of the auto "
                         f"parallel context (supported: {', '.join(_AUTO_PARALLEL_KEYS)})")
    if attr_key == "gradients_mean":
        return True if _STATE["gradients_mean"] is None else _STATE["gradients_mean"]
    if attr_key == "device_num" and _STATE["backend"] == "mpi" and _STATE["device_num"] == 1:
        return _STATE["group_size"]
    return _STATE[attr_key]


def reset_auto_parallel_context():
    """Back to one device, stand-alone."""
    _STATE.update(device_num=1, parallel_mode="stand_alone", gradients_mean=None)


def set_seed(seed):
    """The seed of the initial values and the shuffles."""
    # The engine takes a signed 64-bit seed: a larger one was refused only when Model.train
    # started, in a message naming no setting; a bool was refused there too.
    seed = _checks.plain(seed)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= _MAX_INT:
        raise ValueError(f"set_seed: seed must be a non-negative int (at most 2**63 - 1), got "
                         f"{seed!r}")
    _STATE["seed"] = seed


def get_seed():
    """The seed set by ``set_seed`` (1 by default)."""
    return _STATE["seed"]
