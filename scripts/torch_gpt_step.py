"""PyTorch baseline for `tessera bench gpt-step`: the same GPT (4 layers, 4 heads, width 256,
128 tokens, byte vocabulary, learned positions, pre-LayerNorm, tanh GeLU, biases, tied
embeddings, batch 16, f32) trained with AdamW, on one thread, on two threads, and with DDP on 2
processes (gloo, one thread each, batch 8 per process). Prints tokens/s from the median step time.

    python scripts/torch_gpt_step.py [steps] [layers] [hidden] [--one-thread]

`--one-thread` times the single thread only (no products, no 2 threads, no DDP), for runs
paired with `tessera bench gpt-step --one-rank` (`scripts/bench-gpt-pairs.sh`).

`--paced` runs the single thread step by step as a driver paces it, the protocol of `tessera
bench gpt-step --paced` (`scripts/bench-gpt-lockstep.py`): after 5 warm-up steps it prints
`ready`, then runs one timed step per line read from stdin and answers `step <ms>`, until end of
input or `steps` steps.
"""
import math
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

ONE_THREAD = "--one-thread" in sys.argv[1:]
PACED = "--paced" in sys.argv[1:]
ARGS = [a for a in sys.argv[1:] if a not in ("--one-thread", "--paced")]
STEPS = int(ARGS[0]) if len(ARGS) > 0 else 20
LAYERS = int(ARGS[1]) if len(ARGS) > 1 else 4
HIDDEN = int(ARGS[2]) if len(ARGS) > 2 else 256
HEADS, SEQ, BATCH, VOCAB = 4, 128, 16, 256


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = torch.nn.LayerNorm(HIDDEN)
        self.qkv = torch.nn.Linear(HIDDEN, 3 * HIDDEN)
        self.proj = torch.nn.Linear(HIDDEN, HIDDEN)
        self.ln2 = torch.nn.LayerNorm(HIDDEN)
        self.fc1 = torch.nn.Linear(HIDDEN, 4 * HIDDEN)
        self.fc2 = torch.nn.Linear(4 * HIDDEN, HIDDEN)
        self.register_buffer("mask", torch.triu(torch.ones(SEQ, SEQ, dtype=torch.bool), 1))

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(h, dim=2)
        q, k, v = (t.view(b, s, HEADS, h // HEADS).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)).masked_fill(self.mask, float("-inf"))
        att = torch.softmax(att / math.sqrt(h // HEADS), dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, s, h)
        x = x + self.proj(y)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))


class Gpt(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = torch.nn.Embedding(VOCAB, HIDDEN)
        self.wpe = torch.nn.Parameter(torch.randn(SEQ, HIDDEN) * 0.01)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln_f = torch.nn.LayerNorm(HIDDEN)

    def forward(self, ids, labels):
        x = self.wte(ids) + self.wpe
        for block in self.blocks:
            x = block(x)
        logits = self.ln_f(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.view(-1, VOCAB), labels.view(-1))


def batches(rows):
    g = torch.Generator().manual_seed(1)
    return [
        (torch.randint(0, VOCAB, (rows, SEQ), generator=g), torch.randint(0, VOCAB, (rows, SEQ), generator=g))
        for _ in range(8)
    ]


def trainer(model, data):
    """One AdamW training step of `model` on batch `i` of `data` (cycled), as a function of `i`."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01, eps=1e-8)

    def step(i):
        ids, labels = data[i % len(data)]
        loss = model(ids, labels)
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()

    return step


def time_steps(model, data):
    step = trainer(model, data)
    for i in range(5):
        step(i)
    times = []
    for i in range(STEPS):
        start = time.perf_counter()
        step(i)
        times.append(time.perf_counter() - start)
    return times


def report(label, times):
    times = sorted(times)
    median = statistics.median(times)
    print(
        f"pytorch {torch.__version__}, {label}: {BATCH * SEQ / median:.0f} tokens/s "
        f"({median * 1e3:.1f} ms/step median [p10 {times[len(times) // 10] * 1e3:.1f} - "
        f"p90 {times[len(times) * 9 // 10] * 1e3:.1f}])",
        flush=True,
    )


def ddp_worker(rank, world, queue):
    torch.set_num_threads(1)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(1)
    model = torch.nn.parallel.DistributedDataParallel(Gpt())
    times = time_steps(model, batches(BATCH // world))
    # A step ends when the slowest process ends it.
    t = torch.tensor(times)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    if rank == 0:
        queue.put(t.tolist())
    dist.destroy_process_group()


def product_rates():
    """torch.mm on one thread on the GPT's forward product shapes (those `tessera bench
    gpt-step` times for its utilisation line): GFLOP/s at the median of 15 products."""
    t = BATCH * SEQ
    shapes = [(t, HIDDEN, 3 * HIDDEN), (t, HIDDEN, HIDDEN), (t, HIDDEN, 4 * HIDDEN),
              (t, 4 * HIDDEN, HIDDEN), (t, HIDDEN, 256)]
    rates = []
    for m, k, n in shapes:
        a, b = torch.rand(m, k), torch.rand(k, n)
        for _ in range(3):
            torch.mm(a, b)
        times = []
        for _ in range(15):
            start = time.perf_counter()
            torch.mm(a, b)
            times.append(time.perf_counter() - start)
        rates.append(f"{m}x{k}x{n} {2 * m * k * n / statistics.median(times) / 1e9:.1f}")
    print(f"pytorch {torch.__version__}, torch.mm 1 thread (m x k x n GFLOP/s): "
          + ", ".join(rates), flush=True)


def paced():
    """The paced protocol (see the module's docstring) on one thread."""
    step = trainer(Gpt(), batches(BATCH))
    for i in range(5):
        step(i)
    print("ready", flush=True)
    for i in range(STEPS):
        if not sys.stdin.readline():
            break
        start = time.perf_counter()
        step(5 + i)
        print(f"step {(time.perf_counter() - start) * 1e3:.3f}", flush=True)


def main():
    torch.set_num_threads(1)
    torch.manual_seed(1)
    if PACED:
        paced()
        return
    report("1 thread", time_steps(Gpt(), batches(BATCH)))
    if ONE_THREAD:
        return
    product_rates()
    torch.set_num_threads(2)
    torch.manual_seed(1)
    report("2 threads", time_steps(Gpt(), batches(BATCH)))
    torch.set_num_threads(1)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=ddp_worker, args=(r, 2, queue)) for r in range(2)]
    for p in procs:
        p.start()
    times = queue.get()
    for p in procs:
        p.join()
    report("DDP, 2 processes x 1 thread", times)


if __name__ == "__main__":
    main()
