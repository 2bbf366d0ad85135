"""Wrappers: ``WithLossCell``."""

from .cell import Cell


class WithLossCell(Cell):
    """``loss_fn(backbone(data), label)``. Its own name adds no prefix (MindSpore's
    ``auto_prefix=False``): the backbone's parameters keep their names (``fc1.weight``)."""

    def __init__(self, backbone, loss_fn):
        super().__init__(auto_prefix=False)
        self._backbone = backbone
        self._loss_fn = loss_fn

    def construct(self, data, label):
        return self._loss_fn(self._backbone(data), label)

    @property
    def backbone_network(self):
        """The backbone."""
        return self._backbone
