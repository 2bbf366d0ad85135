"""``tessera.mint``: MindSpore's ``mindspore.mint`` (PyTorch-style API); this slice has
``mint.optim.AdamW``."""

from . import optim

__all__ = ["optim"]
