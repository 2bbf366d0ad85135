#!/usr/bin/env python3
"""Differential sweep: Tessera's checkpoint tools against the real MindSpore (2.10).

Usage (run with a Python that has MindSpore installed, e.g. the CPU wheel in a venv
with ``safetensors==0.7.0`` pinned — 0.8.0 writes strided views wrongly, MindSpore bug 1):

    /tmp/ms-venv/bin/python scripts/mindspore-diff.py [--cases N] [--seed S] [--tessera BIN]
                                                      [--tessera-python PY] [--work DIR]
                                                      [--keep] [--only I,J,..]

* ``--cases`` (default 50): how many random cases; ``--seed`` (default 1): the first case's
  seed (case *i* uses seed ``S + i``, so one case can be re-run alone with ``--only i``).
* ``--tessera``: the ``tessera`` binary (default ``target/debug/tessera``).
* ``--work``: scratch directory (default ``/tmp/msdiff``); a case's directory is removed unless
  it shows a difference (or ``--keep``).

Each case draws a source strategy A (1-16 ranks, 2-4 device axes, optionally 2 pipeline
stages whose per-stage files are merged with ``merge_pipeline_strategys``), parameters of 1-3
dims with plain or multi-axis tensor maps, replicated params, optimizer shards, dtypes
f32/f16/f64/int32/int8/uint8/bool (bf16 only in .ckpt), params outside the strategy, a .ckpt
or .safetensors source and a protobuf or JSON strategy flavour; and a destination B with
another device count, or None (merge to one).  The strategy files are written with MindSpore's
own protobuf classes in the C++ writer's field layout; the full weights are saved with
``mindspore.save_checkpoint`` and sharded under A with MindSpore's ``convert_checkpoints``.

Then it runs MindSpore's ``convert_checkpoints``, ``convert_checkpoint_by_rank`` (with
``rank_list_for_convert``), ``unified_safetensors``, ``get_parameter_redundancy`` /
``remove_param_redundancy`` and ``build_searched_strategy``, and Tessera's ``ckpt convert``
(all ranks, and ``--rank``), ``ckpt merge``, ``ckpt redundancy --json`` and ``strategy show
--json``, and compares file names, tensor names, dtypes, shapes, values and order, and both
against an independent numpy slicer.  A case refused by one side only is reported.

Also covered: ``load_distributed_checkpoint`` in save mode (``unified_safetensors_dir`` +
``dst_safetensors_dir``) against ``ckpt load``; Tessera's ``ckpt ranks`` against
``rank_list_for_convert`` (also under pipeline stages: never longer); on single-stage flat
protobuf cases, MindSpore-made deduplicated sources (each rank keeps what
``remove_param_redundancy`` gives it, ``remove_redundancy=True``) against ``ckpt dedup``, then
``unified_safetensors(merge_with_redundancy=False)`` against ``ckpt merge --dedup`` from both
dedup sets, and ``ckpt convert`` from MindSpore's dedup set against the numpy truth; a
destination strategy listing a parameter the source lacks (``net.dst_only``: Tessera must
refuse without ``--allow-missing``; MindSpore's by-stage ``*_part0`` names are mapped);
``.ckpt`` sources re-saved with ``crc_check=True``; and ``.ckpt`` sources encrypted by
``save_checkpoint(enc_key=..., enc_mode=AES-GCM|AES-CBC|SM4-CBC)`` converted with
``--dec-key-file`` (MindSpore's converters take no key: compared with the plain conversion).
``transform_checkpoint_by_rank`` (which ``convert_checkpoint_by_rank`` wraps) is also called
directly: with only the source files of Tessera's ``ckpt ranks`` list, with MindSpore's own
list in ascending order, and from the unsharded source (``src_strategy_file=None``) against
``ckpt convert`` without ``--src-strategy``. ``load_distributed_checkpoint`` with a network
(``.ckpt``, merged to one device) reads the plain source and both deduplicated sets (MindSpore's
and ``ckpt dedup``'s), against ``ckpt convert`` without ``--dst-strategy`` and, with
``--tessera-python PY`` (a Python with the tessera package), Tessera's own
``load_distributed_checkpoint``; in save mode it also reads the unified merge of MindSpore's
deduplicated set, against ``ckpt load``. Parameters MindSpore's converters misplace (an
optimizer shard of a permuted tensor map) get the true slices in the source and are judged by
the numpy truth only.
Known, documented departures (docs/MINDSPORE_DIFFERENCES.md) are not counted: MindSpore's
redundancy of multi-axis layouts (bug 2) and its ``-`` name split (bug 3) are compared against
the numpy truth instead; Tessera's ``tessera_set.json`` marker and ``tessera_set`` metadata key
are ignored.  Exit code: 0 when no case differs.
"""

import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import traceback

import numpy as np

os.environ.setdefault("GLOG_v", "3")
import mindspore as ms  # noqa: E402
from mindspore.parallel import (  # noqa: E402
    build_searched_strategy,
    convert_checkpoint_by_rank,
    convert_checkpoints,
    merge_pipeline_strategys,
    rank_list_for_convert,
    transform_checkpoint_by_rank,
    unified_safetensors,
)
from mindspore.train import checkpoint_pb2, node_strategy_pb2  # noqa: E402
from mindspore.train._utils import get_parameter_redundancy, remove_param_redundancy  # noqa: E402

DTYPES = ["f32", "f16", "f64", "i32", "i8", "u8", "bool", "bf16"]
NP = {"f32": np.float32, "f16": np.float16, "f64": np.float64, "i32": np.int32, "i8": np.int8,
      "u8": np.uint8, "bool": np.bool_, "bf16": np.float32}
MS_DT = {"f32": ms.float32, "f16": ms.float16, "f64": ms.float64, "i32": ms.int32, "i8": ms.int8,
         "u8": ms.uint8, "bool": ms.bool_, "bf16": ms.bfloat16}
SIZES = [2, 4, 6, 8, 12, 16, 24, 32]


# ----------------------------------------------------------------------------- layouts

def rand_dev(rng, ndev):
    """A device matrix of 2-4 axes whose product is ndev (axes of size 1 allowed)."""
    naxes = int(rng.integers(2, 5))
    dev = [1] * naxes
    n = ndev
    for p in (2, 2, 2, 2):
        if n % p == 0 and n > 1:
            pass
    # factor ndev into primes and scatter them
    primes = []
    m = ndev
    for p in (2, 3, 5, 7, 11, 13):
        while m % p == 0:
            primes.append(p)
            m //= p
    for p in primes:
        dev[int(rng.integers(0, naxes))] *= p
    return dev


def factor(dev, axes):
    f = 1
    for a in axes:
        f *= dev[len(dev) - 1 - a]
    return f


def repeated_dims(dev, tmap):
    used = {len(dev) - 1 - a for axes in tmap for a in axes}
    return [i for i, v in enumerate(dev) if i not in used and v > 1]


def opt_group_dims(dev, tmap, size):
    """MindSpore's _construct_tensor_layout_helper: repeated dev dims from the right until
    size is covered. Returns [(dim, part)] most significant first, or None if impossible."""
    rep = repeated_dims(dev, tmap)
    if size == -1:
        size = int(np.prod([dev[i] for i in rep])) if rep else 1
    rem = size
    out = []
    for d in rep[::-1]:
        v = dev[d]
        if rem < v:
            if v % rem:
                return None
            out.insert(0, (d, rem))
            rem = 1
            break
        if rem % v:
            return None
        out.insert(0, (d, v))
        rem //= v
        if rem == 1:
            break
    if rem != 1:
        return None
    return out


def coords(rank, dev):
    return list(np.unravel_index(rank, dev)) if dev else []


def slice_of(full, dev, tmap, opt_size, rank):
    """The numpy truth: rank's slice of a full tensor (rank local to its stage)."""
    c = coords(rank, dev)
    idx = []
    for d, axes in enumerate(tmap):
        i, f = 0, 1
        for a in axes:
            dd = len(dev) - 1 - a
            i = i * dev[dd] + c[dd]
            f *= dev[dd]
        n = full.shape[d] // f
        idx.append(slice(i * n, (i + 1) * n))
    out = full[tuple(idx)]
    if opt_size not in (0, 1):
        g = opt_group_dims(dev, tmap, opt_size)
        oi, of = 0, 1
        for d, part in g:
            oi = oi * part + (c[d] % part)
            of *= part
        n = out.shape[0] // of
        out = out[oi * n:(oi + 1) * n]
    return out


def ms_opt_perm_bug(lay):
    """Whether MindSpore's converters misplace this layout's slices (documented bug "optimizer
    shard of a permuted tensor map"): an opt shard whose only repeated device axis is the
    first takes _construct_tensor_layout_for_opt_shard's fast path, which assumes the tensor
    dims use the device axes in order (map values decreasing)."""
    dev, tmap = lay["dev"], lay["tmap"]
    if lay["opt_size"] in (0, 1) or not flat(tmap):
        return False
    if repeated_dims(dev, tmap) != [0]:
        return False
    used = [a[0] for a in tmap if a]
    return any(x <= y for x, y in zip(used, used[1:]))


def rand_tmap(rng, dev, shape, multi_ok):
    """A tensor map (list of axis lists per dim) whose splits divide shape."""
    free = list(range(len(dev)))
    rng.shuffle(free)
    tmap = []
    for s in shape:
        axes = []
        r = rng.random()
        want = 0 if r < 0.35 else (1 if r < 0.85 or not multi_ok else 2)
        for _ in range(want):
            for a in list(free):
                if s % (factor(dev, axes + [a])) == 0:
                    axes.append(a)
                    free.remove(a)
                    break
        tmap.append(axes)
    return tmap


def opt_step(dev, g):
    """opt_weight_shard_step as the C++ writer computes it: (last-first)/(n-1) of the group
    holding rank 0."""
    strides = [int(np.prod(dev[d + 1:])) for d in range(len(dev))]
    ranks = [0]
    for d, part in g:
        ranks = sorted(r + k * strides[d] for r in ranks for k in range(part))
    if len(ranks) < 2:
        return 0
    return (ranks[-1] - ranks[0]) // (len(ranks) - 1)


def rand_layout(rng, dev, shape, multi_ok=True):
    tmap = rand_tmap(rng, dev, shape, multi_ok)
    size, step = 0, 0
    if rng.random() < 0.3:
        rep = repeated_dims(dev, tmap)
        reps = int(np.prod([dev[i] for i in rep])) if rep else 1
        cands = [k for k in range(2, reps + 1) if reps % k == 0]
        if cands:
            k = int(rng.choice(cands))
            g = opt_group_dims(dev, tmap, k)
            mp0 = shape[0] // factor(dev, tmap[0])
            if g is not None and mp0 % k == 0:
                size, step = k, opt_step(dev, g)
                if rng.random() < 0.15 and k == reps:
                    size = -1
    return {"dev": list(dev), "tmap": tmap, "opt_size": size, "opt_step": step}


def flat(tmap):
    return all(len(a) <= 1 for a in tmap)


def pb_layout(layouts_msg, lay):
    layouts_msg.dev_matrix.add().dim.extend(lay["dev"])
    if flat(lay["tmap"]):
        layouts_msg.tensor_map.add().dim.extend([a[0] if a else -1 for a in lay["tmap"]])
    else:
        for axes in lay["tmap"]:
            layouts_msg.tensor_map.add().dim.extend(axes if axes else [-1])
        if len(lay["tmap"]) == 1:
            layouts_msg.tensor_map.add()
    layouts_msg.param_split_shape.add()
    layouts_msg.indices_offset.add()
    layouts_msg.field = 0
    layouts_msg.opt_weight_shard_step = lay["opt_step"]
    layouts_msg.opt_weight_shard_size = lay["opt_size"]


def write_pb_strategy(path, stage, items):
    m = node_strategy_pb2.ParallelStrategyMap()
    m.current_stage = 1
    it = m.parallel_strategy_item.add()
    it.node_name = f"Default/network-Net/MatMul-op{stage}"
    it.parallel_strategys.stage = stage
    it.parallel_strategys.parallel_strategy.add().dim.extend([1, 1])
    for name, lay in items:
        li = m.parallel_layout_item.add()
        li.param_name = name
        pb_layout(li.parallel_layouts, lay)
    with open(path, "wb") as f:
        f.write(m.SerializeToString())


def write_json_strategy(path, stage, items, shapes):
    d = {"current_stage": 1,
         "parallel_strategy_item": {f"Default/network-Net/MatMul-op{stage}":
                                    {"stage": stage, "parallel_strategy": [[1, 1]]}},
         "parallel_layout_item": {}}
    for name, lay in items:
        d["parallel_layout_item"][name] = {
            "dev_matrix": lay["dev"], "tensor_map": [a[0] if a else -1 for a in lay["tmap"]],
            "tensor_shape": shapes[name.split("-", 1)[-1]], "field": 0,
            "opt_weight_shard_step": lay["opt_step"], "opt_weight_shard_size": lay["opt_size"]}
    with open(path, "w") as f:
        json.dump(d, f)


# ----------------------------------------------------------------------------- files

def read_ckpt(path):
    """[(name, type, dims, bytes)] in file order (chunks joined)."""
    c = checkpoint_pb2.Checkpoint()
    data = open(path, "rb").read()
    if len(data) >= 17 and data[-17:-10] == b"crc_num":
        data = data[:-17]
    c.ParseFromString(data)
    out = []
    for v in c.value:
        t = v.tensor
        if out and out[-1][0] == v.tag:
            out[-1] = (v.tag, out[-1][1], out[-1][2], out[-1][3] + t.tensor_content)
        else:
            out.append((v.tag, t.tensor_type, list(t.dims), bytes(t.tensor_content)))
    return out


def read_st(path):
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    hdr = json.loads(data[8:8 + n])
    meta = hdr.pop("__metadata__", {})
    base = 8 + n
    out = []
    for name, v in hdr.items():
        b, e = v["data_offsets"]
        out.append((name, v["dtype"], list(v["shape"]), data[base + b:base + e]))
    meta.pop("tessera_set", None)
    return out, meta


def read_any(path):
    if path.endswith(".ckpt"):
        return read_ckpt(path), {}
    return read_st(path)


def tree(d):
    """Relative paths of the checkpoint files under d (Tessera's marker left out)."""
    out = []
    for root, _, files in os.walk(d):
        for f in files:
            if f == "tessera_set.json" or f.startswith("."):
                continue
            out.append(os.path.relpath(os.path.join(root, f), d))
    return sorted(out)


ST_DT = {"f32": "F32", "f16": "F16", "f64": "F64", "i32": "I32", "i8": "I8", "u8": "U8",
         "bool": "BOOL", "bf16": "BF16"}
CK_DT = {"f32": "Float32", "f16": "Float16", "f64": "Float64", "i32": "Int32", "i8": "Int8",
         "u8": "UInt8", "bool": "Bool", "bf16": "BFloat16"}


def to_bytes(arr, dt):
    if dt == "bf16":
        return (np.ascontiguousarray(arr, dtype=np.float32).view(np.uint32) >> 16).astype(
            np.uint16).tobytes()
    return np.ascontiguousarray(arr).tobytes()


# parameters whose MindSpore-side conversions are known wrong in the current case (set by
# one_case; such a parameter is judged by the numpy truth only)
SKIP_MS = set()
# the Python with Tessera's package (``--tessera-python``), or None to skip its calls
PY_TESSERA = [None]


def cmp_files(fa, fb, diffs, what, order=True, whole=(), ms_may_lack=(), notes=None):
    ta, ma = read_any(fa)
    tb, mb = read_any(fb)
    whole = set(whole) | SKIP_MS
    lacking = {t[0] for t in tb} - {t[0] for t in ta}
    if lacking and lacking <= set(ms_may_lack):
        # MindSpore bug: a parameter the (pipelined) destination strategy places on several
        # stages is written on one stage only; Tessera's file is judged by the numpy truth
        notes.append(f"MS-BUG {what}: MindSpore leaves out {sorted(lacking)} (pipelined)")
        tb = [t for t in tb if t[0] not in lacking]
    if not ta and not tb and ma == {} and mb.get("remove_redundancy") == "True":
        # MindSpore writes a rank that owns nothing with empty metadata (documented)
        ma = mb
    if ma != mb:
        diffs.append(f"{what}: metadata {ma} vs {mb}")
    na = [t[0] for t in ta]
    nb = [t[0] for t in tb]
    if sorted(na) != sorted(nb):
        diffs.append(f"{what}: tensor names {na} vs {nb}")
        return
    if order and na != nb:
        diffs.append(f"{what}: tensor order {na} vs {nb}")
    db = {t[0]: t for t in tb}
    for t in ta:
        u = db[t[0]]
        if t[0] in whole:
            continue  # documented: Tessera writes it whole, MindSpore a source slice
        if t[1:3] != u[1:3]:
            diffs.append(f"{what}: {t[0]} dtype/shape {t[1:3]} vs {u[1:3]}")
        elif t[3] != u[3]:
            diffs.append(f"{what}: {t[0]} values differ")


def cmp_truth(path, truth, diffs, what):
    """truth: {name: (dt, ndarray)}; every truth tensor must be in the file with its values."""
    ts, _ = read_any(path)
    got = {t[0]: t for t in ts}
    for name, (dt, arr) in truth.items():
        if name not in got:
            diffs.append(f"{what}: {name} missing (truth)")
            continue
        t = got[name]
        if list(t[2]) != list(arr.shape):
            diffs.append(f"{what}: {name} shape {t[2]} vs truth {list(arr.shape)}")
        elif t[3] != to_bytes(arr, dt):
            diffs.append(f"{what}: {name} values differ from truth")


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    return p.returncode, (p.stdout + p.stderr).strip()



def judge(what, verb, ms_result, tessera_result, diffs, notes):
    """Sorts one call made on both sides (MindSpore's ``(ok, error)``, Tessera's ``(rc,
    output)``): a Tessera refusal of what MindSpore does is a difference, a MindSpore refusal of
    what Tessera does a note (``MS-LIMIT``; the caller judges Tessera's output against the
    truth), both refusing a note. True when both succeeded: the outputs are then compared."""
    (ok, err), (rc, out) = ms_result, tessera_result
    if ok and rc != 0:
        diffs.append(f"{what}: MindSpore {verb}, Tessera refuses: {out[-600:]}")
    elif not ok and rc == 0:
        notes.append(f"MS-LIMIT {what}: MindSpore refuses ({err}), Tessera {verb}")
    elif not ok:
        notes.append(f"{what}: both refuse: MS {err} | T {out[-300:]}")
    return ok and rc == 0


def ms_call(f, *a, **k):
    try:
        return True, f(*a, **k)
    except BaseException as e:  # noqa: BLE001
        return False, f"{type(e).__name__}: {str(e)[:300]}"


# ----------------------------------------------------------------------------- one case

def make_strategy(rng, sdir, name, ndev, stages, params, shapes, flavour):
    """Draw layouts for params over `stages` stages of ndev ranks each; write the strategy
    (merged with MindSpore when pipelined). Returns {param: {"stages": [..], "lay": layout}}."""
    per = ndev
    devs = [rand_dev(rng, per) for _ in range(stages)]
    spec = {}
    for k, p in enumerate(params):
        st = [k] if k < stages else [int(rng.integers(0, stages))]
        if stages > 1 and rng.random() < 0.15:
            st = list(range(stages))
        lays = {s: rand_layout(rng, devs[s], shapes[p], multi_ok=(flavour == "pb")) for s in st}
        spec[p] = {"stages": st, "lays": lays}
    ext = ".ckpt" if flavour == "pb" else ".json"
    path = os.path.join(sdir, name + ext)
    if stages == 1:
        items = [(p, spec[p]["lays"][0]) for p in params]
        if flavour == "pb":
            write_pb_strategy(path, 0, items)
        else:
            write_json_strategy(path, 0, items, shapes)
    else:
        d = os.path.join(sdir, name + "_stages")
        os.makedirs(d)
        for s in range(stages):
            items = [(p, spec[p]["lays"][s]) for p in params if s in spec[p]["stages"]]
            f = os.path.join(d, f"stage{s}{ext}")
            if flavour == "pb":
                write_pb_strategy(f, s, items)
            else:
                write_json_strategy(f, s, items, shapes)
        merge_pipeline_strategys(d, path)
    return path, spec, devs


def truth_for_rank(spec, full, dtypes, ndev, r, outside):
    stage, local = divmod(r, ndev)
    t = {}
    for p, s in spec.items():
        if stage in s["stages"]:
            lay = s["lays"][stage]
            t[p] = (dtypes[p], slice_of(full[p], lay["dev"], lay["tmap"], lay["opt_size"], local))
    for p in outside:
        t[p] = (dtypes[p], full[p])
    return t



def truth_for_dst_rank(b_spec, params, outside, full, dtypes, nd_b, rb):
    """What destination rank ``rb`` must hold: its slices under strategy B (``b_spec``), the
    parameters of A that B does not list written whole; every tensor whole without B."""
    if b_spec is None:
        return {p: (dtypes[p], full[p]) for p in params + outside}
    tr = truth_for_rank({p: v for p, v in b_spec.items() if p in params}, full, dtypes, nd_b,
                        rb, outside)
    for p in params:
        if p not in b_spec:
            tr[p] = (dtypes[p], full[p])
    return tr

def one_case(i, seed, args):
    rng = np.random.default_rng(seed)
    cdir = os.path.join(args.work, f"case{i}")
    shutil.rmtree(cdir, ignore_errors=True)
    os.makedirs(cdir)
    diffs, notes = [], []
    fmt = "ckpt" if rng.random() < 0.5 else "safetensors"
    flavour = "pb" if rng.random() < 0.7 else "json"
    stages_a = 2 if rng.random() < 0.25 else 1
    nd_a = int(rng.choice([1, 2, 4, 8, 16, 2, 4, 8, 6, 12, 3]))
    while nd_a * stages_a > 16:
        nd_a //= 2
    nparams = int(rng.integers(stages_a, 6))
    params = [f"net.p{k}" for k in range(nparams)]
    shapes, dtypes, full = {}, {}, {}
    for p in params:
        nd = int(rng.integers(1, 4))
        shapes[p] = [int(rng.choice(SIZES[:6] if nd == 3 else SIZES)) for _ in range(nd)]
        dts = DTYPES if fmt == "ckpt" else DTYPES[:-1]
        dtypes[p] = str(rng.choice(dts))
    outside = []
    if rng.random() < 0.5:
        outside.append("global_step")
        shapes["global_step"], dtypes["global_step"] = [1], "i32"
    for p in params + outside:
        dt = dtypes[p]
        if dt in ("f32", "f16", "f64", "bf16"):
            a = rng.standard_normal(shapes[p]).astype(np.float32)
            if dt == "bf16":
                a = (a.view(np.uint32) & 0xFFFF0000).view(np.float32)
            full[p] = a.astype(NP[dt])
        elif dt == "bool":
            full[p] = rng.random(shapes[p]) < 0.5
        else:
            info = np.iinfo(NP[dt])
            full[p] = rng.integers(max(info.min, -100000), min(info.max, 100000),
                                   size=shapes[p]).astype(NP[dt])
    sdir = os.path.join(cdir, "strategy")
    os.makedirs(sdir)
    a_path, a_spec, a_devs = make_strategy(rng, sdir, "A", nd_a, stages_a, params, shapes, flavour)
    to_full = rng.random() < 0.2
    b_path, b_spec, nd_b, stages_b = None, None, 1, 1
    if not to_full:
        stages_b = 2 if rng.random() < 0.15 and nparams >= 2 else 1
        nd_b = int(rng.choice([1, 2, 4, 8, 16, 3, 6]))
        while nd_b * stages_b > 16:
            nd_b //= 2
        bparams = [p for p in params if rng.random() > 0.08]
        if len(bparams) < stages_b:
            bparams = params
        if rng.random() < 0.2:
            # a parameter only the destination strategy lists (skipped by both tools)
            bparams = bparams + ["net.dst_only"]
            shapes["net.dst_only"] = [int(rng.choice(SIZES)) for _ in range(2)]
        b_path, b_spec, _ = make_strategy(rng, sdir, "B", nd_b, stages_b, bparams, shapes,
                                          flavour)
    dst_only = [p for p in (b_spec or {}) if p not in params]
    crc = fmt == "ckpt" and rng.random() < 0.3
    enc = fmt == "ckpt" and rng.random() < 0.3
    enc_mode = str(rng.choice(["AES-GCM", "AES-CBC", "SM4-CBC"]))
    desc = (f"fmt={fmt}{' crc' if crc else ''}{f' enc={enc_mode}' if enc else ''} "
            f"dst_only={dst_only} flavour={flavour} A={stages_a}x{nd_a} devs={a_devs} "
            f"B={'None' if to_full else f'{stages_b}x{nd_b}'} "
            f"params={[(p, shapes[p], dtypes[p]) for p in params]} outside={outside}")
    # full weights
    fdir = os.path.join(cdir, "full", "rank_0")
    os.makedirs(fdir)
    save = [{"name": p, "data": ms.Tensor(full[p], dtype=MS_DT[dtypes[p]])} for p in params + outside]
    ms.save_checkpoint(save, os.path.join(fdir, "full." + fmt), format=fmt)
    src = os.path.join(cdir, "src")
    ok, r = ms_call(convert_checkpoints, os.path.dirname(fdir), src, "checkpoint_", None, a_path,
                    1, fmt)
    if not ok:
        notes.append(f"MindSpore could not shard the source under A: {r}")
        return desc, diffs, notes
    nrank_a = nd_a * stages_a
    if crc:
        # re-save every source with MindSpore's crc_num trailer (crc_check=True)
        for r in range(nrank_a):
            for f in tree(os.path.join(src, f"rank_{r}")):
                fp = os.path.join(src, f"rank_{r}", f)
                pd = ms.load_checkpoint(fp)
                os.chmod(fp, 0o600)
                os.remove(fp)
                ms.save_checkpoint([{"name": k, "data": v} for k, v in pd.items()], fp,
                                   crc_check=True)
    # numpy truth of the sources
    SKIP_MS.clear()
    for r in range(nrank_a):
        files = tree(os.path.join(src, f"rank_{r}"))
        if len(files) != 1:
            diffs.append(f"src rank {r}: files {files}")
            continue
        truth = truth_for_rank(a_spec, full, dtypes, nd_a, r, outside)
        wrong = []
        cmp_truth(os.path.join(src, f"rank_{r}", files[0]), truth, wrong,
                  f"(MindSpore-made source) rank {r}")
        notes.extend(wrong)
        bad = {p for p in truth if any(f" {p} " in w for w in wrong)}
        if bad:
            # MindSpore bug (docs/MINDSPORE_DIFFERENCES.md, "opt shard of a permuted map"):
            # its converters place the slices of an opt-sharded parameter with a permuted
            # tensor map on the wrong ranks. The source gets the true slices, so Tessera is
            # judged by the truth; MindSpore's outputs for them are not compared.
            SKIP_MS.update(bad)
            fp = os.path.join(src, f"rank_{r}", files[0])
            pd = ms.load_checkpoint(fp, format=fmt)
            items = []
            for k, v in pd.items():
                if k in bad:
                    v = ms.Tensor(np.ascontiguousarray(truth[k][1]), dtype=MS_DT[dtypes[k]])
                items.append({"name": k, "data": v})
            os.chmod(fp, 0o600)
            os.remove(fp)
            ms.save_checkpoint(items, fp, format=fmt, crc_check=crc)
    # the same MindSpore bug on the destination side: its slices of such a parameter are wrong
    for p, v in (b_spec or {}).items():
        if any(ms_opt_perm_bug(lay) for lay in v["lays"].values()):
            SKIP_MS.add(p)
    if SKIP_MS:
        notes.append(f"MS-BUG opt shard of a permuted map: MindSpore's outputs for "
                     f"{sorted(SKIP_MS)} are not compared (Tessera's are, with the truth)")
    t = args.tessera
    src_only = [p for p in params if b_spec is not None and p not in b_spec]
    # -------- convert_checkpoints
    ms_out = os.path.join(cdir, "ms_conv")
    t_out = os.path.join(cdir, "t_conv")
    prefix = "converted_"
    ok, r = ms_call(convert_checkpoints, src, ms_out, prefix, a_path, b_path, 1, fmt)
    cmd = [t, "ckpt", "convert", "--src", src, "--src-strategy", a_path, "--dst", t_out,
           "--prefix", prefix, "--quiet", "--no-fsync"]
    if b_path:
        cmd += ["--dst-strategy", b_path]
    if dst_only:
        # documented departure: refused (naming the parameter) unless --allow-missing
        rc, out = run(cmd)
        if rc == 0 or dst_only[0] not in out:
            diffs.append(f"convert: B lists {dst_only} the source lacks; Tessera without "
                         f"--allow-missing: rc={rc} {out[-300:]}")
        shutil.rmtree(t_out, ignore_errors=True)
        cmd.append("--allow-missing")
    rc, out = run(cmd)
    rc_conv = rc
    # A MindSpore refusal where Tessera converts is judged by the numpy truth below.
    if judge("convert", "converts", (ok, r), (rc, out), diffs, notes):
        fa, fb = tree(ms_out), tree(t_out)
        by_stage = [f for f in fa if f.endswith(f"_part0.{fmt}")]
        if dst_only and by_stage and len(by_stage) == len(fa):
            # MindSpore's by-stage path (A's keys a strict subset of B's): it names the files
            # <prefix><r>_part<stage>; Tessera writes the usual names (documented)
            notes.append("MindSpore took its by-stage path (files *_part0)")
            for f in by_stage:
                g = f.replace(f"_part0.{fmt}", f".{fmt}")
                os.rename(os.path.join(ms_out, f), os.path.join(ms_out, g))
            fa = tree(ms_out)
        if not fa and fb:
            # documented: MindSpore returns success having written nothing (pipelined
            # safetensors source, device counts that do not divide); Tessera is judged below
            notes.append("MS-BUG convert: MindSpore succeeded without writing any file")
        elif fa != fb:
            diffs.append(f"convert: output files MS {fa} vs T {fb}")
        for f in sorted(set(fa) & set(fb)):
            shared = [p for p, v in (b_spec or {}).items() if len(v["stages"]) > 1]
            if stages_a > 1 and stages_b == 1 and fmt == "safetensors":
                # documented MindSpore bug: from a pipelined safetensors source into one
                # stage it keeps the last source stage's parameters only
                shared += params
            cmp_files(os.path.join(ms_out, f), os.path.join(t_out, f), diffs, f"convert {f}",
                      whole=src_only, ms_may_lack=shared, notes=notes)
    if rc == 0:
        nrank_b = nd_b * stages_b
        for rb in range(nrank_b):
            files = [f for f in tree(t_out) if f.startswith(f"rank_{rb}/")]
            if len(files) != 1:
                diffs.append(f"convert: Tessera rank {rb} files {files}")
                continue
            tr = truth_for_dst_rank(b_spec, params, outside, full, dtypes, nd_b, rb)
            cmp_truth(os.path.join(t_out, files[0]), tr, diffs, f"convert T rank {rb} vs truth")
    # -------- convert_checkpoint_by_rank (ckpt only)
    if fmt == "ckpt":
        rb = int(rng.integers(0, nd_b * stages_b))
        ok, rl = ms_call(rank_list_for_convert, rb, a_path, b_path)
        ms_file = os.path.join(cdir, "ms_byrank", f"rank_{rb}.ckpt")
        os.makedirs(os.path.dirname(ms_file))
        if ok:
            fmap = {}
            for k in rl:
                fs = tree(os.path.join(src, f"rank_{k}"))
                fmap[int(k)] = os.path.join(src, f"rank_{k}", fs[0])
            ok, r = ms_call(convert_checkpoint_by_rank, rb, fmap, ms_file, a_path, b_path)
        else:
            r = rl
        t_r = os.path.join(cdir, "t_byrank")
        cmd = [t, "ckpt", "convert", "--src", src, "--src-strategy", a_path, "--dst", t_r,
               "--rank", str(rb), "--prefix", prefix, "--quiet", "--no-fsync"]
        if dst_only:
            cmd.append("--allow-missing")
        if b_path:
            cmd += ["--dst-strategy", b_path]
        rc, out = run(cmd)
        tl = None
        if ok:
            rcr, outr = run([t, "ckpt", "ranks", "--src-strategy", a_path, "--rank", str(rb),
                             "--json"] + (["--dst-strategy", b_path] if b_path else []))
            if rcr != 0:
                diffs.append(f"ranks {rb}: Tessera refuses: {outr[-300:]}")
            else:
                tl = json.loads(outr).get("source_ranks")
                if tl is None or len(tl) > len(rl):
                    diffs.append(f"ranks {rb}: Tessera {tl} longer than MindSpore's {list(rl)}")
                elif not set(tl) <= {int(k) for k in rl}:
                    # as short, another choice among equal covers (documented)
                    notes.append(f"ranks {rb}: Tessera {tl}, MindSpore {[int(k) for k in rl]}")
        if judge(f"by_rank {rb}", "converts", (ok, r), (rc, out), diffs, notes):
            tf = os.path.join(t_r, f"rank_{rb}", f"{prefix}{rb}.ckpt")
            if not os.path.exists(tf):
                diffs.append(f"by_rank {rb}: Tessera wrote {tree(t_r)}")
            else:
                cmp_files(ms_file, tf, diffs, f"by_rank {rb}", whole=src_only,
                          ms_may_lack=[p for p, v in (b_spec or {}).items()
                                       if len(v["stages"]) > 1], notes=notes)
        if rc == 0:
            transform_checks(cdir, t, src, a_path, b_path, rb, tl,
                             [int(k) for k in rl] if isinstance(rl, list) else [], params,
                             outside, full, dtypes, b_spec, nd_b, src_only, dst_only, prefix,
                             diffs, notes)
    # -------- load_distributed_checkpoint into a network (ckpt, one stage)
    if fmt == "ckpt" and stages_a == 1:
        load_network_checks(cdir, t, src, "src", a_path, params, outside, full, dtypes, nd_a,
                            diffs, notes)
    # -------- unified_safetensors (safetensors only)
    u_ok = False
    if fmt == "safetensors":
        ms_u = os.path.join(cdir, "ms_unified")
        t_u = os.path.join(cdir, "t_unified")
        ok, r = ms_call(unified_safetensors, src, a_path, ms_u)
        rc, out = run([t, "ckpt", "merge", "--src", src, "--strategy", a_path, "--dst", t_u,
                       "--quiet", "--no-fsync"])
        if judge("unified", "merges", (ok, r), (rc, out), diffs, notes):
            u_ok = True
            fa, fb = tree(ms_u), tree(t_u)
            if fa != fb:
                diffs.append(f"unified: files MS {fa} vs T {fb}")
            for f in sorted(set(fa) & set(fb)):
                if f.endswith(".json"):
                    ja, jb = json.load(open(os.path.join(ms_u, f))), json.load(
                        open(os.path.join(t_u, f)))
                    true_size = sum(full[p].nbytes // (2 if dtypes[p] == "bf16" else 1)
                                    for p in ja["weight_map"])
                    if jb["metadata"]["total_size"] != true_size:
                        diffs.append(f"unified {f}: Tessera total_size {jb['metadata']} vs "
                                     f"the full tensors' {true_size}")
                    if ja["metadata"] != jb["metadata"] and \
                            ja["metadata"]["total_size"] != true_size:
                        # MindSpore derives a shared (multi-stage) param's full shape from a
                        # slice with another stage's layout
                        notes.append(f"MS-BUG unified total_size {ja['metadata']} (true {true_size})")
                        ja["metadata"] = jb["metadata"]
                    if ja != jb:
                        diffs.append(f"unified {f}: {ja} vs {jb}")
                else:
                    cmp_files(os.path.join(ms_u, f), os.path.join(t_u, f), diffs,
                              f"unified {f}", order=False)
            for f in fb:
                if f.startswith("part"):
                    cmp_truth(os.path.join(t_u, f),
                              {p: (dtypes[p], full[p]) for p in read_names(os.path.join(t_u, f))},
                              diffs, f"unified T {f} vs truth")
    # -------- encrypted .ckpt sources (MindSpore's converters take no key: against the
    # plain conversion above)
    if enc and os.path.isdir(t_out) and rc_conv == 0:
        key = bytes(rng.integers(0, 256, 16, dtype=np.uint8))
        enc_src = os.path.join(cdir, "src_enc")
        for r in range(nrank_a):
            for f in tree(os.path.join(src, f"rank_{r}")):
                pd = ms.load_checkpoint(os.path.join(src, f"rank_{r}", f))
                os.makedirs(os.path.join(enc_src, f"rank_{r}"), exist_ok=True)
                ms.save_checkpoint([{"name": k, "data": v} for k, v in pd.items()],
                                   os.path.join(enc_src, f"rank_{r}", f), enc_key=key,
                                   enc_mode=enc_mode)
        kf = os.path.join(cdir, "key.bin")
        open(kf, "wb").write(key)
        t_enc = os.path.join(cdir, "t_conv_enc")
        cmd = [t, "ckpt", "convert", "--src", enc_src, "--src-strategy", a_path, "--dst", t_enc,
               "--prefix", prefix, "--quiet", "--no-fsync", "--dec-key-file", kf,
               "--dec-mode", enc_mode] + (["--allow-missing"] if dst_only else [])
        if b_path:
            cmd += ["--dst-strategy", b_path]
        rce, oute = run(cmd)
        if rce != 0:
            diffs.append(f"encrypted ({enc_mode}) source: Tessera refuses: {oute[-400:]}")
        else:
            if tree(t_enc) != tree(t_out):
                diffs.append(f"encrypted source: files {tree(t_enc)} vs plain {tree(t_out)}")
            for f in sorted(set(tree(t_enc)) & set(tree(t_out))):
                cmp_files(os.path.join(t_out, f), os.path.join(t_enc, f), diffs,
                          f"encrypted-source convert {f}")
    # -------- load_distributed_checkpoint, save mode (from the unified output)
    if fmt == "safetensors" and b_path and u_ok:
        ms_ld = os.path.join(cdir, "ms_load")
        t_ld = os.path.join(cdir, "t_load")
        ok, r = ms_call(ms.load_distributed_checkpoint, None, predict_strategy=b_path,
                        format="safetensors", unified_safetensors_dir=ms_u,
                        dst_safetensors_dir=ms_ld)
        rc, out = run([t, "ckpt", "load", "--unified", t_u, "--strategy", b_path, "--dst", t_ld,
                       "--quiet", "--no-fsync"])
        if judge("load_distributed", "loads", (ok, r), (rc, out), diffs, notes):
            fa, fb = tree(ms_ld), tree(t_ld)
            if fa != fb:
                diffs.append(f"load_distributed: files MS {fa} vs T {fb}")
            for f in sorted(set(fa) & set(fb)):
                cmp_files(os.path.join(ms_ld, f), os.path.join(t_ld, f), diffs,
                          f"load_distributed {f}", order=False, whole=src_only,
                          ms_may_lack=[p for p, v in b_spec.items() if len(v["stages"]) > 1],
                          notes=notes)
        if rc == 0:
            for rb in range(nd_b * stages_b):
                f = os.path.join(t_ld, f"rank_{rb}", "net.safetensors")
                if not os.path.exists(f):
                    diffs.append(f"load_distributed: Tessera wrote no rank {rb}: {tree(t_ld)}")
                    continue
                tr = truth_for_rank({p: v for p, v in b_spec.items() if p in params}, full,
                                    dtypes, nd_b, rb, outside)
                cmp_truth(f, tr, diffs, f"load_distributed T rank {rb} vs truth")
    # -------- dedup (remove_param_redundancy) and merges/conversions from dedup sources
    single_flat = stages_a == 1 and flavour == "pb" and all(
        flat(a_spec[p]["lays"][0]["tmap"]) for p in params)
    if single_flat:
        dedup_checks(cdir, t, fmt, src, a_path, b_path, params, outside, full, dtypes, a_spec,
                     b_spec, nd_a, nd_b, stages_b, diffs, notes)
    # -------- redundancy and build_searched_strategy (A, single stage)
    for nm, path, spec, st in (("A", a_path, a_spec, stages_a), ("B", b_path, b_spec, stages_b)):
        if path is None:
            continue
        ok, bss = ms_call(build_searched_strategy, path)
        rc, out = run([t, "strategy", "show", "--json", path])
        if ok and rc == 0:
            from google.protobuf.json_format import MessageToDict
            msd = {k: MessageToDict(v, preserving_proto_field_name=True) for k, v in bss.items()}
            td = json.loads(out)
            if norm_bss(msd) != norm_bss(td):
                diffs.append(f"build_searched_strategy({nm}): {msd} vs {td}")
        elif ok != (rc == 0):
            diffs.append(f"build_searched_strategy({nm}): MS ok={ok} T rc={rc}: {bss if not ok else out[-300:]}")
        if st != 1:
            continue
        if path.endswith(".json"):
            ok, red = False, "get_parameter_redundancy reads protobuf files only"
        else:
            ok, red = ms_call(get_parameter_redundancy, path, 0)
        rc, out = run([t, "ckpt", "redundancy", "--strategy", path, "--json"])
        if rc != 0:
            diffs.append(f"redundancy({nm}): Tessera refuses: {out[-300:]}")
            continue
        tj = json.loads(out)
        truth = {p: red_truth(s["lays"][0]) for p, s in spec.items()}
        tg = {p: [list(g) for g in v] for p, v in tj["get_parameter_redundancy"].items()}
        if {p: sorted(v) for p, v in tg.items()} != {p: sorted(v) for p, v in truth.items()}:
            diffs.append(f"redundancy({nm}): Tessera {tg} vs truth {truth}")
        if ok:
            mg = {p: [list(g) for g in v] for p, v in red.items()}
            multi = {p for p, s in spec.items() if not flat(s["lays"][0]["tmap"])}
            # MindSpore bug: opt_weight_shard_size -1 divides by the whole stage, not the
            # replica group, and leaves the parameter no group at all (judged by the truth)
            all_opt = {p for p, s in spec.items() if s["lays"][0]["opt_size"] == -1}
            if any(not red.get(p) for p in all_opt):
                notes.append(f"MS-BUG redundancy({nm}): no groups for {sorted(all_opt)} "
                             "(opt_weight_shard_size -1)")
            multi |= all_opt
            if {p: v for p, v in mg.items() if p not in multi} != \
                    {p: v for p, v in tg.items() if p not in multi}:
                diffs.append(f"redundancy({nm}): MS {mg} vs T {tg}")
            elif not multi:
                ok2, rem = ms_call(remove_param_redundancy, red)
                if ok2:
                    mr = {str(k): sorted(v) for k, v in rem.items()}
                    tr = {k: sorted(v) for k, v in tj["remove_param_redundancy"].items()}
                    if mr != tr:
                        diffs.append(f"remove_param_redundancy({nm}): MS {mr} vs T {tr}")
        else:
            notes.append(f"MS-LIMIT redundancy({nm}): MindSpore refuses: {red}")
    return desc, diffs, notes


def dedup_checks(cdir, t, fmt, src, a_path, b_path, params, outside, full, dtypes, a_spec,
                 b_spec, nd_a, nd_b, stages_b, diffs, notes):
    """`tessera ckpt dedup` against MindSpore's remove_param_redundancy saves (each rank keeps
    the params remove_param_redundancy gives it), then merges and conversions from both."""
    ok, red = ms_call(get_parameter_redundancy, a_path, 0)
    if ok:
        ok, rem = ms_call(remove_param_redundancy, red)
    if not ok:
        notes.append(f"MS-LIMIT dedup: MindSpore refuses: {red if not ok else rem}")
        return
    ms_bad = sorted(p for p in params if not red.get(p))
    if ms_bad:
        # MindSpore bug (opt_weight_shard_size -1): no owner, its dedup save loses them
        notes.append(f"MS-BUG dedup: MindSpore gives {ms_bad} no owner; its dedup set is "
                     "not compared")
    ms_dd = os.path.join(cdir, "ms_dedup")
    for r in range(nd_a):
        fs = tree(os.path.join(src, f"rank_{r}"))
        pd = ms.load_checkpoint(os.path.join(src, f"rank_{r}", fs[0]), format=fmt)
        keep = set(rem.get(r, set())) | set(outside)
        os.makedirs(os.path.join(ms_dd, f"rank_{r}"))
        ms.save_checkpoint([{"name": k, "data": v} for k, v in pd.items() if k in keep],
                           os.path.join(ms_dd, f"rank_{r}", fs[0]), format=fmt,
                           remove_redundancy=True)
    t_dd = os.path.join(cdir, "t_dedup")
    rc, out = run([t, "ckpt", "dedup", "--src", src, "--strategy", a_path, "--dst", t_dd,
                   "--quiet", "--no-fsync"])
    if rc != 0:
        diffs.append(f"dedup: Tessera refuses: {out[-400:]}")
    elif not ms_bad:
        fa, fb = tree(ms_dd), tree(t_dd)
        if fa != fb:
            diffs.append(f"dedup: files MS {fa} vs T {fb}")
        for f in sorted(set(fa) & set(fb)):
            cmp_files(os.path.join(ms_dd, f), os.path.join(t_dd, f), diffs, f"dedup {f}",
                      order=False)
    # load_distributed_checkpoint (network mode) from both dedup sets
    if fmt == "ckpt":
        for name, sdir in (("MS-dedup", ms_dd), ("T-dedup", t_dd)):
            if os.path.isdir(sdir) and not (ms_bad and name == "MS-dedup"):
                load_network_checks(cdir, t, sdir, name, a_path, params, outside, full, dtypes,
                                    nd_a, diffs, notes, dedup=True)
    # merges from dedup sources: MindSpore-made and Tessera-made
    if fmt == "safetensors":
        ms_u = os.path.join(cdir, "ms_unified_dedup")
        ok, r = ms_call(unified_safetensors, ms_dd, a_path, ms_u, merge_with_redundancy=False)
        for name, sdir in (("MS-dedup", ms_dd), ("T-dedup", t_dd)):
            if not os.path.isdir(sdir) or (ms_bad and name == "MS-dedup"):
                continue
            t_u = os.path.join(cdir, f"t_unified_{name}")
            rc, out = run([t, "ckpt", "merge", "--dedup", "--src", sdir, "--strategy", a_path,
                           "--dst", t_u, "--quiet", "--no-fsync"])
            if rc != 0:
                diffs.append(f"merge --dedup ({name}): Tessera refuses: {out[-400:]}")
                continue
            if ok and not ms_bad:
                fa, fb = tree(ms_u), tree(t_u)
                if fa != fb:
                    diffs.append(f"merge --dedup ({name}): files MS {fa} vs T {fb}")
                for f in sorted(set(fa) & set(fb)):
                    if f.endswith(".safetensors"):
                        cmp_files(os.path.join(ms_u, f), os.path.join(t_u, f), diffs,
                                  f"merge --dedup ({name}) {f}", order=False)
                    elif json.load(open(os.path.join(ms_u, f))) != json.load(
                            open(os.path.join(t_u, f))):
                        diffs.append(f"merge --dedup ({name}) {f} differs")
            for f in tree(t_u):
                if f.startswith("part"):
                    cmp_truth(os.path.join(t_u, f),
                              {p: (dtypes[p], full[p]) for p in read_names(os.path.join(t_u, f))},
                              diffs, f"merge --dedup ({name}) {f} vs truth")
        if not ok:
            notes.append(f"MS-LIMIT unified dedup: MindSpore refuses: {r}")
        elif b_path and not ms_bad:
            # load_distributed_checkpoint (save mode) from MindSpore's dedup merge against
            # `ckpt load` from Tessera's merge of MindSpore's dedup set
            t_u = os.path.join(cdir, "t_unified_MS-dedup")
            ms_ld = os.path.join(cdir, "ms_load_dedup")
            t_ld = os.path.join(cdir, "t_load_dedup")
            okl, rl = ms_call(ms.load_distributed_checkpoint, None, predict_strategy=b_path,
                              format="safetensors", unified_safetensors_dir=ms_u,
                              dst_safetensors_dir=ms_ld)
            rc, out = run([t, "ckpt", "load", "--unified", t_u, "--strategy", b_path, "--dst",
                           t_ld, "--quiet", "--no-fsync"])
            shared = [p for p, v in b_spec.items() if len(v["stages"]) > 1]
            src_only = [p for p in params if p not in b_spec]
            if judge("load_distributed (dedup)", "loads", (okl, rl), (rc, out), diffs, notes):
                fa, fb = tree(ms_ld), tree(t_ld)
                if fa != fb:
                    diffs.append(f"load_distributed (dedup): files MS {fa} vs T {fb}")
                for f in sorted(set(fa) & set(fb)):
                    cmp_files(os.path.join(ms_ld, f), os.path.join(t_ld, f), diffs,
                              f"load_distributed (dedup) {f}", order=False, whole=src_only,
                              ms_may_lack=shared, notes=notes)
            if rc == 0:
                for rb in range(nd_b * stages_b):
                    f = os.path.join(t_ld, f"rank_{rb}", "net.safetensors")
                    if not os.path.exists(f):
                        diffs.append(f"load_distributed (dedup): Tessera wrote no rank {rb}")
                        continue
                    tr = truth_for_rank({p: v for p, v in b_spec.items() if p in params},
                                        full, dtypes, nd_b, rb, outside)
                    cmp_truth(f, tr, diffs, f"load_distributed (dedup) T rank {rb} vs truth")
    # a conversion from a dedup source (MindSpore's; judged by the numpy truth)
    t_c = os.path.join(cdir, "t_conv_dedup")
    cmd = [t, "ckpt", "convert", "--src", t_dd if ms_bad else ms_dd, "--src-strategy", a_path, "--dst", t_c,
           "--quiet", "--no-fsync"] + (["--dst-strategy", b_path] if b_path else [])
    if b_spec and any(p not in params for p in b_spec):
        cmd.append("--allow-missing")
    rc, out = run(cmd)
    if rc != 0:
        diffs.append(f"convert from dedup: Tessera refuses: {out[-400:]}")
        return
    for rb in range(nd_b * stages_b):
        files = [f for f in tree(t_c) if f.startswith(f"rank_{rb}/")]
        if len(files) != 1:
            diffs.append(f"convert from dedup: rank {rb} files {files}")
            continue
        tr = truth_for_dst_rank(b_spec, params, outside, full, dtypes, nd_b, rb)
        cmp_truth(os.path.join(t_c, files[0]), tr, diffs, f"convert from dedup rank {rb}")


def load_network_checks(cdir, t, sdir, name, a_path, params, outside, full, dtypes, nd_a, diffs,
                        notes, dedup=False):
    args_py = PY_TESSERA[0]
    """``load_distributed_checkpoint(network, checkpoint_filenames, None, A)`` (network mode,
    merged to one device) from the source set ``sdir`` against ``tessera ckpt convert`` of the
    same set without ``--dst-strategy`` (merged into rank 0); both judged by the numpy truth."""
    class Holder(ms.nn.Cell):
        def __init__(self):
            super().__init__()
            for k, p in enumerate(params):
                z = np.zeros(full[p].shape, dtype=np.float32)
                # a bf16 Parameter cannot be made on this wheel (its numpy has no bfloat16);
                # MindSpore's merge turns bf16 into float32 anyway
                dt = ms.float32 if dtypes[p] == "bf16" else MS_DT[dtypes[p]]
                setattr(self, f"p{k}", ms.Parameter(ms.Tensor(z, dtype=dt), name=p))
    net = Holder()
    files = []
    for r in range(nd_a):
        fs = tree(os.path.join(sdir, f"rank_{r}"))
        files.append(os.path.join(sdir, f"rank_{r}", fs[0]) if fs else "")
    ok, r = ms_call(ms.load_distributed_checkpoint, net, files, None, a_path)
    t_f = os.path.join(cdir, f"t_full_{name}")
    cmd = [t, "ckpt", "convert", "--src", sdir, "--src-strategy", a_path, "--dst", t_f,
           "--prefix", "full_", "--quiet", "--no-fsync"]
    rc, out = run(cmd)
    what = f"load_distributed network ({name})"
    if rc != 0:
        diffs.append(f"{what}: Tessera's merge refuses: {out[-400:]}")
    else:
        cmp_truth(os.path.join(t_f, "rank_0", "full_0.ckpt"),
                  {p: (dtypes[p], full[p]) for p in params + outside}, diffs,
                  f"{what}: T merge vs truth")
    # Tessera's Python load_distributed_checkpoint (network=None: rank 0's arrays), same files
    if args_py:
        npz = os.path.join(cdir, f"t_py_load_{name}.npz")
        code = ("import json, sys, numpy as np\n"
                "import tessera.parallel as p\n"
                "a = json.loads(sys.argv[1])\n"
                "d = p.load_distributed_checkpoint(None, a['files'], None, a['train'])\n"
                "np.savez(a['out'], **{k.replace('.', '~'): v for k, v in d.items()})\n")
        rcp, outp = run([args_py, "-c", code, json.dumps({"files": files, "train": a_path,
                                                          "out": npz})])
        if rcp != 0:
            diffs.append(f"{what}: Tessera's Python load_distributed_checkpoint refuses: "
                         f"{outp[-400:]}")
        else:
            got = {k.replace('~', '.'): v for k, v in np.load(npz).items()}
            for p in params + outside:
                want = full[p]
                if p not in got:
                    diffs.append(f"{what}: Tessera's Python load lacks {p}")
                elif got[p].shape != want.shape or not np.array_equal(
                        got[p].astype(np.float64), want.astype(np.float64)):
                    diffs.append(f"{what}: Tessera's Python load: {p} differs from the truth")
    if not ok:
        notes.append(f"MS-LIMIT {what}: MindSpore refuses: {r}")
        return
    wrong = []
    for p in net.get_parameters():
        d = p.data
        if d.dtype == ms.bfloat16:
            d = ms.ops.cast(d, ms.float32)
        got = np.asarray(d.asnumpy())
        want = full[p.name]
        if p.name in SKIP_MS:
            continue
        if got.shape != want.shape or not np.array_equal(got.astype(np.float64),
                                                         want.astype(np.float64)):
            wrong.append((p.name, list(got.shape)))
    if wrong:
        diffs.append(f"{what}: MindSpore's network differs from the truth: {wrong}")


def transform_checks(cdir, t, src, a_path, b_path, rb, tl, ms_list, params, outside, full,
                     dtypes, b_spec, nd_b, src_only, dst_only, prefix, diffs, notes):
    """``transform_checkpoint_by_rank`` (the function ``convert_checkpoint_by_rank`` wraps)
    called directly: (1) given only the source files of Tessera's (shorter) ``ckpt ranks``
    list, it must write what ``tessera ckpt convert --rank`` writes; (2) from the unsharded
    source (``src_strategy_file=None``, ``full/rank_0``) against ``ckpt convert`` without
    ``--src-strategy``. Both are also judged by the numpy truth."""
    shared = [p for p, v in (b_spec or {}).items() if len(v["stages"]) > 1]
    tf = os.path.join(cdir, "t_byrank", f"rank_{rb}", f"{prefix}{rb}.ckpt")
    if tl is not None and os.path.exists(tf):
        fmap = {}
        for k in sorted(tl, reverse=True):  # MindSpore's own lists are descending
            fs = tree(os.path.join(src, f"rank_{k}"))
            fmap[int(k)] = os.path.join(src, f"rank_{k}", fs[0])
        ms_file = os.path.join(cdir, "ms_transform_tl", f"rank_{rb}.ckpt")
        os.makedirs(os.path.dirname(ms_file))
        ok, r = ms_call(transform_checkpoint_by_rank, rb, fmap, ms_file, a_path, b_path)
        if not ok and not set(tl) >= set(ms_list):
            # documented: MindSpore reads from the ranks of its own list, not from any rank
            # holding the piece; another cover of the same pieces is refused
            notes.append(f"MS-LIMIT transform_checkpoint_by_rank {rb}: refuses Tessera's "
                         f"ranks {tl}: {r}")
        elif not ok:
            diffs.append(f"transform_checkpoint_by_rank {rb} from Tessera's ranks {tl}: "
                         f"MindSpore refuses: {r}")
        else:
            # Tessera's file is judged by MindSpore's own-list output and the truth above;
            # what MindSpore makes of another (sufficient) cover is recorded: with a pipelined
            # source it can silently merge wrong shapes (documented)
            d2 = []
            cmp_files(ms_file, tf, d2, f"transform_checkpoint_by_rank {rb} (ranks {tl})",
                      order=False, whole=src_only, ms_may_lack=shared, notes=notes)
            if d2 and not set(tl) >= set(ms_list):
                notes += [f"MS-BUG {d}" for d in d2]
            else:
                diffs += d2
    # MindSpore's own list in ascending order: the result must not depend on the map's order
    own = os.path.join(cdir, "ms_byrank", f"rank_{rb}.ckpt")
    if ms_list and os.path.exists(own):
        fmap = {}
        for k in sorted(ms_list):
            fs = tree(os.path.join(src, f"rank_{k}"))
            fmap[k] = os.path.join(src, f"rank_{k}", fs[0])
        ms_file = os.path.join(cdir, "ms_transform_asc", f"rank_{rb}.ckpt")
        os.makedirs(os.path.dirname(ms_file))
        ok, r = ms_call(transform_checkpoint_by_rank, rb, fmap, ms_file, a_path, b_path)
        d2 = []
        if ok:
            cmp_files(own, ms_file, d2, f"transform_checkpoint_by_rank {rb} ascending map",
                      order=False)
        else:
            d2.append(f"transform_checkpoint_by_rank {rb}: refuses its own list ascending: {r}")
        # documented MindSpore bug: a parameter on several source stages with different
        # layouts is merged from whichever stage's file comes last
        notes += [f"MS-BUG {d}" for d in d2]
    # the unsharded source: full/rank_0/full.ckpt holds every tensor whole
    t_u = os.path.join(cdir, "t_byrank_unsharded")
    cmd = [t, "ckpt", "convert", "--src", os.path.join(cdir, "full"), "--dst", t_u, "--rank",
           str(rb), "--prefix", prefix, "--quiet", "--no-fsync"]
    if b_path:
        cmd += ["--dst-strategy", b_path]
    if dst_only:
        cmd.append("--allow-missing")
    rc, out = run(cmd)
    ms_file = os.path.join(cdir, "ms_transform_unsharded", f"rank_{rb}.ckpt")
    os.makedirs(os.path.dirname(ms_file))
    ok, r = ms_call(transform_checkpoint_by_rank, rb,
                    {0: os.path.join(cdir, "full", "rank_0", "full.ckpt")}, ms_file, None, b_path)
    tf = os.path.join(t_u, f"rank_{rb}", f"{prefix}{rb}.ckpt")
    if judge(f"transform unsharded {rb}", "converts", (ok, r), (rc, out), diffs, notes):
        cmp_files(ms_file, tf, diffs, f"transform unsharded {rb}", order=False,
                  ms_may_lack=shared, notes=notes)
    if rc == 0:
        tr = truth_for_dst_rank(b_spec, params, outside, full, dtypes, nd_b, rb)
        if os.path.exists(tf):
            cmp_truth(tf, tr, diffs, f"convert unsharded T rank {rb} vs truth")
        else:
            diffs.append(f"convert unsharded: Tessera wrote {tree(t_u)}")


def read_names(path):
    return [t[0] for t in read_any(path)[0]]


def norm_bss(d):
    out = {}
    for k, v in d.items():
        v = dict(v)
        for key in ("dev_matrix", "tensor_map", "param_split_shape", "indices_offset"):
            v[key] = [list(x.get("dim", [])) for x in v.get(key, [])]
        for key in ("field", "opt_weight_shard_step", "opt_weight_shard_size"):
            v[key] = int(v.get(key, 0))
        out[k] = v
    return out


def red_truth(lay):
    """Replica groups of a layout, MindSpore's order: groups of ranks holding the same slice,
    each sorted, groups ordered by first rank; an opt shard strides each group."""
    dev, tmap = lay["dev"], lay["tmap"]
    n = int(np.prod(dev))
    groups = {}
    for r in range(n):
        c = coords(r, dev)
        key = tuple(c[len(dev) - 1 - a] for axes in tmap for a in axes)
        groups.setdefault(key, []).append(r)
    gs = sorted(groups.values())
    k = lay["opt_size"]
    if k not in (0, 1):
        if k == -1:
            k = len(gs[0])
        gs = [g[i::k] for g in gs for i in range(k)]
    return gs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", type=int, default=50)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--tessera", default="target/debug/tessera")
    ap.add_argument("--tessera-python", default="",
                    help="a Python with the tessera package: its load_distributed_checkpoint "
                         "is compared too")
    ap.add_argument("--work", default="/tmp/msdiff")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    args.tessera = os.path.abspath(args.tessera)
    PY_TESSERA[0] = args.tessera_python or None
    os.makedirs(args.work, exist_ok=True)
    only = [int(x) for x in args.only.split(",") if x]
    bad = 0
    for i in (only or range(args.cases)):
        try:
            desc, diffs, notes = one_case(i, args.seed + i, args)
        except Exception:  # noqa: BLE001
            desc, diffs, notes = "?", ["generator crashed: " + traceback.format_exc()[-800:]], []
        status = "DIFF" if diffs else "ok"
        print(f"case {i} (seed {args.seed + i}) {status}: {desc}")
        for d in diffs:
            print("   DIFF", d)
        for n in notes:
            print("   note", n)
        sys.stdout.flush()
        if diffs:
            bad += 1
        elif not args.keep:
            shutil.rmtree(os.path.join(args.work, f"case{i}"), ignore_errors=True)
    print(f"{bad} of {len(only) or args.cases} cases differ")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
