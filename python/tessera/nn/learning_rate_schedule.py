"""MindSpore's learning-rate schedules (``mindspore.nn.learning_rate_schedule``): Cells that
map the global step to a rate, for an optimizer's ``learning_rate``. The engine runs them as
its own schedules (``runtime::LrSchedule``, the same formulas with ``step_per_epoch = 1``);
called in Python (``schedule(step)``) they return the step's rate as a float32."""

import math

import numpy as np

from .. import _checks
from .cell import Cell
from .dynamic_lr import _float, _positive_int

__all__ = ["CosineDecayLR", "ExponentialDecayLR", "LearningRateSchedule", "PolynomialDecayLR",
           "WarmUpLR"]


class LearningRateSchedule(Cell):
    """Base of the schedules: ``schedule(global_step)`` is the rate of that step. Tessera runs
    the classes below only; a subclass of your own is a ``TypeError`` when an optimizer
    takes it (its ``construct`` would run per step, and Tessera traces no per-step Python)."""

    def construct(self, global_step):
        """The rate of ``global_step`` (a Python float)."""
        return self._value(int(global_step))

    def __call__(self, global_step):
        return np.float32(self.construct(np.asarray(global_step).item()))

    def _value(self, step):
        raise TypeError(f"{type(self).__name__}: Tessera runs the schedules of tessera.nn only "
                        "(CosineDecayLR, WarmUpLR, PolynomialDecayLR, ExponentialDecayLR)")

    def _peak(self):
        """The largest rate (the engine's ``train.learning_rate``)."""
        return self.learning_rate

    def _engine_schedule(self):
        """The engine's ``[train]`` schedule keys (``lr_schedule`` and its own) when the
        engine's schedule is exactly this one, else None (the optimizer then passes per-step
        values)."""
        return None


class WarmUpLR(LearningRateSchedule):
    """``learning_rate · min(global_step, warmup_steps) / warmup_steps``."""

    def __init__(self, learning_rate, warmup_steps):
        super().__init__()
        self.learning_rate = _float(learning_rate, "learning_rate")
        self.warmup_steps = _positive_int(warmup_steps, "warmup_steps")

    def _value(self, step):
        return self.learning_rate * min(step, self.warmup_steps) / self.warmup_steps

    def _engine_schedule(self):
        return {"lr_schedule": "warmup_lr", "learning_rate": self.learning_rate,
                "warmup_epoch": self.warmup_steps}


class CosineDecayLR(LearningRateSchedule):
    """``min_lr + ½(max_lr − min_lr)(1 + cos(π · min(global_step, decay_steps) /
    decay_steps))``."""

    def __init__(self, min_lr, max_lr, decay_steps):
        super().__init__()
        self.min_lr = _float(min_lr, "min_lr", positive=False)
        self.max_lr = _float(max_lr, "max_lr")
        self.decay_steps = _positive_int(decay_steps, "decay_steps")
        if min_lr >= max_lr:
            raise ValueError("For 'CosineDecayLR', the 'max_lr' must be greater than the "
                             f"'min_lr', but got 'max_lr' value: {max_lr} and 'min_lr' value: "
                             f"{min_lr}.")
        self.learning_rate = self.max_lr

    def _value(self, step):
        t = min(step, self.decay_steps)
        return self.min_lr + 0.5 * (self.max_lr - self.min_lr) * (
            1 + math.cos(math.pi * t / self.decay_steps))

    def _engine_schedule(self):
        return {"lr_schedule": "cosine_decay_lr", "learning_rate": self.max_lr, "min_lr": self.min_lr,
                "decay_epoch": self.decay_steps}


class PolynomialDecayLR(LearningRateSchedule):
    """``(learning_rate − end_learning_rate)(1 − t / d)^power + end_learning_rate`` with
    ``t = min(global_step, decay_steps)``, ``d = decay_steps``; with ``update_decay_steps``,
    ``t = global_step`` and ``d = decay_steps · max(ceil(global_step / decay_steps), 1)``."""

    def __init__(self, learning_rate, end_learning_rate, decay_steps, power,
                 update_decay_steps=False):
        super().__init__()
        owner = "PolynomialDecayLR"
        self.learning_rate = _float(learning_rate, "learning_rate")
        self.end_learning_rate = _float(end_learning_rate, "end_learning_rate", positive=False)
        self.decay_steps = _positive_int(decay_steps, "decay_steps")
        self.power = _float(power, "power")
        update_decay_steps = _checks.plain(update_decay_steps)
        if not isinstance(update_decay_steps, bool):
            raise TypeError(f"For '{owner}', 'update_decay_steps' must be a bool.")
        self.update_decay_steps = update_decay_steps

    def _value(self, step):
        if self.update_decay_steps:
            d, t = self.decay_steps * max(math.ceil(step / self.decay_steps), 1), step
        else:
            d, t = self.decay_steps, min(step, self.decay_steps)
        return (self.learning_rate - self.end_learning_rate) * (1 - t / d) ** self.power + \
            self.end_learning_rate

    def _peak(self):
        return max(self.learning_rate, self.end_learning_rate)

    def _engine_schedule(self):
        if self.end_learning_rate > self.learning_rate:
            return None  # a rising "decay": the engine's rule requires the end ≤ the peak
        return {"lr_schedule": "polynomial_decay_lr", "learning_rate": self.learning_rate,
                "min_lr": self.end_learning_rate, "decay_epoch": self.decay_steps,
                "power": self.power, "update_decay_epoch": self.update_decay_steps}


class ExponentialDecayLR(LearningRateSchedule):
    """``learning_rate · decay_rate^(global_step / decay_steps)`` (with ``is_stair`` the
    exponent is floored)."""

    def __init__(self, learning_rate, decay_rate, decay_steps, is_stair=False):
        super().__init__()
        owner = "ExponentialDecayLR"
        self.learning_rate = _float(learning_rate, "learning_rate")
        self.decay_rate = _float(decay_rate, "decay_rate")
        self.decay_steps = _positive_int(decay_steps, "decay_steps")
        is_stair = _checks.plain(is_stair)
        if not isinstance(is_stair, bool):
            raise TypeError(f"For '{owner}', 'is_stair' must be a bool.")
        self.is_stair = is_stair

    def _value(self, step):
        p = step / self.decay_steps
        return self.learning_rate * self.decay_rate ** (math.floor(p) if self.is_stair else p)

    def _peak(self):
        return self.learning_rate * max(1.0, self.decay_rate)

    def _engine_schedule(self):
        return {"lr_schedule": "exponential_decay_lr", "learning_rate": self.learning_rate,
                "decay_rate": self.decay_rate, "decay_epoch": self.decay_steps,
                "is_stair": self.is_stair}
