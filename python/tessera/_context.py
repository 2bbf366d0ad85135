"""``tessera.set_context``, ``tessera.set_auto_parallel_context`` and ``tessera.set_seed``: what
``Model.train`` reads (device count, parallel mode, determinism, seed)."""

GRAPH_MODE = 0
PYNATIVE_MODE = 1

_STATE = {"device_num": 1, "parallel_mode": "stand_alone", "deterministic": False, "seed": 1,
          # set by tessera.communication.init(): "local" (one process) or "mpi" (one rank of a
          # launched job), the rank and the job's size
          "backend": None, "rank": 0, "group_size": 1}
_PARALLEL_MODES = ("stand_alone", "data_parallel", "semi_auto_parallel")


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
    does not have yet) and ``parallel_mode`` (``"stand_alone"``, ``"data_parallel"`` or
    ``"semi_auto_parallel"``; shard strategies apply in ``semi_auto_parallel`` only)."""
    for key, value in kwargs.items():
        if key == "device_num":
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"set_auto_parallel_context: device_num must be a positive int, "
                                 f"got {value!r}")
            _STATE["device_num"] = value
        elif key == "parallel_mode":
            if value not in _PARALLEL_MODES:
                raise ValueError(f"set_auto_parallel_context: parallel_mode {value!r} is not "
                                 f"supported yet (supported: {', '.join(_PARALLEL_MODES)})")
            _STATE["parallel_mode"] = value
        else:
            raise ValueError(f"set_auto_parallel_context: {key} is not supported yet")


def reset_auto_parallel_context():
    """Back to one device, stand-alone."""
    _STATE.update(device_num=1, parallel_mode="stand_alone")


def set_seed(seed):
    """The seed of the initial values and the shuffles."""
    if not isinstance(seed, int) or seed < 0:
        raise ValueError(f"set_seed: seed must be a non-negative int, got {seed!r}")
    _STATE["seed"] = seed


def get_seed():
    """The seed set by ``set_seed`` (1 by default)."""
    return _STATE["seed"]
