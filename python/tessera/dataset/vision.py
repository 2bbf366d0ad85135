"""``tessera.dataset.vision``: MindSpore's ``mindspore.dataset.vision``, this slice:
``Rescale(rescale, shift)``, ``Normalize(mean, std, is_hwc=True)`` and ``HWC2CHW()``. Each
applies in numpy when the pipeline is built (``map``), once, not per training step; called on
one image (``Rescale(1/255, 0)(image)``) it returns the result as MindSpore's eager mode does."""

import numpy as np

from .transforms import TensorOperation

__all__ = ["HWC2CHW", "Normalize", "Rescale"]


class Rescale(TensorOperation):
    """``image * rescale + shift``, as float32."""

    def __init__(self, rescale, shift):
        self.rescale, self.shift = float(rescale), float(shift)

    def _apply_column(self, column):
        column = np.asarray(column, dtype=np.float32)
        return column * np.float32(self.rescale) + np.float32(self.shift)


class Normalize(TensorOperation):
    """``(image - mean) / std`` per channel, as float32: ``mean`` and ``std`` have one value per
    channel (the last dim of an ``<H, W, C>`` image when ``is_hwc``, else the first of
    ``<C, H, W>``); a ``<H, W>`` image has one channel."""

    def __init__(self, mean, std, is_hwc=True):
        mean, std = np.atleast_1d(np.asarray(mean, np.float32)), np.atleast_1d(np.asarray(std, np.float32))
        if mean.ndim != 1 or std.ndim != 1 or len(mean) != len(std):
            raise ValueError("Normalize: mean and std must be sequences of one value per channel, "
                             "of the same length")
        if np.any(std <= 0):
            raise ValueError("Normalize: std values must be positive")
        self.mean, self.std, self.is_hwc = mean, std, bool(is_hwc)

    def _apply_column(self, column):
        column = np.asarray(column, dtype=np.float32)
        if column.ndim == 3:  # <H, W> images: one channel
            return (column - self.mean[0]) / self.std[0] if len(self.mean) == 1 else \
                self._bad(column)
        if column.ndim != 4:
            raise ValueError(f"Normalize: images must be <H, W> or <H, W, C>, got shape "
                             f"{column.shape[1:]}")
        channels = column.shape[3] if self.is_hwc else column.shape[1]
        if len(self.mean) != channels:
            self._bad(column)
        if self.is_hwc:
            return (column - self.mean) / self.std
        return (column - self.mean[:, None, None]) / self.std[:, None, None]

    def _bad(self, column):
        raise ValueError(f"Normalize: {len(self.mean)} mean/std value(s) for images of shape "
                         f"{column.shape[1:]}")


class HWC2CHW(TensorOperation):
    """``<H, W, C>`` → ``<C, H, W>`` (the dtype kept)."""

    def __init__(self):
        pass

    def _apply_column(self, column):
        column = np.asarray(column)
        if column.ndim != 4:
            raise ValueError(f"HWC2CHW: images must be <H, W, C>, got shape {column.shape[1:]}")
        return np.ascontiguousarray(column.transpose(0, 3, 1, 2))
