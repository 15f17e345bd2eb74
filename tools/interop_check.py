#!/usr/bin/env python3
"""Weights both ways between the notebook modules (Python) and torchattn (C++).

  interop_check.py export DIR   saves seeded notebook modules' state dicts, an input
                                and the Python outputs (DIR/py_*.pt)
  (tests/interop_check DIR      loads them in C++, checks the outputs, saves its own)
  interop_check.py verify DIR   loads the C++ state dicts into fresh notebook modules
                                and checks that they give the C++ outputs

Also safetensors both ways: Python's `safetensors` package writes every dtype
(DIR/py_tensors.safetensors, with the same tensors in DIR/py_tensors.pt) for
torchattn::load_safetensors, and reads back what torchattn::save_safetensors wrote
(DIR/cpp_tensors.safetensors against DIR/cpp_tensors.pt).
"""

import os
import sys

import torch
from safetensors.torch import load_file, save_file

import notebook_reference as nr  # noqa: E402
import torchattn_interop  # noqa: E402

MODULES = {
    "self_attention_v2": lambda: nr.SelfAttentionV2(5, 4, qkv_bias=True),
    "causal_attention": lambda: nr.CausalAttention(5, 4, 9, 0.0, qkv_bias=True),
    "multi_head_attention": lambda: nr.MultiHeadAttention(5, 6, 9, 0.0, 3, qkv_bias=True),
}


def export(d):
    os.makedirs(d, exist_ok=True)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 9, 5, generator=g)
    torch.save({"x": x}, os.path.join(d, "py_input.pt"))
    for i, (name, make) in enumerate(MODULES.items()):
        torch.manual_seed(100 + i)
        m = make().eval()
        torchattn_interop.save(m, os.path.join(d, f"py_{name}.pt"))
        with torch.no_grad():
            torch.save({"y": m(x)}, os.path.join(d, f"py_{name}_out.pt"))
    tensors = {
        "f64": torch.randn(3, 2, dtype=torch.float64, generator=g), "f32": torch.randn(4, generator=g),
        "f16": torch.randn(2, 3, generator=g).half(), "bf16": torch.randn(5, generator=g).bfloat16(),
        "i64": torch.randint(-9, 9, (3,), generator=g), "i32": torch.randint(-9, 9, (2, 2), generator=g).int(),
        "i16": torch.randint(-9, 9, (4,), generator=g).short(), "i8": torch.randint(-9, 9, (6,), generator=g).to(torch.int8),
        "u8": torch.randint(0, 255, (6,), generator=g).to(torch.uint8), "bool": torch.rand(5, generator=g) < 0.5,
        "scalar": torch.tensor(2.5),
    }
    save_file(tensors, os.path.join(d, "py_tensors.safetensors"), metadata={"format": "pt"})
    torch.save(tensors, os.path.join(d, "py_tensors.pt"))
    print(f"exported {len(MODULES)} notebook modules and {len(tensors)} safetensors to {d}")


def verify(d):
    x = torch.load(os.path.join(d, "py_input.pt"))["x"]
    worst = 0.0
    for name, make in MODULES.items():
        torch.manual_seed(999)  # other weights, replaced by the C++ ones below
        m = make().eval()
        m.load_state_dict(torchattn_interop.load(os.path.join(d, f"cpp_{name}.pt")))
        y_cpp = torchattn_interop.load(os.path.join(d, f"cpp_{name}_out.pt"))["y"]
        with torch.no_grad():
            err = (m(x) - y_cpp).abs().max().item()
        print(f"C++ -> Python {name:<22} max |diff| {err:.2e}")
        worst = max(worst, err)
    ok = worst <= 1e-6
    print(f"{'ok' if ok else 'FAIL'}: C++ weights in the notebook modules give the C++ outputs (<= 1e-6)")
    written = load_file(os.path.join(d, "cpp_tensors.safetensors"))
    expected = torchattn_interop.load(os.path.join(d, "cpp_tensors.pt"))
    same = list(written) == list(expected) and all(
        written[k].dtype == v.dtype and torch.equal(written[k], v) for k, v in expected.items())
    print(f"{'ok' if same else 'FAIL'}: safetensors written by torchattn read in Python: {len(written)} tensors, "
          f"{'equal' if same else 'NOT equal'}")
    return 0 if ok and same else 1


if __name__ == "__main__":
    mode, d = sys.argv[1], sys.argv[2]
    sys.exit(export(d) if mode == "export" else verify(d))
