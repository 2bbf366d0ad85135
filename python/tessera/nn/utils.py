"""``mindspore.nn.utils``: ``no_init_parameters``."""

import contextlib

__all__ = ["no_init_parameters"]

_DEFERRED = [0]


@contextlib.contextmanager
def no_init_parameters():
    """Parameters created inside are not filled when they are created: each rank fills only
    the shard it holds, when a step first reads it (the engine's ``train.lazy_init``; a run
    whose network has such parameters is configured so)."""
    _DEFERRED[0] += 1
    try:
        yield
    finally:
        _DEFERRED[0] -= 1


def deferring():
    """Whether a Parameter created now is inside ``no_init_parameters``."""
    return _DEFERRED[0] > 0
