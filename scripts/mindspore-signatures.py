"""Writes tests/fixtures/mindspore/signatures.json: the parameter names, kinds and defaults of the
mindspore.parallel functions that tessera.parallel mirrors, and of the network API (nn, ops,
dataset, communication, AutoParallel, parallel.nn, train) that tessera's front end mirrors
(`network` entries, keyed `module:qualname`), as MindSpore itself declares them.

Run in a venv with MindSpore installed (pip install mindspore==2.10.0):
    python scripts/mindspore-signatures.py tests/fixtures/mindspore/signatures.json
"""
import importlib
import inspect
import json
import sys

import mindspore
import mindspore.parallel as P

NAMES = [
    "convert_checkpoints",
    "convert_checkpoint_by_rank",
    "rank_list_for_convert",
    "unified_safetensors",
    "load_distributed_checkpoint",
    "load_segmented_checkpoints",
    "build_searched_strategy",
    "merge_pipeline_strategys",
    "restore_group_info_list",
]


# The network API of issue 34: (module, qualified name). A class stands for its __init__.
NETWORK = [
    ("mindspore", n) for n in ("Parameter", "Tensor", "set_context", "set_seed",
                               "set_auto_parallel_context")
] + [
    ("mindspore.nn", n) for n in (
        "Cell", "Dense", "Flatten", "ReLU", "GELU", "Tanh", "Sigmoid", "SiLU", "Softmax",
        "Dropout", "LayerNorm",
        "Embedding", "SequentialCell", "CellList", "WithLossCell", "CrossEntropyLoss",
        "SoftmaxCrossEntropyWithLogits", "MSELoss", "SGD", "Momentum", "Adam", "AdamWeightDecay",
        "warmup_lr", "cosine_decay_lr", "polynomial_decay_lr", "exponential_decay_lr",
        "piecewise_constant_lr", "CosineDecayLR", "WarmUpLR", "PolynomialDecayLR",
        "ExponentialDecayLR", "Accuracy", "Loss", "Cell.trainable_params", "Cell.construct",
        "Cell.parameters_and_names", "Cell.cells_and_names", "LeakyReLU", "ELU", "Mish",
        "Identity")
] + [("mindspore.nn.utils", "no_init_parameters"), ("mindspore.mint.optim", "AdamW")] + [
    ("mindspore.ops", n) for n in (
        "MatMul", "BatchMatMul", "Add", "Sub", "Mul", "RealDiv", "ReLU", "GeLU", "Softmax",
        "LogSoftmax", "Reshape", "Transpose", "ReduceSum", "ReduceMean", "ReduceMax", "Gather",
        "OneHot", "Concat", "Split", "Cast", "LayerNorm", "Exp", "Sqrt", "Log", "Neg", "Print",
        "BiasAdd", "Flatten", "Tanh", "Sigmoid", "sigmoid", "silu",
        "SparseSoftmaxCrossEntropyWithLogits", "Dropout", "Primitive.shard", "ExpandDims",
        "expand_dims", "unsqueeze", "Squeeze", "squeeze", "Square", "square", "Abs", "abs",
        "Maximum", "maximum", "Minimum", "minimum", "Rsqrt", "rsqrt", "Pow", "pow", "Elu", "elu",
        "Softplus", "softplus", "Mish", "mish", "leaky_relu")
] + [
    ("mindspore.common.initializer", n) for n in (
        "initializer", "HeUniform", "Normal", "TruncatedNormal", "Zero", "One", "XavierUniform",
        "Uniform")
] + [
    ("mindspore.dataset", n) for n in (
        "MnistDataset", "NumpySlicesDataset", "GeneratorDataset", "MnistDataset.map",
        "MnistDataset.batch", "MnistDataset.shuffle")
] + [
    ("mindspore.dataset.vision", n) for n in ("Rescale", "Normalize", "HWC2CHW")
] + [("mindspore.dataset.transforms", "TypeCast")] + [
    ("mindspore.communication", n) for n in (
        "init", "get_rank", "get_group_size", "get_local_rank", "get_local_rank_size", "release")
] + [("mindspore.parallel.auto_parallel", "AutoParallel")] + [
    ("mindspore.parallel.auto_parallel", "AutoParallel." + m) for m in (
        "comm_fusion", "dataset_strategy", "disable_gradient_fp32_sync",
        "disable_loss_repeated_mean", "disable_strategy_file_only_for_trainable_params",
        "dump_local_norm", "enable_device_local_norm", "enable_fp32_communication",
        "enable_gradients_mean", "hsdp", "load_operator_strategy_file",
        "load_param_strategy_file", "no_init_parameters_in_compile", "pipeline",
        "print_local_norm", "save_operator_strategy_file", "save_param_strategy_file",
        "set_group_ckpt_save_file", "transformer_opt")
] + [
    ("mindspore.parallel.nn", n) for n in (
        "Pipeline", "PipelineGradReducer", "GradAccumulation", "MicroBatchInterleaved")
] + [
    ("mindspore.train", n) for n in (
        "Model", "Model.train", "Model.eval", "LossMonitor", "TimeMonitor", "ModelCheckpoint",
        "CheckpointConfig", "Callback", "RunContext")
]


def lookup(module, qualname):
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def describe_network(module, qualname):
    """The parameters of a function, a method (without self) or a class's __init__; None when
    MindSpore lacks the name or inspect cannot read it."""
    try:
        obj = lookup(module, qualname)
    except (AttributeError, ImportError):
        return None
    is_class = inspect.isclass(obj)
    try:
        params = describe(obj.__init__ if is_class else obj)
    except (TypeError, ValueError):
        return None
    if is_class or "." in qualname:
        params = [p for p in params if p["name"] != "self"]
    return params


def describe(func):
    params = []
    for p in inspect.signature(func).parameters.values():
        entry = {"name": p.name, "kind": p.kind.name}
        if p.default is not inspect.Parameter.empty:
            entry["default"] = repr(p.default)
        params.append(entry)
    return params


def main(out):
    sigs = {name: describe(getattr(P, name)) for name in NAMES}
    sigs["Layout.__init__"] = describe(P.Layout.__init__)[1:]
    sigs["Layout.__call__"] = describe(P.Layout.__call__)[1:]
    sigs["Layout.to_dict"] = describe(P.Layout.to_dict)[1:]
    network = {f"{m}:{q}": describe_network(m, q) for m, q in NETWORK}
    doc = {"mindspore": mindspore.__version__, "signatures": sigs, "network": network}
    with open(out, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main(sys.argv[1])
