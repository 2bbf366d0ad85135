"""Shared fixtures: the in-repository MindSpore reference cases and independent readers of
the two checkpoint formats (pure Python, so outputs are not judged by the code that wrote them)."""

import json
import pathlib
import struct

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "mindspore"
CASES = FIXTURES / "cases"
CONVERSION_CASES = ["case1_dp2mp4_to_2x2", "case3_opt_shard_to_4"]


def pytest_configure(config):
    assert CASES.is_dir(), f"{CASES} is missing: the MindSpore fixtures are part of the repository"


@pytest.fixture(params=CONVERSION_CASES)
def case(request):
    """A conversion case directory (case1, case3)."""
    return CASES / request.param


def _varint(buf, i):
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return value, i


def _fields(buf):
    """(field number, wire type, value) of one protobuf message."""
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 2:
            n, i = _varint(buf, i)
            value, i = buf[i:i + n], i + n
        elif wire == 5:
            value, i = buf[i:i + 4], i + 4
        elif wire == 1:
            value, i = buf[i:i + 8], i + 8
        else:
            raise ValueError(f"wire type {wire}")
        yield field, wire, value


def read_ckpt(path):
    """[(name, dtype, dims, bytes)] of a MindSpore .ckpt file, chunks joined, in file order."""
    data = pathlib.Path(path).read_bytes()
    if len(data) >= 17 and data[-17:-10] == b"crc_num":
        data = data[:-17]
    out = []
    for field, _, value in _fields(data):
        assert field == 1
        tag, tensor = None, None
        for f, _, v in _fields(value):
            if f == 1:
                tag = bytes(v).decode()
            elif f == 2:
                tensor = v
        dims, ttype, content = [], None, b""
        for f, wire, v in _fields(tensor):
            if f == 1 and wire == 0:
                dims.append(v)
            elif f == 1:  # packed
                j = 0
                while j < len(v):
                    d, j = _varint(v, j)
                    dims.append(d)
            elif f == 2:
                ttype = bytes(v).decode()
            elif f == 3:
                content = bytes(v)
        if out and out[-1][0] == tag:
            out[-1] = (tag, ttype, dims, out[-1][3] + content)
        else:
            out.append((tag, ttype, dims, content))
    return out


_ST_TO_MS = {"F32": "Float32", "F16": "Float16", "BF16": "BFloat16", "F64": "Float64",
             "I32": "Int32", "I64": "Int64", "I16": "Int16", "I8": "Int8", "U8": "UInt8",
             "BOOL": "Bool"}


def read_safetensors(path):
    """[(name, dtype, shape, bytes)] of a safetensors file in header order, and its metadata."""
    data = pathlib.Path(path).read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    base = 8 + n
    out = []
    for name, t in header.items():
        b, e = t["data_offsets"]
        out.append((name, _ST_TO_MS[t["dtype"]], t["shape"], data[base + b:base + e]))
    return out, meta


def read_any(path):
    """Tensors of either format: {name: (dtype, shape, bytes)} plus the name order."""
    path = pathlib.Path(path)
    rows = read_ckpt(path) if path.suffix == ".ckpt" else read_safetensors(path)[0]
    return {n: (t, list(s), b) for n, t, s, b in rows}, [r[0] for r in rows]


def assert_same_file(ours, theirs, order=True):
    """Same tensors (names, dtypes, shapes, bytes) and, for .ckpt, the same order."""
    a, a_order = read_any(ours)
    b, b_order = read_any(theirs)
    assert sorted(a) == sorted(b), f"{ours}: tensors {sorted(a)} vs {sorted(b)}"
    for name in b:
        assert a[name][:2] == b[name][:2], f"{ours}: {name}: {a[name][:2]} vs {b[name][:2]}"
        assert a[name][2] == b[name][2], f"{ours}: {name}: values differ"
    if order:
        assert a_order == b_order, f"{ours}: order {a_order} vs {b_order}"
