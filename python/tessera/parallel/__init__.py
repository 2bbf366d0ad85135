"""``mindspore.parallel``'s checkpoint and layout tools, call for call.

``from tessera import parallel as ms_parallel`` stands in for scripts that use these
functions: names, parameters (order, names, defaults) and return types are MindSpore 2.10's.
Tessera's additions come after MindSpore's parameters and are keyword-only:
``force`` (replace existing outputs; without it an existing output is an error and nothing is
overwritten) and ``progress`` (see :func:`tessera._progress.resolve`).

Where MindSpore is wrong or not minimal, Tessera's answer stands; ``docs/PYTHON.md`` lists
every difference. Beyond MindSpore: :func:`reshard_plan`, :func:`layout_slices` and
:func:`verify_checkpoint` return plain Python data. MindSpore's names that need what the
engine lacks (``distributed.DistributedDataParallel``, ``strategy``'s online metadata,
``set_algo_parameters``, ``set_op_strategy_config``) raise ``NotImplementedError`` naming what
to use instead.

Every function calls Tessera's Rust library in-process (no subprocess); conversions release
the GIL.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence

from .. import _checks, _progress, _tessera
from .._tessera import CheckpointError, CheckpointIOError
from ._layout import Layout
from ._merge import merge_sliced_parameter
from ._network_functions import parameter_broadcast, sync_pipeline_shared_parameters
from ._search_settings import (get_algo_parameters, reset_algo_parameters, set_algo_parameters,
                               set_op_strategy_config)
from ._shard import shard

if TYPE_CHECKING:
    # Only for the annotations: numpy (and the BLAS threads it starts) is loaded when a call
    # first returns arrays, so a conversion does not share the cores with idle BLAS threads.
    import numpy as np

__all__ = [
    "CheckpointError",
    "CheckpointIOError",
    "Layout",
    "build_searched_strategy",
    "convert_checkpoint_by_rank",
    "convert_checkpoints",
    "layout_slices",
    "load_distributed_checkpoint",
    "get_algo_parameters",
    "load_segmented_checkpoints",
    "merge_pipeline_strategys",
    "merge_sliced_parameter",
    "parameter_broadcast",
    "rank_list_for_convert",
    "rank_list_for_transform",
    "reset_algo_parameters",
    "reshard_plan",
    "restore_group_info_list",
    "set_algo_parameters",
    "set_op_strategy_config",
    "shard",
    "sync_pipeline_shared_parameters",
    "transform_checkpoint_by_rank",
    "transform_checkpoints",
    "unified_safetensors",
    "verify_checkpoint",
]

_FORMATS = ("ckpt", "safetensors")
_NOTHING_TO_CONVERT = ("src_strategy_file and dst_strategy_file are both None: there is "
                       "nothing to convert")


def convert_checkpoints(src_checkpoints_dir, dst_checkpoints_dir, ckpt_prefix,
                        src_strategy_file=None, dst_strategy_file=None, process_num=1,
                        output_format="ckpt", *, force: bool = False,
                        allow_missing: bool = False, progress: _progress.Progress = None,
                        fsync: bool = True) -> None:
    """Converts the checkpoint in ``src_checkpoints_dir/rank_<r>/`` saved under
    ``src_strategy_file`` to ``dst_strategy_file`` (None: everything merged into rank 0;
    ``src_strategy_file=None``: ``rank_0`` holds an unsharded checkpoint to slice),
    writing ``dst_checkpoints_dir/rank_<r>/<ckpt_prefix><r>.<output_format>``.

    Each destination rank reads a minimal set of source files, streaming; ``process_num`` is
    accepted for compatibility (one process is enough). A source strategy parameter that no
    source file holds is an error (``CheckpointError`` naming it) unless ``allow_missing``,
    where MindSpore leaves it out silently.

    ``fsync=False`` skips every fsync (files, set marker, directories): the output still appears
    atomically (a failed or killed process leaves the old checkpoint or the new one), but a
    power loss or OS crash soon after may lose it. MindSpore never fsyncs.
    """
    src = _checks.path(src_checkpoints_dir, "src_checkpoints_dir")
    dst = _checks.path(dst_checkpoints_dir, "dst_checkpoints_dir")
    _checks.text(ckpt_prefix, "ckpt_prefix")
    dst_strategy = _checks.optional_path(dst_strategy_file, "dst_strategy_file")
    _checks.positive_int(process_num, "process_num")
    _checks.choice(output_format, "output_format", _FORMATS)
    if src_strategy_file is None:
        # An unsharded source (rank_0 holds every tensor whole), sliced for the destination.
        if dst_strategy is None:
            raise ValueError(_NOTHING_TO_CONVERT)
        _tessera.convert_unsharded(src, dst, dst_strategy, prefix=ckpt_prefix,
                                   output_format=output_format, force=_checks.flag(force, "force"),
                                   progress=_progress.resolve(progress), fsync=_checks.flag(fsync, "fsync"))
        return
    src_strategy = _checks.path(src_strategy_file, "src_strategy_file")
    _tessera.convert_checkpoints(src, src_strategy, dst, dst_strategy, prefix=ckpt_prefix,
                                 output_format=output_format, force=_checks.flag(force, "force"),
                                 allow_missing=_checks.flag(allow_missing, "allow_missing"),
                                 progress=_progress.resolve(progress),
                                 fsync=_checks.flag(fsync, "fsync"))


def convert_checkpoint_by_rank(rank_id, checkpoint_files_map, save_checkpoint_file_name,
                               src_strategy_file=None, dst_strategy_file=None, *,
                               force: bool = False, progress: _progress.Progress = None,
                               fsync: bool = True) -> None:
    """Converts destination rank ``rank_id`` from the source files ``checkpoint_files_map``
    (source rank → file; the ranks of :func:`rank_list_for_convert` suffice) into
    ``save_checkpoint_file_name`` (``.ckpt`` or ``.safetensors``). With
    ``src_strategy_file=None`` the source is unsharded: one file holding every tensor whole,
    given as ``{0: file}``. A rank past the source strategy's devices holding more than a
    step counter, a needed rank without a file, or one file given for two ranks holding
    different slices is a
    ``CheckpointError`` naming ``checkpoint_files_map``. ``fsync=False``: as for
    :func:`convert_checkpoints`."""
    rank = _checks.non_negative_int(rank_id, "rank_id")
    if not isinstance(checkpoint_files_map, dict):
        raise TypeError("For 'checkpoint_files_map', the type must be dict, but got "
                        f"{type(checkpoint_files_map).__name__}.")
    files = {}
    for r, f in checkpoint_files_map.items():
        files[_checks.non_negative_int(r, "checkpoint_files_map key")] = _checks.path(
            f, "checkpoint_files_map value")
    out = _checks.path(save_checkpoint_file_name, "save_checkpoint_file_name")
    src_strategy = _checks.optional_path(src_strategy_file, "src_strategy_file")
    dst_strategy = _checks.optional_path(dst_strategy_file, "dst_strategy_file")
    if src_strategy is None and dst_strategy is None:
        raise ValueError(_NOTHING_TO_CONVERT)
    _tessera.convert_checkpoint_files(rank, files, src_strategy, out, dst_strategy,
                                      force=_checks.flag(force, "force"),
                                      progress=_progress.resolve(progress),
                                      fsync=_checks.flag(fsync, "fsync"))


def rank_list_for_convert(rank_id, src_strategy_file=None, dst_strategy_file=None) -> List[int]:
    """The source ranks destination ``rank_id`` needs: a proven minimum (ascending), where
    MindSpore returns a superset (descending). Without a source strategy, ``[0]``."""
    rank = _checks.non_negative_int(rank_id, "rank_id")
    if src_strategy_file is None:
        return [0]
    ranks, _exact = _tessera.rank_list(
        rank, _checks.path(src_strategy_file, "src_strategy_file"),
        _checks.optional_path(dst_strategy_file, "dst_strategy_file"))
    return ranks


def _split_dst_file(value: Any) -> Optional[tuple]:
    """``split_dst_file``: ``()`` (everything) or ``(k, total)`` with ``1 <= k <= total``."""
    if not isinstance(value, (tuple, list)):
        raise TypeError(f"For 'split_dst_file', the type must be tuple, but got {type(value).__name__}.")
    if len(value) == 0:
        return None
    if len(value) != 2 or any(isinstance(v, bool) or not isinstance(v, int) for v in value):
        raise ValueError("For 'split_dst_file', the value must be () or a tuple (k, total) of two "
                         f"ints, but got {tuple(value)!r}.")
    k, total = value
    if total > _checks.MAX_INT:
        raise ValueError("For 'split_dst_file', the total must be at most 2**63 - 1, but got "
                         f"{tuple(value)!r}.")
    if total < 1 or not 1 <= k <= total:
        raise ValueError("For 'split_dst_file', the value (k, total) must satisfy 1 <= k <= total, "
                         f"but got {tuple(value)!r}.")
    return (int(k), int(total))


def unified_safetensors(src_dir, src_strategy_file, dst_dir, merge_with_redundancy=True,
                        file_suffix=None, max_process_num=64, choice_func=None,
                        split_dst_file=(), *, max_part_size: int = 3 << 30,
                        force: bool = False, progress: _progress.Progress = None,
                        fsync: bool = True) -> None:
    """Merges every rank of ``src_dir`` into full tensors: ``dst_dir/part<i>.safetensors``
    (about ``max_part_size`` bytes each), ``param_name_map.json`` and
    ``hyper_param.safetensors`` for tensors outside the strategy.

    ``merge_with_redundancy=False`` declares sources saved without redundancy; Tessera reads
    each piece from whichever replica holds it either way. ``file_suffix`` takes in each rank
    directory only the files named ``*<file_suffix>.safetensors`` (several: the one MindSpore
    picks). ``choice_func(name)`` returns True to keep a parameter, False to drop it, or a str
    to rename it (part file and index). ``split_dst_file=(k, total)`` writes only the k-th of
    ``total`` runs of part files, and the index and hyper-parameter file only when ``k == 1``
    (the directory then carries no checkpoint-set marker: several runs fill it).

    ``fsync=False`` skips every fsync (files, set marker, directories): the output still appears
    atomically (a failed or killed process leaves the old checkpoint or the new one), but a
    power loss or OS crash soon after may lose it. MindSpore never fsyncs.
    """
    src = _checks.path(src_dir, "src_dir")
    strategy = _checks.path(src_strategy_file, "src_strategy_file")
    dst = _checks.path(dst_dir, "dst_dir")
    if not isinstance(merge_with_redundancy, bool):
        raise TypeError("For 'merge_with_redundancy', the type must be bool, but got "
                        f"{type(merge_with_redundancy).__name__}.")
    _checks.positive_int(max_process_num, "max_process_num")
    if file_suffix is not None:
        _checks.text(file_suffix, "file_suffix")
    if choice_func is not None and not callable(choice_func):
        raise TypeError(f"For 'choice_func', the type must be callable, but got {type(choice_func).__name__}.")
    split = _split_dst_file(split_dst_file)
    _checks.positive_int(max_part_size, "max_part_size")
    _tessera.unified_safetensors(src, strategy, dst, dedup=not merge_with_redundancy,
                                 max_part_bytes=max_part_size, force=_checks.flag(force, "force"),
                                 progress=_progress.resolve(progress), file_suffix=file_suffix,
                                 choice=choice_func, split=split,
                                 fsync=_checks.flag(fsync, "fsync"))


def _rename(tensors: Dict[str, np.ndarray], name_map: Optional[dict]) -> Dict[str, np.ndarray]:
    if name_map is None:
        return tensors
    return {name_map.get(k, k): v for k, v in tensors.items()}


def _name_map(name_map: Any) -> Optional[Dict[str, str]]:
    if name_map is None:
        return None
    if not isinstance(name_map, dict):
        raise TypeError(f"For 'name_map', the type must be dict, but got {type(name_map).__name__}.")
    for k, v in name_map.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise TypeError("For 'name_map', keys and values must be str, but got "
                            f"{k!r}: {v!r}.")
        _checks.text(k, "name_map")
        _checks.text(v, "name_map")
    return dict(name_map)


_BAD_PREDICT_STRATEGY = (
    "For 'load_distributed_checkpoint', the argument 'predict_strategy' is dict, "
    "the key of it must be string, and the value of it must be list or tuple that "
    "the first four elements must be dev_matrix (list[int]), tensor_map (list[int]), "
    "param_split_shape (list[int]) and field_size (int, which value is 0)."
    "Please check whether 'predict_strategy' is correct.")


def _layout_entries(predict_strategy: dict) -> list:
    """MindSpore's layout dict as ``(name, dev_matrix, tensor_map, param_split_shape,
    field_size, opt_shard_step, opt_shard_size)`` tuples, checked as MindSpore's
    ``_check_predict_strategy`` checks it (same ValueError). Entries 4 and 5 are the optimizer
    shard step and size (``_convert_to_list``'s form); a runtime layout's opt-shard group name
    at index 5 is accepted only when empty."""

    def int_list(arg):
        return isinstance(arg, (list, tuple)) and all(
            isinstance(i, int) and not isinstance(i, bool) for i in arg)

    entries = []
    for name, value in predict_strategy.items():
        if not isinstance(name, str) or not isinstance(value, (list, tuple)) or len(value) < 4:
            raise ValueError(_BAD_PREDICT_STRATEGY)
        _checks.text(name, "predict_strategy")
        dev_matrix, tensor_map, split_shape, field_size = value[:4]
        if not int_list(dev_matrix) or not int_list(tensor_map) or \
                not (int_list(split_shape) or not split_shape) or \
                not (isinstance(field_size, int) and field_size == 0):
            raise ValueError(_BAD_PREDICT_STRATEGY)
        step = size = 0
        if len(value) > 5 and isinstance(value[5], str):
            if value[5]:
                raise ValueError(
                    f"For 'predict_strategy', parameter {name!r} names the optimizer-shard "
                    f"communication group {value[5]!r}, which tessera.parallel cannot resolve "
                    "outside a MindSpore job: give opt_shard_step and opt_shard_size as ints "
                    "(the build_searched_strategy / _convert_to_list form)")
        elif len(value) > 5:
            step, size = value[4], value[5]
            for what, v in (("opt_shard_step", step), ("opt_shard_size", size)):
                if isinstance(v, bool) or not isinstance(v, int):
                    raise ValueError(f"For 'predict_strategy', parameter {name!r}: {what} must be "
                                     f"an int, but got {type(v).__name__}.")
        # The library takes these as signed 64-bit ints: a value beyond that was an
        # OverflowError naming neither the parameter nor the field.
        for what, values in (("dev_matrix", dev_matrix), ("tensor_map", tensor_map),
                             ("param_split_shape", split_shape or ()),
                             ("opt_shard_step and opt_shard_size", (step, size))):
            for v in values:
                if not -2**63 <= v <= _checks.MAX_INT:
                    raise ValueError(f"For 'predict_strategy', parameter {name!r}: {what} holds "
                                     f"{v}, outside the 64-bit range (-2**63 to 2**63 - 1).")
        entries.append((name, list(dev_matrix), list(tensor_map), list(split_shape or []),
                        0, int(step), int(size)))
    return entries


_DEC_MODES = ("AES-GCM", "AES-CBC", "SM4-CBC")


def _decryption(dec_key: Any, dec_mode: Any) -> Optional[bytes]:
    """``dec_key`` (None or bytes) and ``dec_mode`` checked as MindSpore checks them."""
    if dec_key is not None and not isinstance(dec_key, bytes):
        raise TypeError(f"For 'dec_key', the type must be bytes, but got {type(dec_key).__name__}.")
    if not isinstance(dec_mode, str):
        raise TypeError(f"For 'dec_mode', the type must be str, but got {type(dec_mode).__name__}.")
    if dec_key is not None:
        _checks.choice(dec_mode, "dec_mode", _DEC_MODES)
    return dec_key


def load_distributed_checkpoint(network, checkpoint_filenames=None, predict_strategy=None,
                                train_strategy_filename=None, strict_load=False, dec_key=None,
                                dec_mode="AES-GCM", format="ckpt", unified_safetensors_dir=None,
                                dst_safetensors_dir=None, rank_id=None,
                                output_format="safetensors", name_map=None,
                                max_process_num=64, return_param_dict=False, *,
                                force: bool = False, progress: _progress.Progress = None,
                                fsync: bool = True,
                                allow_missing: bool = False) -> Optional[Dict[str, np.ndarray]]:
    """The tensors a rank holds under ``predict_strategy``, as a dict of name → numpy array,
    or, with ``dst_safetensors_dir``, files ``dst_safetensors_dir/rank_<r>/net.<output_format>``
    (every rank, or ``rank_id``).

    ``predict_strategy`` is a strategy file, or MindSpore's layout dict
    ``{name: [dev_matrix, tensor_map, param_split_shape, field_size, opt_shard_step,
    opt_shard_size, ...]}``, or None: one device predicts, so every tensor comes whole (as
    rank 0).

    - ``format="ckpt"``: from ``checkpoint_filenames`` (one file per training rank, in rank
      order) saved under ``train_strategy_filename`` (None: one unsharded file); encrypted files are read with
      ``dec_key`` and ``dec_mode`` ('AES-GCM', 'AES-CBC' or 'SM4-CBC'). As MindSpore requires,
      the list holds one file per device of the training strategy (a merged pipeline
      strategy: every stage's); fewer, more (files past the devices holding more than a step
      counter), or one file given for two ranks that hold different slices, is a
      ``CheckpointError`` naming ``checkpoint_filenames`` with the counts given and needed.
      A parameter of the training (or predict) strategy that no file holds is a
      ``CheckpointError`` naming it unless ``allow_missing=True`` (then it is left out;
      MindSpore leaves it out with a warning). A deduplicated set's empty (0-byte) files, of
      ranks that own nothing, are read as holding no tensor; with no training strategy the
      one file must not be empty.
    - ``format="safetensors"``: from ``unified_safetensors_dir`` (see
      :func:`unified_safetensors`).

    An argument of the other format (``unified_safetensors_dir`` or ``dst_safetensors_dir``
    with ``"ckpt"``, ``checkpoint_filenames`` or ``train_strategy_filename`` with
    ``"safetensors"``), or ``output_format="ckpt"`` without ``dst_safetensors_dir``, is a
    ``ValueError``: it would be ignored.

    ``name_map`` renames tensors (name in the checkpoint → name returned or written).
    ``network`` None returns the arrays of ``rank_id`` (default 0) whatever
    ``return_param_dict`` says; a ``tessera.nn.Cell`` takes them into its Parameters
    (``tessera.load_param_into_net(network, arrays, strict_load)``, its rules and errors), and
    the call returns None, or the arrays with ``return_param_dict=True``. ``strict_load=True``
    without a network, and ``return_param_dict=True`` or a network with
    ``dst_safetensors_dir`` (nothing is returned or loaded there), are a ``ValueError``: they
    would do nothing. bf16 tensors come back as float32.
    ``fsync=False`` (files written to ``dst_safetensors_dir`` only): as for
    :func:`convert_checkpoints`.
    """
    _load_target(network, strict_load, return_param_dict, "load_distributed_checkpoint",
                 "network")
    if dst_safetensors_dir is not None and (network is not None or return_param_dict):
        raise ValueError("For 'load_distributed_checkpoint', network and "
                         "return_param_dict=True do not apply with dst_safetensors_dir (the "
                         "arrays are written to files, not loaded or returned); pass network="
                         "None and return_param_dict=False.")
    _checks.choice(format, "format", _FORMATS)
    _checks.choice(output_format, "output_format", _FORMATS)
    key = _decryption(dec_key, dec_mode)
    _checks.positive_int(max_process_num, "max_process_num")
    missing = _checks.flag(allow_missing, "allow_missing")
    if missing and format != "ckpt":
        raise ValueError("For 'load_distributed_checkpoint', allow_missing=True applies to "
                         "format='ckpt' (checkpoint_filenames) only; the unified safetensors "
                         "checkpoint holds every parameter whole.")
    if predict_strategy is None:
        strategy, layouts = None, None
    elif isinstance(predict_strategy, dict):
        strategy, layouts = None, _layout_entries(predict_strategy)
    else:
        strategy, layouts = _checks.path(predict_strategy, "predict_strategy"), None
    names = _name_map(name_map)
    rank = None if rank_id is None else _checks.non_negative_int(rank_id, "rank_id")
    _other_format_arguments(format, checkpoint_filenames=checkpoint_filenames,
                            train_strategy_filename=train_strategy_filename,
                            unified_safetensors_dir=unified_safetensors_dir,
                            dst_safetensors_dir=dst_safetensors_dir)
    if dst_safetensors_dir is None and output_format != "safetensors":
        raise ValueError(f"For 'load_distributed_checkpoint', output_format={output_format!r} "
                         "has no effect without dst_safetensors_dir (the arrays are returned, "
                         "no file is written).")
    if format == "safetensors":
        if key is not None:
            raise ValueError("For 'load_distributed_checkpoint', dec_key must be None when "
                             "format is 'safetensors'.")
        if dec_mode != "AES-GCM":
            raise ValueError("For 'load_distributed_checkpoint', strict_load and dec_mode must "
                             "be default when format is 'safetensors'.")
        unified = _checks.path(unified_safetensors_dir, "unified_safetensors_dir")
        if dst_safetensors_dir is not None:
            _tessera.load_distributed_files(
                unified, strategy, _checks.path(dst_safetensors_dir, "dst_safetensors_dir"),
                ranks=None if rank is None else [rank], output_format=output_format,
                force=_checks.flag(force, "force"), progress=_progress.resolve(progress),
                layouts=layouts,
                name_map=names, fsync=_checks.flag(fsync, "fsync"))
            return None
        tensors = _tessera.load_rank_from_unified(unified, strategy, rank or 0, layouts=layouts)
        return _into_network(_rename(tensors, names), network, strict_load, return_param_dict)
    if not isinstance(checkpoint_filenames, (list, tuple)):
        raise TypeError("For 'checkpoint_filenames', the type must be list, but got "
                        f"{type(checkpoint_filenames).__name__}.")
    files = {r: _checks.path(f, "checkpoint_filenames") for r, f in enumerate(checkpoint_filenames)}
    train = _checks.optional_path(train_strategy_filename, "train_strategy_filename")
    if train is None:
        # one unsharded file: empty, it holds nothing to load
        for f in files.values():
            _not_empty(f)
    try:
        tensors = _tessera.load_rank_from_files(files, train, strategy, rank or 0,
                                                layouts=layouts, dec_key=key,
                                                dec_mode=dec_mode, allow_missing=missing)
    except CheckpointError as e:
        # A deduplicated .ckpt set has an empty (0-byte) file for a rank that owns nothing,
        # which is read as holding no tensor; when the set then lacks something, name them.
        empty = [f for f in files.values() if _is_empty(f)]
        if not empty:
            raise
        rule = (f"the file is empty (0 bytes), and the set cannot be read without what it "
                f"should hold ({len(empty)} empty file(s) in checkpoint_filenames): {e}")
        err = CheckpointError(f"{empty[0]}: {rule}")
        err.file, err.tensor, err.rule = empty[0], getattr(e, "tensor", None), rule
        raise err from e
    return _into_network(_rename(tensors, names), network, strict_load, return_param_dict)


def _load_target(net: Any, strict_load: Any, return_param_dict: Any, func: str,
                 net_name: str) -> None:
    """``net`` (None or a ``tessera.nn.Cell``), ``strict_load`` and ``return_param_dict``
    (bools) checked; ``strict_load=True`` without a network would do nothing, so it is a
    ``ValueError``."""
    from ..nn.cell import Cell

    if net is not None and not isinstance(net, Cell):
        raise TypeError(f"For '{net_name}', the type must be tessera.nn.Cell or None, but got "
                        f"{type(net).__name__}.")
    for name, value in (("strict_load", strict_load), ("return_param_dict", return_param_dict)):
        _checks.flag(value, name)
    if strict_load and net is None:
        raise ValueError(f"For '{func}', strict_load=True applies only when '{net_name}' is "
                         "given (a tessera.nn.Cell to load the parameters into); without one "
                         "the arrays are returned and nothing is loaded.")


def _into_network(tensors: Dict[str, np.ndarray], network: Any, strict_load: bool,
                  return_param_dict: bool) -> Optional[Dict[str, np.ndarray]]:
    """``tensors`` loaded into ``network`` (a Cell) when given; returned without a network or
    with ``return_param_dict``."""
    if network is None:
        return tensors
    from ..train.checkpoint import load_param_into_net

    load_param_into_net(network, tensors, strict_load)
    return tensors if return_param_dict else None


def _other_format_arguments(format: str, **given: Any) -> None:
    """The arguments of the other ``format`` left at None: ``checkpoint_filenames`` and
    ``train_strategy_filename`` are read only with ``format="ckpt"``,
    ``unified_safetensors_dir`` and ``dst_safetensors_dir`` only with
    ``format="safetensors"``; one given with the other format would be ignored (no file
    written to ``dst_safetensors_dir``), so it is a ``ValueError`` naming it."""
    wrong = ("unified_safetensors_dir", "dst_safetensors_dir") if format == "ckpt" else \
        ("checkpoint_filenames", "train_strategy_filename")
    named = [name for name in wrong if given[name] is not None]
    if named:
        raise ValueError(f"For 'load_distributed_checkpoint', {' and '.join(named)} "
                         f"{'applies' if len(named) == 1 else 'apply'} only when format is "
                         f"'{'safetensors' if format == 'ckpt' else 'ckpt'}', but format is "
                         f"'{format}'; {'it' if len(named) == 1 else 'they'} would be ignored.")


def _is_empty(path: str) -> bool:
    """Whether ``path`` is a regular file of 0 bytes (False when it cannot be looked at: the
    reader reports that, naming the file)."""
    try:
        return os.path.isfile(path) and os.path.getsize(path) == 0
    except OSError:
        return False


def _not_empty(path: str) -> None:
    """A checkpoint file of 0 bytes is a ``CheckpointError`` naming it, as MindSpore refuses
    one ("may be empty"); read on, it would hold no tensor and the error would be about the
    strategy, naming neither the file nor the cause."""
    try:
        empty = os.path.isfile(path) and os.path.getsize(path) == 0
    except OSError:
        return  # the reader reports it, naming the file
    if empty:
        rule = "the file is empty (0 bytes), not a checkpoint"
        err = CheckpointError(f"{path}: {rule}")
        err.file, err.tensor, err.rule = path, None, rule
        raise err


def load_segmented_checkpoints(ckpt_file_dir, net=None, strict_load=False, filter_prefix=None,
                               dec_key=None, dec_mode="AES-GCM", specify_prefix=None,
                               choice_func=None) -> Dict[str, np.ndarray]:
    """The union of every checkpoint file in ``ckpt_file_dir`` (files in name order, a later
    file's tensor replacing an earlier one's), as name → numpy array. ``filter_prefix`` drops
    names with those prefixes, ``specify_prefix`` keeps only those, ``choice_func(name)``
    keeps a name when true. Encrypted ``.ckpt`` files are read with ``dec_key`` and
    ``dec_mode``. With ``net`` (a ``tessera.nn.Cell``) the arrays also go into its Parameters
    (``tessera.load_param_into_net(net, arrays, strict_load)``), as in MindSpore;
    ``strict_load=True`` without ``net`` is a ``ValueError`` (it would do nothing)."""
    directory = _checks.path(ckpt_file_dir, "ckpt_file_dir")
    _load_target(net, strict_load, False, "load_segmented_checkpoints", "net")
    key = _decryption(dec_key, dec_mode)

    def prefixes(value, name):
        if value is None:
            return ()
        if isinstance(value, str):
            return (value,)
        if isinstance(value, (list, tuple)) and all(isinstance(p, str) for p in value):
            return tuple(value)
        raise TypeError(f"For '{name}', the type must be str or a list of str, but got {type(value).__name__}.")

    drop, keep = prefixes(filter_prefix, "filter_prefix"), prefixes(specify_prefix, "specify_prefix")
    if choice_func is not None and not callable(choice_func):
        raise TypeError(f"For 'choice_func', the type must be callable, but got {type(choice_func).__name__}.")
    tensors = _tessera.load_segmented_checkpoints(directory, dec_key=key, dec_mode=dec_mode)
    tensors = {name: t for name, t in tensors.items()
               if not name.startswith(drop) and (not keep or name.startswith(keep))
               and (choice_func is None or choice_func(name))}
    _into_network(tensors, net, strict_load, True)
    return tensors


def _regular_file(path: str, what: str) -> str:
    """``path`` when it names a regular file; otherwise a ``CheckpointError`` (a
    ``ValueError``, MindSpore's class for "no such strategy file") naming it."""
    if not os.path.isfile(path):
        rule = (f"no such {what}" if not os.path.lexists(path) else
                f"not a regular file, so not a {what}")
        err = CheckpointError(f"{path}: {rule}")
        err.file, err.tensor, err.rule = path, None, rule
        raise err
    return path


def build_searched_strategy(strategy_filename) -> Dict[str, dict]:
    """Per parameter, its ``ParallelLayouts`` as a plain dict (``dev_matrix``,
    ``tensor_map``, ``param_split_shape``, ``indices_offset`` as lists of ``{"dim": [...]}``,
    ``field``, ``opt_weight_shard_step``, ``opt_weight_shard_size``)."""
    import json

    path = _regular_file(_checks.path(strategy_filename, "strategy_filename"), "strategy file")
    return json.loads(_tessera.build_searched_strategy(path))


def merge_pipeline_strategys(src_strategy_dirs, dst_strategy_file, *, force: bool = False) -> None:
    """Merges the per-stage strategy files in ``src_strategy_dirs`` into
    ``dst_strategy_file`` (names become ``"<stage>-<name>"``; inputs taken in sorted order)."""
    _tessera.merge_pipeline_strategys(_checks.path(src_strategy_dirs, "src_strategy_dirs"),
                                      _checks.path(dst_strategy_file, "dst_strategy_file"),
                                      force=_checks.flag(force, "force"))


def restore_group_info_list(group_info_file_name) -> List[int]:
    """The ranks whose checkpoint can restore this rank's (``ckpt_restore_rank_list``)."""
    path = _regular_file(_checks.path(group_info_file_name, "group_info_file_name"),
                         "group information file")
    return _tessera.restore_group_info_list(path)


# MindSpore 2.x's earlier names of the conversions, still exported by mindspore.parallel:
# the same functions, with the same parameters.
transform_checkpoints = convert_checkpoints
transform_checkpoint_by_rank = convert_checkpoint_by_rank
rank_list_for_transform = rank_list_for_convert


# ---------------------------------------------------------------------------- beyond MindSpore

def reshard_plan(src_strategy_file, dst_strategy_file=None, src_checkpoints_dir=None,
                 rank_id=None) -> List[dict]:
    """The plan of a conversion, per destination rank (``rank_id``, or all): ``source_ranks``
    (a minimal cover), ``minimal`` (``"exact"`` or ``"greedy"``) and per parameter the rank's
    box (``offset``, ``shape``, ``global_shape``) with the ``pieces`` it needs, each with the
    source ranks (``holders``) that hold it. Shapes come from ``src_checkpoints_dir`` when
    given, else from the strategies (the smallest shapes their splits divide)."""
    ranks = None if rank_id is None else [_checks.non_negative_int(rank_id, "rank_id")]
    return _tessera.reshard_plan(
        _checks.path(src_strategy_file, "src_strategy_file"),
        _checks.optional_path(dst_strategy_file, "dst_strategy_file"),
        _checks.optional_path(src_checkpoints_dir, "src_checkpoints_dir"), ranks)


def layout_slices(layout: Layout, shape: Sequence[int]) -> dict:
    """Every rank's slice of a tensor of ``shape`` under ``layout`` (a called
    :class:`Layout`): ``slices`` (per mesh slot: ``rank``, ``device``, ``offset``,
    ``shape``), ``slice_shape``, ``split_factors`` and ``replicas``."""
    if not isinstance(layout, Layout):
        raise TypeError(f"For 'layout', the type must be Layout, but got {type(layout).__name__}.")
    if not isinstance(shape, (list, tuple)):
        raise TypeError(f"For 'shape', the type must be tuple or list, but got {type(shape).__name__}.")
    for dim in shape:
        _checks.non_negative_int(dim, "shape")
    return layout.slices(shape)


def verify_checkpoint(checkpoints_dir, strategy_file, check_replicas=False) -> dict:
    """Checks ``checkpoints_dir/rank_<r>/`` against its strategy without raising for faults:
    ``{"ok", "files", "parameters", "slices", "replica_pairs", "faults": [{"file",
    "tensor", "rule"}]}``. ``check_replicas`` also compares every replica's bytes."""
    return _tessera.verify_checkpoint(_checks.path(checkpoints_dir, "checkpoints_dir"),
                                      _checks.path(strategy_file, "strategy_file"),
                                      replicas=_checks.flag(check_replicas, "check_replicas"))
