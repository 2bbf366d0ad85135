"""Optimizers: the engine's update rules under MindSpore's class names, with MindSpore's
``learning_rate`` forms (a number, a list of per-step values, a ``LearningRateSchedule``) and
parameter groups, as far as the engine honours them exactly."""

import numbers

from .. import _checks
from ..common.parameter import Parameter
from .learning_rate_schedule import LearningRateSchedule

_GROUP_KEYS = ("params", "lr", "weight_decay", "grad_centralization")


def _number(owner, key, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{owner}: {key} must be a number, got {type(value).__name__}")
    return float(value)


def _bool(owner, key, value):
    """A bool setting (``np.bool_`` taken as its value): anything else is a ``TypeError``
    naming it (``bool("False")`` was True)."""
    value = _checks.plain(value)
    if not isinstance(value, bool):
        raise TypeError(f"{owner}: {key} must be a bool, got {type(value).__name__}")
    return value


def _learning_rate(owner, learning_rate):
    """``learning_rate`` checked: a float, a list of per-step floats (MindSpore's dynamic
    learning rate) or a ``LearningRateSchedule``."""
    if isinstance(learning_rate, LearningRateSchedule):
        if type(learning_rate)._value is LearningRateSchedule._value:
            raise TypeError(f"{owner}: learning_rate is a {type(learning_rate).__name__}; Tessera "
                            "runs the schedules of tessera.nn only (CosineDecayLR, WarmUpLR, "
                            "PolynomialDecayLR, ExponentialDecayLR) or a list of per-step rates")
        return learning_rate
    if isinstance(learning_rate, (list, tuple)):
        if not learning_rate:
            raise ValueError(f"{owner}: learning_rate is an empty list (one value per step is "
                             "needed)")
        values = [_number(owner, f"learning_rate[{i}]", v) for i, v in enumerate(learning_rate)]
        for i, v in enumerate(values):
            if not v >= 0.0 or v == float("inf"):
                raise ValueError(f"{owner}: learning_rate[{i}] = {v} is out of range: it must "
                                 "be finite and ≥ 0")
        return values
    if hasattr(learning_rate, "asnumpy"):  # a Tensor: 0-d a number, 1-d per-step rates
        array = learning_rate.asnumpy()
        if array.ndim > 1:
            raise ValueError(f"{owner}: learning_rate is a Tensor of shape {array.shape}; it "
                             "must be 0-d (one rate) or 1-d (a rate per step)")
        return _learning_rate(owner, array.tolist())
    value = _number(owner, "learning_rate", learning_rate)
    if not 0.0 <= value < float("inf"):
        raise ValueError(f"{owner}: learning_rate = {value} is out of range: it must be finite "
                         "and ≥ 0")
    return value


def _params(owner, where, params):
    params = list(params)
    for p in params:
        if not isinstance(p, Parameter):
            raise TypeError(f"{owner}: {where} holds a {type(p).__name__}, not a Parameter")
    return params


class Optimizer:
    """Base of the optimizers: the engine's optimizer by MindSpore's class name and its
    hyperparameters.

    ``learning_rate``: a float, a list of floats (the rate of each global step, MindSpore's
    dynamic learning rate, e.g. ``nn.cosine_decay_lr(...)``; training past its end is an
    error), a ``tessera.Tensor`` (0-d: a float, 1-d: a list) or a ``LearningRateSchedule``
    (``nn.CosineDecayLR`` and friends: the engine's own schedule, or the schedule's per-step
    values).

    ``parameters``: Parameters, or MindSpore's parameter groups ``[{'params': [...],
    'weight_decay': w}, ..., {'order_params': [...]}]``. The engine has one learning rate and
    one weight decay per run, with a filter of parameters that get none, so groups may
    differ only in ``weight_decay`` being one value ``w`` or ``0.0``; a group's ``lr`` other
    than ``learning_rate`` or ``grad_centralization=True`` is a ``ValueError`` naming the group
    and the key. Every trainable Parameter of the network must be in the optimizer (the
    engine updates all of them).

    Without groups, weight decay applies to every parameter whose name contains neither
    ``beta`` nor ``gamma`` (MindSpore's default filter, the engine's). ``loss_scale`` must be
    1.0 (MindSpore divides the gradients by it, for a loss scaled by a loss-scale manager,
    which Tessera lacks; in float32, where the engine computes, the pair changes nothing).
    A parameter group's ``params`` must be non-empty (MindSpore's rule).

    ``max_grad_norm`` (keyword-only, a Tessera addition): every step's gradient is clipped to
    this global L2 norm before the update (the engine's ``train.max_grad_norm``: MindSpore
    users write ``ops.clip_by_global_norm`` in a custom ``TrainOneStepCell``, which Tessera
    does not trace)."""

    _engine_name = None  # the engine's name of the rule (`train.optimizer`), set by each class
    _defaults_filter = True  # weight decay skips `beta`/`gamma` names without groups

    def __init__(self, learning_rate, parameters, weight_decay=0.0, loss_scale=1.0, *,
                 max_grad_norm=None):
        owner = type(self).__name__
        self.learning_rate = _learning_rate(owner, learning_rate)
        self.weight_decay = _number(owner, "weight_decay", weight_decay)
        if self.weight_decay < 0:
            raise ValueError(f"{owner}: weight_decay = {self.weight_decay} is out of range: it "
                             "must be ≥ 0")
        if loss_scale != 1.0:
            raise ValueError(f"{owner}: loss_scale must be 1.0 (MindSpore divides the gradients "
                             "by it, expecting a loss scaled as much by Model's "
                             "loss_scale_manager, which Tessera lacks: given alone it shrinks "
                             "every update; the pair changes nothing in float32, where the engine "
                             "computes)")
        if max_grad_norm is not None:
            max_grad_norm = _number(owner, "max_grad_norm", max_grad_norm)
            if not 0 < max_grad_norm < float("inf"):
                raise ValueError(f"{owner}: max_grad_norm = {max_grad_norm} is out of range: "
                                 "it must be finite and > 0")
        self.max_grad_norm = max_grad_norm
        self._groups = None  # [(params, weight_decay)] with parameter groups
        if isinstance(parameters, Parameter):
            parameters = [parameters]
        parameters = list(parameters)
        if parameters and all(isinstance(g, dict) for g in parameters):
            self.parameters = self._read_groups(parameters)
        elif any(isinstance(g, dict) for g in parameters):
            raise TypeError(f"{owner}: params mixes dicts (parameter groups) and Parameters")
        else:
            self.parameters = _params(owner, "params", parameters)

    def _group_hyper(self, owner, index, group):
        """Checks a group's keys other than ``params`` and ``weight_decay`` (overridden by
        optimizers with other per-group keys)."""
        for key in group:
            if key not in _GROUP_KEYS:
                raise ValueError(f"{owner}: parameter group {index} has key {key!r}, which "
                                 f"MindSpore's groups do not have (keys: {list(_GROUP_KEYS)})")
        if "lr" in group:
            lr = _learning_rate(owner, group["lr"])
            if lr != self.learning_rate:
                raise ValueError(f"{owner}: parameter group {index} sets 'lr' = {group['lr']!r}, "
                                 f"not the optimizer's learning_rate: the engine has one learning "
                                 "rate for every parameter")
        if group.get("grad_centralization", False):
            raise ValueError(f"{owner}: parameter group {index} sets 'grad_centralization': the "
                             "engine has no gradient centralization")

    def _read_groups(self, groups):
        owner = type(self).__name__
        order, seen, out = None, {}, []
        for index, group in enumerate(groups):
            if "order_params" in group:
                if len(group) != 1:
                    raise ValueError(f"{owner}: parameter group {index} has 'order_params' beside "
                                     "other keys; it must be a group of its own")
                order = _params(owner, f"group {index}'s 'order_params'", group["order_params"])
                continue
            if "params" not in group:
                raise ValueError(f"{owner}: parameter group {index} has no 'params'")
            self._group_hyper(owner, index, group)
            params = _params(owner, f"group {index}'s 'params'", group["params"])
            if not params:
                # MindSpore's message (`_parameters_base_check`), with the group named.
                raise ValueError(f"For 'Optimizer', the argument group `params` must not be empty "
                                 f"({owner}: parameter group {index}).")
            wd = _number(owner, f"group {index}'s 'weight_decay'",
                         group.get("weight_decay", self.weight_decay))
            if wd < 0:
                raise ValueError(f"{owner}: parameter group {index} has 'weight_decay' = {wd}: "
                                 "it must be ≥ 0")
            for p in params:
                if id(p) in seen:
                    raise ValueError(f"{owner}: Parameter {p.name} is in parameter groups "
                                     f"{seen[id(p)]} and {index}")
                seen[id(p)] = index
            out.append((params, wd))
        if order is not None:
            # MindSpore: parameters of order_params in no group get the optimizer's defaults.
            rest = [p for p in order if id(p) not in seen]
            if rest:
                out.append((rest, self.weight_decay))
        decays = sorted({wd for _, wd in out if wd > 0})
        if len(decays) > 1:
            raise ValueError(f"{owner}: parameter groups set weight_decay {decays}: the engine has "
                             "one weight decay, with a filter of parameters that get none, so "
                             "groups may differ only in weight_decay being one value or 0.0")
        self.weight_decay = decays[0] if decays else 0.0
        self._groups = out
        return [p for params, _ in out for p in params]

    def _no_weight_decay(self, names):
        """The engine's weight-decay filter (names that get none) for the traced parameters
        ``names`` (``{id(param): name}``), checked to give exactly the optimizer's decay."""
        owner = type(self).__name__
        mine = {id(p) for p in self.parameters}
        missing = [name for i, name in names.items() if i not in mine]
        if missing:
            raise ValueError(f"{owner}: the network's Parameters {sorted(missing)} are not in the "
                             "optimizer's params; the engine trains every trainable Parameter")
        frozen = sorted(str(p.name) for p in self.parameters if not p.requires_grad)
        if frozen:
            raise ValueError(f"{owner}: Parameters {frozen} are frozen (requires_grad=False) but "
                             "in the optimizer's params; the engine never updates them (pass "
                             "net.trainable_params())")
        if self._groups is None or self.weight_decay == 0:
            if not self._defaults_filter and self.weight_decay > 0:
                decayed = [n for n in names.values() if "beta" in n or "gamma" in n]
                if decayed:
                    raise ValueError(f"{owner}: weight decay applies to every parameter, but the "
                                     f"engine never decays {sorted(decayed)} (names with 'beta' "
                                     "or 'gamma'); use parameter groups giving them "
                                     "weight_decay 0.0")
            return []
        wd = {id(p): w for params, w in self._groups for p in params}
        excluded = sorted(names[i] for i in names if wd.get(i, 0.0) == 0.0)
        for i, name in names.items():
            if wd.get(i, 0.0) == 0.0:
                continue
            if "beta" in name or "gamma" in name:
                raise ValueError(f"{owner}: a parameter group decays Parameter {name}, but the "
                                 "engine never decays names with 'beta' or 'gamma' (MindSpore's "
                                 "default filter)")
            clash = [e for e in excluded if e in name]
            if clash:
                raise ValueError(f"{owner}: Parameter {name} is decayed but contains the name of "
                                 f"undecayed {clash}; the engine's filter matches name parts")
        return excluded

    def _engine_args(self):
        """The optimizer's rule and hyperparameters as the engine's ``[train]`` keys."""
        lr = self.learning_rate
        peak = lr if isinstance(lr, float) else (
            max(lr) if isinstance(lr, list) else lr._peak())
        return {"optimizer": self._engine_name,
                "learning_rate": peak if peak > 0 else 1.0,
                "weight_decay": self.weight_decay}

    def _train_keys(self, names, end_step):
        """The engine's ``[train]`` keys beyond the rule's (docs/CONFIG.md) for a run that
        trains the parameters ``names`` (``{id(param): name}``) up to global step
        ``end_step``: the learning-rate schedule (``lr_schedule`` and its keys), the
        weight-decay filter (``no_weight_decay``) and the clipping norm (``max_grad_norm``)."""
        owner = type(self).__name__
        keys = {}
        excluded = self._no_weight_decay(names)
        if excluded:
            keys["no_weight_decay"] = excluded
        if self.max_grad_norm is not None:
            keys["max_grad_norm"] = self.max_grad_norm
        lr = self.learning_rate
        schedule = None
        if isinstance(lr, float):
            if lr == 0:
                schedule = _per_step(owner, [0.0], end_step, hold=True)
        elif isinstance(lr, list):
            schedule = _per_step(owner, lr, end_step)
        else:
            schedule = lr._engine_schedule()
            if schedule is None:
                schedule = _per_step(owner, [lr._value(s) for s in range(end_step)], end_step)
        if schedule is not None:
            keys.update(schedule)
        return keys


def _per_step(owner, values, end_step, hold=False):
    """Per-step rates as the engine's ``piecewise_constant_lr`` keys (a milestone where the
    value changes); ``hold``: the last value holds for every step up to ``end_step``."""
    if hold:
        values = list(values) + [values[-1]] * max(0, end_step - len(values))
    if len(values) < end_step:
        raise ValueError(f"{owner}: learning_rate gives rates for {len(values)} steps, but "
                         f"training runs to global step {end_step} (MindSpore has no rate past "
                         "the list's end)")
    milestone, rates = [], []
    for i, v in enumerate(values):
        if rates and rates[-1] == v:
            milestone[-1] = i + 1
        else:
            milestone.append(i + 1)
            rates.append(v)
    peak = max(values)
    return {"lr_schedule": "piecewise_constant_lr", "learning_rate": peak if peak > 0 else 1.0,
            "milestone": milestone, "learning_rates": rates}


class SGD(Optimizer):
    """MindSpore's ``nn.SGD``; with ``momentum > 0`` it is the engine's Momentum rule
    (``dampening=0`` only)."""

    _engine_name = "sgd"

    def __init__(self, params, learning_rate=0.1, momentum=0.0, dampening=0.0, weight_decay=0.0,
                 nesterov=False, loss_scale=1.0, *, max_grad_norm=None):
        super().__init__(learning_rate, params, weight_decay, loss_scale,
                         max_grad_norm=max_grad_norm)
        if dampening != 0.0:
            raise ValueError("SGD: dampening must be 0.0 (the engine's momentum has none)")
        self.momentum = _number("SGD", "momentum", momentum)
        self.nesterov = _bool("SGD", "nesterov", nesterov)

    def _engine_args(self):
        args = super()._engine_args()
        if self.momentum > 0 or self.nesterov:
            args.update(optimizer="momentum", momentum=self.momentum, use_nesterov=self.nesterov)
        return args


class Momentum(Optimizer):
    """MindSpore's ``nn.Momentum``."""

    _engine_name = "momentum"

    def __init__(self, params, learning_rate, momentum, weight_decay=0.0, loss_scale=1.0,
                 use_nesterov=False, *, max_grad_norm=None):
        super().__init__(learning_rate, params, weight_decay, loss_scale,
                         max_grad_norm=max_grad_norm)
        self.momentum = _number("Momentum", "momentum", momentum)
        self.use_nesterov = _bool("Momentum", "use_nesterov", use_nesterov)

    def _engine_args(self):
        args = super()._engine_args()
        args.update(momentum=self.momentum, use_nesterov=self.use_nesterov)
        return args


class _AdamFamily(Optimizer):
    """The Adam rules' hyperparameters ``beta1``, ``beta2``, ``eps``."""

    def _betas(self, beta1, beta2, eps):
        owner = type(self).__name__
        self.beta1, self.beta2, self.eps = (_number(owner, "beta1", beta1),
                                            _number(owner, "beta2", beta2),
                                            _number(owner, "eps", eps))

    def _engine_args(self):
        args = super()._engine_args()
        args.update(beta1=self.beta1, beta2=self.beta2, eps=self.eps)
        return args


class Adam(_AdamFamily):
    """MindSpore's ``nn.Adam`` (bias-corrected). ``use_nesterov=True`` is ``ops.Adam``'s
    Nesterov step, ``use_amsgrad=True`` ``ops.ApplyAdamWithAmsgradV2`` (the step divides by
    the running maximum of the second moment, kept as the state ``vhat``); the engine's
    ``train.use_nesterov`` and ``train.use_amsgrad``. Both at once is a ``ValueError``:
    MindSpore's AMSGrad kernel has no Nesterov step (its ``nn.Adam`` then ignores
    ``use_nesterov``)."""

    _engine_name = "adam"

    def __init__(self, params, learning_rate=1e-3, beta1=0.9, beta2=0.999, eps=1e-8,
                 use_locking=False, use_nesterov=False, weight_decay=0.0, loss_scale=1.0,
                 use_amsgrad=False, *, max_grad_norm=None, **kwargs):
        if kwargs:
            raise ValueError(f"Adam: {sorted(kwargs)} are not supported")
        super().__init__(learning_rate, params, weight_decay, loss_scale,
                         max_grad_norm=max_grad_norm)
        self.use_nesterov = _bool("Adam", "use_nesterov", use_nesterov)
        self.use_amsgrad = _bool("Adam", "use_amsgrad", use_amsgrad)
        if self.use_nesterov and self.use_amsgrad:
            raise ValueError("Adam: use_nesterov=True with use_amsgrad=True is not supported: "
                             "MindSpore's AMSGrad (ops.ApplyAdamWithAmsgradV2) has no Nesterov "
                             "step, so its nn.Adam ignores use_nesterov beside use_amsgrad; "
                             "set one of the two")
        self._betas(beta1, beta2, eps)

    def _engine_args(self):
        args = super()._engine_args()
        args.update(use_nesterov=self.use_nesterov, use_amsgrad=self.use_amsgrad)
        return args


class Lamb(_AdamFamily):
    """MindSpore's ``nn.Lamb``: Adam's bias-corrected step with L2 weight decay, scaled per
    parameter by the trust ratio ``‖p‖ / ‖update‖`` over the whole parameter (1 when either
    norm is 0, at most 10), as MindSpore's ``Lamb`` kernel computes it; state ``lamb_m``,
    ``lamb_v``. The engine's ``train.optimizer = "lamb"``: a parameter sharded over devices
    takes the norms of all its pieces, so every layout trains one device's numbers."""

    _engine_name = "lamb"

    def __init__(self, params, learning_rate, beta1=0.9, beta2=0.999, eps=1e-6,
                 weight_decay=0.0, *, max_grad_norm=None):
        super().__init__(learning_rate, params, weight_decay, max_grad_norm=max_grad_norm)
        self._betas(beta1, beta2, eps)


class AdamWeightDecay(_AdamFamily):
    """MindSpore's ``nn.AdamWeightDecay`` (decoupled weight decay, no bias correction)."""

    _engine_name = "adamw"

    def __init__(self, params, learning_rate=1e-3, beta1=0.9, beta2=0.999, eps=1e-6,
                 weight_decay=0.0, *, max_grad_norm=None):
        super().__init__(learning_rate, params, weight_decay, max_grad_norm=max_grad_norm)
        self._betas(beta1, beta2, eps)
