#!/usr/bin/env python3
"""A seeded fuzz of config values: each case takes an example config, sets one to three keys
(the examples' own and the parallel, model and data sizes) to hostile values (0, -1, 2^31,
2^63-1, inf, nan, huge strings, wrong types, nested lists), and runs `tessera plan`, `tessera
train --explain` or one step of `tessera train` under a 6 GiB address-space limit and a 60 s
timeout. A panic, a signal (an allocation abort), an exit code other than 0-2, a timeout, or a
refusal whose message names no key (`section.key`), flag or file is printed as BAD.

    python3 scripts/config-fuzz.py BINARY SEED CASES"""
import os, random, re, subprocess, sys, tomllib, json, resource
BIN = sys.argv[1]
SEED = int(sys.argv[2]); N = int(sys.argv[3])
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
import tempfile
TMP = tempfile.mkdtemp(prefix="tessera-config-fuzz-")
EXAMPLES = ["gpt_kjv.toml", "seed_semi_auto.toml", "seed_data_parallel.toml", "seed_stand_alone.toml"]
HOSTILE = [0, -1, 1, 2, 3, 7, 2**31, 2**32 + 1, 2**53 + 1, 2**63 - 1, -2**63, 1e308, -1e308,
           float("inf"), float("nan"), 0.5, -0.5, 1e-320, "", "x" * 5000, "None", "auto", True, False,
           [], [0], [2**40, 2**40], [-1, 2], {"a": 1}, "../../etc/passwd", "\u0000", [[1, 2], [3]]]

def toml_value(v):
    if isinstance(v, bool): return "true" if v else "false"
    if isinstance(v, int): return str(v)
    if isinstance(v, float):
        if v != v: return "nan"
        if v == float("inf"): return "inf"
        if v == float("-inf"): return "-inf"
        return repr(v)
    if isinstance(v, str): return json.dumps(v)
    if isinstance(v, list): return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict): return "{ " + ", ".join(f"{k} = {toml_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(v)

def flat(d, prefix=""):
    for k, v in d.items():
        if isinstance(v, dict) and k not in ("shard", "out_shard"):
            yield from flat(v, prefix + k + ".")
        else:
            yield prefix + k, v

KNOWN_KEYS = set()
for ex in EXAMPLES:
    with open(f"{ROOT}/examples/{ex}", "rb") as f:
        KNOWN_KEYS.update(k for k, _ in flat(tomllib.load(f)))
EXTRA_KEYS = ["parallel.pipeline.stages", "parallel.pipeline.micro_batches", "parallel.model_parallel",
              "parallel.data_parallel", "parallel.context_parallel", "parallel.expert_parallel",
              "model.moe.experts", "model.moe.top_k", "model.layers", "model.heads", "model.hidden",
              "model.seq_len", "model.ffn_hidden", "data.batch_size", "train.grad_accumulation_steps",
              "parallel.micro_batch_interleave", "parallel.hsdp.shard_size", "parallel.hsdp.threshold",
              "train.threads_per_rank", "parallel.deterministic_blocks", "data.steps_per_epoch",
              "train.warmup_steps", "train.max_grad_norm", "train.learning_rate", "data.val_fraction",
              "parallel.recompute.cells", "parallel.comm_fusion.allreduce", "train.epochs",
              "output.save_checkpoint_steps", "output.keep_checkpoint_max", "parallel.mesh.device_matrix",
              "parallel.search_time_budget", "model.vocab_size", "train.eval_interval", "data.eval_batches"]
ALL_KEYS = sorted(KNOWN_KEYS) + EXTRA_KEYS

def case(i):
    r = random.Random(SEED * 100003 + i)
    ex = r.choice(EXAMPLES)
    sets = ["train.max_steps=1", "train.epochs=1"]
    for _ in range(r.randint(1, 3)):
        key = r.choice(ALL_KEYS)
        v = r.choice(HOSTILE)
        sets.append(f"{key}={toml_value(v)}")
    devices = r.choice([None, 1, 2, 4, 3, 0, 2**40])
    cmd = r.choice(["plan", "train", "explain"])
    return ex, sets, devices, cmd

def limit():
    resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))

bad = 0
for i in range(N):
    ex, sets, devices, cmd = case(i)
    out = os.path.join(TMP, f"out{i}")
    args = [BIN, "plan" if cmd == "plan" else "train", f"examples/{ex}"]
    if cmd == "explain": args.append("--explain")
    if devices is not None: args += ["--devices", str(devices)]
    for s in sets + [f'output.dir="{out}"']:
        args += ["--set", s]
    try:
        p = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=60, preexec_fn=limit)
    except subprocess.TimeoutExpired:
        print(f"[{i}] TIMEOUT {' '.join(args[1:])}"); bad += 1; continue
    err = p.stderr
    verdict = None
    if p.returncode < 0: verdict = f"SIGNAL {-p.returncode}"
    elif "panicked" in err or p.returncode == 101: verdict = "PANIC"
    elif "memory allocation" in err: verdict = "ALLOC"
    elif p.returncode not in (0, 1, 2): verdict = f"EXIT {p.returncode}"
    elif p.returncode != 0:
        if not re.search(r"[a-z_]+\.[a-z_]+|--[a-z]|\.toml", err):
            verdict = "UNNAMED"
    if verdict:
        bad += 1
        tail = "\n    ".join(err.strip().splitlines()[-4:])
        print(f"[{i}] BAD {verdict}: {' '.join(args[1:])}\n    {tail}")
    subprocess.run(["rm", "-rf", out])
os.rmdir(TMP)
print(f"done: {N} cases, {bad} bad")
