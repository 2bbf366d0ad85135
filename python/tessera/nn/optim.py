"""Optimizers: the engine's update rules under MindSpore's class names."""


class Optimizer:
    """Base of the optimizers: the engine's optimizer by MindSpore's class name and its
    hyperparameters. Every parameter is updated by the same rule (parameter groups and
    learning-rate schedules are not supported yet: ``learning_rate`` is a number)."""

    def __init__(self, learning_rate, parameters, weight_decay=0.0, loss_scale=1.0):
        if isinstance(parameters, (list, tuple)) and parameters and isinstance(parameters[0], dict):
            raise ValueError(f"{type(self).__name__}: parameter groups are not supported yet")
        if not isinstance(learning_rate, (int, float)):
            raise ValueError(f"{type(self).__name__}: learning_rate must be a number in this "
                             "slice (schedules are not supported yet)")
        if loss_scale != 1.0:
            raise ValueError(f"{type(self).__name__}: loss_scale is not supported yet")
        self.parameters = list(parameters)
        self.learning_rate = float(learning_rate)
        self.weight_decay = float(weight_decay)

    def _engine_args(self):
        return {"optimizer": type(self).__name__, "learning_rate": self.learning_rate,
                "weight_decay": self.weight_decay}


class SGD(Optimizer):
    """MindSpore's ``nn.SGD``; with ``momentum > 0`` it is the engine's Momentum rule
    (``dampening=0`` only)."""

    def __init__(self, params, learning_rate=0.1, momentum=0.0, dampening=0.0, weight_decay=0.0,
                 nesterov=False, loss_scale=1.0):
        super().__init__(learning_rate, params, weight_decay, loss_scale)
        if dampening != 0.0:
            raise ValueError("SGD: dampening is not supported yet")
        self.momentum, self.nesterov = float(momentum), bool(nesterov)

    def _engine_args(self):
        args = super()._engine_args()
        if self.momentum > 0 or self.nesterov:
            args.update(optimizer="Momentum", momentum=self.momentum, use_nesterov=self.nesterov)
        return args


class Momentum(Optimizer):
    """MindSpore's ``nn.Momentum``."""

    def __init__(self, params, learning_rate, momentum, weight_decay=0.0, loss_scale=1.0,
                 use_nesterov=False):
        super().__init__(learning_rate, params, weight_decay, loss_scale)
        self.momentum, self.use_nesterov = float(momentum), bool(use_nesterov)

    def _engine_args(self):
        args = super()._engine_args()
        args.update(momentum=self.momentum, use_nesterov=self.use_nesterov)
        return args


class Adam(Optimizer):
    """MindSpore's ``nn.Adam`` (bias-corrected)."""

    def __init__(self, params, learning_rate=1e-3, beta1=0.9, beta2=0.999, eps=1e-8,
                 use_locking=False, use_nesterov=False, weight_decay=0.0, loss_scale=1.0,
                 use_amsgrad=False):
        super().__init__(learning_rate, params, weight_decay, loss_scale)
        if use_nesterov or use_amsgrad:
            raise ValueError("Adam: use_nesterov and use_amsgrad are not supported yet")
        self.beta1, self.beta2, self.eps = float(beta1), float(beta2), float(eps)

    def _engine_args(self):
        args = super()._engine_args()
        args.update(beta1=self.beta1, beta2=self.beta2, eps=self.eps)
        return args


class AdamWeightDecay(Adam):
    """MindSpore's ``nn.AdamWeightDecay`` (decoupled weight decay, no bias correction)."""

    def __init__(self, params, learning_rate=1e-3, beta1=0.9, beta2=0.999, eps=1e-6,
                 weight_decay=0.0):
        super().__init__(params, learning_rate, beta1, beta2, eps, weight_decay=weight_decay)
