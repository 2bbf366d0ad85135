"""``mindspore.parallel.Layout``: a device matrix with named axes, mapped onto a tensor's dims."""

from __future__ import annotations

import copy
from typing import Optional, Tuple, Union

from .. import _checks, _tessera

#: One ``Layout.__call__`` entry: an alias, ``"None"``, or a tuple of aliases (multi-axis dim).
DimEntry = Union[str, Tuple[str, ...]]


class Layout:
    """MindSpore's ``Layout(device_matrix, alias_name, rank_list=None)``.

    ``layout("dp", "mp")`` returns a copy carrying the tensor map; ``to_dict()`` returns
    ``{device_matrix, tensor_map, interleaved_parallel, alias_name, rank_list}`` as MindSpore
    does. Type errors raise ``TypeError`` and rule violations ``ValueError`` with MindSpore's
    messages; the rules are checked by Tessera's layout algebra (the ``layout`` crate).
    """

    def __init__(self, device_matrix: Tuple[int, ...], alias_name: Tuple[str, ...],
                 rank_list: Optional[list] = None) -> None:
        if not isinstance(device_matrix, tuple):
            raise TypeError(f"device_matrix must be tuple type, but got:{type(device_matrix)}")
        if not isinstance(alias_name, tuple):
            raise TypeError(f"alias_name must be tuple type, but got:{type(alias_name)}")
        for dim in device_matrix:
            if isinstance(dim, bool) or not isinstance(dim, int):
                raise TypeError(f"The element of device_matrix must be int type, but got:{type(dim)}")
        for alias in alias_name:
            if not isinstance(alias, str):
                raise TypeError(f"The element of alias_name must be string type, but got:{type(alias)}")
        if rank_list is not None:
            if not isinstance(rank_list, list):
                raise TypeError(f"The rank_list should be a list, but got {type(rank_list).__name__}.")
            for rank in rank_list:
                if isinstance(rank, bool) or not isinstance(rank, int):
                    raise TypeError(f"The element of rank_list should be int, but got {type(rank).__name__}.")
        # Values the layout algebra cannot even receive (it takes sizes and ranks as unsigned
        # 64-bit ints): named here, where they were an OverflowError naming nothing.
        for i, dim in enumerate(device_matrix):
            if dim < 1:
                raise ValueError(f"device_matrix {device_matrix}: axis {i} has size {dim}; every "
                                 "axis needs at least one device")
            if dim > _checks.MAX_INT:
                raise ValueError(f"device_matrix {device_matrix}: axis {i} has size {dim}, above "
                                 "2**63 - 1")
        for rank in rank_list or ():
            if not 0 <= rank <= _checks.MAX_INT:
                raise ValueError(f"rank_list: rank {rank} is out of range (ranks are ints from 0 "
                                 "to 2**63 - 1)")
        # Every value rule (lengths, duplicates, 'None', interleaved_parallel last, rank_list
        # length) is checked by the layout algebra, with MindSpore's messages.
        _tessera.layout_to_dict(list(device_matrix), list(alias_name), rank_list, [])
        self._device_shape = device_matrix
        self._alias_name = alias_name
        self._rank_list = list(rank_list) if rank_list is not None else None
        self._tensor_map: Optional[list] = None

    def __call__(self, *tensor_map: DimEntry) -> "Layout":
        """Set ``tensor_map`` (per tensor dim an alias, ``"None"`` or a tuple of aliases) on this
        layout, as MindSpore does, and return a copy of it."""
        entries = []
        for entry in tensor_map:
            if isinstance(entry, str):
                entries.append(entry)
            elif isinstance(entry, tuple) and all(isinstance(a, str) for a in entry):
                entries.append(list(entry))
            else:
                # MindSpore looks every entry (and tuple item) up in alias_name, so anything
                # else is its ValueError "The axis ... is not found in ...".
                bad = next((a for a in entry if not isinstance(a, str)), entry) \
                    if isinstance(entry, tuple) else entry
                raise ValueError(
                    f"The axis {bad!r} is not found in {self._alias_name}: an element of "
                    f"tensor_map must be an alias name, 'None' or a tuple of them, but got "
                    f"{type(bad).__name__}")
        self._check(entries)
        # MindSpore's __call__ sets the map on this layout too and returns a copy of it, so
        # ``layout("dp", "mp")`` followed by ``layout.to_dict()`` works there (and here).
        self._tensor_map = entries
        return copy.deepcopy(self)

    def _check(self, entries: list) -> dict:
        return _tessera.layout_to_dict(list(self._device_shape), list(self._alias_name),
                                       self._rank_list, entries)

    def to_dict(self) -> dict:
        """``{device_matrix, tensor_map, interleaved_parallel, alias_name, rank_list}``;
        ValueError before ``__call__``, as in MindSpore."""
        if self._tensor_map is None:
            raise ValueError("The tensor_map of layout is None")
        result = self._check(self._tensor_map)
        # MindSpore's tensor_map keeps the shape of the call: a tuple entry stays a tuple (one
        # alias, none, or with 'None' items as -1), a str entry is one int.
        names = list(self._alias_name)

        def value(alias: str) -> int:
            return -1 if alias == "None" else len(names) - 1 - names.index(alias)

        result["tensor_map"] = tuple(
            tuple(value(a) for a in entry) if isinstance(entry, list) else value(entry)
            for entry in self._tensor_map)
        return result

    def slices(self, shape) -> dict:
        """Every rank's slice of a tensor of ``shape`` under this layout (see
        :func:`tessera.parallel.layout_slices`)."""
        if self._tensor_map is None:
            raise ValueError("The tensor_map of layout is None")
        if not isinstance(shape, (list, tuple)):
            raise TypeError(f"For 'shape', the type must be tuple or list, but got {type(shape).__name__}.")
        shape = [_checks.non_negative_int(dim, "shape") for dim in shape]
        return _tessera.layout_slices(list(self._device_shape), list(self._alias_name),
                                      self._rank_list, self._tensor_map, shape)

    def __repr__(self) -> str:
        return (f"Layout(device_matrix={self._device_shape!r}, alias_name={self._alias_name!r}, "
                f"rank_list={self._rank_list!r}, tensor_map={self._tensor_map!r})")
