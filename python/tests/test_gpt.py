"""A GPT written in Python (python/examples/gpt.py) against the built-in ``model.name = "gpt"``:
the same graph (parameters, initializers, ops), and the same per-step losses, bit for bit, from
``tessera.train.Model`` and from ``tessera.train(config)`` with the same token data, seed,
optimizer and strategy, on one device and model parallel on 4."""

import sys

import numpy as np
import pytest

import tessera
from tessera import dataset as ds
from tessera import nn
from tessera.train import Model

from conftest import REPO
from nets import fresh_context  # noqa: F401 (the fixture is used by name)

sys.path.insert(0, str(REPO / "python" / "examples"))
import gpt  # noqa: E402  (python/examples/gpt.py)

pytestmark = pytest.mark.usefixtures("fresh_context")

VOCAB, LAYERS, HEADS, HIDDEN, SEQ, BATCH, STEPS = 64, 2, 4, 32, 16, 8, 4


def _tokens(tmp_path):
    """A token file (u16 ids below VOCAB, with some structure to learn) and its tokens."""
    rng = np.random.default_rng(3)
    tokens = (np.cumsum(rng.integers(1, 4, 4000)) % VOCAB).astype(np.uint16)
    path = tmp_path / "tokens.bin"
    tokens.tofile(path)
    return path, tokens


def _builtin(tmp_path, path, devices, dropout, mp, vocab_emb_dp=True, deterministic=False,
             seq_parallel=False):
    mode = "stand_alone" if devices == 1 else "semi_auto"
    parallel = {"devices": devices, "mode": mode}
    if devices > 1:
        parallel.update(data_parallel=devices // mp, model_parallel=mp, vocab_emb_dp=vocab_emb_dp,
                        use_seq_parallel=seq_parallel)
    config = {
        "model": {"name": "gpt", "layers": LAYERS, "heads": HEADS, "hidden": HIDDEN,
                  "seq_len": SEQ, "dropout": dropout, "tie_embeddings": True,
                  # The Python GPT traces the unfused attention ops; compare like with like.
                  "fused_attention": False},
        "data": {"format": "tokens", "path": str(path), "dtype": "u16", "vocab_size": VOCAB,
                 "val_fraction": 0.0, "batch_size": BATCH, "steps_per_epoch": STEPS},
        "parallel": parallel,
        "train": {"epochs": 1, "optimizer": "momentum", "learning_rate": 0.05,
                  "momentum": 0.9, "seed": 1, "deterministic": deterministic},
        "output": {"dir": str(tmp_path / f"builtin{devices}")},
    }
    return np.array(tessera.train(config, devices=devices)["losses"], np.float32)


def _python(tokens, devices, dropout, mp, vocab_emb_dp=True, deterministic=False,
            seq_parallel=False):
    tessera.set_auto_parallel_context(device_num=devices, parallel_mode="semi_auto_parallel")
    tessera.set_context(deterministic="ON" if deterministic else "OFF")
    inputs, labels = gpt.token_windows(tokens, 1, STEPS, BATCH, SEQ)
    net = gpt.GPT(VOCAB, LAYERS, HEADS, HIDDEN, SEQ, BATCH, dropout=dropout)
    # The built-in GPT's loss is the vocabulary-parallel composite in deterministic mode and
    # when the vocabulary is split (vocab_emb_dp = false under model parallelism).
    vocab_parallel = deterministic or (devices > 1 and not vocab_emb_dp and mp > 1)
    loss = gpt.GPTLoss(BATCH * SEQ, VOCAB, vocab_parallel=vocab_parallel)
    if devices > 1:
        net.set_parallel(devices // mp, mp, vocab_emb_dp, seq_parallel)
        loss.set_parallel(devices // mp, 1 if vocab_emb_dp else mp)
    model = Model(net, loss, nn.Momentum(net.trainable_params(), 0.05, 0.9))
    model.train(1, ds.NumpySlicesDataset((inputs, labels), shuffle=False).batch(BATCH))
    return np.array(model.losses, np.float32), net


def test_the_python_gpt_traces_the_builtin_graph():
    from tessera import _trace
    from tessera._tessera import NetworkBuilder

    net = gpt.GPT(VOCAB, LAYERS, HEADS, HIDDEN, SEQ, BATCH, dropout=0.1)
    builder = NetworkBuilder()
    net._name_tree("")
    with _trace.tracing(builder):
        ids = _trace.Tensor(*builder.input("input_ids", [BATCH, SEQ], "int32"), dtype="int32")
        logits = net(ids)
    assert logits.shape == (BATCH * SEQ, VOCAB)
    names = [p.name for p in net.trainable_params()]
    assert names[:2] == ["embedding.embedding_table", "position_embedding.embedding_table"]
    assert "blocks.1.attn.qkv.weight" in names and "blocks.0.mlp.fc2.bias" in names
    assert names[-2:] == ["ln_f.gamma", "ln_f.beta"]
    nodes = builder.node_names()
    for node in ("embedding.gather", "embed.add", "embed.dropout", "blocks.0.ln1.layer_norm",
                 "blocks.0.attn.qkv.matmul", "blocks.0.attn.qkv_split",
                 "blocks.0.attn.causal_mask", "blocks.0.attn.masked", "blocks.0.attn.softmax",
                 "blocks.0.attn.attn_dropout", "blocks.1.mlp.dropout", "blocks.1.residual2",
                 "lm_head.matmul", "logits"):
        assert node in nodes, node
    extra = [n for n in nodes if n.rsplit(".", 1)[-1] in ("mul", "ones", "value")]
    assert not extra, "the scaling and the mask's ones are folded into their consumers"


@pytest.mark.parametrize("dropout", [0.0, 0.1])
def test_one_device_losses_are_the_builtin_gpts_bit_for_bit(tmp_path, dropout):
    path, tokens = _tokens(tmp_path)
    builtin = _builtin(tmp_path, path, 1, dropout, 1)
    python, _ = _python(tokens, 1, dropout, 1)
    assert len(builtin) == STEPS and np.isfinite(builtin).all()
    assert builtin[-1] < builtin[0]
    assert python.tobytes() == builtin.tobytes(), f"{python} vs {builtin}"


@pytest.mark.parametrize("mp", [2, 4])
def test_model_parallel_losses_are_the_builtin_gpts_bit_for_bit(tmp_path, mp):
    path, tokens = _tokens(tmp_path)
    builtin = _builtin(tmp_path, path, 4, 0.1, mp)
    python, _ = _python(tokens, 4, 0.1, mp)
    assert len(builtin) == STEPS and np.isfinite(builtin).all()
    assert python.tobytes() == builtin.tobytes(), f"{python} vs {builtin}"


@pytest.mark.parametrize("devices,mp,vocab_emb_dp,deterministic", [
    (1, 1, True, True), (4, 2, False, False), (4, 2, True, True), (4, 2, False, True)],
    ids=["1-deterministic", "mp2-vocab-parallel", "mp2-deterministic",
         "mp2-vocab-parallel-deterministic"])
def test_vocabulary_parallel_and_deterministic_losses_are_the_builtin_gpts_bit_for_bit(
        tmp_path, devices, mp, vocab_emb_dp, deterministic):
    path, tokens = _tokens(tmp_path)
    builtin = _builtin(tmp_path, path, devices, 0.1, mp, vocab_emb_dp, deterministic)
    python, _ = _python(tokens, devices, 0.1, mp, vocab_emb_dp, deterministic)
    assert len(builtin) == STEPS and np.isfinite(builtin).all()
    assert python.tobytes() == builtin.tobytes(), f"{python} vs {builtin}"
    if deterministic:
        one, _ = _python(tokens, 1, 0.1, 1, True, True)
        assert python.tobytes() == one.tobytes(), "deterministic mode is one device's bits"


def test_sequence_parallel_losses_are_the_builtin_gpts_bit_for_bit(tmp_path):
    path, tokens = _tokens(tmp_path)
    builtin = _builtin(tmp_path, path, 4, 0.1, 2, seq_parallel=True)
    python, _ = _python(tokens, 4, 0.1, 2, seq_parallel=True)
    assert len(builtin) == STEPS and np.isfinite(builtin).all()
    assert python.tobytes() == builtin.tobytes(), f"{python} vs {builtin}"
