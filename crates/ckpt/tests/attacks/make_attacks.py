#!/usr/bin/env python3
"""Writes the hostile files of this folder. Run from anywhere: python3 make_attacks.py

Each file breaks exactly one rule of its format; tests/attacks.rs checks that reading it gives
the matching CkptError variant (never a panic, never an unbounded allocation).
"""
import json
import os
import struct
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))


def put(name, data):
    with open(os.path.join(HERE, name), "wb") as f:
        f.write(data)


# ---------------------------------------------------------------- safetensors
def st(header, data=b"", raw_header=None, length=None):
    h = raw_header if raw_header is not None else json.dumps(header, separators=(",", ":")).encode()
    n = len(h) if length is None else length
    return struct.pack("<Q", n) + h + data


ok_entry = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
put("st_too_short.safetensors", b"\x01\x02\x03")
put("st_header_too_large.safetensors", st({}, length=200_000_000))
put("st_header_truncated.safetensors", st({"a": ok_entry}, length=4096))
put("st_not_utf8.safetensors", st(None, raw_header=b"{\xff\xfe}"))
put("st_not_json.safetensors", st(None, raw_header=b"{not json"))
put("st_not_object.safetensors", st([1, 2]))
put("st_metadata_not_strings.safetensors", st({"__metadata__": {"format": 1}}))
put("st_unknown_dtype.safetensors", st({"a": {"dtype": "F8_E4M3", "shape": [2], "data_offsets": [0, 2]}}, b"\0" * 2))
put(
    "st_shape_overflow.safetensors",
    st({"a": {"dtype": "F64", "shape": [2**40, 2**40], "data_offsets": [0, 8]}}, b"\0" * 8),
)
put(
    "st_hole.safetensors",
    st({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
        "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}}, b"\0" * 12),
)
put(
    "st_overlap.safetensors",
    st({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, b"\0" * 8),
)
put("st_byte_length.safetensors", st({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8))
put("st_trailing_data.safetensors", st({"a": ok_entry}, b"\0" * 12))
put("st_truncated_data.safetensors", st({"a": ok_entry}, b"\0" * 5))
put("st_missing_offsets.safetensors", st({"a": {"dtype": "F32", "shape": [2]}}, b"\0" * 8))


# ---------------------------------------------------------------- MindSpore .ckpt
def varint(v):
    v &= (1 << 64) - 1
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def field(num, payload):
    return varint(num << 3 | 2) + varint(len(payload)) + payload


def value(tag, dims, ttype, content):
    tensor = b"".join(varint(1 << 3) + varint(d) for d in dims)
    tensor += field(2, ttype.encode()) + field(3, content)
    return field(1, field(1, tag.encode()) + field(2, tensor))


good = value("w", [2, 2], "Float32", struct.pack("<4f", 1, 2, 3, 4))
put("ckpt_truncated.ckpt", good[:-3])
put("ckpt_bad_crc.ckpt", good + b"crc_num" + (zlib.crc32(good) ^ 1).to_bytes(10, "big"))
put("ckpt_good_crc.ckpt", good + b"crc_num" + zlib.crc32(good).to_bytes(10, "big"))
put("ckpt_dims_mismatch.ckpt", value("w", [3, 2], "Float32", struct.pack("<4f", 1, 2, 3, 4)))
put(
    "ckpt_chunk_mismatch.ckpt",
    value("w", [2, 2], "Float32", b"\0" * 8) + value("w", [4, 2], "Float32", b"\0" * 8),
)
put("ckpt_negative_dim.ckpt", value("w", [-2], "Float32", b"\0" * 8))
put("ckpt_maptensor.ckpt", field(1, field(1, b"m") + field(3, b"")))
put("ckpt_huge_length.ckpt", varint(1 << 3 | 2) + varint(2**62) + b"\0" * 16)
put("ckpt_no_tag.ckpt", field(1, field(2, field(2, b"Float32") + field(3, b""))))
put("ckpt_garbage.ckpt", bytes(range(7, 200)))

# ---------------------------------------------------------------- strategy files
put("strategy_garbage.ckpt", b"\x0a\xff\xff\xff\xff\x0f")
put("strategy_unknown_json.json", b'{"hello": 1}')


def layout_item(name, dev, tmap, step=0, size=0):
    lay = field(1, b"".join(varint(1 << 3) + varint(d) for d in dev))
    lay += field(2, b"".join(varint(1 << 3) + varint(v) for v in tmap))
    lay += field(3, b"") + field(4, b"")
    lay += varint(5 << 3) + varint(0) + varint(6 << 3) + varint(step) + varint(7 << 3) + varint(size)
    return field(3, field(1, name.encode()) + field(2, lay))


put("strategy_bad_opt_step.ckpt", varint(1 << 3) + varint(1) + layout_item("w", [2, 4], [-1, 0], step=3, size=2))
put("strategy_map_out_of_range.ckpt", varint(1 << 3) + varint(1) + layout_item("w", [2, 4], [5, 0]))
put("strategy_empty.ckpt", varint(1 << 3) + varint(1))
put(
    "strategy_two_device_counts.ckpt",
    varint(1 << 3) + varint(1) + layout_item("a", [2, 4], [1, 0]) + layout_item("b", [2, 2], [1, 0]),
)
put(
    "strategy_not_dividing.json",
    json.dumps({
        "format": "tessera-strategy", "version": 1,
        "tensors": [{"name": "w", "shape": [6, 4], "dtype": "f32",
                     "placements": [{"stage": 0, "mesh": {"axes": [["dp", 4]]}, "dims": [["dp"], []]}]}],
    }).encode(),
)
put(
    "strategy_future_version.json",
    json.dumps({"format": "tessera-strategy", "version": 99, "tensors": []}).encode(),
)
