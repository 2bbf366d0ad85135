"""Wrappers: ``WithLossCell``, ``TrainOneStepCell``."""

import numbers

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


class TrainOneStepCell(Cell):
    """MindSpore's ``TrainOneStepCell(network, optimizer, sens=None, return_grad=False)``:
    ``network`` (ending in its loss, e.g. ``WithLossCell``) trained by ``optimizer``. Given to
    ``Model`` alone (``Model(TrainOneStepCell(net_with_loss, opt))``, the tutorials' pattern)
    it trains exactly as ``Model(net, loss_fn, opt)``: the engine computes the gradients and
    applies ``optimizer``'s rule, reducing the gradients over data-parallel replicas as the
    context says. ``sens`` must be ``None`` or 1.0 (another scale of the backward pass's input
    would change every gradient, which the engine's rules do not take) and ``return_grad``
    False; adds no name prefix (MindSpore's ``auto_prefix=False``). It is not run eagerly:
    ``Model.train`` traces it."""

    def __init__(self, network, optimizer, sens=None, return_grad=False):
        super().__init__(auto_prefix=False)
        from .optim import Optimizer
        if not isinstance(network, Cell):
            raise TypeError(f"TrainOneStepCell: network must be a Cell, but got "
                            f"{type(network).__name__}")
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"TrainOneStepCell: optimizer must be a tessera.nn optimizer, but "
                            f"got {type(optimizer).__name__}")
        if sens is not None and (isinstance(sens, bool) or not isinstance(sens, numbers.Number)):
            raise TypeError(f"For 'TrainOneStepCell', 'sens' must be a number, but got "
                            f"{type(sens).__name__}")
        if sens is not None and sens != 1.0:
            raise ValueError(f"TrainOneStepCell: sens={sens} is not supported: it scales every "
                             "gradient, which the engine's optimizer rules do not take; leave "
                             "it None (1.0), or scale the loss or the learning rate instead")
        if return_grad is not False:
            raise ValueError("TrainOneStepCell: return_grad=True is not supported (the engine "
                             "keeps the gradients; Model.train returns the losses)")
        self.network = network
        self.optimizer = optimizer
        self.sens = 1.0 if sens is None else float(sens)

    def construct(self, *inputs):
        return self.network(*inputs)
