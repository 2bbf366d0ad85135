"""``mindspore.parallel.merge_sliced_parameter``: the slices of one parameter, one per rank,
put back together by the parameter's layout."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from .. import _checks, _tessera

_FUNC = "For 'merge_sliced_parameter'"


def _dims(layout: Any, key: str, name: str) -> List[int]:
    """``layout[key][0]["dim"]`` (``build_searched_strategy``'s form) as a list of ints."""
    try:
        entries = layout[key]
        dims = list(entries[0]["dim"]) if entries else []
    except (KeyError, IndexError, TypeError) as e:
        raise ValueError(f"{_FUNC}, the layout of parameter {name!r} in 'strategy' has no "
                         f"{key!r} of the form [{{'dim': [...]}}] (build_searched_strategy's "
                         f"form); please make sure that 'strategy' is correct.") from e
    out = []
    for d in dims:
        d = _checks.plain(d)
        if isinstance(d, bool) or not isinstance(d, int):
            raise ValueError(f"{_FUNC}, the {key} of parameter {name!r} in 'strategy' must hold "
                             f"ints, but got {d!r}; please make sure that 'strategy' is correct.")
        out.append(d)
    return out


def _int_field(layout: Any, key: str, name: str) -> int:
    value = _checks.plain(layout.get(key, 0) if isinstance(layout, dict) else None)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        also = " (or -1, the whole replica group)" if key == "opt_weight_shard_size" else ""
        raise ValueError(f"{_FUNC}, the {key} of parameter {name!r} in 'strategy' must be an "
                         f"int >= 0{also}, but got {value!r}; please make sure that 'strategy' "
                         "is correct.")
    return value


def _tensor_map(layout: Any, name: str) -> List[List[int]]:
    """Per tensor dim, the device-matrix axes (counted from the right) that split it. A
    strategy's ``tensor_map`` is one entry holding one value per dim (the plain form), or, as
    MindSpore reads it whenever there is more than one entry, one entry per dim holding that
    dim's axes (the extended form of multi-axis layouts; empty entries are dropped)."""
    try:
        entries = layout["tensor_map"]
        count = len(entries)
    except (KeyError, TypeError) as e:
        raise ValueError(f"{_FUNC}, the layout of parameter {name!r} in 'strategy' has no "
                         "'tensor_map' of the form [{'dim': [...]}] (build_searched_strategy's "
                         "form); please make sure that 'strategy' is correct.") from e
    if count <= 1:
        return [[m] for m in _dims(layout, "tensor_map", name)]
    out = []
    for index in range(count):
        dims = _dims({"tensor_map": entries[index:]}, "tensor_map", name)
        if dims:
            out.append(dims)
    return out


def _block_coordinates(dev_matrix: List[int], tensor_map: List[List[int]], name: str) -> tuple:
    """Per rank (in rank order), the block of the tensor it holds: a coordinate per tensor dim,
    from the engine's layout algebra; and the number of blocks per dim."""
    n = len(dev_matrix)
    if n == 0 or any(d < 1 for d in dev_matrix):
        raise ValueError(f"{_FUNC}, the dev_matrix of parameter {name!r} in 'strategy' must be "
                         f"a non-empty list of sizes >= 1, but got {dev_matrix}.")
    aliases = [f"axis{i}" for i in range(n)]
    entries, factors = [], []
    for axes in tensor_map:
        dim_aliases, factor = [], 1
        for m in axes:
            if m == -1:
                continue
            if not 0 <= m < n:
                raise ValueError(
                    f"{_FUNC}, the tensor_map of parameter {name!r} in 'strategy' holds {m}, "
                    "but a tensor_map value is -1 or a device-matrix axis counted from the "
                    f"right (0 to {n - 1}).")
            dim_aliases.append(aliases[n - 1 - m])
            factor *= dev_matrix[n - 1 - m]
        entries.append(dim_aliases if dim_aliases else "None")
        factors.append(factor)
    try:
        # A tensor of shape `factors` has one element per block: each rank's offset is the
        # coordinate of its block.
        slices = _tessera.layout_slices(dev_matrix, aliases, None, entries, factors)["slices"]
    except ValueError as e:
        shown = [axes[0] if len(axes) == 1 else axes for axes in tensor_map]
        raise ValueError(f"{_FUNC}, the layout of parameter {name!r} in 'strategy' (dev_matrix "
                         f"{dev_matrix}, tensor_map {shown}) breaks a layout rule: "
                         f"{e}") from e
    order = sorted(slices, key=lambda s: s["rank"])
    return [tuple(s["offset"]) for s in order], factors


def merge_sliced_parameter(sliced_parameters, strategy=None):
    """MindSpore's ``merge_sliced_parameter(sliced_parameters, strategy=None)``: one
    parameter's slices (``tessera.Parameter``s holding values, one per rank, in rank order)
    merged into one ``Parameter`` with the whole value.

    Without ``strategy`` the slices are concatenated along axis 0. With ``strategy``
    (``{name: layout}``, as :func:`build_searched_strategy` returns it) each rank's block of
    the tensor comes from the layout's ``dev_matrix`` and ``tensor_map`` (Tessera's layout
    algebra), with ``param_split_shape`` giving uneven row blocks; there must be one slice per
    device of ``dev_matrix``. Errors are MindSpore's: ``TypeError`` for a non-list or a
    non-Parameter, ``ValueError`` for slices that do not fit, ``KeyError`` for a parameter
    missing from ``strategy``. Differences: replicas (ranks holding the same block) that hold
    different values are a ``ValueError`` naming the ranks (MindSpore keeps the last one's); a
    layout with optimizer sharding (``opt_weight_shard_size`` > 1 or -1) is merged from the
    optimizer-shard pieces each rank saved (MindSpore merges them as if they were whole
    blocks); an embedding ``field`` is a ``ValueError`` (not supported).
    """
    import numpy as np

    from ..common.parameter import Parameter

    if not isinstance(sliced_parameters, list):
        raise TypeError(f"{_FUNC}, the argument 'sliced_parameters' should be list, but got "
                        f"{type(sliced_parameters)}.")
    if not sliced_parameters:
        raise ValueError(f"{_FUNC}, the argument 'sliced_parameters' should not be empty.")
    if strategy is not None and not isinstance(strategy, dict):
        raise TypeError(f"{_FUNC}, the argument 'strategy' should be dict, but got "
                        f"{type(strategy)}.")
    for index, parameter in enumerate(sliced_parameters):
        if not isinstance(parameter, Parameter):
            raise TypeError(f"{_FUNC}, the element in 'sliced_parameters' should be "
                            f"'Parameter', but got {type(parameter)} at index {index}.")
    name = sliced_parameters[0].name
    data = [p.asnumpy() for p in sliced_parameters]  # a Parameter without a value raises
    first = data[0]
    for index, (parameter, value) in enumerate(zip(sliced_parameters, data)):
        if parameter.name != name or value.ndim != first.ndim or \
                value.shape[1:] != first.shape[1:]:
            raise ValueError(
                f"{_FUNC}, please make sure that the elements in 'slice_parameters' have the "
                "same name, dimension length and shape except 0 axis. The name, dimension "
                f"length, shape except 0 axis should be {name}, {first.ndim}, {first.shape[1:]}, "
                f"but got name: {parameter.name}, dimension length: {value.ndim}, shape except "
                f"0 axis: {value.shape[1:]} at index {index}.")
        if value.dtype != first.dtype:
            raise ValueError(f"{_FUNC}, the slices of {name!r} must have one dtype, but index 0 "
                             f"is {first.dtype} and index {index} is {value.dtype}.")
    if not strategy:
        if first.ndim == 0:
            raise ValueError(f"{_FUNC}, the slices of {name!r} are scalars, which cannot be "
                             "concatenated along axis 0; give 'strategy'.")
        merged = np.concatenate(data)
    else:
        if name not in strategy:
            raise KeyError(f"{_FUNC}, the parameter name {name} should be a key in the "
                           "'strategy'. Please check 'sliced_parameter' and 'strategy'.")
        merged = _merge_with_layout(data, name, strategy[name])
    result = Parameter._holding(merged, name)
    result.requires_grad = sliced_parameters[0].requires_grad
    return result


def _merge_with_layout(data: list, name: str, layout: Any):
    import numpy as np

    if not isinstance(layout, dict):
        raise ValueError(f"{_FUNC}, the layout of parameter {name!r} in 'strategy' must be a "
                         f"dict (build_searched_strategy's form), but got "
                         f"{type(layout).__name__}; please make sure that 'strategy' is correct.")
    dev_matrix = _dims(layout, "dev_matrix", name)
    tensor_map = _tensor_map(layout, name)
    split_shape = _dims(layout, "param_split_shape", name) if layout.get(
        "param_split_shape") else []
    if _int_field(layout, "field", name) > 0:
        raise ValueError(f"{_FUNC}, parameter {name!r} has an embedding field size in "
                         "'strategy', which tessera.parallel does not merge; merge the "
                         "checkpoint files with unified_safetensors or convert_checkpoints.")
    # -1: the whole replica group (MindSpore's setting saved as it is)
    opt_size = -1 if _checks.plain(layout.get("opt_weight_shard_size")) == -1 else \
        _int_field(layout, "opt_weight_shard_size", name)
    device_count = 1
    for d in dev_matrix:
        device_count *= d
    if len(data) != device_count:
        raise ValueError(f"{_FUNC}, the length of 'sliced_parameters' should be equal to "
                         f"device_count. The length of 'sliced_parameters' is {len(data)}, but "
                         f"device_count is {device_count}.")
    if len(tensor_map) != data[0].ndim:
        raise ValueError(f"{_FUNC}, the tensor_map of parameter {name!r} in 'strategy' has "
                         f"{len(tensor_map)} dims but its slices have {data[0].ndim}.")
    coords, factors = _block_coordinates(dev_matrix, tensor_map, name)
    slice_count = 1
    for f in factors:
        slice_count *= f
    if split_shape:
        if len(split_shape) != slice_count:
            raise ValueError(f"{_FUNC}, the param_split_shape length in strategy should be "
                             f"{slice_count}, but got {len(split_shape)}.")
    elif any(d.shape != data[0].shape for d in data):
        raise ValueError(f"{_FUNC}, the shape of every parameter in 'sliced_parameters' should "
                         "be the same when slice manner is even.")
    if opt_size not in (0, 1):
        if split_shape:
            raise ValueError(f"{_FUNC}, parameter {name!r} has both param_split_shape and "
                             "optimizer sharding in 'strategy', which MindSpore never saves.")
        coords, data, ranks = _gather_opt_shards(coords, data, opt_size, name)
    else:
        ranks = list(range(len(data)))
    blocks: Dict[tuple, Any] = {}
    holder: Dict[tuple, int] = {}
    for rank, coord, value in zip(ranks, coords, data):
        if split_shape:
            index = 0
            for c, f in zip(coord, factors):
                index = index * f + c
            if value.shape[0] != split_shape[index]:
                raise ValueError(f"{_FUNC}, the slice {index} should be {split_shape[index]} in "
                                 f"0 axis, but got {value.shape[0]}.")
        if coord in blocks:
            if not np.array_equal(blocks[coord], value, equal_nan=value.dtype.kind in "fc"):
                raise ValueError(f"{_FUNC}, ranks {holder[coord]} and {rank} hold the same block "
                                 f"{list(coord)} of {name!r} (replicas under the layout) but "
                                 "their values differ: the slices are not of this layout, or "
                                 "not in rank order.")
        else:
            blocks[coord], holder[coord] = value, rank
    if not factors:
        return np.array(blocks[()])

    def nested(prefix: tuple, dim: int):
        if dim == len(factors):
            return blocks[prefix]
        return [nested(prefix + (i,), dim + 1) for i in range(factors[dim])]

    try:
        return np.block(nested((), 0))
    except ValueError as e:
        raise ValueError(f"{_FUNC}, the slices of {name!r} do not fit together under its "
                         f"layout: {e}") from e


def _gather_opt_shards(coords: list, data: list, opt_size: int, name: str) -> tuple:
    """Optimizer sharding (``opt_weight_shard_size`` K, -1 for the whole group): the ranks
    holding one model-parallel block (its replica group G, ascending) are cut into runs of K
    consecutive ranks (all of G when K is -1 or at least |G|), and the i-th rank of a run holds
    the i-th of K equal pieces of the block's axis 0. Returns one (block coordinate, block)
    per run, in rank order of the runs' first ranks (the runs of a block are replicas), and
    each run's first rank."""
    import numpy as np

    groups: Dict[tuple, List[int]] = {}
    for rank, coord in enumerate(coords):
        groups.setdefault(coord, []).append(rank)
    runs = []
    for coord, ranks in groups.items():
        k = len(ranks) if opt_size == -1 or opt_size >= len(ranks) else opt_size
        if len(ranks) % k:
            raise ValueError(f"{_FUNC}, parameter {name!r}: opt_weight_shard_size {opt_size} "
                             f"does not divide its replica group of {len(ranks)} ranks "
                             f"{ranks}.")
        for start in range(0, len(ranks), k):
            run = ranks[start:start + k]
            pieces = [data[r] for r in run]
            if data[run[0]].ndim == 0 or any(p.shape != pieces[0].shape for p in pieces):
                raise ValueError(f"{_FUNC}, the optimizer-shard pieces of {name!r} held by "
                                 f"ranks {run} must have one shape with at least one dim, but "
                                 f"got {[p.shape for p in pieces]}.")
            runs.append((run[0], coord, np.concatenate(pieces)))
    runs.sort(key=lambda r: r[0])
    return ([coord for _, coord, _ in runs], [block for _, _, block in runs],
            [first for first, _, _ in runs])
