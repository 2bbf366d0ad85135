"""Loss Cells."""

from .. import ops
from .cell import Cell


class SoftmaxCrossEntropyWithLogits(Cell):
    """MindSpore's loss Cell; this slice supports ``sparse=True, reduction="mean"`` (int labels,
    the batch mean), one node ``<path>.sparse_softmax_cross_entropy``."""

    def __init__(self, sparse=False, reduction="none"):
        super().__init__()
        if not sparse or reduction != "mean":
            raise ValueError("SoftmaxCrossEntropyWithLogits: only sparse=True, reduction='mean' "
                             "are supported yet")
        self.sparse_softmax_cross_entropy = ops.SparseSoftmaxCrossEntropyWithLogits()

    def construct(self, logits, labels):
        return self.sparse_softmax_cross_entropy(logits, labels)
