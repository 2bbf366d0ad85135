"""Checkpoints while training: MindSpore's ``CheckpointConfig`` and ``ModelCheckpoint`` over the
engine's periodic checkpoint sets (``output.save_checkpoint_steps``,
``output.save_checkpoint_seconds``, ``output.keep_checkpoint_max``), and
``load_checkpoint`` of such sets (and of single files), ``load_param_into_net`` and
``save_checkpoint``.

A Tessera checkpoint is a *set*: a directory with every rank's piece
(``rank_<r>/checkpoint_<r>.safetensors``), the strategy (``strategy.json``), the loop's state
(``train_state.json``) and a commit marker (``tessera_set.json``) — not one ``.ckpt`` file.
``ModelCheckpoint`` names each set as MindSpore names its files, without the suffix:
``<directory>/<prefix>-<epoch>_<step in epoch>``.
"""

import glob
import os
import re
import shutil

import numpy as np

from .. import _checks, _context
from .._tessera import CheckpointIOError
from .callback import Callback

__all__ = ["CheckpointConfig", "ModelCheckpoint", "load_checkpoint", "load_param_into_net",
           "save_checkpoint"]

_SET_MARKER = "tessera_set.json"
_PERIODIC = re.compile(r"^checkpoint_step_(\d+)$")


class CheckpointConfig:
    """MindSpore's ``CheckpointConfig``: when ``ModelCheckpoint`` saves and how many sets it
    keeps. ``save_checkpoint_steps``: every this many global steps; ``save_checkpoint_seconds``:
    when this many seconds passed since the last save (used only when
    ``save_checkpoint_steps`` is 0 or None, as in MindSpore); ``keep_checkpoint_max``: the
    newest sets kept. ``keep_checkpoint_per_n_minutes``, ``append_info``, ``enc_key``,
    ``exception_save``, ``crc_check``, ``remove_redundancy``, ``saved_network``,
    ``async_save`` and ``integrated_save=False`` are not supported (a ``ValueError`` naming
    them); the switches ``integrated_save``, ``async_save`` (also ``"thread"`` or
    ``"process"``), ``exception_save``, ``crc_check`` and ``remove_redundancy`` must be bools
    (a ``TypeError`` naming the switch: ``"False"`` is not off); ``format`` is the engine's
    (safetensors pieces in a set)."""

    def __init__(self, save_checkpoint_steps=1, save_checkpoint_seconds=0, keep_checkpoint_max=5,
                 keep_checkpoint_per_n_minutes=0, integrated_save=True, async_save=False,
                 saved_network=None, append_info=None, enc_key=None, enc_mode="AES-GCM",
                 exception_save=False, crc_check=False, remove_redundancy=False, format="ckpt",
                 **kwargs):
        # The switches are bools (an np.bool_ as its value), judged by value, not truthiness:
        # a string such as "False" is a TypeError naming the switch, as for every other flag.
        # async_save also takes MindSpore's "thread" and "process" (both switch it on).
        if not (isinstance(async_save, str) and async_save in ("thread", "process")):
            async_save = _checks.flag(async_save, "async_save")
        integrated_save, exception_save, crc_check, remove_redundancy = (
            _checks.flag(integrated_save, "integrated_save"),
            _checks.flag(exception_save, "exception_save"), _checks.flag(crc_check, "crc_check"),
            _checks.flag(remove_redundancy, "remove_redundancy"))
        unsupported = {
            "keep_checkpoint_per_n_minutes": keep_checkpoint_per_n_minutes not in (0, None),
            "integrated_save": not integrated_save, "async_save": async_save is not False,
            "saved_network": saved_network is not None, "append_info": append_info is not None,
            "enc_key": enc_key is not None, "exception_save": exception_save,
            "crc_check": crc_check, "remove_redundancy": remove_redundancy}
        unsupported.update({k: True for k in kwargs})
        named = sorted(k for k, bad in unsupported.items() if bad)
        if named:
            raise ValueError(f"CheckpointConfig: {named} are not supported (the engine saves "
                             "whole sets every save_checkpoint_steps or save_checkpoint_seconds "
                             "and keeps keep_checkpoint_max of them)")
        if format not in ("ckpt", "safetensors"):
            raise ValueError(f"For 'format', the value must be 'ckpt' or 'safetensors', but got "
                             f"{format!r}.")
        steps = None if save_checkpoint_steps in (0, None) else _checks.positive_int(
            save_checkpoint_steps, "save_checkpoint_steps")
        seconds = None if save_checkpoint_seconds in (0, None) else _checks.positive_int(
            save_checkpoint_seconds, "save_checkpoint_seconds")
        if steps is None and seconds is None:
            raise ValueError("CheckpointConfig: save_checkpoint_steps and save_checkpoint_seconds "
                             "are both 0: nothing would be saved")
        self.save_checkpoint_steps = steps
        self.save_checkpoint_seconds = None if steps is not None else seconds
        self.keep_checkpoint_max = _checks.positive_int(keep_checkpoint_max,
                                                        "keep_checkpoint_max")
        self.keep_checkpoint_per_n_minutes = None

    def _recipe(self):
        """The engine's ``[output]`` keys."""
        out = {"keep_checkpoint_max": self.keep_checkpoint_max}
        if self.save_checkpoint_steps is not None:
            out["save_checkpoint_steps"] = self.save_checkpoint_steps
        if self.save_checkpoint_seconds is not None:
            out["save_checkpoint_seconds"] = self.save_checkpoint_seconds
        return out


def _run_recipe(optimizer, callbacks, names, end_step):
    """The engine keys of a ``Model.train`` beyond ``engine_config``'s, as ``{"train": {...},
    "output": {...}}``: the optimizer's (schedule, weight-decay filter, clipping) and the
    checkpoint callback's, for the traced trainable parameters ``names`` (``{id(param):
    name}``) and a run to global step ``end_step``."""
    recipe = {"train": optimizer._train_keys(names, end_step), "output": {}}
    savers = [cb for cb in callbacks if isinstance(cb, ModelCheckpoint)]
    if len(savers) > 1:
        raise ValueError(f"Model.train: {len(savers)} ModelCheckpoint callbacks; the engine saves "
                         "on one schedule, so give one")
    for cb in savers:
        recipe["output"].update(cb._recipe())
    return recipe


def _is_set(path):
    return os.path.isfile(os.path.join(path, _SET_MARKER))


def _io_error(path, what, error):
    """A ``CheckpointIOError`` for the OS error ``error`` (an ``OSError``, ``shutil.Error``
    included) met while ``what`` ``path``, with the ``file``, ``tensor`` and ``rule``
    attributes the library's errors carry."""
    failures = error.args[0] if isinstance(error, shutil.Error) and error.args else None
    if isinstance(failures, list) and failures:
        _, dst, why = failures[0]  # copytree's (source, destination, reason) per file
        rule = f"{dst}: {why}"
    else:
        rule = str(error)
    err = CheckpointIOError(f"{what} {path}: {rule}")
    err.file, err.tensor, err.rule = path, None, rule
    if getattr(error, "errno", None) is not None:
        err.errno = error.errno
    return err


def _copy_set(source, staging, move):
    """Set ``source`` as the new directory ``staging``: renamed when ``move`` and on the same
    filesystem, else copied (``source`` stays; the caller removes it)."""
    if move:
        try:
            os.rename(source, staging)
            return
        except OSError:
            pass  # another filesystem: copied below
    shutil.copytree(source, staging)


class ModelCheckpoint(Callback):
    """MindSpore's ``ModelCheckpoint(prefix='CKP', directory=None, config=None)``: in
    ``Model.train``'s ``callbacks``, the engine saves checkpoint sets while training as
    ``config`` (a ``CheckpointConfig``, default ``CheckpointConfig()``) says, and each set
    appears in ``directory`` (default: the current directory) as
    ``<prefix>-<epoch>_<step in epoch>`` (a set directory; see :func:`load_checkpoint`),
    within a step of being saved; at the end of training the final weights are saved too
    (unless the last step's set already holds them), as MindSpore's does. Only the newest
    ``keep_checkpoint_max`` sets of this callback's prefix are kept. When ``directory`` already
    holds sets of ``prefix``, the prefix becomes ``<prefix>_1`` (``_2``, …), as in MindSpore.
    One ModelCheckpoint per ``train``. Under ``tessera launch`` rank 0 moves and removes the
    sets (every rank's pieces are in each)."""

    def __init__(self, prefix="CKP", directory=None, config=None):
        if not isinstance(prefix, str) or not prefix or "/" in prefix or os.sep in prefix:
            raise ValueError(f"For 'prefix', the value must be a non-empty str without a path "
                             f"separator, but got {prefix!r}.")
        if config is None:
            config = CheckpointConfig()
        if not isinstance(config, CheckpointConfig):
            raise TypeError(f"For 'config', the type must be CheckpointConfig, but got "
                            f"{type(config).__name__}.")
        directory = os.path.abspath(_checks.path(directory, "directory")
                                    if directory is not None else os.getcwd())
        os.makedirs(directory, exist_ok=True)
        base, n = prefix, 0
        while any(_name_of(e, prefix) for e in os.listdir(directory)):
            n += 1
            prefix = f"{base}_{n}"
        self._prefix, self._directory, self._config = prefix, directory, config
        self._published = []  # set directories written, oldest first
        self._names = {}      # engine global step -> (epoch, step in epoch), this train
        self._this_run = set()  # sets written by this train

    @property
    def latest_ckpt_file_name(self):
        """The newest set written (MindSpore's name of the attribute)."""
        return self._published[-1] if self._published else None

    def _recipe(self):
        return self._config._recipe()

    def on_train_begin(self, run_context):
        """Starts the record of this train's steps and sets."""
        self._names, self._this_run = {}, set()

    def on_train_step_end(self, run_context):
        """Records the step's epoch and step in epoch; publishes the sets saved so far."""
        p = run_context.original_args()
        self._names[p._global_step] = (p.cur_epoch_num, (p.cur_step_num - 1) % p.batch_num + 1)
        self._publish_periodic(p._output_dir)

    def on_train_end(self, run_context):
        """Publishes the last sets and, unless the last step's set holds them, the final
        weights."""
        p = run_context.original_args()
        self._publish_periodic(p._output_dir)
        final = getattr(p, "_final_set", None)
        if final is not None and self._names and _context._STATE["rank"] == 0:
            last = max(self._names)
            target = self._target(last)
            if target not in self._this_run:
                self._publish(final, target, move=False)
                self._prune()

    def _target(self, global_step):
        epoch, step = self._names.get(global_step, (0, global_step))
        return os.path.join(self._directory, f"{self._prefix}-{epoch}_{step}")

    def _replace(self, target):
        """``target``, emptied: a set of the same name (an earlier ``train``'s) is replaced,
        as MindSpore replaces a checkpoint file of the same name."""
        if target in self._published:
            self._published.remove(target)
        if os.path.exists(target):
            shutil.rmtree(target)
        return target

    def _publish(self, source, target, move):
        """Set ``source`` published as ``target`` (in ``directory``) at once: copied (or, when
        ``move`` and on the same filesystem, renamed) into a hidden staging directory beside
        it, then renamed into place, so ``target`` never holds part of a set. A failure removes
        the staging directory and is a ``CheckpointIOError`` naming the set."""
        staging = os.path.join(self._directory, f".{os.path.basename(target)}.staging")
        try:
            shutil.rmtree(staging, ignore_errors=True)  # a killed run's
            _copy_set(source, staging, move)
            os.rename(staging, self._replace(target))
        except OSError as e:  # shutil.Error included
            shutil.rmtree(staging, ignore_errors=True)
            raise _io_error(target, "ModelCheckpoint: publishing the checkpoint set", e) from e
        if move:
            shutil.rmtree(source, ignore_errors=True)
        self._published.append(target)

    def _publish_periodic(self, output_dir):
        """Moves the engine's committed periodic sets from the run's directory into
        ``directory`` under their MindSpore names, then keeps the newest
        ``keep_checkpoint_max``."""
        if output_dir is None or not os.path.isdir(output_dir) or _context._STATE["rank"] != 0:
            return
        found = sorted((int(m.group(1)), e) for e in os.listdir(output_dir)
                       if (m := _PERIODIC.match(e)) and _is_set(os.path.join(output_dir, e)))
        for step, entry in found:
            target = self._target(step)
            self._publish(os.path.join(output_dir, entry), target, move=True)
            self._this_run.add(target)
        if found:
            self._prune()

    def _prune(self):
        keep = self._config.keep_checkpoint_max
        while len(self._published) > keep:
            shutil.rmtree(self._published.pop(0), ignore_errors=True)


def _name_of(entry, prefix):
    """Whether directory entry ``entry`` is a checkpoint of ``prefix`` (``<prefix>-…``)."""
    return entry.startswith(f"{prefix}-")


def _rank_files(set_dir):
    files = glob.glob(os.path.join(set_dir, "rank_*", "*.safetensors")) + \
        glob.glob(os.path.join(set_dir, "rank_*", "*.ckpt"))
    by_rank = {}
    for f in files:
        rank = int(re.search(r"rank_(\d+)", os.path.relpath(f, set_dir)).group(1))
        if rank in by_rank:
            raise ValueError(f"load_checkpoint: {set_dir}/rank_{rank} holds more than one "
                             "checkpoint file")
        by_rank[rank] = f
    if sorted(by_rank) != list(range(len(by_rank))) or not by_rank:
        raise ValueError(f"load_checkpoint: {set_dir} is not a Tessera checkpoint set (it needs "
                         "rank_0/, rank_1/, … with one checkpoint file each and strategy.json)")
    return [by_rank[r] for r in range(len(by_rank))]


def load_checkpoint(ckpt_file_name, net=None, strict_load=False, filter_prefix=None,
                    dec_key=None, dec_mode="AES-GCM", specify_prefix=None, choice_func=None,
                    crc_check=False, remove_redundancy=False, format="ckpt"):
    """MindSpore's ``load_checkpoint``: the tensors of a Tessera checkpoint set (a directory
    ``ModelCheckpoint`` or ``save_checkpoint`` wrote) gathered whole from the ranks' pieces,
    as ``{name: Parameter}`` (each holding its value: ``asnumpy()``), optimizer state
    (``moments.fc1.weight``) and ``global_step`` included. A single ``.ckpt`` or
    ``.safetensors`` file is read as it is; a name ``<set>.ckpt`` (or ``.safetensors``) that
    does not exist, beside a set ``<set>``, reads the set (MindSpore's name of the file
    ``ModelCheckpoint`` saved). ``filter_prefix`` drops names with those prefixes,
    ``specify_prefix`` keeps only those, ``choice_func(name)`` keeps a name when true. With
    ``net``, the values are also loaded into it (``load_param_into_net(net, ...,
    strict_load)``)."""
    from .. import parallel
    from ..common.parameter import Parameter

    path = _checks.path(ckpt_file_name, "ckpt_file_name")
    _checks.flag(strict_load, "strict_load")
    if strict_load and net is None:
        raise ValueError("For 'load_checkpoint', strict_load=True applies only when 'net' is "
                         "given (a Cell to load the parameters into); without one nothing is "
                         "loaded.")
    if dec_key is not None or crc_check or remove_redundancy:
        raise ValueError("load_checkpoint: dec_key, crc_check and remove_redundancy are not "
                         "supported for Tessera checkpoint sets")
    stem, suffix = os.path.splitext(path)
    if not os.path.lexists(path) and suffix in (".ckpt", ".safetensors") and _is_set(stem):
        # MindSpore's name of what ModelCheckpoint saved (`lenet-1_4.ckpt`), which Tessera
        # saved as the set `lenet-1_4`
        path = stem
    if os.path.isdir(path):
        if not os.path.isfile(os.path.join(path, "strategy.json")):
            raise ValueError(f"load_checkpoint: {path} has no strategy.json; it is not a "
                             "Tessera checkpoint set")
        tensors = parallel.load_distributed_checkpoint(
            None, _rank_files(path), None, os.path.join(path, "strategy.json"))
    elif os.path.isfile(path):
        tensors = parallel.load_distributed_checkpoint(None, [path], None, None)
    elif os.path.exists(path):
        # A FIFO, a socket or a device: it exists, but holds no checkpoint to read (reading a
        # FIFO would wait for a writer).
        raise ValueError(f"load_checkpoint: {path} is neither a regular file nor a directory "
                         "(a FIFO, a socket or a device); it is not a checkpoint")
    else:
        raise ValueError(f"load_checkpoint: {path} does not exist")

    def prefixes(value):
        return () if value is None else ((value,) if isinstance(value, str) else tuple(value))

    drop, keep = prefixes(filter_prefix), prefixes(specify_prefix)
    out = {}
    for name, array in tensors.items():
        if name.startswith(drop) if drop else False:
            continue
        if keep and not name.startswith(keep):
            continue
        if choice_func is not None and not choice_func(name):
            continue
        out[name] = Parameter._holding(np.asarray(array), name)
    if net is not None:
        load_param_into_net(net, out, strict_load)
    return out


def load_param_into_net(net, parameter_dict, strict_load=False, remove_redundancy=False):
    """MindSpore's ``load_param_into_net``: every Parameter of ``net`` whose name is in
    ``parameter_dict`` (``{name: Parameter or array}``, e.g. ``load_checkpoint``'s) takes that
    value, and training starts from it (as ``Parameter(value)``: a ``Model`` that has not
    trained yet, or a new one; a Model that already trained continues from its own last
    checkpoint). Returns ``(param_not_load, ckpt_not_load)``: the network's names that took no
    value and the dict's names that went into no Parameter.

    ``strict_load=False`` (MindSpore's default) also loads a Parameter the dict holds under a
    prefix (``network.fc1.weight`` for ``fc1.weight``: MindSpore's rule, one prefix at a time,
    taken from the first dict name that ends with a name not loaded yet) and converts float16
    and float64 values to the Parameter's float32. ``strict_load=True`` loads exact names only
    and refuses a value whose dtype is not the Parameter's (a ``ValueError`` naming it). A
    shape that differs is always a ``ValueError``; a refused dict changes no Parameter."""
    from ..common.initializer import Values
    from ..nn.cell import Cell

    if not isinstance(net, Cell):
        raise TypeError(f"For 'net', the type must be Cell, but got {type(net).__name__}.")
    if not isinstance(parameter_dict, dict):
        raise TypeError(f"For 'parameter_dict', the type must be dict, but got "
                        f"{type(parameter_dict).__name__}.")
    if not isinstance(strict_load, bool):
        raise TypeError(f"For 'strict_load', the type must be bool, but got "
                        f"{type(strict_load).__name__}.")
    if not isinstance(remove_redundancy, bool):
        raise TypeError(f"For 'remove_redundancy', the type must be bool, but got "
                        f"{type(remove_redundancy).__name__}.")
    if remove_redundancy:
        raise ValueError("load_param_into_net: remove_redundancy is not supported")
    taken = {}  # net name -> (dict name, Parameter, Values)

    def take(name, key, p):
        value = parameter_dict[key]
        value = value.asnumpy() if hasattr(value, "asnumpy") else np.asarray(value)
        if tuple(value.shape) != tuple(p.shape):
            raise ValueError(f"load_param_into_net: {name} has shape {tuple(value.shape)} in "
                             f"the dict{'' if key == name else f' (as {key})'} and "
                             f"{tuple(p.shape)} in the network")
        if strict_load and value.dtype.kind == "f" and value.dtype != np.float32:
            raise ValueError(f"load_param_into_net: {name} is {value.dtype} in the dict and "
                             "float32 in the network; strict_load=True loads no value of "
                             "another type (strict_load=False converts it)")
        taken[name] = (key, p, Values(value, f"load_param_into_net: {name}"))

    params = list(net.parameters_and_names())
    for name, p in params:
        if name in parameter_dict:
            take(name, name, p)
    not_loaded = [name for name, _ in params if name not in taken]
    while not_loaded and not strict_load:
        # MindSpore's `_load_dismatch_prefix_params`: the prefix of the first dict name that
        # ends with a name not loaded yet, then every such name found under that prefix.
        prefix = next((key[:-len(name)] for name in not_loaded for key in parameter_dict
                       if key.endswith(name) and key != name), None)
        if prefix is None:
            break
        for name, p in params:
            if name in not_loaded and prefix + name in parameter_dict:
                take(name, prefix + name, p)
        not_loaded = [name for name, _ in params if name not in taken]
    # every entry checked: only now does any Parameter change (a refused dict changes none)
    for _, p, values in taken.values():
        p.init = values
        p._value = values.values.copy()
    used = {key for key, _, _ in taken.values()}
    return not_loaded, [n for n in parameter_dict if n not in used]


def save_checkpoint(save_obj, ckpt_file_name, integrated_save=True, async_save=False,
                    append_dict=None, enc_key=None, enc_mode="AES-GCM", choice_func=None,
                    crc_check=False, format="ckpt", **kwargs):
    """MindSpore's ``save_checkpoint``: ``save_obj`` — a Cell (its Parameters' values: trained,
    or given), a dict ``{name: Parameter, Tensor or array}`` or a list of ``{"name": ...,
    "data": ...}`` — written as one unsharded file, MindSpore's ``.ckpt`` or ``.safetensors``
    as ``format`` says (the suffix is added when missing). ``choice_func(name)`` keeps a name
    when true; ``append_dict`` adds ``{name: number or array}``. ``load_checkpoint`` reads it
    back. ``async_save``, ``enc_key``, ``crc_check`` and other options are not supported."""
    from .. import _tessera
    from ..common.parameter import Parameter, initial_values
    from ..nn.cell import Cell

    if async_save or enc_key is not None or crc_check or kwargs or integrated_save is not True:
        raise ValueError(f"save_checkpoint: async_save, enc_key, crc_check, "
                         f"integrated_save=False and {sorted(kwargs) or 'other options'} are "
                         "not supported")
    if format not in ("ckpt", "safetensors"):
        raise ValueError(f"For 'format', the value must be 'ckpt' or 'safetensors', but got "
                         f"{format!r}.")
    path = _checks.path(ckpt_file_name, "ckpt_file_name")
    if not path.endswith("." + format):
        path += "." + format
    if isinstance(save_obj, Cell):
        items = list(save_obj.parameters_and_names())
    elif isinstance(save_obj, dict):
        items = list(save_obj.items())
    elif isinstance(save_obj, list):
        items = []
        for i, d in enumerate(save_obj):
            if not isinstance(d, dict) or "name" not in d or "data" not in d:
                raise TypeError(f"For 'save_obj', item {i} of the list must be a dict "
                                f"{{'name': ..., 'data': ...}}, but got {d!r:.80}.")
            items.append((d["name"], d["data"]))
    else:
        raise TypeError(f"For 'save_obj', the type must be Cell, dict or list, but got "
                        f"{type(save_obj).__name__}.")
    if append_dict is not None:
        if not isinstance(append_dict, dict):
            raise TypeError(f"For 'append_dict', the type must be dict, but got "
                            f"{type(append_dict).__name__}.")
        items += list(append_dict.items())
    if choice_func is not None and not callable(choice_func):
        raise TypeError(f"For 'choice_func', the type must be callable, but got "
                        f"{type(choice_func).__name__}.")
    kept = []
    for name, value in items:
        _checks.text(name, "save_obj (a tensor name)")
        if choice_func is None or choice_func(name):
            kept.append((name, value))
    # Parameters not trained yet: the values training starts them from (the engine's
    # initializers under the current seed), as MindSpore saves a freshly built network's.
    params = [value for _, value in kept if isinstance(value, Parameter)]
    initial = {id(p): v for p, v in zip(params, initial_values(params))}
    tensors = []
    for name, value in kept:
        try:
            if id(value) in initial:
                array = initial[id(value)]
            else:
                array = value.asnumpy() if hasattr(value, "asnumpy") else np.asarray(value)
        except ValueError as e:  # a ragged list: numpy's message names no tensor
            raise ValueError(f"save_checkpoint: tensor {name}: {e}") from None
        if array.ndim == 0:
            array = array.reshape(1)  # MindSpore stores a scalar as shape [1]
        tensors.append((name, np.ascontiguousarray(array)))
    _tessera.save_tensors(path, tensors)
