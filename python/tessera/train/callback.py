"""Callbacks: ``Callback``, ``RunContext``, ``LossMonitor``, ``TimeMonitor``."""

import time


class RunContext:
    """What a callback gets: ``original_args()`` (the run's parameters, ``cb_params``) and
    ``request_stop()``."""

    def __init__(self, original_args):
        self._cb_params = original_args
        self._stop = False

    def original_args(self):
        """The run's parameters: ``cur_epoch_num``, ``cur_step_num`` (over the run, from 1),
        ``batch_num`` (steps per epoch), ``epoch_num``, ``net_outputs`` (the step's loss),
        ``train_network``, ``optimizer``."""
        return self._cb_params

    def request_stop(self):
        """Stops training after this step."""
        self._stop = True

    def get_stop_requested(self):
        """Whether a callback asked to stop."""
        return self._stop


class Callback:
    """MindSpore's ``Callback``: override what you need. This slice calls ``on_train_begin``,
    ``on_train_step_end`` (and the older ``step_end``), ``on_train_epoch_end`` (and
    ``epoch_end``) and ``on_train_end``."""

    def on_train_begin(self, run_context):
        """Before the first step."""

    def on_train_epoch_begin(self, run_context):
        """Not called yet in this slice."""

    def on_train_step_begin(self, run_context):
        """Not called yet in this slice (the engine runs the step)."""

    def on_train_step_end(self, run_context):
        """After every step's update; ``net_outputs`` is the step's loss."""
        self.step_end(run_context)

    def on_train_epoch_end(self, run_context):
        """After the last step of an epoch."""
        self.epoch_end(run_context)

    def on_train_end(self, run_context):
        """After the last step."""
        self.end(run_context)

    def step_end(self, run_context):
        """MindSpore's older name of ``on_train_step_end``."""

    def epoch_end(self, run_context):
        """MindSpore's older name of ``on_train_epoch_end``."""

    def end(self, run_context):
        """MindSpore's older name of ``on_train_end``."""


class LossMonitor(Callback):
    """Prints ``epoch: 1 step: 10, loss is 2.2871413`` every ``per_print_times`` steps."""

    def __init__(self, per_print_times=1):
        if not isinstance(per_print_times, int) or per_print_times < 0:
            raise ValueError("LossMonitor: per_print_times must be a non-negative int")
        self._per_print_times = per_print_times

    def on_train_step_end(self, run_context):
        p = run_context.original_args()
        step = (p.cur_step_num - 1) % p.batch_num + 1
        if self._per_print_times and p.cur_step_num % self._per_print_times == 0:
            print(f"epoch: {p.cur_epoch_num} step: {step}, loss is {p.net_outputs}", flush=True)


class _StopRequested(Exception):
    pass


class TimeMonitor(Callback):
    """MindSpore's ``TimeMonitor(data_size=None)``: prints ``Train epoch time: 123.456 ms, per
    step time: 1.234 ms`` after every epoch (the wall time since the previous epoch ended or
    training began; per step: divided by ``data_size``, default the steps per epoch)."""

    def __init__(self, data_size=None, data_time=False):
        if data_size is not None and (not isinstance(data_size, int) or data_size <= 0):
            raise ValueError("TimeMonitor: data_size must be a positive int")
        self.data_size = data_size

    def on_train_begin(self, run_context):
        self._start = time.time()

    def on_train_epoch_end(self, run_context):
        now = time.time()
        ms = (now - getattr(self, "_start", now)) * 1000
        steps = self.data_size or run_context.original_args().batch_num
        print(f"Train epoch time: {ms:5.3f} ms, per step time: {ms / steps:5.3f} ms", flush=True)
        self._start = now
