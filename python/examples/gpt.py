"""A GPT written in Python with ``tessera.nn`` Cells and ``tessera.ops`` primitives, traced into
the same graph as the built-in ``model.name = "gpt"`` (crates/models/src/gpt.rs): the same
parameter names, shapes and initializers, the same ops in the same order, the same dropout
seeds. Trained through ``tessera.train.Model`` on the same token windows, it gives the built-in
GPT's per-step losses bit for bit (python/tests/test_gpt.py), on one device and with the
Megatron-style model-parallel strategies ``GPT.set_parallel`` sets (those of
crates/models/src/gpt_parallel.rs with ``vocab_emb_dp = true``).

    python examples/gpt.py            # trains a small GPT on the bundled King James Bible

The layout is GPT-2's: learned token and position embeddings, pre-LayerNorm blocks of causal
multi-head attention (a fused QKV projection whose output features are ordered ``(head, q|k|v,
head_dim)``) and a GeLU MLP, a final LayerNorm and an LM head tied to the token embedding
table. ``GPT`` outputs the logits ``[batch·seq_len, vocab]``; ``GPTLoss`` flattens the labels
``[batch, seq_len]`` and takes the mean cross entropy.
"""

import math

import numpy as np

from tessera import nn, ops
from tessera.common.initializer import Normal, Zero


def _dense(in_features, out_features, std, activation=None):
    """GPT-2's dense layer: weight ``Normal(std)``, zero bias."""
    return nn.Dense(in_features, out_features, weight_init=Normal(std), bias_init=Zero(),
                    activation=activation)


class Attention(nn.Cell):
    """Causal multi-head self-attention on ``x [batch, seq, hidden]`` (scope ``attn``)."""

    def __init__(self, batch, seq_len, hidden, heads, layers, dropout):
        super().__init__()
        self.shape = (batch, seq_len, hidden, heads, hidden // heads)
        hd = hidden // heads
        self.qkv = _dense(hidden, 3 * hidden, 0.02)
        self.split_heads = ops.Reshape()
        self.qkv_split = ops.Split(3, 3)
        self.q_t, self.k_t, self.v_t = ops.Transpose(), ops.Transpose(), ops.Transpose()
        self.scores = ops.BatchMatMul(transpose_b=True)
        self.causal_mask = ops.Triu(1)
        self.masked = ops.MaskedFill()
        self.softmax = ops.Softmax()
        self.scale = 1.0 / math.sqrt(hd)
        self.attn_dropout = nn.Dropout(p=dropout)
        self.context = ops.BatchMatMul()
        self.context_t = ops.Transpose()
        self.merge_heads = ops.Reshape()
        self.proj = _dense(hidden, hidden, 0.02 / math.sqrt(2.0 * layers))
        self.resid_dropout = nn.Dropout(p=dropout)

    def construct(self, x):
        batch, seq, hidden, heads, hd = self.shape
        qkv = self.split_heads(self.qkv(x), (batch, seq, heads, 3 * hd))
        q, k, v = self.qkv_split(qkv)
        q = self.q_t(q, (0, 2, 1, 3))
        k = self.k_t(k, (0, 2, 1, 3))
        v = self.v_t(v, (0, 2, 1, 3))
        mask = self.causal_mask(ops.ones((seq, seq)))
        scores = self.masked(self.scores(q, k), mask, -1e9)
        probs = self.attn_dropout(self.softmax(scores * self.scale))  # one ScaledSoftmax node
        context = self.context_t(self.context(probs, v), (0, 2, 1, 3))
        context = self.merge_heads(context, (batch, seq, hidden))
        return self.resid_dropout(self.proj(context))


class MLP(nn.Cell):
    """``fc2(gelu(fc1(x)))`` then dropout (scope ``mlp``)."""

    def __init__(self, hidden, ffn_hidden, layers, dropout):
        super().__init__()
        self.fc1 = _dense(hidden, ffn_hidden, 0.02, activation=nn.GELU(approximate=True))
        self.fc2 = _dense(ffn_hidden, hidden, 0.02 / math.sqrt(2.0 * layers))
        self.dropout = nn.Dropout(p=dropout)

    def construct(self, x):
        return self.dropout(self.fc2(self.fc1(x)))


class Block(nn.Cell):
    """A pre-LayerNorm transformer block (scope ``blocks.<i>``)."""

    def __init__(self, batch, seq_len, hidden, heads, ffn_hidden, layers, dropout):
        super().__init__()
        self.ln1 = nn.LayerNorm((hidden,), epsilon=1e-5)
        self.attn = Attention(batch, seq_len, hidden, heads, layers, dropout)
        self.residual1 = ops.Add()
        self.ln2 = nn.LayerNorm((hidden,), epsilon=1e-5)
        self.mlp = MLP(hidden, ffn_hidden, layers, dropout)
        self.residual2 = ops.Add()

    def construct(self, x):
        x = self.residual1(x, self.attn(self.ln1(x)))
        return self.residual2(x, self.mlp(self.ln2(x)))


class Embed(nn.Cell):
    """Adds the position embeddings and applies the embedding dropout (scope ``embed``)."""

    def __init__(self, dropout):
        super().__init__()
        self.add = ops.Add()
        self.dropout = nn.Dropout(p=dropout)

    def construct(self, tokens, positions):
        return self.dropout(self.add(tokens, positions))


class LMHead(nn.Cell):
    """The logits: ``x · tableᵀ`` with the token embedding table (scope ``lm_head``)."""

    def __init__(self):
        super().__init__()
        self.matmul = ops.BatchMatMul(transpose_b=True)

    def construct(self, x, table):
        return self.matmul(x, table)


class GPT(nn.Cell):
    """The built-in GPT's network: ``input_ids [batch, seq_len]`` (int32) → logits
    ``[batch·seq_len, vocab_size]``. The arguments are the ``[model]`` keys of a GPT
    configuration, plus the vocabulary and the global batch."""

    def __init__(self, vocab_size, layers, heads, hidden, seq_len, batch, ffn_hidden=None,
                 dropout=0.0):
        super().__init__()
        ffn_hidden = ffn_hidden or 4 * hidden
        self.vocab_size, self.tokens = vocab_size, batch * seq_len
        self.embedding = nn.Embedding(vocab_size, hidden, embedding_table=Normal(0.02))
        self.position_embedding = nn.Embedding(seq_len, hidden, embedding_table=Normal(0.01))
        self.embed = Embed(dropout)
        self.blocks = nn.CellList([Block(batch, seq_len, hidden, heads, ffn_hidden, layers,
                                         dropout) for _ in range(layers)])
        self.ln_f = nn.LayerNorm((hidden,), epsilon=1e-5)
        self.lm_head = LMHead()
        self.logits = ops.Reshape()

    def construct(self, input_ids):
        table = self.embedding.embedding_table
        x = self.embed(self.embedding(input_ids), self.position_embedding.embedding_table)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x), table)
        return self.logits(logits, (self.tokens, self.vocab_size))

    def set_parallel(self, data_parallel, model_parallel, vocab_emb_dp=True,
                     use_seq_parallel=False):
        """Sets the strategies of the built-in GPT's ``[parallel]`` keys ``data_parallel``,
        ``model_parallel`` (heads and MLP features, Megatron's layout), ``vocab_emb_dp`` (false:
        the embedding table's rows and the logits' vocabulary split ``model_parallel`` ways) and
        ``use_seq_parallel`` (the residual stream's sequence dim split ``model_parallel`` ways),
        as crates/models/src/gpt_parallel.rs sets them. Returns the GPT."""
        dp, mp = data_parallel, model_parallel
        v = 1 if vocab_emb_dp else mp
        s = mp if use_seq_parallel else 1
        stream, heads4 = (dp, s, 1), (dp, mp, 1, 1)
        self.embedding.gather.shard(((v, 1), (dp, 1)))
        self.embed.add.shard((stream, (s, 1)))
        _shard_dropout(self.embed.dropout, stream)
        for block in list(self.blocks) + [None]:
            lns = (block.ln1, block.ln2) if block else (self.ln_f,)
            for ln in lns:
                ln.layer_norm.shard((stream, (1,), (1,)))
            if block is None:
                continue
            a, m = block.attn, block.mlp
            for col in (a.qkv, m.fc1):
                col.matmul.shard(((dp, 1, 1), (mp, 1)))
                col.bias_add.shard(((dp, 1, mp), (mp,)))
            m.fc1.activation.gelu.shard(((dp, 1, mp),))
            for row in (a.proj, m.fc2):
                row.matmul.shard(((dp, 1, mp), (1, mp)))
                row.bias_add.shard((stream, (1,)))
            a.split_heads.shard(((dp, 1, mp),))
            for prim in (a.qkv_split, a.q_t, a.k_t, a.v_t, a.merge_heads):
                prim.shard(((dp, 1, mp, 1),))
            a.scores.shard((heads4, heads4))
            a.context.shard((heads4, heads4))
            a.masked.shard((heads4, (1, 1)))
            a.softmax.shard((heads4,))
            a.context_t.shard((heads4,))
            _shard_dropout(a.attn_dropout, heads4)
            _shard_dropout(a.resid_dropout, stream)
            _shard_dropout(m.dropout, stream)
            block.residual1.shard((stream, stream))
            block.residual2.shard((stream, stream))
        self.lm_head.matmul.shard(((dp, 1, 1), (v, 1)))
        self.logits.shard(((dp, 1, v),))
        return self


def _shard_dropout(cell, strategy):
    """Shards an ``nn.Dropout``'s node, if it has one (``p > 0``)."""
    if cell.dropout is not None:
        cell.dropout.shard((strategy,))


class VocabParallelCrossEntropy(nn.Cell):
    """Softmax cross entropy of ``logits [n, c]`` against int ``labels [n]`` from ops that keep
    the logits split on the classes (MindFormers' vocabulary-parallel cross entropy), as the
    engine's ``GraphBuilder::vocab_parallel_cross_entropy`` builds it (scope ``loss``):
    ``Σ_rows (log Σ exp(x − m) − Σ onehot·(x − m)) / n`` with ``m`` the row maximum."""

    def __init__(self, classes, rows):
        super().__init__()
        self.classes, self.rows = classes, rows
        self.max = ops.ReduceMax(keep_dims=True)
        self.shift = ops.StopGradient()
        self.shifted = ops.Sub()
        self.exp = ops.Exp()
        self.sum_exp = ops.ReduceSum(keep_dims=True)
        self.log_sum_exp = ops.Log()
        self.one_hot = ops.OneHot()
        self.pick = ops.Mul()
        self.target = ops.ReduceSum(keep_dims=True)
        self.row_loss = ops.Sub()
        self.total = ops.ReduceSum()
        self.loss = ops.RealDiv()

    def construct(self, logits, labels):
        shifted = self.shifted(logits, self.shift(self.max(logits, 1)))
        lse = self.log_sum_exp(self.sum_exp(self.exp(shifted), 1))
        picked = self.pick(self.one_hot(labels, self.classes, 1.0, 0.0), shifted)
        row_loss = self.row_loss(lse, self.target(picked, 1))
        return self.loss(self.total(row_loss), float(self.rows))

    def set_parallel(self, data_parallel, vocab_split):
        """Rows split ``data_parallel`` ways, classes ``vocab_split`` ways (the engine's
        ``vocab_parallel_cross_entropy_strategies``). Returns the Cell."""
        logits, rows = (data_parallel, vocab_split), (data_parallel, 1)
        for prim in (self.max, self.exp, self.sum_exp, self.target):
            prim.shard((logits,))
        for prim in (self.shift, self.log_sum_exp, self.total):
            prim.shard((rows,))
        self.shifted.shard((logits, rows))
        self.one_hot.shard((logits,))
        self.pick.shard((logits, logits))
        self.row_loss.shard((rows, rows))
        self.loss.shard(((), ()))
        return self


class GPTLoss(nn.Cell):
    """The mean cross entropy of the logits ``[batch·seq_len, vocab]`` against the next tokens
    ``[batch, seq_len]``: nodes ``labels_flat`` and ``loss`` (the fused sparse softmax cross
    entropy) or, with ``vocab_parallel``, the scope ``loss`` of ``VocabParallelCrossEntropy`` —
    as the built-in GPT builds them (it uses the latter in deterministic mode, and with
    ``vocab_emb_dp = false`` under model parallelism)."""

    def __init__(self, tokens, vocab_size=None, vocab_parallel=False):
        super().__init__()
        self.tokens = tokens
        self.labels_flat = ops.Reshape()
        if vocab_parallel:
            self.loss = VocabParallelCrossEntropy(vocab_size, tokens)
        else:
            self.loss = ops.SparseSoftmaxCrossEntropyWithLogits()

    def construct(self, logits, labels):
        return self.loss(logits, self.labels_flat(labels, (self.tokens,)))

    def set_parallel(self, data_parallel, vocab_split=1):
        """The built-in GPT's strategies of its loss nodes (``vocab_split``: the classes' split
        of a vocabulary-parallel loss). Returns the loss."""
        self.labels_flat.shard(((data_parallel, 1),))
        if isinstance(self.loss, VocabParallelCrossEntropy):
            self.loss.set_parallel(data_parallel, vocab_split)
        else:
            self.loss.shard(((data_parallel, 1), (data_parallel,)))
        return self


# The built-in GPT's training data: windows of seq_len + 1 tokens at seeded random starts
# (crates/runtime/src/data/text.rs, TokenSplit::window_starts_of_rows).

_MASK = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15


def _mix64(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def _stream_key(seed, name):
    h = 0xCBF29CE484222325
    for byte in name.encode():
        h = ((h ^ byte) * 0x100000001B3) & _MASK
    return _mix64(seed ^ _mix64(h))


def window_starts(n_tokens, seed, epoch, step, batch, seq_len):
    """The first token of every window of global batch ``step`` (from 0) of ``epoch`` (from 1),
    as the engine's GPT training reads them from a split of ``n_tokens`` tokens."""
    choices = n_tokens - seq_len
    key = _stream_key(seed, f"text-windows/{epoch}/{step}")
    return [(_mix64((key + (row + 1) * _GAMMA) & _MASK) * choices) >> 64 for row in range(batch)]


def token_windows(tokens, seed, steps, batch, seq_len, steps_per_epoch=None):
    """``(input_ids, labels)`` of the windows the built-in GPT trains on in its first ``steps``
    steps (``steps_per_epoch`` steps an epoch), in step order: int32 ``[steps·batch, seq_len]``
    each, the labels the inputs shifted by one token. Fed unshuffled in batches of ``batch``,
    they are the built-in GPT's batches."""
    steps_per_epoch = steps_per_epoch or steps
    tokens = np.asarray(tokens)
    inputs, labels = [], []
    for s in range(steps):
        epoch, step = 1 + s // steps_per_epoch, s % steps_per_epoch
        for start in window_starts(len(tokens), seed, epoch, step, batch, seq_len):
            inputs.append(tokens[start:start + seq_len])
            labels.append(tokens[start + 1:start + seq_len + 1])
    return np.array(inputs, np.int32), np.array(labels, np.int32)


def main():
    """Trains a small GPT on the bundled King James Bible (byte tokens) for a few steps."""
    import gzip
    import pathlib

    import tessera
    from tessera import dataset as ds
    from tessera.train import LossMonitor, Model

    text = pathlib.Path(__file__).resolve().parents[2] / "data" / "kjv" / "kjv.txt.gz"
    tokens = np.frombuffer(gzip.decompress(text.read_bytes())[:200_000], np.uint8)
    batch, seq_len, steps = 8, 32, 20
    inputs, labels = token_windows(tokens, tessera.get_seed(), steps, batch, seq_len)
    net = GPT(256, layers=2, heads=4, hidden=64, seq_len=seq_len, batch=batch)
    model = Model(net, GPTLoss(batch * seq_len), nn.Adam(net.trainable_params(), 0.003))
    data = ds.NumpySlicesDataset((inputs, labels), shuffle=False).batch(batch)
    model.train(1, data, callbacks=[LossMonitor(5)])


if __name__ == "__main__":
    main()
