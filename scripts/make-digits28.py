#!/usr/bin/env python3
"""Writes data/digits28/: the bundled 8x8 digits (data/digits/) scaled to MNIST's 28x28 frame, for
scripts written for MNIST (the AutoParallel flagship example's MatMulCell takes 28*28 features).

Each pixel of the 28x28 image takes the value of the 8x8 pixel it falls in (nearest neighbour,
row r -> source row r*8//28), scaled from 0..16 to 0..255 (v*255//16). The training split keeps
its first 1472 images and the test split its first 288 (multiples of 32, so that a batch of 32
divides every split and their union: MindSpore's `batch(32)` keeps a short last batch, which a
traced graph of fixed shape cannot take). Usage: python3 scripts/make-digits28.py
"""

import pathlib
import struct

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
SRC, DST = ROOT / "data" / "digits", ROOT / "data" / "digits28"
KEEP = {"train": 1472, "t10k": 288}


def read_idx(path):
    raw = path.read_bytes()
    magic, n = struct.unpack(">ii", raw[:8])
    dims = {2051: 3, 2049: 1}[magic]
    shape = struct.unpack(">" + "i" * dims, raw[4:4 + 4 * dims])
    return magic, np.frombuffer(raw, np.uint8, offset=4 + 4 * dims).reshape(shape)


def write_idx(path, magic, array):
    path.write_bytes(struct.pack(">i" + "i" * array.ndim, magic, *array.shape) + array.tobytes())


def main():
    DST.mkdir(exist_ok=True)
    rows = np.arange(28) * 8 // 28
    for split, keep in KEEP.items():
        _, images = read_idx(SRC / f"{split}-images-idx3-ubyte")
        _, labels = read_idx(SRC / f"{split}-labels-idx1-ubyte")
        big = images[:keep][:, rows][:, :, rows].astype(np.uint32) * 255 // 16
        write_idx(DST / f"{split}-images-idx3-ubyte", 2051, big.astype(np.uint8))
        write_idx(DST / f"{split}-labels-idx1-ubyte", 2049, labels[:keep].copy())


if __name__ == "__main__":
    main()
