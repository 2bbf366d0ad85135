"""A seeded random sweep of pipelines and optimizer parallelism through the package's API: the
small networks of ``test_sweep_sharded.py`` cut into 2–4 pipeline stages
(``AutoParallel.pipeline`` with every scheduler, ``interleave``, ``parallel.nn.Pipeline`` with
micro-batch counts and ``stage_config`` boundaries at random layers, random ``shard``
strategies — tuples and ``Layout``s — inside a stage, the search modes) and
``AutoParallel.hsdp`` configurations (every level, shard sizes, thresholds), each with and without
``GradAccumulation`` (inside or around the ``Pipeline``), some with ``MicroBatchInterleaved``,
the context's ``semi_auto_parallel``/``data_parallel`` instead of ``AutoParallel``, or a second
``Model.train`` resuming the first, on 2, 4 and 8 devices, under
``set_context(deterministic="ON")``.

Each must give the one-device run's bits (docs/DETERMINISM.md: a pipeline's micro-batches are a
step's gradient accumulation, so the reference is one device accumulating the same
micro-batches, which ``Model.train`` does with the same wrappers on one device): every step's
loss, every trained parameter, and the run's checkpoint set merged back to whole tensors two
ways (``tessera.load_checkpoint`` of the set, and MindSpore's ``convert_checkpoints`` to an
unsharded file) — weights, optimizer state and step counter, against the one-device set.
With ``hsdp`` the saved strategy must shard each parameter's optimizer state as MindSpore's
rules say (``threshold``, ``shard_size``): a switch that does nothing fails. A configuration
refused must be refused naming the setting or node and the rule. Below the sweep, one test per
bug it found.

The test runs a fixed set of cases (well under a minute); ``python tests/test_sweep_pipeline.py
--seed S --cases K`` runs a longer sweep by hand, one process per case (a hang is a TIMEOUT),
printing each case and its result (``--one SEED`` runs one case in this process)."""

import dataclasses
import os
import shutil
import sys
import tempfile
import warnings

import numpy as np
import pytest

import tessera
from tessera import dataset as ds
from tessera import nn, ops
from tessera.parallel import build_searched_strategy, convert_checkpoints
from tessera.parallel.auto_parallel import AutoParallel
from tessera.parallel.nn import GradAccumulation, MicroBatchInterleaved, Pipeline
from tessera.train import Model

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_sweep_sharded import BATCH, CLASSES, SEQ, SweepNet, _optimizer  # noqa: E402

SCHEDULERS = ("1f1b", "gpipe", "zero_bubble", "interleaved_1f1b")
LEVELS = ("level1", "level2", "level3")
MODES = ("semi_auto", "sharding_propagation", "recursive_programming")
VIRTUAL = 2  # the engine's model chunks per stage with interleave (DEFAULT_VIRTUAL_STAGES)


@dataclasses.dataclass
class Case:
    """One drawn configuration (``describe()`` prints it)."""

    seed: int
    devices: int
    mode: str = "semi_auto"          # AutoParallel's parallel_mode
    stages: int = 1                  # AutoParallel.pipeline(stages=...); 1: no pipeline switch
    scheduler: str = "1f1b"
    interleave: bool = False
    micro: int = 0                   # Pipeline(micro_size); 0: no Pipeline wrapper
    stage_of_layer: tuple = ()       # the group (stage, or chunk with interleave) of each layer
    named: tuple = ()                # the layers stage_config names (the others inherit)
    accumulate: int = 1              # GradAccumulation(micro_size); 1: none
    inner: bool = False              # GradAccumulation inside Pipeline (else around it)
    hsdp: dict = None                # AutoParallel.hsdp(**hsdp)
    share: float = 0.0               # the layers given random strategies
    steps: int = 2
    interleaved: int = 0             # MicroBatchInterleaved(interleave_num); 0: none
    context: str = ""                # no AutoParallel: set_auto_parallel_context(parallel_mode)
    resume: bool = False             # a second Model.train continues from the first's set

    def describe(self):
        parts = [f"net {self.seed} on {self.devices} ({self.context or self.mode})"]
        if self.micro:
            parts.append(f"Pipeline(micro={self.micro}, stage_config={self.stage_config()})")
        if self.stages > 1:
            parts.append(f"pipeline(stages={self.stages}, scheduler={self.scheduler}, "
                         f"interleave={self.interleave})")
        if self.accumulate > 1:
            parts.append(f"GradAccumulation({self.accumulate}, "
                         f"{'inside' if self.inner else 'around'} Pipeline)")
        if self.hsdp:
            parts.append(f"hsdp({self.hsdp})")
        if self.interleaved:
            parts.append(f"MicroBatchInterleaved({self.interleaved})")
        if self.resume:
            parts.append("resumed")
        parts.append(f"share={self.share:.2f}")
        return ", ".join(parts)

    def groups(self):
        return self.stages * (VIRTUAL if self.interleave else 1)

    def stage_config(self):
        """The cell names of the Pipeline's network: each wrapper inside it
        (``GradAccumulation``, ``MicroBatchInterleaved``) adds its ``network`` attribute, as in
        MindSpore's ``cells_and_names``."""
        inside = (self.inner and self.accumulate > 1) + bool(self.interleaved)
        prefix = "network." * inside + "_backbone"
        return {f"{prefix}.l{i}": self.stage_of_layer[i] for i in self.named}


def _layers(seed):
    return len(SweepNet(seed).layers)


def _fits(net, stage_of_layer, stages):
    """True when every stage holds a parameter and every group starts at a layer with ops
    (the cuts a valid configuration has; the others must be refused naming the setting)."""
    held = set()
    for layer, group in zip(net.layers, stage_of_layer):
        if list(layer.trainable_params()):
            held.add(group % stages)
    starts = [i for i, g in enumerate(stage_of_layer) if i == 0 or stage_of_layer[i - 1] != g]
    opless = ("Identities", "Dropout(0)")
    return len(held) == stages and not any(net.layers[i].desc in opless for i in starts)


def draw(seed):
    """The case of ``seed``: a pipeline (about 60%) or an hsdp configuration, on 2, 4 or 8."""
    rng = np.random.default_rng([seed, 7])
    case = Case(seed=seed, devices=int(rng.choice([2, 4, 8])), steps=2 + seed % 2)
    case.mode = str(rng.choice(MODES, p=[0.6, 0.2, 0.2]))
    layers = _layers(seed)
    if rng.random() < 0.6:
        stages = [p for p in (2, 4) if case.devices % p == 0 and p <= layers]
        if stages:
            case.stages = int(rng.choice(stages))
            case.scheduler = str(rng.choice(SCHEDULERS))
            # interleave=True with gpipe is the other spelling of interleaving.
            case.interleave = case.scheduler == "interleaved_1f1b" or (
                case.scheduler == "gpipe" and rng.random() < 0.3)
            if case.groups() > layers:
                case.interleave, case.scheduler = False, "1f1b"
            micros = [m for m in (1, 2, 4, 8) if not case.interleave or m % case.stages == 0]
            case.micro = int(rng.choice(micros))
            g = case.groups()
            if rng.random() < 0.2:
                case.stage_of_layer, case.named = (), ()  # the engine's even cut
            else:
                net = SweepNet(seed)
                for _ in range(20):  # mostly valid cuts; about one in ten taken as drawn
                    cuts = sorted(rng.choice(np.arange(1, layers), g - 1,
                                             replace=False).tolist())
                    case.stage_of_layer = tuple(sum(c <= i for c in cuts) for i in range(layers))
                    if _fits(net, case.stage_of_layer, case.stages) or rng.random() < 0.1:
                        break
                firsts = [0] + cuts
                others = [i for i in range(layers) if i not in firsts and rng.random() < 0.3]
                case.named = tuple(sorted(firsts + others))
    if case.stages == 1 or rng.random() < 0.25:
        sizes = [-1] + [s for s in (1, 2, 4, 8) if (case.devices // case.stages) % s == 0]
        case.hsdp = {"shard_size": int(rng.choice(sizes)),
                     "threshold": int(rng.choice([0, 1, 4, 64, 4096])),
                     "optimizer_level": str(rng.choice(LEVELS))}
    if rng.random() < 0.35:
        case.accumulate = int(rng.choice([2, 4]))
        case.inner = bool(rng.integers(2))
    per_stage = case.devices // case.stages
    case.share = 0.0 if per_stage == 1 else float(rng.choice([0.0, 0.5, 1.0]))
    if case.mode == "semi_auto" and per_stage > 1 and rng.random() < 0.7:
        case.share = 1.0 if case.share == 0.0 else case.share
    if rng.random() < (0.15 if case.stages == 1 else 0.03):  # refused with stages
        case.interleaved = 2
    case.resume = bool(rng.random() < 0.2)
    if case.stages == 1 and case.hsdp is not None and rng.random() < 0.3:
        # The context's modes (no AutoParallel: no stages, no hsdp); Pipeline only cuts.
        case.context = str(rng.choice(["semi_auto_parallel", "data_parallel"]))
        case.hsdp, case.mode = None, "semi_auto"
        if rng.random() < 0.5:
            case.micro = int(rng.choice([1, 2, 4]))
    return case


def _data(net, seed, case):
    """Every step's batch: ``BATCH`` samples per micro-batch (so strategies drawn for ``BATCH``
    rows divide every micro-batch), ``micro × accumulate`` of them per step."""
    per_step = BATCH * max(case.micro, 1) * case.accumulate * max(case.interleaved, 1)
    rng = np.random.default_rng(seed + 1)
    count = per_step * case.steps
    if net.input == "tokens":
        x = rng.integers(0, net.vocab, (count, SEQ)).astype(np.int32)
    else:
        x = rng.standard_normal((count,) + net.in_shape[1:]).astype(np.float32)
    y = rng.integers(0, CLASSES, count).astype(np.int32)
    return ds.NumpySlicesDataset({"data": x, "label": y}, shuffle=False).batch(per_step)


def run(case, devices, run_dir):
    """``case`` trained on ``devices`` (1: the reference, same wrappers, no strategies):
    (losses, {param: array}, the checkpoint set's directory, the network)."""
    tessera.reset_auto_parallel_context()
    tessera.set_seed(case.seed % 1000 + 1)
    tessera.set_context(deterministic="ON")
    net = SweepNet(case.seed)
    if devices > 1 and case.share:
        net.shard(np.random.default_rng([case.seed, 3]), case.devices // case.stages,
                  share=case.share)
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    opt = _optimizer(case.seed, net.trainable_params())
    if case.context:
        tessera.set_auto_parallel_context(
            device_num=devices, gradients_mean=True,
            parallel_mode=case.context if devices > 1 else "stand_alone")
    else:
        tessera.set_auto_parallel_context(device_num=devices)
    top = nn.WithLossCell(net, loss)
    if case.interleaved:
        top = MicroBatchInterleaved(top, case.interleaved)
    if case.accumulate > 1 and case.inner:
        top = GradAccumulation(top, case.accumulate)
    if case.micro:
        top = Pipeline(top, case.micro, stage_config=case.stage_config() or None)
    if case.accumulate > 1 and not case.inner:
        top = GradAccumulation(top, case.accumulate)
    if not case.context:
        top = AutoParallel(top, parallel_mode=case.mode)
        top.enable_gradients_mean()
        if case.stages > 1:
            top.pipeline(stages=case.stages, interleave=case.interleave,
                         scheduler=case.scheduler)
        if case.hsdp:
            top.hsdp(**case.hsdp)
    model = Model(top, optimizer=opt, run_dir=run_dir)
    data = _data(net, case.seed, case)
    losses = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(2 if case.resume else 1):
            model.train(1, data)
            losses += model.losses
    params = {p.name: p.asnumpy() for p in net.trainable_params()}
    sets = sorted((d for d in os.listdir(run_dir) if d.startswith("run_")),
                  key=lambda d: int(d[4:]))
    return np.array(losses), params, os.path.join(run_dir, sets[-1]), net


def merged(set_dir, work):
    """The set read back whole two ways: ``load_checkpoint`` of the set, and
    ``convert_checkpoints`` to one unsharded file read back."""
    whole = {k: v.asnumpy() for k, v in tessera.load_checkpoint(set_dir).items()}
    dst = os.path.join(work, "unsharded")
    convert_checkpoints(set_dir, dst, "net", src_strategy_file=os.path.join(set_dir,
                                                                            "strategy.ckpt"))
    file = os.path.join(dst, "rank_0", "net0.ckpt")
    converted = {k: v.asnumpy() for k, v in tessera.load_checkpoint(file).items()}
    return whole, converted


def hsdp_effect(case, set_dir, params):
    """None when the run's strategy shards each parameter's optimizer state as ``case.hsdp``
    says (MindSpore's rules: a parameter below ``threshold`` KB is not sharded; one at or above
    it, with a replica group of R > 1 ranks whose dim-0 slice the shard count divides, is
    sharded over ``min(shard_size, R)`` ranks, R for -1); else the parameter that is not."""
    k, threshold = case.hsdp["shard_size"], case.hsdp["threshold"]
    strategy = build_searched_strategy(os.path.join(set_dir, "strategy.ckpt"))
    for key, entry in strategy.items():
        name = key.split("-", 1)[1] if key.split("-", 1)[0].isdigit() else key
        if name not in params:
            continue
        dm = entry["dev_matrix"][0]["dim"]
        tm = [d for item in entry["tensor_map"] for d in item["dim"]]
        used = [dm[len(dm) - 1 - d] for d in tm if d >= 0]
        replicas = int(np.prod(dm)) // int(np.prod(used)) if used else int(np.prod(dm))
        size = entry.get("opt_weight_shard_size", 0)
        dim0_split = dm[len(dm) - 1 - tm[0]] if tm and tm[0] >= 0 else 1
        value = params[name]
        want = replicas if k == -1 or k >= replicas else k
        if value.nbytes < threshold * 1024:
            if size not in (0, 1):
                return f"{name} ({value.nbytes} bytes) is below threshold={threshold} KB but " \
                       f"its optimizer state is sharded {size} ways"
        elif replicas > 1 and value.ndim and (value.shape[0] // dim0_split) % want == 0:
            if size not in ((want, -1 if k == -1 else want) if want > 1 else (0, 1)):
                return f"{name} ({value.nbytes} bytes, {replicas} replicas) should be sharded " \
                       f"{want} ways but opt_weight_shard_size is {size}"
    return None


#: What a refusal must name: a setting (an engine key, a wrapper or switch) and a rule.
REFUSAL_NAMES = ("parallel.", "train.", "Pipeline", "GradAccumulation", "AutoParallel",
                 "stage_config", "micro")


def compare(case):
    """None when ``case`` on its devices is bitwise the one-device run; ``("refused", message)``
    for a refusal naming a setting; else what differs."""
    work = tempfile.mkdtemp(prefix="sweep-pipeline-")
    try:
        one = run(case, 1, os.path.join(work, "one"))
        try:
            got = run(case, case.devices, os.path.join(work, "many"))
        except (tessera.ConfigError, ValueError) as e:
            message = str(e)
            if not any(name in message for name in REFUSAL_NAMES):
                return ("refusal names no setting", message)
            return ("refused", message)
        if got[0].shape != one[0].shape or not (got[0] == one[0]).all():
            return ("losses", f"{got[0].tolist()} vs one device's {one[0].tolist()}")
        for name, value in one[1].items():
            if not np.array_equal(got[1][name], value):
                return ("params", f"{name} differs by {np.abs(got[1][name] - value).max()}")
        ref, _ = merged(one[2], os.path.join(work, "one-merged"))
        for how, tensors in zip(("load_checkpoint", "convert_checkpoints"),
                                merged(got[2], os.path.join(work, "many-merged"))):
            if sorted(tensors) != sorted(ref):
                return ("checkpoint", f"{how}: names {sorted(tensors)} vs one device's "
                                      f"{sorted(ref)}")
            for name, value in ref.items():
                if not np.array_equal(tensors[name], value):
                    return ("checkpoint", f"{how}: {name} differs from one device's")
            for name, value in one[1].items():
                if not np.array_equal(tensors[name], value):
                    return ("checkpoint", f"{how}: {name} differs from the trained Parameter")
        if case.hsdp:
            wrong = hsdp_effect(case, got[2], got[1])
            if wrong:
                return ("hsdp", wrong)
        return None
    finally:
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture
def fresh():
    yield
    tessera.reset_auto_parallel_context()
    tessera.set_context(deterministic="OFF")
    tessera.set_seed(1)


#: Fixed cases: seeds whose draws cover every scheduler (and gpipe with interleave), 2 and 4
#: stages with drawn and even cuts, each hsdp level, accumulation inside and around the
#: Pipeline, MicroBatchInterleaved, resumes, the context's modes and the search modes on 2, 4
#: and 8 devices.
CASES = list(range(1, 41))


@pytest.mark.usefixtures("fresh")
@pytest.mark.parametrize("seed", CASES)
def test_pipelines_and_hsdp_are_bitwise_one_devices(seed):
    case = draw(seed)
    found = compare(case)
    assert found is None or found[0] == "refused", f"{case.describe()}: {found}"


class _Shift(nn.Cell):
    """``x + shift`` with a frozen ``shift``."""

    def __init__(self):
        super().__init__()
        self.shift = tessera.Parameter(np.full(16, 0.1, np.float32), requires_grad=False)
        self.add = ops.Add()

    def construct(self, x):
        return self.add(x, self.shift)


class _Three(nn.Cell):
    """``fc1`` → ``mid`` → ``fc2`` (→ ``act``): ``mid`` is ``nn.Dropout(p=0)`` (no op), a
    ``ReLU`` (an op, no parameter) or ``_Shift`` (a frozen parameter)."""

    def __init__(self, mid):
        super().__init__()
        self.fc1 = nn.Dense(16, 16, activation="tanh")
        self.mid = {"dropout": nn.Dropout(p=0.0), "relu": nn.ReLU(), "frozen": _Shift()}[mid]
        self.fc2 = nn.Dense(16, CLASSES)
        self.act = nn.Tanh()

    def construct(self, x):
        return self.act(self.fc2(self.mid(self.fc1(x))))


def _three(devices, mid="dropout", stage_config=None, stages=2, micro=2, setup=None):
    """Losses and parameters of ``_Three`` in a ``Pipeline`` on ``devices`` (engine warnings
    are left to the caller)."""
    tessera.reset_auto_parallel_context()
    tessera.set_seed(5)
    tessera.set_context(deterministic="ON")
    tessera.set_auto_parallel_context(device_num=devices)
    net = _Three(mid)
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    top = AutoParallel(Pipeline(nn.WithLossCell(net, loss), micro, stage_config=stage_config))
    top.enable_gradients_mean()
    if stages:
        top.pipeline(stages=stages)
    if setup:
        setup(top)
    rng = np.random.default_rng(0)
    data = ds.NumpySlicesDataset({"x": rng.standard_normal((64, 16)).astype(np.float32),
                                  "y": rng.integers(0, CLASSES, 64).astype(np.int32)},
                                 shuffle=False).batch(32)
    model = Model(top, optimizer=nn.Momentum(net.trainable_params(), 0.1, 0.9))
    model.train(1, data)
    return model.losses, {p.name: p.asnumpy() for p in net.trainable_params()}


@pytest.mark.usefixtures("fresh")
def test_a_stage_without_parameters_before_one_with_some_is_refused_before_training():
    """A stage holding no parameter before one that holds some (MindSpore: "each stage must
    have at least one parameter that needs to be trained") is refused before training, naming
    the setting: it used to train, then fail reading its own checkpoint back ("pipeline stage 1
    has no parameters"), a set no conversion or resume could read either."""
    config = {"_backbone.fc1": 0, "_backbone.mid": 1, "_backbone.fc2": 2, "_backbone.act": 3}
    with pytest.raises(tessera.ConfigError, match=r"parallel\.pipeline\.stage_config: stage 1 "
                                                  r"holds no trainable parameter \(its cells: "
                                                  r"mid\) but stage 2 does"):
        _three(4, mid="relu", stage_config=config, stages=4, micro=4)
    # A frozen parameter is not in the checkpoint: a stage holding only one is refused alike.
    with pytest.raises(tessera.ConfigError, match=r"stage 1 holds no trainable parameter"):
        _three(4, mid="frozen", stage_config=config, stages=4, micro=4)
    # A last stage without parameters (the activation and the loss) trains as one device.
    config = {"_backbone.fc1": 0, "_backbone.fc2": 1, "_backbone.act": 2}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        one = _three(1, mid="relu", stage_config=config, stages=None, micro=2)
        many = _three(6, mid="relu", stage_config=config, stages=3, micro=2)
    assert one[0] == many[0]


@pytest.mark.usefixtures("fresh")
def test_a_stage_given_to_a_cell_without_ops_is_left_out_with_a_warning():
    """``stage_config`` naming a cell that adds no op (``nn.Dropout(p=0)``) is MindSpore's
    no-op (a stage colours ops): left out with a warning naming it, and the run is one
    device's; it was refused as "matches no layer of the model". A stage that only such a
    cell was given would run nothing: refused naming the cell."""
    config = {"_backbone.fc1": 0, "_backbone.mid": 1, "_backbone.fc2": 1}
    one = _three(1, stage_config=config, stages=None)
    with pytest.warns(UserWarning, match=r"stage_config\['_backbone\.mid'\] = 1 has no effect"):
        many = _three(4, stage_config=config)
    assert many[0] == one[0]
    for name, value in one[1].items():
        assert np.array_equal(many[1][name], value), name
    with pytest.raises(ValueError, match=r"stage_config\['_backbone\.mid'\] = 1: the cell adds "
                                         r"no op .* no other cell is given stage 1"):
        _three(4, stage_config={"_backbone.fc1": 0, "_backbone.mid": 1})


@pytest.mark.usefixtures("fresh")
def test_settings_without_effect_warn_and_defaults_do_not():
    """The engine's warnings reach ``Model.train`` (they were dropped): pipeline keys given
    with one stage; ``output_broadcast=True`` (no effect on training) and an ``hsdp``
    threshold no parameter reaches warn too. The defaults warn about nothing."""
    with pytest.warns(UserWarning, match=r"parallel\.pipeline\.scheduler has no effect with "
                                         r"parallel\.pipeline\.stages = 1"):
        _three(2, mid="relu", stages=1, setup=lambda p: p.pipeline(stages=1, scheduler="gpipe"))
    with pytest.warns(UserWarning, match=r"output_broadcast=True\) has no effect"):
        _three(2, mid="relu", setup=lambda p: p.pipeline(stages=2, output_broadcast=True))
    with pytest.warns(UserWarning, match=r"hsdp\(threshold=64\) has no effect: no parameter has "
                                         r"64 KB or more \(the largest: 1024 bytes\)"):
        _three(2, mid="relu", stages=None, setup=lambda p: p.hsdp())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _three(2, mid="relu", stages=1)
        _three(2, mid="relu", stages=None, setup=lambda p: p.hsdp(threshold=1))


@pytest.mark.usefixtures("fresh")
@pytest.mark.parametrize("seed", [183, 136])
def test_micro_batch_interleaved_is_bitwise_one_devices(seed):
    """``MicroBatchInterleaved(net, 2)`` on 2 devices (alone, and inside a ``Pipeline``) gives
    one device's bits: one device accumulates the interleaved parts as the ranks add them (it
    ran them as one batch, 1e-7 off)."""
    case = draw(seed)
    assert case.interleaved == 2 and case.devices == 2
    assert compare(case) is None, case.describe()


@pytest.mark.usefixtures("fresh")
@pytest.mark.parametrize("key,value,instead", [
    ("pipeline_stages", 2, r"AutoParallel\(net\)\.pipeline\(stages=\.\.\.\)"),
    ("enable_parallel_optimizer", True, r"AutoParallel\(net\)\.hsdp"),
    ("parallel_optimizer_config", {"parallel_optimizer_threshold": 1},
     r"AutoParallel\(net\)\.hsdp"),
    ("grad_accumulation_step", 2, r"parallel\.nn\.GradAccumulation"),
])
def test_mindspores_context_keys_for_pipelines_and_hsdp_name_the_switch_to_use(key, value,
                                                                              instead):
    with pytest.raises(ValueError, match=rf"set_auto_parallel_context: {key} is not supported; "
                                         rf"use {instead}"):
        tessera.set_auto_parallel_context(**{key: value})


def main(argv):
    import argparse
    import subprocess
    import time
    p = argparse.ArgumentParser()
    p.add_argument("--seed", type=int, default=1000)
    p.add_argument("--cases", type=int, default=20)
    p.add_argument("--one", type=int, default=None, help="run case SEED in this process")
    args = p.parse_args(argv)
    if args.one is not None:
        case = draw(args.one)
        t = time.time()
        try:
            r = compare(case)
        except Exception as e:  # noqa: BLE001 - a sweep reports every failure
            r = ("EXCEPTION", f"{type(e).__name__}: {e}")
        print(f"case {args.one}: {case.describe()}: {'ok' if r is None else r} "
              f"({time.time() - t:.1f}s)", flush=True)
        return
    for seed in range(args.seed, args.seed + args.cases):
        cmd = [sys.executable, __file__, "--one", str(seed)]
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
            print(out.stdout.strip() + (out.stderr[-3000:] if out.returncode else ""),
                  flush=True)
        except subprocess.TimeoutExpired:
            print(f"case {seed}: TIMEOUT", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
