#!/usr/bin/env python3
"""Differential sweep of ``tessera.parallel``'s pure functions against the real MindSpore 2.10.

Usage (run with the Python of a venv that has MindSpore 2.10 installed; it writes the strategy
and group-info files with MindSpore's own protobuf classes)::

    /tmp/ms-venv/bin/python scripts/mindspore-api-diff.py [--cases N] [--seed S]
        [--ms-python /tmp/ms-venv/bin/python] [--tessera-python /tmp/py-venv-h/bin/python]
        [--work DIR] [--show-all]

* ``--ms-python``: a Python with ``mindspore`` (default ``/tmp/ms-venv/bin/python``);
  ``--tessera-python``: a Python with the ``tessera`` package (``maturin develop`` from
  ``python/``; default ``/tmp/py-venv-h/bin/python``).
* ``--cases`` (default 2000) random cases from ``--seed`` (default 1); case *i* uses seed
  ``S + i``. ``--work`` (default ``/tmp/msapidiff``) holds the generated files and both
  sides' JSON results.

Each case is one call sequence, drawn at random, valid or not:

* ``Layout(device_matrix, alias_name, rank_list)``, then ``layout(*tensor_map)``, then
  ``to_dict()`` of the result and of the original layout;
* ``build_searched_strategy`` on a random protobuf or JSON strategy file (flat and multi-axis
  tensor maps, optimizer shards, pipeline stages; also empty, truncated or garbage files, a
  missing path, a non-str argument, ``None``);
* ``restore_group_info_list`` on a random group-info file (or a broken one);
* ``merge_pipeline_strategys`` of 1-3 stage files, its output read back with
  ``build_searched_strategy``;
* ``rank_list_for_convert`` between two random strategies (Tessera returns a minimal list,
  difference 1 of docs/MINDSPORE_DIFFERENCES.md: only "Tessera's list is a subset of
  MindSpore's" is checked);
* ``merge_sliced_parameter`` of random slices, without and with a strategy.

Each side runs every case in ONE subprocess (``--side ms`` / ``--side tessera``) and writes a
JSON result per case: the normalised value, or the exception's class and message. A case is a
difference when one side refuses and the other does not, when the exception classes differ, or
when the values differ. MindSpore's known bugs (reference cases README, "Bugs") and the
documented departures are classified, not reported as differences: Tessera refusing a value
MindSpore accepts but cannot use (an axis of size < 1, a bool, an empty device matrix, ...)
is listed as "stricter" with the message, for review.
"""

from __future__ import annotations

import argparse
import ast
import collections
import json
import os
import random
import subprocess
import sys
import types

ALIASES = ["dp", "mp", "sp", "cp", "ep", "pp", "x", "y"]


# ---------------------------------------------------------------------------------------------
# Generation (in the MindSpore venv: the files are written with its protobuf classes)
# ---------------------------------------------------------------------------------------------

def gen_layout(rng: random.Random) -> dict:
    """A random Layout call sequence, as Python literals (repr strings)."""
    n = rng.choice([0, 1, 2, 2, 3, 3, 4]) if rng.random() < 0.97 else 5
    dm = [rng.choice([1, 2, 2, 3, 4]) for _ in range(n)]
    bad = rng.random() < 0.35
    names = rng.sample(ALIASES, n)
    if n and rng.random() < 0.2:
        names[-1] = "interleaved_parallel"
    rank_list = None
    if rng.random() < 0.4:
        total = 1
        for d in dm:
            total *= d
        rank_list = list(range(total))
        rng.shuffle(rank_list)
    dm_t, names_t = tuple(dm), tuple(names)
    if bad:
        kind = rng.randrange(16)
        if kind == 0 and n:
            dm[rng.randrange(n)] = rng.choice([0, -1, -2])
        elif kind == 1 and n:
            dm[rng.randrange(n)] = rng.choice([True, 2.0, "2", None])
        elif kind == 2 and n:
            names[rng.randrange(n)] = rng.choice(["", "None", 3, None, b"dp"])
        elif kind == 3 and n > 1:
            names[rng.randrange(n)] = names[(rng.randrange(n - 1) + 1 + 0) % n]
        elif kind == 4 and n > 1:
            names[rng.randrange(n - 1)] = "interleaved_parallel"
        elif kind == 5:
            names.append("extra")
        elif kind == 6 and rank_list:
            rank_list.pop()
        elif kind == 7 and rank_list:
            rank_list[0] = rng.choice([True, 1.0, "0", None, -1, rank_list[-1]])
        elif kind == 8 and rank_list:
            rank_list = tuple(rank_list)
        elif kind == 9 and rank_list is not None:
            rank_list = [rank_list]
        dm_t = list(dm) if kind == 10 else tuple(dm)
        names_t = list(names) if kind == 11 else tuple(names)
    tm = []
    used = set()
    for _ in range(rng.choice([0, 1, 2, 2, 3, 4])):
        r = rng.random()
        free = [a for a in names if isinstance(a, str) and a not in used]
        if r < 0.3 or not free:
            tm.append("None")
        elif r < 0.75:
            a = rng.choice(free)
            used.add(a)
            tm.append(a)
        else:
            k = rng.randint(0, min(3, len(free)))
            t = tuple(rng.sample(free, k))
            used.update(t)
            if rng.random() < 0.15:
                t = t + ("None",)
            tm.append(t)
    if bad and rng.random() < 0.5:
        k = rng.randrange(6)
        if k == 0:
            tm.append("nope")
        elif k == 1 and names and isinstance(names[0], str):
            tm.append(names[0])
            tm.append((names[0],))
        elif k == 2:
            tm.append(rng.choice([1, None, ["dp"], -1]))
        elif k == 3:
            tm.append(("nope",))
        elif k == 4:
            tm.append(("dp", 1))
        else:
            tm.append(())
    return {"kind": "layout", "dm": repr(dm_t), "names": repr(names_t),
            "rank_list": repr(rank_list), "tm": repr(tuple(tm)),
            "call": rng.random() < 0.9}


def _rand_layout(rng, n_dev_axes=None, multi=True, ndims=None):
    k = n_dev_axes or rng.randint(1, 3)
    dev = [rng.choice([1, 2, 2, 4]) for _ in range(k)]
    nd = ndims if ndims is not None else rng.randint(1, 3)
    axes = list(range(k))
    rng.shuffle(axes)
    tmap = []
    for _ in range(nd):
        r = rng.random()
        if r < 0.35 or not axes:
            tmap.append([-1])
        elif multi and r > 0.85 and len(axes) >= 2:
            tmap.append([axes.pop(), axes.pop()])
        else:
            tmap.append([axes.pop()])
    return dev, tmap


def write_strategy(path, rng, params, stage=0, json_flavour=False, opt=False):
    """A strategy file of ``params``: {name: (dev, tmap)}; returns what was written."""
    from mindspore.train import node_strategy_pb2 as pb
    layouts = {}
    for name, (dev, tmap) in params.items():
        total = 1
        for d in dev:
            total *= d
        osize, ostep = 0, 0
        if opt and rng.random() < 0.25 and total > 1:
            osize = rng.choice([-1, 2])
            ostep = rng.choice([0, 1, 2])
        split = [] if not opt or rng.random() < 0.9 else [rng.randint(1, 4) for _ in range(2)]
        layouts[name] = (dev, tmap, osize, ostep, split)
    if json_flavour:
        items = {}
        for name, (dev, tmap, osize, ostep, split) in layouts.items():
            flat = [t[0] if len(t) == 1 else t[0] for t in tmap]
            item = {"dev_matrix": dev, "tensor_map": flat, "tensor_shape": [4] * len(flat),
                    "field": 0, "opt_weight_shard_step": ostep, "opt_weight_shard_size": osize}
            if split:
                item["param_split_shape"] = split
            items[name] = item
        doc = {"current_stage": stage,
               "parallel_strategy_item": {"op": {"stage": stage, "parallel_strategy": [[1]]}},
               "parallel_layout_item": items}
        with open(path, "w") as f:
            json.dump(doc, f)
        return
    m = pb.ParallelStrategyMap()
    m.current_stage = stage
    it = m.parallel_strategy_item.add()
    it.node_name = "op"
    it.parallel_strategys.stage = stage
    it.parallel_strategys.parallel_strategy.add().dim.extend([1])
    for name, (dev, tmap, osize, ostep, split) in layouts.items():
        li = m.parallel_layout_item.add()
        li.param_name = name
        pl = li.parallel_layouts
        pl.dev_matrix.add().dim.extend(dev)
        if all(len(t) == 1 for t in tmap):
            pl.tensor_map.add().dim.extend([t[0] for t in tmap])
        else:
            for t in tmap:
                pl.tensor_map.add().dim.extend(t)
            if len(tmap) == 1:
                pl.tensor_map.add()
        pl.param_split_shape.add().dim.extend(split)
        pl.indices_offset.add()
        pl.field = 0
        pl.opt_weight_shard_step = ostep
        pl.opt_weight_shard_size = osize
    with open(path, "wb") as f:
        f.write(m.SerializePartialToString())


def _params(rng, prefix="net.", k=None, multi=True, dev=None):
    if dev is None:
        dev, _ = _rand_layout(rng, rng.randint(1, 3))
    dev_axes = len(dev)
    out = {}
    for i in range(k or rng.randint(1, 4)):
        _, tmap = _rand_layout(rng, dev_axes, multi=multi)
        name = f"{prefix}p{i}"
        if rng.random() < 0.05:
            name = f"layer-{i}.w"
        out[name] = (dev, tmap)
    return out


def gen_strategy_case(rng, d, i) -> dict:
    kind = rng.choice(["bss", "bss", "group", "merge", "ranks", "ranks", "msp", "msp"])
    base = os.path.join(d, f"c{i}")
    os.makedirs(base, exist_ok=True)
    if kind == "bss":
        js = rng.random() < 0.3
        path = os.path.join(base, "s.json" if js else "s.ckpt")
        r = rng.random()
        if r < 0.75:
            risky = rng.random() < 0.2  # random optimizer shards: often break the step rule
            write_strategy(path, rng, _params(rng, multi=not js), stage=rng.randint(0, 1),
                           json_flavour=js, opt=risky)
            return {"kind": "bss", "path": repr(path), "invalid": risky}
        elif r < 0.8:
            open(path, "wb").close()
        elif r < 0.88:
            write_strategy(path, rng, _params(rng), json_flavour=js)
            data = open(path, "rb").read()
            with open(path, "wb") as f:
                f.write(data[: rng.randrange(1, max(2, len(data)))])
        elif r < 0.93:
            with open(path, "wb") as f:
                f.write(bytes(rng.randrange(256) for _ in range(rng.randint(1, 40))))
        elif r < 0.96:
            path = os.path.join(base, "missing.ckpt")
        else:
            path = rng.choice([None, 3, b"x.ckpt"])
        return {"kind": "bss", "path": repr(path), "invalid": True}
    if kind == "group":
        from mindspore.train import node_strategy_pb2 as pb
        path = os.path.join(base, "group_info.pb")
        m = pb.ParallelGroupMap()
        for g in range(rng.randint(0, 2)):
            gi = m.parallel_group_item.add()
            gi.group_name = f"g{g}"
            gi.parallel_group_ranks.dim.extend(rng.sample(range(8), rng.randint(1, 4)))
        r = rng.random()
        if r < 0.8:
            m.ckpt_restore_rank_list.dim.extend(rng.sample(range(16), rng.randint(0, 6)))
        data = m.SerializePartialToString()
        if r > 0.9:
            data = data[: max(1, len(data) // 2)] + b"\xff\xff"
        with open(path, "wb") as f:
            f.write(data)
        if rng.random() < 0.05:
            path = rng.choice([None, os.path.join(base, "none.pb")])
        return {"kind": "group", "path": repr(path)}
    if kind == "merge":
        src = os.path.join(base, "stages")
        os.makedirs(src)
        n = rng.randint(1, 3)
        stages = list(range(n))
        invalid = False
        dev, _ = _rand_layout(rng, rng.randint(1, 3))
        if rng.random() < 0.1:
            stages[-1] = n  # a gap in the stage numbers
            invalid = True
        for s in stages:
            d = dev
            if rng.random() < 0.1:
                d, invalid = _rand_layout(rng, rng.randint(1, 3))[0], True
            write_strategy(os.path.join(src, f"stage{s}.ckpt"), rng,
                           _params(rng, prefix=f"s{s}.", multi=True, dev=d), stage=s)
        if rng.random() < 0.1:
            write_strategy(os.path.join(src, "dup.ckpt"), rng, _params(rng, dev=dev), stage=0)
            invalid = True
        return {"kind": "merge", "src": src, "dst": os.path.join(base, "merged.ckpt"),
                "invalid": invalid}
    if kind == "ranks":
        k = rng.randint(1, 4)
        names = [f"net.p{j}" for j in range(k)]
        a_dev, _ = _rand_layout(rng, rng.randint(1, 3))
        b_dev, _ = _rand_layout(rng, rng.randint(1, 3))
        shapes_nd = [rng.randint(1, 3) for _ in names]
        a = {nm: (a_dev, _rand_layout(rng, len(a_dev), ndims=nd)[1]) for nm, nd in zip(names, shapes_nd)}
        b = {nm: (b_dev, _rand_layout(rng, len(b_dev), ndims=nd)[1]) for nm, nd in zip(names, shapes_nd)}
        pa, pb_ = os.path.join(base, "A.ckpt"), os.path.join(base, "B.ckpt")
        write_strategy(pa, rng, a, opt=False)
        write_strategy(pb_, rng, b, opt=False)
        total = 1
        for x in b_dev:
            total *= x
        rank = rng.randrange(total) if rng.random() < 0.9 else rng.choice([total, -1])
        dst = pb_ if rng.random() < 0.8 else None
        return {"kind": "ranks", "rank": rank, "a": pa, "b": dst, "la": a, "lb": b,
                "invalid": not 0 <= rank < total or dst is None and rank != 0}
    # merge_sliced_parameter
    nd = rng.randint(1, 3)
    dev, tmap = _rand_layout(rng, rng.randint(1, 3), ndims=nd)
    shape = []
    for t in tmap:
        f = 1
        for ax in t:
            if ax >= 0:
                f *= dev[len(dev) - 1 - ax]
        shape.append(f * rng.randint(1, 2))
    use_strategy = rng.random() < 0.6
    total = 1
    for x in dev:
        total *= x
    path = os.path.join(base, "s.ckpt")
    write_strategy(path, rng, {"w": (dev, tmap)}, opt=False)
    return {"kind": "msp", "shape": shape, "dev": dev, "tmap": tmap, "strategy": path if use_strategy else None,
            "ranks": total, "bad": rng.random() < 0.2, "seed": rng.randrange(1 << 30)}


# ---------------------------------------------------------------------------------------------
# Running (one subprocess per side)
# ---------------------------------------------------------------------------------------------

def norm(v):
    """JSON-able value keeping tuple/list apart (tuples become {"t": [...]})."""
    try:
        import numpy as np
        if isinstance(v, np.integer):
            return int(v)
        if isinstance(v, np.ndarray):
            return {"nd": v.tolist(), "dtype": str(v.dtype), "shape": list(v.shape)}
    except ImportError:
        pass
    if isinstance(v, tuple):
        return {"t": [norm(x) for x in v]}
    if isinstance(v, list):
        return [norm(x) for x in v]
    if isinstance(v, dict):
        return {str(k): norm(x) for k, x in v.items()}
    if hasattr(v, "ListFields"):  # a protobuf message
        from google.protobuf.json_format import MessageToDict
        return MessageToDict(v, preserving_proto_field_name=True,
                             always_print_fields_with_no_presence=True)
    return v


def pb_like(v):
    """Tessera's build_searched_strategy layouts in MessageToDict's shape (int64 as str)."""
    out = {}
    for name, lay in v.items():
        d = {}
        for key, val in lay.items():
            if isinstance(val, list):
                d[key] = [{"dim": [str(x) if key in ("param_split_shape", "indices_offset")
                                   else x for x in e.get("dim", [])]} for e in val]
            else:
                d[key] = val
        out[name] = d
    return out


def run_case(side, P, c):
    kind = c["kind"]
    if kind == "layout":
        dm, names = ast.literal_eval(c["dm"]), ast.literal_eval(c["names"])
        rl, tm = ast.literal_eval(c["rank_list"]), ast.literal_eval(c["tm"])
        lay = P.Layout(dm, names, rl)
        if not c["call"]:
            return {"before_call": _catch(lay.to_dict)}
        new = lay(*tm)
        return {"new": norm(new.to_dict()), "orig": _catch(lambda: norm(lay.to_dict()))}
    if kind == "bss":
        r = P.build_searched_strategy(ast.literal_eval(c["path"]))
        if r is None:
            return None
        return norm(r) if side == "ms" else pb_like(r)
    if kind == "group":
        return norm(P.restore_group_info_list(ast.literal_eval(c["path"])))
    if kind == "merge":
        P.merge_pipeline_strategys(c["src"], c["dst"])
        r = P.build_searched_strategy(c["dst"])
        return norm(r) if side == "ms" else pb_like(r)
    if kind == "ranks":
        return sorted(int(x) for x in P.rank_list_for_convert(c["rank"], c["a"], c["b"]))
    if kind == "msp":
        import numpy as np
        rng = np.random.default_rng(c["seed"])
        full = rng.integers(0, 1000, size=c["shape"]).astype(np.float32)
        if c["strategy"] is None:
            pieces = np.array_split(full, c["ranks"], axis=0) if c["shape"][0] >= c["ranks"] \
                else [full]
            strategy = None
        else:
            pieces = np_slices(c, full)
            strategy = P.build_searched_strategy(c["strategy"])
        if c["bad"] and len(pieces) > 1:
            pieces = pieces[:-1]
        params = [P.Parameter(P.Tensor(p), name="w") for p in pieces]
        out = P.merge_sliced_parameter(params, strategy)
        value = np.asarray(out.asnumpy() if hasattr(out, "asnumpy") else out.data)
        return {"value": value.tolist(), "name": out.name,
                "exact": value.shape == full.shape and bool((value == full).all())}
    raise AssertionError(kind)


def _catch(fn):
    try:
        return {"ok": fn()}
    except Exception as e:  # noqa: BLE001 - recorded for the comparison
        return {"err": type(e).__name__, "msg": str(e)[:400]}


def side_main(side, cases_file, out_file):
    # The same names from either package: MindSpore's, or Tessera's that stand for them.
    import importlib
    top = importlib.import_module("mindspore" if side == "ms" else "tessera")
    par = importlib.import_module(top.__name__ + ".parallel")
    names = ["Layout", "build_searched_strategy", "restore_group_info_list",
             "merge_pipeline_strategys", "rank_list_for_convert", "merge_sliced_parameter"]
    P = types.SimpleNamespace(**{n: getattr(par, n) for n in names},
                              Parameter=top.Parameter, Tensor=top.Tensor)
    cases = json.load(open(cases_file))
    done = set()
    if os.path.exists(out_file):
        done = {json.loads(line)["key"] for line in open(out_file)}
    out = open(out_file, "a")
    for key, c in cases.items():
        if key in done:
            continue
        # A case that kills the process (MindSpore segfaults on some inputs) is found by
        # the line written before it runs.
        out.write(json.dumps({"key": key, "started": True}) + "\n")
        out.flush()
        if c["kind"] == "merge" and os.path.exists(c["dst"] + "." + side):
            os.remove(c["dst"] + "." + side)
        if c["kind"] == "merge":
            c = dict(c, dst=c["dst"] + "." + side)
        out.write(json.dumps({"key": key, "result": _catch(lambda: run_case(side, P, c))}) + "\n")
        out.flush()


def np_slices(c, full):
    """Each rank's slice of ``full`` under the case's layout (an independent numpy slicer)."""
    dev, tmap = c["dev"], c["tmap"]
    out = []
    total = 1
    for d in dev:
        total *= d
    for r in range(total):
        coord, rest = [], r
        for d in reversed(dev):
            coord.append(rest % d)
            rest //= d
        coord.reverse()
        index = []
        for dim, axes in enumerate(tmap):
            pos, parts = 0, 1
            for ax in axes:
                if ax < 0:
                    continue
                k = len(dev) - 1 - ax
                pos = pos * dev[k] + coord[k]
                parts *= dev[k]
            step = full.shape[dim] // parts
            index.append(slice(pos * step, (pos + 1) * step))
        out.append(full[tuple(index)])
    return out


def classify(c, ms, te):
    """None when the sides agree (or differ only as documented), else a short label."""
    kind = c["kind"]
    if kind == "layout" and c["dm"] == "()" and "err" in te:
        return None  # MindSpore: TypeError from np.prod(()) (a float); see difference 12
    if ms.get("err") == "crash" and "err" in te:
        return "mindspore crashes (tessera refuses)"
    if "err" in ms and "err" in te:
        if kind == "layout" and any(m in te["msg"] for m in DOCUMENTED_LAYOUT_RULES):
            return None
        return None if ms["err"] == te["err"] or (ms["err"], te["err"]) in SAME_ERR else \
            f"error class {ms['err']}/{te['err']}"
    if "err" in te:
        if kind == "layout" and c["dm"] == "()":
            return None  # MindSpore: TypeError from np.prod(()) (a float); see difference 12
        if kind == "group" and ms["ok"] == []:
            return None  # MindSpore bug 4: no ckpt_restore_rank_list gives []
        if kind == "layout" and any(m in te["msg"] for m in DOCUMENTED_LAYOUT_RULES):
            return "stricter (documented, difference 12)"
        return "stricter (invalid input)" if c.get("invalid") else "stricter"
    if "err" in ms:
        if kind == "msp" and te["ok"]["exact"] and any(
                len([x for x in t if x >= 0]) > 1 for t in c["tmap"]):
            return None  # MindSpore reads only tensor_map[0] of an extended map (bug 2)
        return "tessera accepts"
    a, b = ms["ok"], te["ok"]
    if kind == "ranks":
        # Difference 1: Tessera's list is minimal; it must still cover the destination slice.
        if not covers(c, b):
            return "ranks do not cover"
        return None if covers(c, a) else "check: MindSpore's list does not cover"
    if kind == "msp":
        if c["bad"]:  # a slice left out: without a strategy both concatenate what they got
            return None if a == b else "value"
        if not b["exact"]:
            return "tessera's merge is not the whole value"
        multi = any(len([x for x in t if x >= 0]) > 1 for t in c["tmap"])
        if not a["exact"]:
            # MindSpore reads only tensor_map[0] of an extended (multi-axis) map (bug 2)
            return None if multi and c["strategy"] else "mindspore's merge is wrong"
        return None if a == b else "value"
    return None if a == b else "value"


def _box(dev, tmap, rank, shape):
    coord, rest = [], rank
    for d in reversed(dev):
        coord.append(rest % d)
        rest //= d
    coord.reverse()
    box = []
    for dim, axes in enumerate(tmap):
        pos, parts = 0, 1
        for ax in axes:
            if ax >= 0:
                k = len(dev) - 1 - ax
                pos, parts = pos * dev[k] + coord[k], parts * dev[k]
        step = shape[dim] // parts
        box.append((pos * step, (pos + 1) * step))
    return box


def covers(c, ranks):
    """Whether the source ranks ``ranks`` (under A) hold every element the destination rank
    needs (its slice under B, or everything without B), for every parameter."""
    import itertools
    for name, (adev, amap) in c["la"].items():
        shape = [64] * len(amap)
        if c["b"] is None:
            need = [(0, 64)] * len(amap)
        else:
            bdev, bmap = c["lb"][name]
            need = _box(bdev, bmap, c["rank"], shape)
        boxes = [_box(adev, amap, r, shape) for r in ranks]
        for point in itertools.product(*[range(lo, hi) for lo, hi in need]):
            if not any(all(lo <= x < hi for x, (lo, hi) in zip(point, b)) for b in boxes):
                return False
    return True


# Layout values Tessera refuses and MindSpore takes (docs/MINDSPORE_DIFFERENCES.md, 12).
DOCUMENTED_LAYOUT_RULES = ("every axis needs at least one device", "must be int type, but got:<class 'bool'>",
                           "should be int, but got bool", "more than once", "is out of range",
                           "slots of one mesh position")

# Exception classes both sides use for the same refusal (Tessera's CheckpointError is a
# ValueError, CheckpointIOError an OSError).
SAME_ERR = {("ValueError", "CheckpointError"), ("TypeError", "CheckpointError"),
            # a malformed protobuf file: MindSpore lets protobuf's DecodeError through
            ("DecodeError", "CheckpointError"),
            # a rank outside the strategies: MindSpore fails inside its own code
            ("IndexError", "CheckpointError"), ("RuntimeError", "CheckpointError"),
            ("IndexError", "ValueError"), ("AxisError", "ValueError"),
            # a broken JSON strategy: both ValueErrors (CheckpointError is one)
            ("JSONDecodeError", "CheckpointError"), ("UnicodeDecodeError", "CheckpointError")}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--side", choices=["ms", "tessera"])
    ap.add_argument("--cases", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--work", default="/tmp/msapidiff")
    ap.add_argument("--ms-python", default="/tmp/ms-venv/bin/python")
    ap.add_argument("--tessera-python", default="/tmp/py-venv-h/bin/python")
    ap.add_argument("--show-all", action="store_true")
    ap.add_argument("io", nargs="*")
    args = ap.parse_args()
    if args.side:
        side_main(args.side, *args.io)
        return 0
    import shutil
    if os.path.isdir(args.work) and os.path.exists(os.path.join(args.work, ".msapidiff")):
        shutil.rmtree(args.work)
    os.makedirs(args.work, exist_ok=True)
    open(os.path.join(args.work, ".msapidiff"), "w").close()
    files = os.path.join(args.work, "files")
    os.makedirs(files, exist_ok=True)
    cases = {}
    for i in range(args.cases):
        rng = random.Random(args.seed + i)
        c = gen_layout(rng) if rng.random() < 0.6 else gen_strategy_case(rng, files, i)
        cases[str(args.seed + i)] = c
    cf = os.path.join(args.work, "cases.json")
    json.dump(cases, open(cf, "w"))
    out = {}
    for side, py in (("ms", args.ms_python), ("tessera", args.tessera_python)):
        of = os.path.join(args.work, f"{side}.json")
        env = dict(os.environ, GLOG_v="3", PYTHONWARNINGS="ignore")
        results = {}
        while True:
            rc = subprocess.run([py, os.path.abspath(__file__), "--side", side, cf, of],
                                env=env, stderr=subprocess.DEVNULL).returncode
            for line in open(of):
                rec = json.loads(line)
                results[rec["key"]] = rec.get("result", {"err": "crash", "msg": f"exit {rc}"})
            if rc == 0 or len(results) == len(cases):
                break
            if all("result" not in json.loads(line) for line in open(of)) and not results:
                raise SystemExit(f"{side} side failed with exit {rc}")
            with open(of, "a") as f:  # the crashed case counts as done
                last = [json.loads(line) for line in open(of)][-1]
                f.write(json.dumps({"key": last["key"], "result": {"err": "crash",
                                                                  "msg": f"exit {rc}"}}) + "\n")
        out[side] = results
    counts = collections.Counter()
    for key, c in cases.items():
        label = classify(c, out["ms"][key], out["tessera"][key])
        counts[(c["kind"], label)] += 1
        if label and (not label.startswith("stricter (") or args.show_all):
            print(f"--- case {key} [{c['kind']}] {label}")
            print("  case:", json.dumps(c)[:600])
            print("  ms:  ", json.dumps(out["ms"][key])[:600])
            print("  tess:", json.dumps(out["tessera"][key])[:600])
    for (kind, label), n in sorted(counts.items(), key=lambda kv: (kv[0][0], str(kv[0][1]))):
        print(f"{kind:7} {label or 'same':18} {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
