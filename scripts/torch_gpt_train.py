"""PyTorch reference for the training recipe (issue 31): the GPT of `examples/gpt_kjv.toml`
(learned positions, pre-LayerNorm, tanh GeLU, biases, tied embeddings, byte tokens, f32) trained
on the bundled King James text with PyTorch's AdamW, a linear warm-up and cosine decay of the
learning rate, and gradient clipping by global norm; and the evaluator both sides are scored by.

The validation loss is the mean next-byte loss over the whole validation split (its last
`val_fraction` of the bytes, as Tessera splits it), cut into non-overlapping windows of
`seq_len + 1` bytes: the same windows for every model, so two runs compare without sampling
noise.

    python scripts/torch_gpt_train.py train [--steps 1000] [--lr 3e-3] ... [--json]
    python scripts/torch_gpt_train.py eval CHECKPOINT.safetensors [--json]

`eval` loads a Tessera checkpoint merged into one safetensors file (`tessera ckpt merge`) into
the same PyTorch module (the names are Tessera's; the fused QKV projection's output features are
ordered (head, q|k|v, head_dim), as Tessera lays them out) and scores it with this evaluator.
"""
import argparse
import gzip
import json
import math
import os
import struct
import sys
import time

import torch
import torch.nn.functional as F

KJV = os.path.join(os.path.dirname(__file__), "..", "data", "kjv", "kjv.txt.gz")


def load_text(path, val_fraction):
    """The text's bytes as token ids, split as Tessera splits them (the last fraction held out)."""
    data = gzip.open(path, "rb").read() if path.endswith(".gz") else open(path, "rb").read()
    tokens = torch.frombuffer(bytearray(data), dtype=torch.uint8).long()
    n_val = int(len(tokens) * val_fraction)
    return tokens[: len(tokens) - n_val], tokens[len(tokens) - n_val :]


class Block(torch.nn.Module):
    def __init__(self, hidden, heads, seq):
        super().__init__()
        self.heads = heads
        self.ln1 = torch.nn.LayerNorm(hidden, eps=1e-5)
        self.qkv = torch.nn.Linear(hidden, 3 * hidden)
        self.proj = torch.nn.Linear(hidden, hidden)
        self.ln2 = torch.nn.LayerNorm(hidden, eps=1e-5)
        self.fc1 = torch.nn.Linear(hidden, 4 * hidden)
        self.fc2 = torch.nn.Linear(4 * hidden, hidden)
        self.register_buffer("mask", torch.triu(torch.ones(seq, seq, dtype=torch.bool), 1))

    def forward(self, x):
        b, s, h = x.shape
        hd = h // self.heads
        # Features ordered (head, q|k|v, head_dim), as Tessera (Megatron) lays them out.
        qkv = self.qkv(self.ln1(x)).view(b, s, self.heads, 3 * hd)
        q, k, v = (t.transpose(1, 2) for t in qkv.split(hd, dim=3))
        att = (q @ k.transpose(-2, -1)).masked_fill(self.mask[:s, :s], float("-inf"))
        att = torch.softmax(att / math.sqrt(hd), dim=-1)
        ctx = (att @ v).transpose(1, 2).reshape(b, s, h)
        x = x + self.proj(ctx)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class Gpt(torch.nn.Module):
    def __init__(self, layers, hidden, heads, seq, vocab=256):
        super().__init__()
        self.embedding = torch.nn.Embedding(vocab, hidden)
        self.position = torch.nn.Parameter(torch.zeros(seq, hidden))
        self.blocks = torch.nn.ModuleList(Block(hidden, heads, seq) for _ in range(layers))
        self.ln_f = torch.nn.LayerNorm(hidden, eps=1e-5)
        # GPT-2's initialisation, as Tessera's GPT: N(0, 0.02), residual outputs scaled.
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                torch.nn.init.zeros_(p)
            elif name.endswith(("proj.weight", "fc2.weight")):
                torch.nn.init.normal_(p, std=0.02 / math.sqrt(2 * layers))
            elif p.dim() == 2 and "ln" not in name:
                torch.nn.init.normal_(p, std=0.02)
        torch.nn.init.normal_(self.position, std=0.01)

    def forward(self, ids):
        x = self.embedding(ids) + self.position[: ids.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x) @ self.embedding.weight.t()


def validation_loss(model, val, seq, batch=64):
    """Mean next-byte loss over every non-overlapping window of the validation split."""
    n = (len(val) - 1) // seq
    windows = val[: n * seq + 1]
    inputs = windows[:-1].view(n, seq)
    targets = windows[1:].view(n, seq)
    total, count = 0.0, 0
    model.eval()
    with torch.no_grad():
        for i in range(0, n, batch):
            logits = model(inputs[i : i + batch])
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets[i : i + batch].reshape(-1), reduction="sum")
            total += loss.item()
            count += targets[i : i + batch].numel()
    model.train()
    return total / count


def lr_at(step, args):
    """Tessera's `lr_schedule = "cosine"` (MindFormers' CosineWithWarmUpLR, warmup_lr_init 0,
    one half cycle): `lr · i / W` for `i < W`, then cosine decay to `min_lr` at the last step."""
    if step >= args.steps:
        return args.min_lr
    if step < args.warmup:
        return args.lr * step / args.warmup
    progress = (step - args.warmup) / max(1, args.steps - args.warmup)
    return args.min_lr + (args.lr - args.min_lr) * max(0.0, 0.5 * (1 + math.cos(math.pi * progress)))


def decayed(name):
    """MindFormers' filter: no weight decay on biases, LayerNorm and embeddings."""
    return not (name.endswith("bias") or ".ln" in name or name.startswith("ln_f") or "embedding" in name or name == "position")


def train(args):
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    train_split, val = load_text(args.data, args.val_fraction)
    model = Gpt(args.layers, args.hidden, args.heads, args.seq)
    groups = [
        {"params": [p for n, p in model.named_parameters() if decayed(n)], "weight_decay": args.weight_decay},
        {"params": [p for n, p in model.named_parameters() if not decayed(n)], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=args.lr, betas=(args.beta1, args.beta2), eps=1e-8)
    gen = torch.Generator().manual_seed(args.seed)
    start = time.time()
    for step in range(args.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, args)
        starts = torch.randint(0, len(train_split) - args.seq - 1, (args.batch,), generator=gen)
        rows = torch.stack([train_split[s : s + args.seq + 1] for s in starts.tolist()])
        logits = model(rows[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), rows[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if args.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        opt.step()
    seconds = time.time() - start
    return {"val_loss": validation_loss(model, val, args.seq), "seconds": seconds, "steps": args.steps}


def read_safetensors(path):
    """A safetensors file's f32 tensors by name."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, meta in header.items():
        if name == "__metadata__" or meta["dtype"] != "F32":
            continue
        begin, end = meta["data_offsets"]
        out[name] = torch.frombuffer(bytearray(data[begin:end]), dtype=torch.float32).view(meta["shape"])
    return out


def evaluate_tessera(args):
    tensors = read_safetensors(args.checkpoint)
    layers = 1 + max(int(k.split(".")[1]) for k in tensors if k.startswith("blocks."))
    vocab, hidden = tensors["embedding.embedding_table"].shape
    seq = tensors["position_embedding.embedding_table"].shape[0]
    model = Gpt(layers, hidden, args.heads, seq, vocab)
    state = {"embedding.weight": tensors["embedding.embedding_table"], "position": tensors["position_embedding.embedding_table"],
             "ln_f.weight": tensors["ln_f.gamma"], "ln_f.bias": tensors["ln_f.beta"]}
    for l in range(layers):
        for ours, theirs in [("ln1", "ln1"), ("ln2", "ln2")]:
            state[f"blocks.{l}.{ours}.weight"] = tensors[f"blocks.{l}.{theirs}.gamma"]
            state[f"blocks.{l}.{ours}.bias"] = tensors[f"blocks.{l}.{theirs}.beta"]
        for ours, theirs in [("qkv", "attn.qkv"), ("proj", "attn.proj"), ("fc1", "mlp.fc1"), ("fc2", "mlp.fc2")]:
            state[f"blocks.{l}.{ours}.weight"] = tensors[f"blocks.{l}.{theirs}.weight"]
            state[f"blocks.{l}.{ours}.bias"] = tensors[f"blocks.{l}.{theirs}.bias"]
    model.load_state_dict(state, strict=False)
    _, val = load_text(args.data, args.val_fraction)
    return {"val_loss": validation_loss(model, val, seq)}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", choices=["train", "eval"])
    p.add_argument("checkpoint", nargs="?")
    p.add_argument("--data", default=KJV)
    p.add_argument("--val-fraction", type=float, default=0.1)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--min-lr", type=float, default=3e-4)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.95)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--max-grad-norm", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    if args.mode == "eval" and not args.checkpoint:
        p.error("eval needs a merged checkpoint file")
    result = train(args) if args.mode == "train" else evaluate_tessera(args)
    if args.json:
        print(json.dumps(result))
    else:
        print(" ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in result.items()))


if __name__ == "__main__":
    sys.exit(main())
