#!/usr/bin/env python3
"""Writes a few small safetensors files (every dtype, metadata, empty and scalar
tensors) into a folder: the seed corpus of tests/fuzz/fuzz_safetensors.cpp.

Usage: .venv/bin/python tests/fuzz/safetensors_seeds.py DIR
"""

import os
import sys

import torch
from safetensors.torch import save_file


def main(d):
    os.makedirs(d, exist_ok=True)
    g = torch.Generator().manual_seed(0)
    seeds = {
        "floats": {"a": torch.randn(2, 3, generator=g), "b": torch.randn(4, dtype=torch.float64, generator=g)},
        "halves": {"h": torch.randn(3, generator=g).half(), "bf": torch.randn(2, 2, generator=g).bfloat16()},
        "ints": {"i64": torch.arange(3), "i32": torch.arange(4, dtype=torch.int32), "i16": torch.arange(2, dtype=torch.int16),
                 "i8": torch.arange(5, dtype=torch.int8), "u8": torch.arange(5, dtype=torch.uint8)},
        "mixed": {"mask": torch.tensor([True, False]), "scalar": torch.tensor(1.5), "empty": torch.zeros(0, 3)},
    }
    for name, tensors in seeds.items():
        save_file(tensors, os.path.join(d, f"{name}.safetensors"), metadata={"format": "pt"})
    print(f"safetensors_seeds: {len(seeds)} files in {d}")


if __name__ == "__main__":
    main(sys.argv[1])
