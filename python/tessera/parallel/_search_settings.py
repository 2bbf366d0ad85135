"""``mindspore.parallel``'s settings of MindSpore's own strategy searches:
``set_algo_parameters``, ``get_algo_parameters``, ``reset_algo_parameters`` and
``set_op_strategy_config``. Tessera's searches (``AutoParallel(net, "sharding_propagation")``
and ``"recursive_programming"``) have none of these knobs, and the operator strategy file is a
switch of ``AutoParallel``, not of a process-wide context; so setting or reading one raises
``NotImplementedError`` naming what to use instead (a switch silently ignored would train
another plan than the script asks for). A key MindSpore does not know is MindSpore's
``ValueError``."""

__all__ = ["get_algo_parameters", "reset_algo_parameters", "set_algo_parameters",
           "set_op_strategy_config"]

#: The keys of MindSpore's ``set_algo_parameters``.
ALGO_KEYS = ("fully_use_devices", "elementwise_op_strategy_follow", "enable_algo_approxi",
             "algo_approxi_epsilon", "tensor_slice_align_enable", "tensor_slice_align_size")

_SEARCHES = ("Tessera's strategy searches are chosen with "
             "tessera.parallel.auto_parallel.AutoParallel(net, parallel_mode="
             "'sharding_propagation' or 'recursive_programming') and take no algorithm "
             "parameters; set the strategies you need with shard (they fix the search).")


def set_algo_parameters(**kwargs):
    """MindSpore's ``set_algo_parameters(**kwargs)``: an unknown key is a ``ValueError``;
    a known one (``fully_use_devices``, ``elementwise_op_strategy_follow``,
    ``enable_algo_approxi``, ``algo_approxi_epsilon``, ``tensor_slice_align_enable``,
    ``tensor_slice_align_size``) raises ``NotImplementedError``: the engine's searches have no
    such parameter."""
    for key in kwargs:
        if key not in ALGO_KEYS:
            raise ValueError(f"Set context keyword {key} is not recognized!")
    if kwargs:
        raise NotImplementedError(f"set_algo_parameters({', '.join(sorted(kwargs))}): "
                                  f"{_SEARCHES}")


def get_algo_parameters(attr_key):
    """MindSpore's ``get_algo_parameters(attr_key)``: an unknown key is a ``ValueError``; a
    known one raises ``NotImplementedError`` (the engine's searches have no such parameter)."""
    if attr_key not in ALGO_KEYS:
        raise ValueError(f"Get context keyword {attr_key} is not recognized!")
    raise NotImplementedError(f"get_algo_parameters({attr_key!r}): {_SEARCHES}")


def reset_algo_parameters():
    """MindSpore's ``reset_algo_parameters()``: the algorithm parameters back to their
    defaults. None can be set in Tessera (``set_algo_parameters`` raises), so they are at
    their defaults already and there is nothing to do."""


def set_op_strategy_config(mode="SAVE", path=""):
    """MindSpore's ``set_op_strategy_config(mode="SAVE", path="")``: ``mode`` must be
    ``"SAVE"`` or ``"LOAD"`` and ``path`` a str (MindSpore's ``TypeError``/``ValueError``);
    then ``NotImplementedError`` naming ``AutoParallel``'s switches, which do this per
    network: ``save_operator_strategy_file(path)`` and ``load_operator_strategy_file(path)``."""
    if not isinstance(mode, str):
        raise TypeError(f"For 'set_op_strategy_config', the type of 'mode' must be str, but got "
                        f"{type(mode).__name__}.")
    if mode not in ("SAVE", "LOAD"):
        raise ValueError(f"For 'set_op_strategy_config', the 'mode' must be 'SAVE' or 'LOAD', "
                         f"but got {mode!r}.")
    if not isinstance(path, str):
        raise TypeError(f"For 'set_op_strategy_config', the type of 'path' must be str, but got "
                        f"{type(path).__name__}.")
    method = "save_operator_strategy_file" if mode == "SAVE" else "load_operator_strategy_file"
    raise NotImplementedError(
        f"set_op_strategy_config(mode={mode!r}): Tessera has no process-wide operator strategy "
        f"setting; call AutoParallel(net, parallel_mode=...).{method}(path) on the network "
        "Model.train trains (the engine's parallel." + method + ").")
