"""Metrics ``Model(metrics=...)`` evaluates."""


class Metric:
    """Base of the metrics ``Model(..., metrics={name: metric})`` evaluates in ``Model.eval``
    (computed there from the network's outputs; ``update``/``eval`` are not supported yet)."""

    _kind = None


class Accuracy(Metric):
    """MindSpore's ``nn.Accuracy(eval_type='classification')``: the fraction of samples whose
    highest class score is the label's."""

    _kind = "accuracy"

    def __init__(self, eval_type="classification"):
        if eval_type != "classification":
            raise ValueError("Accuracy: only eval_type='classification' is supported yet")
        self.eval_type = eval_type


class Loss(Metric):
    """MindSpore's ``nn.Loss()``: the mean over the batches of the Model's loss Cell's value
    (``SoftmaxCrossEntropyWithLogits``, ``CrossEntropyLoss`` and ``MSELoss`` with reduction
    ``'mean'`` or ``'sum'``; another loss Cell is refused by ``Model.eval``)."""

    _kind = "loss"

    def __init__(self):
        pass
