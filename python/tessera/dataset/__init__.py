"""``tessera.dataset``: MindSpore's ``mindspore.dataset`` (issue 34):
``NumpySlicesDataset(data, column_names=None, ..., shuffle=None)``,
``GeneratorDataset(source, column_names, ..., shuffle=None, num_samples=None)`` and
``MnistDataset(dataset_dir, usage=None, num_samples=None, shuffle=None)``, with
``.map(operations, input_columns)`` (``vision.Rescale``, ``vision.Normalize``,
``vision.HWC2CHW``, ``transforms.TypeCast``; applied in numpy to the whole column when ``map``
is called, once, never per training step), ``.shuffle(buffer_size)`` and
``.batch(batch_size, drop_remainder)``. Every dataset is held in memory as numpy columns. The
first column is the network's input (numbers, cast to float32), the second its label (integer
class indices, one per sample, cast to int32).

**Shuffling.** The engine reads the batches (each rank its rows) in an order it draws afresh
every epoch from ``tessera.set_seed``'s seed, when the dataset shuffles: ``shuffle=None``/``True``
(MindSpore's default) or ``.shuffle(buffer_size)``. The engine's shuffle is global (every
sample can land anywhere): MindSpore's ``.shuffle(buffer_size)`` with ``buffer_size`` at least
the dataset's size. A smaller ``buffer_size`` shuffles less in MindSpore; in Tessera the order
is still global. ``shuffle=False`` reads the samples in order every epoch."""

import os

import numpy as np

from . import transforms, vision
from .transforms import TensorOperation

__all__ = ["GeneratorDataset", "MnistDataset", "NumpySlicesDataset", "transforms", "vision"]


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
        for name, column in zip(names, columns):
            if column.ndim == 0:
                raise ValueError(f"NumpySlicesDataset: column {name!r} is a scalar "
                                 f"({column.dtype}); a column is sliced along its first dim, "
                                 "one entry per sample")
        for name, column in zip(names[1:], columns[1:]):
            if len(column) != len(columns[0]):
                raise ValueError(f"NumpySlicesDataset: column {name!r} has {len(column)} "
                                 f"samples, column {names[0]!r} {len(columns[0])}; every column "
                                 "needs one entry per sample")
        if num_samples is not None:
            # A negative count would slice samples off the end (-1: all but the last), a float
            # or bool would be taken as an index: each is refused, naming the argument.
            if isinstance(num_samples, bool) or not isinstance(num_samples, int):
                raise TypeError(f"NumpySlicesDataset: num_samples must be an int or None, got "
                                f"{type(num_samples).__name__}")
            if num_samples < 1:
                raise ValueError(f"NumpySlicesDataset: num_samples must be a positive int or "
                                 f"None (all samples), got {num_samples}")
            columns = [c[:num_samples] for c in columns]
        self.column_names = names
        self._columns = columns
        self._shuffle = True if shuffle is None else bool(shuffle)
        self.batch_size = None
        self.drop_remainder = False

    def batch(self, batch_size, drop_remainder=False, num_parallel_workers=None, **kwargs):
        """Batches of ``batch_size`` samples. The engine's batches have one size: with
        ``drop_remainder=False`` the sample count must be a multiple of ``batch_size``."""
        if kwargs:
            raise ValueError(f"batch: {sorted(kwargs)} not supported yet")
        # A bool is no size (True was batches of one), and a size beyond 64 bits was a bare
        # OverflowError when Model.train started.
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or \
                not 1 <= batch_size <= 2**63 - 1:
            raise ValueError(f"batch: batch_size must be a positive int (at most 2**63 - 1), got "
                             f"{batch_size!r}")
        n = len(self._columns[0])
        if not drop_remainder and n % batch_size:
            raise ValueError(f"batch: {n} samples do not split into batches of {batch_size}; "
                             "use drop_remainder=True (the engine's batches have one size)")
        out = NumpySlicesDataset.__new__(type(self))
        out.__dict__.update(self.__dict__)
        out.batch_size, out.drop_remainder = batch_size, bool(drop_remainder)
        return out

    def shuffle(self, buffer_size):
        """MindSpore's ``shuffle(buffer_size)``: the engine shuffles the samples every epoch,
        seeded by ``tessera.set_seed`` (a global shuffle, whatever ``buffer_size``; see the
        module docs). ``buffer_size`` is an int > 1. Call it before ``batch`` (the engine
        shuffles samples, then batches them)."""
        if isinstance(buffer_size, bool) or not isinstance(buffer_size, int) or buffer_size < 2:
            raise ValueError(f"shuffle: buffer_size must be an int > 1, got {buffer_size!r}")
        if self.batch_size is not None:
            raise ValueError("shuffle: call it before batch (the engine shuffles the samples, "
                             "then batches them; it cannot shuffle whole batches)")
        out = NumpySlicesDataset.__new__(type(self))
        out.__dict__.update(self.__dict__)
        out._shuffle = True
        return out

    def map(self, operations, input_columns=None, output_columns=None, num_parallel_workers=None,
            **kwargs):
        """Applies ``operations`` (one or a list, in order) to every sample of
        ``input_columns`` (one column name; default the first column), in numpy, now."""
        if output_columns is not None or kwargs:
            raise ValueError("map: output_columns and other options are not supported yet")
        ops = list(operations) if isinstance(operations, (list, tuple)) else [operations]
        for op in ops:
            if not isinstance(op, TensorOperation) and not callable(op):
                raise TypeError(f"map: operation {op!r} is not a tessera.dataset operation")
        if input_columns is None:
            input_columns = self.column_names[0]
        if isinstance(input_columns, (list, tuple)):
            if len(input_columns) != 1:
                raise ValueError("map: operations on several columns are not supported yet")
            input_columns = input_columns[0]
        if input_columns not in self.column_names:
            raise ValueError(f"map: input_columns {input_columns!r} is not a column "
                             f"(columns: {self.column_names})")
        i = self.column_names.index(input_columns)
        column = self._columns[i]
        for op in ops:
            if isinstance(op, TensorOperation):
                column = op._apply_column(column)
            else:
                column = np.stack([np.asarray(op(sample)) for sample in column])
        out = NumpySlicesDataset.__new__(type(self))
        out.__dict__.update(self.__dict__)
        out._columns = list(self._columns)
        out._columns[i] = column
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
        names = self.column_names
        label = np.asarray(label)
        if label.ndim == 2 and label.shape[1] == 1:
            label = label[:, 0]
        if label.ndim != 1:
            raise ValueError(f"the label column {names[1]} has shape {label.shape}; "
                             "one class index per sample is needed")
        if data.dtype.kind not in "biuf":
            raise ValueError(f"the data column {names[0]} has dtype {data.dtype}; the network's "
                             "input must be numbers (it is cast to float32)")
        if label.dtype.kind not in "iu" and not (
                label.dtype.kind == "f" and np.array_equal(label, np.round(label))):
            raise ValueError(f"the label column {names[1]} has dtype {label.dtype} with values "
                             "that are not whole numbers; class indices are needed")
        if label.size and (label.min() < 0 or label.max() > np.iinfo(np.int32).max):
            raise ValueError(f"the label column {names[1]} holds {label.min()}..{label.max()}; "
                             "class indices are ≥ 0")
        return (np.ascontiguousarray(data, dtype=np.float32),
                np.ascontiguousarray(label, dtype=np.int32))


def _sample_columns(item, n_columns, index, names):
    """Sample ``index`` of a ``GeneratorDataset`` source as one array per column."""
    if isinstance(item, (tuple, list)):
        values = list(item)
    elif n_columns == 1:
        values = [item]
    else:
        raise ValueError(f"GeneratorDataset: sample {index} is a {type(item).__name__}, not a "
                         f"tuple of {n_columns} columns ({names})")
    if len(values) != n_columns:
        raise ValueError(f"GeneratorDataset: sample {index} has {len(values)} column(s), but "
                         f"column_names has {n_columns} ({names})")
    out = []
    for k, v in enumerate(values):
        try:
            out.append(np.asarray(v))
        except ValueError as e:
            raise ValueError(f"GeneratorDataset: column {names[k]!r}: sample {index} is ragged "
                             f"({e}); every sample must be a rectangular array") from None
    return out


class GeneratorDataset(NumpySlicesDataset):
    """MindSpore's ``GeneratorDataset(source, column_names=None, column_types=None,
    schema=None, num_samples=None, num_parallel_workers=1, shuffle=None, sampler=None,
    num_shards=None, shard_id=None, python_multiprocessing=True, max_rowsize=None,
    batch_sampler=None, collate_fn=None)``.

    ``source``: a random-accessible object (``__getitem__`` and ``__len__``: samples ``0 ..
    len-1``), an iterable, or a callable returning an iterator (a generator function). Each
    sample is a tuple with one value per column (one value alone for one column). The samples
    are read once, when the dataset is made (``num_samples``: only the first that many), into
    one numpy array per column: every sample of a column must have the same shape and dtype
    kind, else a ``ValueError`` names the column, the sample and the rule."""

    def __init__(self, source, column_names=None, column_types=None, schema=None,
                 num_samples=None, num_parallel_workers=1, shuffle=None, sampler=None,
                 num_shards=None, shard_id=None, python_multiprocessing=True,
                 max_rowsize=None, batch_sampler=None, collate_fn=None):
        if batch_sampler is not None or collate_fn is not None:
            raise ValueError("GeneratorDataset: batch_sampler and collate_fn are not supported "
                             "(batch the dataset with .batch)")
        if column_types is not None or schema is not None:
            raise ValueError("GeneratorDataset: column_types and schema are not supported yet "
                             "(the columns take the samples' dtypes; use map(TypeCast))")
        if sampler is not None or num_shards is not None or shard_id is not None:
            raise ValueError("GeneratorDataset: sampler, num_shards and shard_id are not "
                             "supported yet (the engine gives each rank its rows)")
        if column_names is None:
            raise ValueError("GeneratorDataset: column_names is required (schema is not "
                             "supported)")
        names = [column_names] if isinstance(column_names, str) else list(column_names)
        if not names or not all(isinstance(n, str) for n in names) or len(set(names)) != len(names):
            raise ValueError(f"GeneratorDataset: column_names must be distinct strs, got "
                             f"{column_names!r}")
        if num_samples is not None and (isinstance(num_samples, bool) or
                                        not isinstance(num_samples, int) or num_samples < 1):
            raise ValueError(f"GeneratorDataset: num_samples must be a positive int, got "
                             f"{num_samples!r}")
        columns = [[] for _ in names]
        for index, item in enumerate(self._samples(source, num_samples)):
            for k, value in enumerate(_sample_columns(item, len(names), index, names)):
                if columns[k]:
                    first = columns[k][0]
                    if value.shape != first.shape:
                        raise ValueError(f"GeneratorDataset: column {names[k]!r}: sample {index} "
                                         f"has shape {value.shape}, sample 0 {first.shape}; "
                                         "every sample of a column needs the same shape")
                    if value.dtype.kind != first.dtype.kind:
                        raise ValueError(f"GeneratorDataset: column {names[k]!r}: sample {index} "
                                         f"has dtype {value.dtype}, sample 0 {first.dtype}; "
                                         "every sample of a column needs the same kind of dtype")
                columns[k].append(value)
        if not columns[0]:
            raise ValueError("GeneratorDataset: the source gave no samples")
        super().__init__(tuple(np.stack(c) for c in columns), column_names=names,
                         shuffle=shuffle)

    @staticmethod
    def _samples(source, num_samples):
        """The source's samples, at most ``num_samples``."""
        if hasattr(source, "__getitem__") and hasattr(source, "__len__"):
            n = len(source)
            it = (source[i] for i in range(n if num_samples is None else min(n, num_samples)))
        else:
            if callable(source) and not hasattr(source, "__iter__"):
                source = source()
            try:
                it = iter(source)
            except TypeError as e:
                raise TypeError(f"GeneratorDataset: source must be random-accessible "
                                f"(__getitem__, __len__), iterable or a callable returning an "
                                f"iterator, got {type(source).__name__}") from e
        for index, item in enumerate(it):
            if num_samples is not None and index >= num_samples:
                break
            yield item


_MNIST_FILES = {"train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
                "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")}


def _read_idx(path, ndim):
    """The array of IDX file ``path`` (unsigned bytes, ``ndim`` dims)."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 + 4 * ndim or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08 or raw[3] != ndim:
        raise ValueError(f"MnistDataset: {path} is not an IDX file of unsigned bytes with {ndim} "
                         "dim(s)")
    dims = [int.from_bytes(raw[4 + 4 * k:8 + 4 * k], "big") for k in range(ndim)]
    body = raw[4 + 4 * ndim:]
    if len(body) != int(np.prod(dims)):
        raise ValueError(f"MnistDataset: {path} holds {len(body)} bytes of data; its header "
                         f"says {dims}")
    return np.frombuffer(body, dtype=np.uint8).reshape(dims)


class MnistDataset(NumpySlicesDataset):
    """MindSpore's ``MnistDataset(dataset_dir, usage=None, num_samples=None, shuffle=None)``:
    the IDX files of ``dataset_dir`` (``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``,
    ``t10k-images-idx3-ubyte``, ``t10k-labels-idx1-ubyte``). Columns ``image`` (uint8,
    ``<H, W, 1>``) and ``label`` (uint32). ``usage``: ``"train"``, ``"test"`` or ``"all"``
    (``None``: all, the training files then the test files). ``num_samples``: the first that
    many samples (in file order). ``shuffle``: the engine shuffles the samples every epoch
    (default yes)."""

    def __init__(self, dataset_dir, usage=None, num_samples=None, num_parallel_workers=None,
                 shuffle=None, sampler=None, num_shards=None, shard_id=None, cache=None):
        if sampler is not None or num_shards is not None or shard_id is not None or \
                cache is not None:
            raise ValueError("MnistDataset: sampler, num_shards, shard_id and cache are not "
                             "supported yet (the engine gives each rank its rows)")
        if usage not in (None, "train", "test", "all"):
            raise ValueError(f"MnistDataset: usage must be 'train', 'test', 'all' or None, got "
                             f"{usage!r}")
        if num_samples is not None and (not isinstance(num_samples, int) or num_samples < 0):
            raise ValueError(f"MnistDataset: num_samples must be a non-negative int, got "
                             f"{num_samples!r}")
        dataset_dir = os.fspath(dataset_dir)
        if not os.path.isdir(dataset_dir):
            raise ValueError(f"MnistDataset: dataset_dir {dataset_dir} does not exist or is not "
                             "a directory")
        splits = ["train", "test"] if usage in (None, "all") else [usage]
        images, labels = [], []
        for split in splits:
            image_file, label_file = (os.path.join(dataset_dir, f) for f in _MNIST_FILES[split])
            for f in (image_file, label_file):
                if not os.path.isfile(f):
                    raise ValueError(f"MnistDataset: {f} does not exist (usage={usage!r} reads "
                                     f"{', '.join(_MNIST_FILES[split])})")
            im, lb = _read_idx(image_file, 3), _read_idx(label_file, 1)
            if len(im) != len(lb):
                raise ValueError(f"MnistDataset: {image_file} holds {len(im)} images but "
                                 f"{label_file} {len(lb)} labels")
            images.append(im[..., None])
            labels.append(lb.astype(np.uint32))
        super().__init__((np.concatenate(images), np.concatenate(labels)),
                         column_names=["image", "label"], num_samples=num_samples or None,
                         shuffle=shuffle)
