"""Loss Cells: ``SoftmaxCrossEntropyWithLogits``, ``CrossEntropyLoss``, ``MSELoss``."""

from .. import _trace, ops
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


class CrossEntropyLoss(Cell):
    """MindSpore's ``nn.CrossEntropyLoss(weight=None, ignore_index=-100, reduction='mean',
    label_smoothing=0.0)`` of ``logits [N, C]`` and int class labels ``[N]`` (the graph's sparse
    softmax cross entropy, the batch mean): one node named after the Cell. Class weights,
    an ``ignore_index`` that is a class index (>= 0; a negative one matches no label), label
    smoothing, probability labels and other reductions are not supported."""

    _single_op = "sparse_softmax_cross_entropy"

    def __init__(self, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0):
        super().__init__()
        if weight is not None or label_smoothing != 0.0 or reduction != "mean":
            raise ValueError("CrossEntropyLoss: only weight=None, reduction='mean' and "
                             "label_smoothing=0.0 are supported yet")
        if isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
            raise TypeError(f"For 'CrossEntropyLoss', the type of 'ignore_index' must be int, but "
                            f"got {type(ignore_index).__name__}.")
        if ignore_index >= 0:
            # A class index would be counted in the loss as any other: refused, not ignored. A
            # negative one matches no label (labels outside 0..classes-1 are refused).
            raise ValueError(f"CrossEntropyLoss: ignore_index={ignore_index} is not supported "
                             "(every label counts in the loss); use a negative value such as "
                             "the default -100, which no class index equals")
        self.sparse_softmax_cross_entropy = ops.SparseSoftmaxCrossEntropyWithLogits()

    def construct(self, logits, labels):
        if labels.dtype.is_float:
            raise _trace.UnsupportedOpError(
                _trace.require("CrossEntropyLoss").cell(), "CrossEntropyLoss",
                f"labels must be int class indices, got {labels.dtype.name} (probabilities are "
                "not supported)")
        return self.sparse_softmax_cross_entropy(logits, labels)


class MSELoss(Cell):
    """MindSpore's ``nn.MSELoss(reduction='mean')``: ``(logits - labels)²`` reduced by ``'mean'``
    or ``'sum'`` over every element, or kept (``'none'``). Nodes ``sub``, ``square`` and
    ``reduce``."""

    def __init__(self, reduction="mean"):
        super().__init__()
        if reduction not in ("mean", "sum", "none"):
            raise ValueError(f"MSELoss: reduction must be 'mean', 'sum' or 'none', got "
                             f"{reduction!r}")
        self.reduction = reduction
        self.sub = ops.Sub()
        self.square = ops.Mul()
        self.reduce = ops.ReduceMean() if reduction == "mean" else ops.ReduceSum()

    def construct(self, logits, labels):
        diff = self.sub(logits, labels)
        squared = self.square(diff, diff)
        return squared if self.reduction == "none" else self.reduce(squared)
