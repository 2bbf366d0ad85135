"""``tessera.dataset``: MindSpore's ``mindspore.dataset``, first slice (issue 34):
``NumpySlicesDataset(data, column_names=None, ..., shuffle=None)`` with ``.batch(batch_size,
drop_remainder)``. The first column is the network's input (cast to float32), the second its
label (cast to int32, one per sample). The engine reads the batches (each rank its rows), in a
seeded shuffled order when ``shuffle`` (the default)."""

import numpy as np

__all__ = ["NumpySlicesDataset"]


class NumpySlicesDataset:
    """Samples sliced from numpy arrays along their first dim. ``data``: a dict of columns, a
    tuple or list of arrays, or one array."""

    def __init__(self, data, column_names=None, num_samples=None, num_parallel_workers=1,
                 shuffle=None, sampler=None, num_shards=None, shard_id=None):
        if sampler is not None or num_shards is not None or shard_id is not None:
            raise ValueError("NumpySlicesDataset: sampler, num_shards and shard_id are not "
                             "supported yet (the engine gives each rank its rows)")
        if isinstance(data, dict):
            names, columns = list(data.keys()), list(data.values())
        elif isinstance(data, tuple):
            names, columns = None, list(data)
        else:
            names, columns = None, [data]
        columns = [np.asarray(c) for c in columns]
        if column_names is not None:
            names = [column_names] if isinstance(column_names, str) else list(column_names)
        if names is None:
            names = [f"column_{i}" for i in range(len(columns))]
        if len(names) != len(columns):
            raise ValueError(f"NumpySlicesDataset: {len(names)} column name(s) for "
                             f"{len(columns)} column(s)")
        n = {len(c) for c in columns}
        if len(n) != 1:
            raise ValueError(f"NumpySlicesDataset: columns have different numbers of samples "
                             f"{[len(c) for c in columns]}")
        if num_samples is not None:
            columns = [c[:num_samples] for c in columns]
        self.column_names = names
        self._columns = columns
        self.shuffle = True if shuffle is None else bool(shuffle)
        self.batch_size = None
        self.drop_remainder = False

    def batch(self, batch_size, drop_remainder=False, num_parallel_workers=None, **kwargs):
        """Batches of ``batch_size`` samples. The engine's batches have one size: with
        ``drop_remainder=False`` the sample count must be a multiple of ``batch_size``."""
        if kwargs:
            raise ValueError(f"batch: {sorted(kwargs)} not supported yet")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch: batch_size must be a positive int, got {batch_size!r}")
        n = len(self._columns[0])
        if not drop_remainder and n % batch_size:
            raise ValueError(f"batch: {n} samples do not split into batches of {batch_size}; "
                             "use drop_remainder=True (the engine's batches have one size)")
        out = NumpySlicesDataset.__new__(NumpySlicesDataset)
        out.__dict__.update(self.__dict__)
        out.batch_size, out.drop_remainder = batch_size, bool(drop_remainder)
        return out

    def get_dataset_size(self):
        """The number of batches (samples when unbatched)."""
        n = len(self._columns[0])
        return n // self.batch_size if self.batch_size else n

    def get_col_names(self):
        """The column names."""
        return list(self.column_names)

    def _arrays(self):
        """(inputs float32, labels int32) for the engine."""
        if len(self._columns) != 2:
            raise ValueError(f"Model.train needs two columns (data, label); this dataset has "
                             f"{self.column_names}")
        data, label = self._columns
        label = np.asarray(label)
        if label.ndim == 2 and label.shape[1] == 1:
            label = label[:, 0]
        if label.ndim != 1:
            raise ValueError(f"the label column {self.column_names[1]} has shape {label.shape}; "
                             "one class index per sample is needed")
        return (np.ascontiguousarray(data, dtype=np.float32),
                np.ascontiguousarray(label, dtype=np.int32))
