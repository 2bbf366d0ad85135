"""MindSpore's dynamic learning rates (``mindspore.nn.dynamic_lr``): functions returning the
list of every step's rate, for an optimizer's ``learning_rate``. Formulas and checks are
MindSpore 2.10's; ``i`` is the step, ``current_epoch = floor(i / step_per_epoch)``."""

import math

from .. import _checks

__all__ = ["cosine_decay_lr", "exponential_decay_lr", "piecewise_constant_lr",
           "polynomial_decay_lr", "warmup_lr"]


#: The most steps a dynamic learning rate may list: the list holds one Python float per step
#: (about 32 bytes each), so ``total_step=2**62`` would allocate without end instead of failing.
MAX_STEPS = 2**26


def _positive_int(value, name):
    value = _checks.plain(value)  # a numpy int as its value
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"For '{name}', the value must be a positive int, but got {value!r}.")
    return value


def _step_count(value, name):
    """A positive int that sizes the returned list: at most ``MAX_STEPS``."""
    _positive_int(value, name)
    if value > MAX_STEPS:
        raise ValueError(f"For '{name}', the value must be at most {MAX_STEPS} (the list holds "
                         f"one learning rate per step), but got {value}.")
    return value


def _rate(owner, step, compute):
    """The rate of ``step`` by ``compute()``; a float overflow is a ``ValueError`` naming
    ``owner`` and the step (Python's ``**`` raises a bare ``OverflowError``)."""
    try:
        return compute()
    except OverflowError:
        raise ValueError(f"For '{owner}', the learning rate of step {step} overflows a float; "
                         "check decay_rate and power") from None


def _float(value, name, positive=True):
    value = _checks.plain(value)  # a numpy float as its value (a numpy int stays refused)
    if not isinstance(value, float):
        raise TypeError(f"For '{name}', the type must be float, but got "
                        f"{type(value).__name__}.")
    if (positive and not value > 0) or (not positive and not value >= 0):
        rule = "positive" if positive else "non-negative"
        raise ValueError(f"For '{name}', the value must be a {rule} float, but got {value}.")
    return value


def _common(total_step, step_per_epoch, decay_epoch, decay_name="decay_epoch"):
    _step_count(total_step, "total_step")
    _positive_int(step_per_epoch, "step_per_epoch")
    _positive_int(decay_epoch, decay_name)


def piecewise_constant_lr(milestone, learning_rates):
    """``learning_rates[t]`` for every step ``milestone[t-1] ≤ i < milestone[t]``
    (``milestone[-1] = 0``); the list has ``milestone[-1]`` entries."""
    if not isinstance(milestone, (tuple, list)) or not isinstance(learning_rates, (tuple, list)):
        raise TypeError("For 'piecewise_constant_lr', milestone and learning_rates must be "
                        "lists or tuples.")
    if len(milestone) != len(learning_rates):
        raise ValueError("For 'piecewise_constant_lr', the size of 'milestone' must be same as "
                         f"the size of 'learning_rates', but got {len(milestone)} and "
                         f"{len(learning_rates)}.")
    lr, last = [], 0
    for i, item in enumerate(milestone):
        _step_count(item, f"milestone[{i}]")
        _float(learning_rates[i], f"learning_rates[{i}]", positive=False)
        if item < last:
            raise ValueError(f"For 'piecewise_constant_lr', the value of milestone[{i}] must be "
                             f"greater than milestone[{i - 1}], but got {item} and {last}.")
        lr += [learning_rates[i]] * (item - last)
        last = item
    return lr


def exponential_decay_lr(learning_rate, decay_rate, total_step, step_per_epoch, decay_epoch,
                         is_stair=False):
    """``learning_rate · decay_rate^(current_epoch / decay_epoch)`` (with ``is_stair`` the
    exponent is floored)."""
    _common(total_step, step_per_epoch, decay_epoch)
    _float(learning_rate, "learning_rate")
    _float(decay_rate, "decay_rate")
    if not isinstance(is_stair, bool):
        raise TypeError("For 'is_stair', the type must be bool.")
    lr = []
    for i in range(total_step):
        p = math.floor(i / step_per_epoch) / decay_epoch
        lr.append(_rate("exponential_decay_lr", i, lambda p=p: learning_rate * decay_rate ** (
            math.floor(p) if is_stair else p)))
    return lr


def cosine_decay_lr(min_lr, max_lr, total_step, step_per_epoch, decay_epoch):
    """``min_lr + ½(max_lr − min_lr)(1 + cos(π · tmp_epoch / decay_epoch))``,
    ``tmp_epoch = min(current_epoch, decay_epoch)``."""
    _float(min_lr, "min_lr", positive=False)
    _float(max_lr, "max_lr")
    _common(total_step, step_per_epoch, decay_epoch)
    if min_lr >= max_lr:
        raise ValueError("For 'cosine_decay_lr', the 'max_lr' must be greater than the "
                         f"'min_lr', but got 'max_lr' value: {max_lr} and 'min_lr' value: "
                         f"{min_lr}.")
    delta = 0.5 * (max_lr - min_lr)
    return [min_lr + delta * (1 + math.cos(math.pi * min(math.floor(i / step_per_epoch),
                                                         decay_epoch) / decay_epoch))
            for i in range(total_step)]


def polynomial_decay_lr(learning_rate, end_learning_rate, total_step, step_per_epoch,
                        decay_epoch, power, update_decay_epoch=False):
    """``(learning_rate − end_learning_rate)(1 − tmp_epoch / tmp_decay_epoch)^power +
    end_learning_rate``, ``tmp_epoch = min(current_epoch, decay_epoch)`` and
    ``tmp_decay_epoch = decay_epoch``; with ``update_decay_epoch``, ``tmp_epoch =
    current_epoch`` and ``tmp_decay_epoch = decay_epoch · max(ceil(current_epoch /
    decay_epoch), 1)``."""
    _float(learning_rate, "learning_rate")
    _float(end_learning_rate, "end_learning_rate", positive=False)
    _float(power, "power")
    _common(total_step, step_per_epoch, decay_epoch)
    if not isinstance(update_decay_epoch, bool):
        raise TypeError("For 'update_decay_epoch', the type must be bool.")
    delta = learning_rate - end_learning_rate
    lr = []
    for i in range(total_step):
        epoch = math.floor(i / step_per_epoch)
        if update_decay_epoch:
            d, t = decay_epoch * max(math.ceil(epoch / decay_epoch), 1), epoch
        else:
            d, t = decay_epoch, min(epoch, decay_epoch)
        lr.append(_rate("polynomial_decay_lr", i, lambda d=d, t=t: delta * (1 - t / d) ** power +
                        end_learning_rate))
    return lr


def warmup_lr(learning_rate, total_step, step_per_epoch, warmup_epoch):
    """``learning_rate · min(current_epoch, warmup_epoch) / warmup_epoch``."""
    _float(learning_rate, "learning_rate", positive=False)
    _common(total_step, step_per_epoch, warmup_epoch, "warmup_epoch")
    return [learning_rate * min(math.floor(i / step_per_epoch), warmup_epoch) / warmup_epoch
            for i in range(total_step)]


