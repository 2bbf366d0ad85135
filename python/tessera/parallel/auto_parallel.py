"""``mindspore.parallel.auto_parallel.AutoParallel``: a network wrapped for parallel training,
with the switches MindSpore 2.10's class has.

Every switch becomes a key of the engine's configuration (the ``[parallel]``, ``[train]`` and
``[output]`` keys of docs/CONFIG.md), which ``tessera.train.Model`` hands to the engine with the
traced network; the engine checks them as it checks a file's, so a value it refuses is an error
naming the key and the rule. Argument types and values are checked here first, with MindSpore's
exception types (``TypeError`` for a wrong type, ``ValueError`` for a wrong value).
"""

import json
import os
import stat

from .. import _checks
from ..nn.cell import Cell

__all__ = ["AutoParallel"]

_MODES = ("semi_auto", "sharding_propagation", "recursive_programming")
_LEVELS = ("level1", "level2", "level3")
_SCHEDULERS = ("1f1b", "gpipe", "zero_bubble", "interleaved_1f1b")
_FUSION_KINDS = ("allreduce", "allgather", "reducescatter")
# transformer_opt keys the engine implements (parallel.overlap), by MindSpore's name and alias.
_OVERLAP_KEYS = {
    "grad_computation_allreduce_overlap": "grad_computation_allreduce_overlap",
    "enable_grad_comm_opt": "grad_computation_allreduce_overlap",
    "computation_allgather_overlap": "computation_allgather_overlap",
    "enable_opt_shard_comm_opt": "computation_allgather_overlap",
}
# transformer_opt keys MindSpore accepts that have no engine counterpart: refused when switched
# on (never silently ignored), accepted when off.
_OTHER_SPEEDUP_KEYS = (
    "recomputation_communication_overlap", "recompute_comm_overlap",
    "grad_matmul_communication_overlap", "matmul_grad_comm_overlap",
    "grad_fa_allgather_overlap", "recompute_allgather_overlap_fagrad",
    "enable_communication_fusion", "enable_task_opt",
    "computation_communication_fusion_level", "compute_communicate_fusion_level",
    "dataset_broadcast_opt_level", "allreduce_and_biasadd_swap", "bias_add_comm_swap",
    "enable_allreduce_slice_to_reducescatter", "enable_interleave_split_concat_branch",
    "enable_interleave_parallel_branch", "interleaved_matmul_comm", "interleaved_layernorm_comm",
    "enable_begin_end_inline_opt", "enable_concat_eliminate_opt",
    "enable_offloading_packed_experts", "enable_flash_attention_load_balance", "pp_1f1b_overlap",
)


def _check_path(method, file_path):
    if not isinstance(file_path, str):
        raise TypeError(f"AutoParallel.{method}: file_path must be a str, but got "
                        f"{type(file_path).__name__}")
    if not file_path:
        raise ValueError(f"AutoParallel.{method}: file_path is empty")
    return os.path.abspath(file_path)


def _check_file_target(method, path):
    """``path`` (absolute) can be written as a file: it is no directory, and the nearest of its
    ancestors that exists is a writable directory (the missing ones can be made); a
    ``ValueError`` naming ``AutoParallel.method`` otherwise."""
    if os.path.isdir(path):
        raise ValueError(f"AutoParallel.{method}: {path} is a directory; file_path must name "
                         "a file")
    parent = os.path.dirname(path)
    while not os.path.lexists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise ValueError(f"AutoParallel.{method}: the directory of {path} cannot be made: "
                         f"{parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"AutoParallel.{method}: {parent} is not writable, so {path} cannot "
                         "be written")
    return path


def _is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


class AutoParallel(Cell):
    """MindSpore's ``AutoParallel(network, parallel_mode="semi_auto")``: ``network`` (a Cell
    ending in its loss, such as ``nn.WithLossCell`` or ``parallel.nn.Pipeline``) trained in
    ``parallel_mode`` — ``"semi_auto"`` (the strategies set with ``shard``; ops without one are
    data parallel), ``"sharding_propagation"`` or ``"recursive_programming"`` (the engine's
    searches). As in MindSpore, the gradients are summed over the data-parallel replicas
    unless ``enable_gradients_mean()`` is called (``gradients_mean=False`` by default)."""

    def __init__(self, network, parallel_mode="semi_auto"):
        super().__init__(auto_prefix=False)
        if not isinstance(network, Cell):
            raise TypeError(f"AutoParallel: network must be a Cell, but got "
                            f"{type(network).__name__} (functions are not supported)")
        if parallel_mode not in _MODES:
            raise ValueError(f"AutoParallel: parallel_mode must be one of {list(_MODES)}, but "
                             f"got {parallel_mode!r}")
        self.network = network
        self._parallel_mode = parallel_mode
        # The engine keys the switches set, by section.
        object.__setattr__(self, "_keys", {"parallel": {"gradients_mean": False},
                                           "train": {}, "output": {}})
        object.__setattr__(self, "_param_strategy_file", None)
        object.__setattr__(self, "_pipeline", None)

    def construct(self, *inputs):
        return self.network(*inputs)

    def _set(self, section, key, value):
        self._keys[section][key] = value

    # --- the switches, in MindSpore's order -------------------------------------------------

    def comm_fusion(self, config):
        """Gradient communication fused into buckets: ``{"openstate": bool, "allreduce":
        {"mode": "auto"|"size"|"index", "config": None|MB|[indices]}, "allgather": …,
        "reducescatter": …}`` (``parallel.comm_fusion``)."""
        if not isinstance(config, dict):
            raise TypeError(f"AutoParallel.comm_fusion: config must be a dict, but got "
                            f"{type(config).__name__}")
        table = {}
        for key, value in config.items():
            if key == "openstate":
                value = _checks.plain(value)
                if not isinstance(value, bool):
                    raise TypeError("AutoParallel.comm_fusion: openstate must be a bool")
                table[key] = value
            elif key in _FUSION_KINDS:
                if not isinstance(value, dict) or "mode" not in value:
                    raise TypeError(f"AutoParallel.comm_fusion: {key} must be a dict with "
                                    "'mode' and 'config'")
                entry = {"mode": value["mode"]}
                if value.get("config") is not None:
                    config_value = value["config"]
                    if isinstance(config_value, (list, tuple)):  # "index": bucket indices
                        config_value = [_checks.plain(v) for v in config_value]
                    entry["config"] = _checks.plain(config_value)
                table[key] = entry
            else:
                raise KeyError(f"AutoParallel.comm_fusion: the key {key!r} is not one of "
                               f"openstate, {', '.join(_FUSION_KINDS)}")
        self._set("parallel", "comm_fusion", table)

    def dataset_strategy(self, config):
        """How the inputs are split: ``"data_parallel"`` (the batch over the data-parallel
        ranks), ``"full_batch"`` (every rank reads the whole batch), or one tuple or ``Layout``
        per input (``parallel.dataset_strategy``)."""
        from ._layout import Layout
        if isinstance(config, str):
            if config not in ("data_parallel", "full_batch"):
                raise ValueError("AutoParallel.dataset_strategy: config must be "
                                 f"'data_parallel', 'full_batch' or a tuple, but got {config!r}")
            self._set("parallel", "dataset_strategy", config)
            return
        if not isinstance(config, tuple) or not config:
            raise TypeError("AutoParallel.dataset_strategy: config must be a str or a tuple of "
                            f"tuples or Layouts, but got {type(config).__name__}")
        if all(isinstance(item, Layout) for item in config):
            self._set("parallel", "dataset_strategy", [item for item in config])
            return
        config = tuple(tuple(_checks.plain(d) for d in item) if isinstance(item, tuple) else item
                       for item in config)
        for item in config:
            if not isinstance(item, tuple) or not all(_is_int(d) and d > 0 for d in item):
                raise TypeError("AutoParallel.dataset_strategy: every item must be a tuple of "
                                f"positive ints or a Layout, but got {item!r}")
        self._set("parallel", "dataset_strategy", [list(item) for item in config])

    def disable_gradient_fp32_sync(self):
        """Half-precision gradients are summed in their own type (``parallel.gradient_fp32_sync
        = false``)."""
        self._set("parallel", "gradient_fp32_sync", False)

    def disable_loss_repeated_mean(self):
        """MindSpore's ``loss_repeated_mean = False`` (``parallel.loss_repeated_mean``)."""
        self._set("parallel", "loss_repeated_mean", False)

    def disable_strategy_file_only_for_trainable_params(self):
        """Strategy files and checkpoints also hold the non-trainable parameters
        (``parallel.strategy_file_only_for_trainable_params = false``)."""
        self._set("parallel", "strategy_file_only_for_trainable_params", False)

    def dump_local_norm(self, file_path):
        """Every rank writes the L2 norm of its shard of each parameter and of its gradient,
        each step, as JSON under ``file_path`` (``train.dump_local_norm``)."""
        self._set("train", "dump_local_norm", True)
        self._set("train", "dump_local_norm_path", _check_path("dump_local_norm", file_path))

    def enable_device_local_norm(self):
        """With ``dump_local_norm``, each rank's files also hold the norm of everything the
        rank holds (``device_local_norm``, MindSpore's ``dump_device_local_norm``).
        ``Model.train`` refuses it without ``dump_local_norm``."""
        object.__setattr__(self, "_device_local_norm", True)

    def enable_fp32_communication(self):
        """Half-precision activations and gradients are communicated in f32
        (``parallel.enable_fp32_communication``)."""
        self._set("parallel", "enable_fp32_communication", True)

    def enable_gradients_mean(self):
        """The gradient is that of the mean loss over the global batch, what one device computes
        (``parallel.gradients_mean = true``; MindSpore's default is the sum over replicas)."""
        self._set("parallel", "gradients_mean", True)

    def hsdp(self, shard_size=-1, threshold=64, optimizer_level="level1"):
        """Optimizer parallelism: parameters, gradients and optimizer state sharded over their
        replica groups (``[parallel.hsdp]``)."""
        shard_size, threshold = _checks.plain(shard_size), _checks.plain(threshold)
        if not _is_int(shard_size):
            raise TypeError(f"AutoParallel.hsdp: shard_size must be an int, but got "
                            f"{type(shard_size).__name__}")
        if shard_size != -1 and shard_size <= 0:
            raise ValueError(f"shard_size must be a positive integer or -1, but got {shard_size}")
        if not _is_int(threshold):
            raise TypeError(f"AutoParallel.hsdp: threshold must be an int, but got "
                            f"{type(threshold).__name__}")
        if threshold < 0:
            raise ValueError(f"threshold must be a positive integer or 0, but got {threshold}")
        if optimizer_level not in _LEVELS:
            raise ValueError(f"Optimizer level should in {list(_LEVELS)}, but got "
                             f"{optimizer_level!r}")
        self._set("parallel", "hsdp", {"shard_size": shard_size, "threshold": threshold,
                                       "optimizer_level": optimizer_level})

    def load_operator_strategy_file(self, file_path):
        """A search mode takes its strategies from this operator strategy file
        (``parallel.load_operator_strategy_file``)."""
        self._set("parallel", "load_operator_strategy_file",
                  _check_path("load_operator_strategy_file", file_path))

    def load_param_strategy_file(self, file_path):
        """Op strategies from a saved strategy file for every op ``shard`` does not set
        (``parallel.strategy_file``)."""
        self._set("parallel", "strategy_file", _check_path("load_param_strategy_file", file_path))

    def no_init_parameters_in_compile(self):
        """Parameters are allocated and filled only when first read (``train.lazy_init``)."""
        self._set("train", "lazy_init", True)

    def pipeline(self, stages=1, output_broadcast=False, interleave=False, scheduler="1f1b"):
        """Pipeline stages (``[parallel.pipeline]``); the micro-batches and each cell's stage
        come from the ``parallel.nn.Pipeline`` the network is wrapped in."""
        stages, output_broadcast, interleave = (_checks.plain(stages), _checks.plain(
            output_broadcast), _checks.plain(interleave))
        if not _is_int(stages):
            raise TypeError(f"AutoParallel.pipeline: stages must be an int, but got "
                            f"{type(stages).__name__}")
        if stages <= 0:
            raise ValueError(f"AutoParallel.pipeline: stages must be > 0, but got {stages}")
        for name, value in (("output_broadcast", output_broadcast), ("interleave", interleave)):
            if not isinstance(value, bool):
                raise TypeError(f"AutoParallel.pipeline: {name} must be a bool")
        if scheduler not in _SCHEDULERS:
            raise ValueError(f"AutoParallel.pipeline: scheduler must be one of "
                             f"{list(_SCHEDULERS)}, but got {scheduler!r}")
        object.__setattr__(self, "_pipeline", {"stages": stages,
                                               "output_broadcast": output_broadcast,
                                               "interleave": interleave,
                                               "scheduler": scheduler})

    def print_local_norm(self):
        """Every rank prints its shards' norms each step (``train.print_local_norm``)."""
        self._set("train", "print_local_norm", True)

    def save_operator_strategy_file(self, file_path):
        """A search mode writes the strategies it found to this file
        (``parallel.save_operator_strategy_file``)."""
        self._set("parallel", "save_operator_strategy_file",
                  _check_path("save_operator_strategy_file", file_path))

    def save_param_strategy_file(self, file_path):
        """The parameters' layouts in MindSpore's strategy file format (``strategy.ckpt``),
        written to ``file_path`` when ``Model.train`` has trained the network. ``file_path``
        must name a file whose directory exists or can be made (checked here and again
        before ``Model.train`` trains)."""
        path = _check_path("save_param_strategy_file", file_path)
        object.__setattr__(self, "_param_strategy_file",
                           _check_file_target("save_param_strategy_file", path))

    def _check_outputs(self):
        """Before training: the files the switches name can still be written."""
        path = getattr(self, "_param_strategy_file", None)
        if path is not None:
            _check_file_target("save_param_strategy_file", path)

    def set_group_ckpt_save_file(self, file_path):
        """This rank's communication groups and restore ranks (MindSpore's group-info file),
        written after the first step (``output.group_info_file``). ``file_path`` must name a
        file (not a directory: a rank's file would land beside it, ``<dir>_<rank>``, or,
        under ``tessera launch``, fail to be moved onto it after training)."""
        path = _check_path("set_group_ckpt_save_file", file_path)
        if "{rank}" not in path:
            _check_file_target("set_group_ckpt_save_file", path)
        self._set("output", "group_info_file", path)

    def transformer_opt(self, file_path):
        """MindSpore's ``parallel_speed_up.json``: ``grad_computation_allreduce_overlap`` and
        ``computation_allgather_overlap`` (and their old aliases) set ``[parallel.overlap]``; the
        file's other keys are refused when switched on (the engine has no such optimisation)."""
        path = _check_path("transformer_opt", file_path)
        try:
            # A regular file only: opening a FIFO would wait for a writer without end, and a
            # device could be read without end.
            if not stat.S_ISREG(os.stat(path).st_mode):
                raise ValueError(f"AutoParallel.transformer_opt: {path} is not a regular file "
                                 "(a directory, a FIFO or a device); it must be a JSON file")
            with open(path, encoding="utf-8") as f:
                speedup = json.load(f)
        except OSError as e:
            raise ValueError(f"AutoParallel.transformer_opt: cannot read {path}: {e}") from e
        except UnicodeDecodeError as e:
            raise ValueError(f"AutoParallel.transformer_opt: {path} is not UTF-8 text ({e}); it "
                             "must be a JSON file") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"AutoParallel.transformer_opt: {path} is not JSON: {e}") from e
        except RecursionError:
            raise ValueError(f"AutoParallel.transformer_opt: {path} nests its JSON too deeply "
                             "to read; parallel_speed_up.json is one flat object") from None
        if not isinstance(speedup, dict):
            raise ValueError(f"AutoParallel.transformer_opt: {path} must hold a JSON object")
        overlap = dict(self._keys["parallel"].get("overlap", {}))
        for key, value in speedup.items():
            if key in _OVERLAP_KEYS:
                if not isinstance(value, bool):
                    raise TypeError(f"AutoParallel.transformer_opt: {path}: {key} must be a bool")
                overlap[_OVERLAP_KEYS[key]] = value
            elif key in _OTHER_SPEEDUP_KEYS:
                if value not in (False, 0, "", None):
                    raise ValueError(f"AutoParallel.transformer_opt: {path}: {key} = {value!r} "
                                     "is not supported by Tessera (supported: "
                                     f"{', '.join(sorted(_OVERLAP_KEYS))})")
            else:
                raise ValueError(f"AutoParallel.transformer_opt: {path}: unknown key {key!r}")
        self._set("parallel", "overlap", overlap)

    # --- what Model.train reads -------------------------------------------------------------

    def _engine_mode(self):
        return self._parallel_mode
