"""Hostile input found by fuzzing the package: each case raises a clear Python exception naming
the argument, file or tensor and the rule broken — never a Rust panic (PanicException), an
abort, a hang, an unbounded allocation or a file left behind — and a tool removes only what it
made. Cases that could hang or abort the interpreter before their fix run in a subprocess."""

import json
import os
import re
import struct
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import tessera
from tessera import _tessera as T
from tessera import dataset as ds
from tessera import nn, ops
from tessera import parallel as P
from tessera.common.initializer import TruncatedNormal, initializer
from tessera.parallel.auto_parallel import AutoParallel
from tessera.train import Model

from conftest import CASES
from nets import MLP, fresh_context  # noqa: F401 (the fixture is used by name)

CASE = CASES / "case1_dp2mp4_to_2x2"
A, B = str(CASE / "strategy/A.ckpt"), str(CASE / "strategy/B.ckpt")
FULL_CKPT = str(CASE / "full_ckpt/rank_0/full.ckpt")
SRC_FILES = [str(CASE / f"src_ckpt/rank_{r}/checkpoint_{r}.ckpt") for r in range(8)]


def _isolated(code, cwd, timeout=60):
    """Runs ``code`` in a fresh interpreter (a hang or an abort there fails the test instead of
    the test run); returns its stdout. The code prints what it observed."""
    try:
        done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the call did not return within {timeout} s (a hang)")
    assert done.returncode == 0, f"exit {done.returncode} (signal: abort or crash): {done.stderr[-2000:]}"
    return done.stdout


def _reports(code, cwd, timeout=60):
    """The exception ``code`` (which calls the API) raises, as ``(type name, message)``."""
    wrapped = f"""
import json, numpy as np, tessera
from tessera import _tessera as T
try:
{textwrap.indent(textwrap.dedent(code), '    ')}
    print(json.dumps(["ok", ""]))
except BaseException as e:
    print(json.dumps([type(e).__name__, str(e)]))
"""
    kind, message = json.loads(_isolated(wrapped, cwd, timeout).strip().splitlines()[-1])
    return kind, message


# --------------------------------------------------------------------------------- Layout

@pytest.mark.parametrize("device_matrix,rule", [
    ((-2, 4), "axis 0 has size -2"),
    ((2, 0), "axis 1 has size 0"),
    ((2**64, 1), "above 2**63 - 1"),
])
def test_layout_device_matrix_out_of_range_names_it(device_matrix, rule):
    # Negative and >= 2**64 sizes were an OverflowError ("can't convert negative int to
    # unsigned") naming nothing.
    with pytest.raises(ValueError, match="device_matrix") as err:
        P.Layout(device_matrix, ("dp", "mp"))
    assert rule in str(err.value)


@pytest.mark.parametrize("rank", [-1, 2**64])
def test_layout_rank_list_out_of_range_names_it(rank):
    with pytest.raises(ValueError, match=r"rank_list: rank .* is out of range"):
        P.Layout((2, 4), ("dp", "mp"), rank_list=[rank] + list(range(1, 8)))


def test_layout_slices_method_checks_the_shape():
    layout = P.Layout((2, 4), ("dp", "mp"))("dp", "mp")
    with pytest.raises(ValueError, match="For 'shape'"):
        layout.slices([-4, 8])
    with pytest.raises(TypeError, match="For 'shape'"):
        layout.slices(8)


# --------------------------------------------------------------------------------- checkpoint tools

def test_predict_strategy_beyond_64_bits_names_the_parameter():
    # Was OverflowError "Python int too large to convert to C long".
    with pytest.raises(ValueError, match=r"parameter 'net.w1': dev_matrix holds 18446744073709551616"):
        P.load_distributed_checkpoint(None, SRC_FILES, {"net.w1": [[2**64, 4], [1, 0], [], 0]}, A)


def test_split_dst_file_beyond_64_bits_is_named(tmp_path):
    with pytest.raises(ValueError, match="For 'split_dst_file'"):
        P.unified_safetensors(str(CASE / "src_safetensors"), A, str(tmp_path / "u"),
                              split_dst_file=(1, 2**64))
    assert not (tmp_path / "u").exists()


def test_prefix_with_a_lone_surrogate_is_named(tmp_path):
    # Was a UnicodeEncodeError naming neither the argument nor the rule.
    with pytest.raises(ValueError, match="For 'ckpt_prefix'.*lone surrogate"):
        P.convert_checkpoints(str(CASE / "src_ckpt"), str(tmp_path / "out"), "c_\udcff", A, B)
    assert not (tmp_path / "out").exists()


def test_encrypting_a_fifo_is_refused_not_a_hang(tmp_path):
    os.mkfifo(tmp_path / "pipe.ckpt")
    kind, message = _reports(f"T.encrypt_checkpoint_file({str(tmp_path / 'pipe.ckpt')!r}, "
                             f"{str(tmp_path / 'e.ckpt')!r}, b'k' * 16)", tmp_path)
    assert kind == "CheckpointError" and "not a regular file" in message
    assert not (tmp_path / "e.ckpt").exists()


def test_encrypting_a_device_is_refused(tmp_path):
    # /dev/zero was read without end.
    kind, message = _reports(f"T.encrypt_checkpoint_file('/dev/zero', "
                             f"{str(tmp_path / 'e.ckpt')!r}, b'k' * 16)", tmp_path)
    assert kind == "CheckpointError" and "/dev/zero" in message and "not a regular file" in message


def _many_tensors(path, n):
    header = {f"t{i}": {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]}
              for i in range(n)}
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + bytes(4 * n))


def _seconds(call, runs=3):
    """The fastest of `runs` timings of `call`: a busy machine only ever slows a run down, so
    the minimum is the figure least disturbed (these tests compare two sizes' figures)."""
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best


def test_load_segmented_checkpoints_is_not_quadratic_in_the_tensor_count(tmp_path):
    # Each tensor was matched against every earlier one: a file of 100k tiny tensors (a 2.4 MB
    # header) took minutes. Four times the tensors must cost about four times the time.
    small, large = tmp_path / "small", tmp_path / "large"
    small.mkdir()
    large.mkdir()
    _many_tensors(small / "a.safetensors", 15000)
    _many_tensors(large / "a.safetensors", 60000)
    P.load_segmented_checkpoints(str(small))  # warm up
    t_small = _seconds(lambda: P.load_segmented_checkpoints(str(small)))
    t_large = _seconds(lambda: P.load_segmented_checkpoints(str(large)))
    assert t_large < 8 * t_small + 0.5, f"15k tensors {t_small:.2f} s, 60k {t_large:.2f} s"


def test_save_checkpoint_is_not_quadratic_in_the_tensor_count(tmp_path):
    def save(n):
        tessera.save_checkpoint({f"t{k}": np.ones(1, np.float32) for k in range(n)},
                                str(tmp_path / f"m{n}.ckpt"))
    save(100)
    t_small = _seconds(lambda: save(10000))
    t_large = _seconds(lambda: save(40000))
    assert t_large < 8 * t_small + 0.5, f"10k tensors {t_small:.2f} s, 40k {t_large:.2f} s"


# --------------------------------------------------------------------------------- save / load

@pytest.mark.parametrize("fmt", ["ckpt", "safetensors"])
def test_empty_tensors_save_and_load(tmp_path, fmt):
    # A tensor with a dim of 0 last in the file failed "more data written than the tensors
    # described" (naming, for .ckpt, a staging file that no longer exists).
    out = str(tmp_path / f"o.{fmt}")
    tessera.save_checkpoint({"a": np.ones(2, np.float32), "w": np.zeros((0, 5), np.float32)},
                            out, format=fmt)
    back = tessera.load_checkpoint(out)
    assert back["w"].asnumpy().shape == (0, 5)
    assert back["a"].asnumpy().tolist() == [1.0, 1.0]


def test_save_never_removes_a_directory_it_did_not_make(tmp_path):
    # The .ckpt path stages through `.tessera-save-<pid>` beside the file and removed that
    # directory afterwards, with whatever was in it.
    code = f"""
        import os, numpy as np, tessera
        mine = os.path.join({str(tmp_path)!r}, f".tessera-save-{{os.getpid()}}")
        os.makedirs(mine)
        with open(os.path.join(mine, "mine.txt"), "w") as f:
            f.write("user data")
        tessera.save_checkpoint({{"w": np.ones(3, np.float32)}}, {str(tmp_path / 'o.ckpt')!r})
        print(sorted(os.listdir(mine)))
        print(sorted(e for e in os.listdir({str(tmp_path)!r}) if e.startswith(".tessera-save")))
    """
    kept, staging = _isolated(code, tmp_path).strip().splitlines()
    assert kept == "['mine.txt']"
    assert staging.count(".tessera-save") == 1, "only the user's directory is left"


def test_duplicate_names_in_a_ckpt_name_the_destination(tmp_path):
    out = tmp_path / "o.ckpt"
    with pytest.raises(tessera.CheckpointError) as err:
        T.save_tensors(str(out), [("w", np.ones(2, np.float32)), ("w", np.ones(2, np.float32))])
    assert err.value.file == str(out) and err.value.tensor == "w"
    assert ".tessera-save" not in str(err.value)
    assert not out.exists() and os.listdir(tmp_path) == []


@pytest.mark.parametrize("kwargs,kind,match", [
    (dict(save_obj=[{"name": "a"}]), TypeError, "For 'save_obj', item 0"),
    (dict(save_obj=[5]), TypeError, "For 'save_obj', item 0"),
    (dict(append_dict=5), TypeError, "For 'append_dict'"),
    (dict(choice_func=5), TypeError, "For 'choice_func'"),
    (dict(save_obj={"\udcff": np.ones(2, np.float32)}), ValueError, "lone surrogate"),
    (dict(save_obj={5: np.ones(2, np.float32)}), TypeError, "tensor name"),
    (dict(save_obj={"a": [1, [2, 3]]}), ValueError, "tensor a:"),
])
def test_save_checkpoint_bad_arguments_are_named(tmp_path, kwargs, kind, match):
    # Were KeyError 'data', AttributeError, "'int' object is not callable",
    # UnicodeEncodeError and numpy's "inhomogeneous shape", none naming the argument.
    args = {"save_obj": {"a": np.ones(2, np.float32)}, **kwargs}
    with pytest.raises(kind, match=match):
        tessera.save_checkpoint(args.pop("save_obj"), str(tmp_path / "o.ckpt"), **args)
    assert os.listdir(tmp_path) == []


def test_load_checkpoint_of_a_fifo_says_what_it_is(tmp_path):
    # It said "does not exist".
    os.mkfifo(tmp_path / "pipe.ckpt")
    with pytest.raises(ValueError, match="neither a regular file nor a directory"):
        tessera.load_checkpoint(str(tmp_path / "pipe.ckpt"))


# --------------------------------------------------------------------------------- arrays

@pytest.mark.parametrize("call", [
    "b = T.NetworkBuilder(); T.parameter_values(b, 'p', np.broadcast_to(np.float32(1), (2**40,)))",
    "T.save_tensors('o.safetensors', [('w', np.broadcast_to(np.float32(1), (2**40,)))])",
])
def test_huge_broadcast_views_are_a_memory_error_not_an_abort(tmp_path, call):
    # Copying a 2**40-element view aborted the interpreter ("memory allocation failed").
    kind, message = _reports(call, tmp_path)
    assert kind == "MemoryError" and "1099511627776 elements" in message


def test_scalar_dataset_column_is_named():
    with pytest.raises(ValueError, match="column 'column_0' is a scalar"):
        ds.NumpySlicesDataset((np.float32(3), np.int32(0)))


# --------------------------------------------------------------------------------- traced networks

def _builder():
    b = T.NetworkBuilder()
    x = b.input("x", [8, 16], "float32")[0]
    w = b.parameter("w", [16, 4], "zeros")[0]
    y = b.input("y", [8], "int32")[0]
    h = b.op("matmul", "mm", [x, w])[0][0]
    loss = b.op("sparse_softmax_cross_entropy", "loss", [h, y])[0][0]
    return b, x, w, y, h, loss


@pytest.mark.parametrize("call,match", [
    (lambda b: b.op("reshape", "r", [1], shape=[2**62, 2**62]), "r: reshape attribute shape"),
    (lambda b: b.op("split", "s", [1], axis=0, sizes=[2**63, 2**63]), "s: split attribute sizes"),
    (lambda b: b.op("fill", "f", [], shape=[2**40, 2**40], value=1.0), "f: fill attribute shape"),
    (lambda b: b.op("one_hot", "o", [2], depth=2**62), r"o \(one_hot\) output"),
    (lambda b: b.op("broadcast_to", "bt", [0], shape=[2**62, 8, 16]), "bt: broadcast_to attribute"),
    (lambda b: b.input("big", [2**32, 2**32], "float32"), "input big"),
    (lambda b: b.parameter("big", [2**62, 2**62], "zeros"), "parameter big"),
    (lambda b: T.anchored_strategies(b, [(1, [2, 1])], 0), "devices is 0"),
])
def test_builder_shapes_beyond_memory_are_value_errors(call, match):
    # Reshape and Split panicked ("attempt to multiply with overflow"), the others were accepted
    # and overflowed later; devices=0 divided by zero.
    b = _builder()[0]
    with pytest.raises(ValueError, match=match):
        call(b)


def test_train_network_checks_its_arguments_before_training(tmp_path):
    b, x, w, y, h, loss = _builder()
    inputs, labels = np.zeros((32, 16), np.float32), np.zeros(32, np.int32)
    config = json.dumps({"parallel": {"mode": "stand_alone", "devices": 1},
                         "train": {"optimizer": "sgd", "learning_rate": 0.01, "epochs": 1},
                         "output": {"dir": str(tmp_path / "run")}})
    with pytest.raises(ValueError, match=r"inputs\[0\]: value 999 is not in the traced network"):
        T.train_network(b, [999, y], h, loss, [inputs, labels], config)  # was an index panic
    with pytest.raises(ValueError, match="column 1: samples of shape .* dtype f32.*takes"):
        T.train_network(b, [x, y], h, loss, [inputs, labels.astype(np.float32)], config)
    with pytest.raises(ValueError, match="batch_size is 0"):
        T.train_network(b, [x, y], h, loss, [inputs, labels], config, batch_size=0)
    with pytest.raises(TypeError, match="callback must be callable"):
        T.train_network(b, [x, y], h, loss, [inputs, labels], config, callback=5)
    with pytest.raises(ValueError, match="data: 1 column.*for 2 graph input"):
        T.train_network(b, [x, y], h, loss, [inputs], config)
    with pytest.raises(ValueError, match="column label has shape .*one row per sample"):
        T.train_network(b, [x, y], h, loss, [inputs, labels[:8]], config,
                        names=["data", "label"])
    assert not (tmp_path / "run").exists(), "refused before any rank started"


def test_read_parameters_shape_beyond_memory_is_named(tmp_path):
    # Was a panic: "a replicated layout always divides: Overflow".
    with pytest.raises(ValueError, match="w: shape"):
        T.read_parameters(str(tmp_path), [("w", [2**62, 2**62])])


class _Reshaping(nn.Cell):
    def __init__(self, body):
        super().__init__()
        self.flatten = nn.Flatten()
        self.fc = nn.Dense(64, 10)
        self.body = body

    def construct(self, x):
        self.body(x)
        return self.fc(self.flatten(x))


def _train(net, tmp_path):
    x = np.random.default_rng(0).standard_normal((16, 8, 8)).astype(np.float32)
    y = np.zeros(16, np.int32)
    data = ds.NumpySlicesDataset((x, y), shuffle=False).batch(8)
    model = Model(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                  nn.SGD(net.trainable_params(), 0.01), run_dir=str(tmp_path / "runs"))
    model.train(1, data)
    return model


@pytest.mark.usefixtures("fresh_context")
@pytest.mark.parametrize("body,kind,match", [
    (lambda x: ops.reshape(x, (2**62, 2**62)), ValueError, "more elements than fit in memory"),
    (lambda x: ops.reshape(x, (-1, -1)), ValueError, "except at most one -1"),
    (lambda x: ops.reshape(x, (-1, 7)), ValueError, "do not divide the 512 elements"),
    (lambda x: ops.reshape(x, "a"), TypeError, "shape must be a tuple of ints"),
    (lambda x: ops.ones(5.5), TypeError, "ones: shape must be"),
    (lambda x: ops.zeros((-1, 4)), ValueError, "zeros: shape .* negative"),
    (lambda x: ops.dropout(x, p=2.0), ValueError, r"dropout: p=2.0 is out of range"),
])
def test_construct_bad_op_arguments(tmp_path, body, kind, match):
    # reshape to [2**62, 2**62] was a PanicException; the others named no rule (or the wrong
    # argument: keep_prob=-1.0 for p=2.0).
    with pytest.raises(kind, match=match):
        _train(_Reshaping(body), tmp_path)


@pytest.mark.usefixtures("fresh_context")
def test_run_dir_that_is_a_file_is_named(tmp_path):
    (tmp_path / "runs").write_text("user data")
    with pytest.raises(ValueError, match="run_dir .* exists and is not a directory"):
        _train(MLP(), tmp_path)
    assert (tmp_path / "runs").read_text() == "user data"


@pytest.mark.parametrize("content,match", [
    (b"\xff\xfe", "is not UTF-8 text"),
    (b"[" * 100000, "nests its JSON too deeply"),
    (None, "is not a regular file"),
])
def test_transformer_opt_bad_files(tmp_path, content, match):
    # A FIFO hung in open(); the others were UnicodeDecodeError and RecursionError.
    path = tmp_path / "speedup.json"
    if content is None:
        os.mkfifo(path)
    else:
        path.write_bytes(content)
    kind, message = _reports(f"""
        from tessera import nn
        from tessera.parallel.auto_parallel import AutoParallel
        AutoParallel(nn.Dense(2, 2)).transformer_opt({str(path)!r})""", tmp_path)
    assert kind == "ValueError" and str(path) in message and match in message


# --------------------------------------------------------------------------------- numbers

@pytest.mark.parametrize("call,match", [
    ("nn.dynamic_lr.cosine_decay_lr(0.0, 0.1, 2**62, 2, 1)", "For 'total_step'.*at most"),
    ("nn.dynamic_lr.warmup_lr(0.1, 2**64, 2, 1)", "For 'total_step'.*at most"),
    ("nn.dynamic_lr.piecewise_constant_lr([2, 2**62], [0.1, 0.01])", r"milestone\[1\]"),
])
def test_dynamic_lr_step_counts_are_bounded(tmp_path, call, match):
    # The list of one rate per step was built for total_step=2**62: no end, then MemoryError.
    kind, message = _reports(f"from tessera import nn\n{call}", tmp_path)
    assert kind == "ValueError" and re.search(match, message), message


def test_dynamic_lr_overflow_names_the_step():
    # 1e308 ** 2.0 was a bare OverflowError (34, 'Numerical result out of range').
    with pytest.raises(ValueError, match="exponential_decay_lr.*step 4 overflows"):
        nn.dynamic_lr.exponential_decay_lr(0.1, 1e308, 10, 2, 1)


def test_truncated_normal_far_in_a_tail_does_not_hang(tmp_path):
    # [0, 1e-300] holds almost none of N(0, 1): redrawing never ended.
    out = _isolated("""
        import numpy as np
        from tessera.common.initializer import TruncatedNormal, initializer
        values = initializer(TruncatedNormal(sigma=1.0, a=0.0, b=1e-300), (64,)).init.values
        print(bool(((values >= 0) & (values <= 1e-300)).all()))
        values = initializer(TruncatedNormal(sigma=2.0**62), (64,)).init.values
        print(bool(((values >= -2) & (values <= 2)).all()))
    """, tmp_path)
    assert out.split() == ["True", "True"]


def test_truncated_normal_and_initializer_reject_bad_numbers():
    with pytest.raises(ValueError, match="TruncatedNormal: sigma"):
        TruncatedNormal(sigma=float("inf"))
    with pytest.raises(TypeError, match="initializer: shape must be"):
        initializer("xavier_uniform", (float("nan"), 4))


def test_train_timeout_of_the_wrong_type_is_named():
    with pytest.raises(TypeError, match="For 'timeout'"):
        tessera.train({"model": {"name": "seed_mlp"}}, timeout="x")
