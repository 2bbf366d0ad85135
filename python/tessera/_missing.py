"""MindSpore names this package does not have, each with why and what to use instead.

A module's ``__getattr__`` (:func:`missing_name`) raises ``AttributeError`` for them, as for any
absent name (so ``hasattr`` stays ``False`` and code probing for a feature takes its other
path), but with a message saying what the engine lacks rather than only that the name is
absent.
"""

from __future__ import annotations

from typing import Dict, Iterable, Optional

_NO_CONV = ("the engine has no convolution, pooling or batch-normalisation kernels; networks are "
            "built from Dense, LayerNorm, Embedding, activations and tessera.ops primitives "
            "(flatten images with nn.Flatten and use Dense layers)")
_NO_RNN = ("the engine has no recurrent cells; for sequences use Embedding, Dense, LayerNorm and "
           "the ops primitives, or the built-in GPT (tessera train with model.name = \"gpt\")")
_GRAPH_ONLY = ("construct is traced once into Tessera's graph and the engine computes the "
               "gradients and runs the step (GRAPH_MODE): train with tessera.train.Model(net, "
               "loss_fn, optimizer).train(...) or Model(nn.TrainOneStepCell(...)), not with a "
               "Python training step")

#: ``mindspore.nn`` names the engine cannot run, and why.
NN: Dict[str, str] = {
    **{name: _NO_CONV for name in (
        "Conv1d", "Conv2d", "Conv3d", "Conv1dTranspose", "Conv2dTranspose", "Conv3dTranspose",
        "MaxPool1d", "MaxPool2d", "MaxPool3d", "AvgPool1d", "AvgPool2d", "AvgPool3d",
        "AdaptiveAvgPool1d", "AdaptiveAvgPool2d", "AdaptiveMaxPool2d", "BatchNorm1d",
        "BatchNorm2d", "BatchNorm3d", "GroupNorm", "InstanceNorm2d")},
    **{name: _NO_RNN for name in ("RNN", "GRU", "LSTM", "RNNCell", "GRUCell", "LSTMCell")},
}

#: Top-level ``mindspore`` names of the Python (PyNative) training step, and why.
TOP: Dict[str, str] = {
    "value_and_grad": _GRAPH_ONLY,
    "grad": _GRAPH_ONLY,
    "jit": _GRAPH_ONLY,
    "export": ("exporting a network (MindIR, ONNX, AIR) is not supported; save its parameters "
               "with save_checkpoint, which MindSpore loads"),
    "load": ("loading a MindIR graph is not supported; load parameters with load_checkpoint and "
             "load_param_into_net"),
}


def missing_name(module: str, name: str, known: Dict[str, str],
                 present: Optional[Iterable[str]] = None) -> None:
    """Raises the ``AttributeError`` for ``module.name``: when ``known`` lists the name, saying
    what the engine lacks (and, given ``present``, the names the module has)."""
    if name not in known:
        raise AttributeError(f"module '{module}' has no attribute '{name}'")
    have = "" if present is None else f" {module} has: " + ", ".join(
        sorted(n for n in present if not n.startswith("_"))) + "."
    raise AttributeError(f"module '{module}' has no attribute '{name}': MindSpore's {name} is "
                         f"not supported: {known[name]}.{have}")
