#!/usr/bin/env python3
"""Writes the GGUF files of ctest -R gguf (tests/serialize/gguf_checks.cpp) with the gguf
Python package (llama.cpp's own writer, pinned in tools/requirements.txt), and what the
C++ reader must find in them:

- types.gguf: one tensor of every type torchattn reads (F32, F16, BF16, Q8_0, Q4_0, Q4_1
  quantized by gguf's quantize; Q4_K, Q5_K, Q6_K as random blocks with finite scales,
  which gguf cannot quantize), shapes of 1 to 4 dimensions, and metadata of every value
  type (each integer width, floats, bools, strings with non-ASCII text, arrays of each,
  an array of arrays); types_reference.safetensors: each tensor dequantized by gguf's
  dequantize (float32), types_metadata.json: the metadata as JSON;
- aligned.gguf: the same tensors with general.alignment 64;
- unsupported.gguf: a tensor of Q5_0, which torchattn does not read.

Usage: make_gguf_reference.py OUT_DIR
"""

import json
import os
import sys

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T
from safetensors.numpy import save_file

QUANTIZED = [T.Q8_0, T.Q4_0, T.Q4_1]
RAW_K = [T.Q4_K, T.Q5_K, T.Q6_K]
# Where each K type keeps its f16 scales in a block: byte offsets (Q4_K, Q5_K: d and dmin).
K_HALVES = {T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208]}


def tensors(rng):
    """name -> (type, numpy data to write, its logical shape, reference float32)."""
    out = {}
    shapes = {T.F32: (3, 5, 7), T.F16: (4, 9), T.BF16: (2, 3, 2, 6), T.Q8_0: (6, 64), T.Q4_0: (3, 2, 96),
              T.Q4_1: (5, 32), T.Q4_K: (3, 256), T.Q5_K: (2, 512), T.Q6_K: (4, 256)}
    for t, shape in shapes.items():
        values = (rng.standard_normal(shape) * 2.5).astype(np.float32)
        if t == T.F32:
            data = values
        elif t == T.F16:
            data = values.astype(np.float16)
        elif t == T.BF16:
            data = gguf.quants.quantize(values, t)
        elif t in QUANTIZED:
            data = gguf.quants.quantize(values, t)
        else:
            block, size = gguf.GGML_QUANT_SIZES[t]
            blocks = int(np.prod(shape)) // block
            data = rng.integers(0, 256, size=(blocks, size), dtype=np.uint8)
            for at in K_HALVES[t]:
                half = (rng.uniform(0.01, 0.2, size=blocks).astype(np.float16)).view(np.uint8).reshape(blocks, 2)
                data[:, at:at + 2] = half
            data = data.reshape(*shape[:-1], shape[-1] // block * size)
        reference = gguf.quants.dequantize(data, t).astype(np.float32).reshape(shape)
        out[f"t.{t.name.lower()}"] = (t, data, shape, reference)
    return out


def write(path, items, alignment=None, metadata=True):
    w = gguf.GGUFWriter(path, "llama")
    if alignment is not None:
        w.add_custom_alignment(alignment)
    expected = {}
    if metadata:
        for key, value, add in [
            ("test.u8", 200, w.add_uint8), ("test.i8", -100, w.add_int8), ("test.u16", 60000, w.add_uint16),
            ("test.i16", -30000, w.add_int16), ("test.u32", 4000000000, w.add_uint32),
            ("test.i32", -2000000000, w.add_int32), ("test.u64", 2 ** 62 + 5, w.add_uint64),
            ("test.i64", -(2 ** 62), w.add_int64), ("test.f32", 0.15625, w.add_float32),
            ("test.f64", 1.0 / 3.0, w.add_float64), ("test.true", True, w.add_bool), ("test.false", False, w.add_bool),
            ("test.text", "ÉtéĠ\u4e2d\U0001F600 and \"quotes\"", w.add_string),
            # add_string skips an empty string: the generic call writes it.
            ("test.empty", "", lambda k, v: w.add_key_value(k, v, gguf.GGUFValueType.STRING)),
        ]:
            add(key, value)
            expected[key] = value
        for key, value in [("test.strings", ["a", "", "Ġthe", "\u00e9"]), ("test.ints", [1, -2, 3]),
                           ("test.floats", [0.5, -1.25]), ("test.nested", [[1, 2], [3]])]:
            w.add_array(key, value)
            expected[key] = value
    for name, (t, data, shape, _) in items.items():
        if t in (T.F32, T.F16):
            w.add_tensor(name, data)
        else:
            w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return expected


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(65)
    items = tensors(rng)
    expected = write(os.path.join(out, "types.gguf"), items)
    write(os.path.join(out, "aligned.gguf"), items, alignment=64, metadata=False)
    save_file({name: ref for name, (_, _, _, ref) in items.items()}, os.path.join(out, "types_reference.safetensors"))
    with open(os.path.join(out, "types_metadata.json"), "w") as f:
        json.dump({"metadata": expected, "types": {name: int(t) for name, (t, _, _, _) in items.items()},
                   "gguf": gguf.__version__ if hasattr(gguf, "__version__") else "0.19.0"}, f, ensure_ascii=False)
    bad = {"t.q5_0": (T.Q5_0, gguf.quants.quantize(np.ones((2, 32), np.float32), T.Q5_0), (2, 32), None)}
    write(os.path.join(out, "unsupported.gguf"), bad, metadata=False)
    print(f"make_gguf_reference: {len(items)} tensors of every type torchattn reads in {out}")


if __name__ == "__main__":
    main()
