#!/usr/bin/env python3
"""Weights both ways between the notebook modules (Python) and torchattn (C++).

  interop_check.py export DIR   saves seeded notebook modules' state dicts, an input
                                and the Python outputs (DIR/py_*.pt)
  (tests/interop_check DIR      loads them in C++, checks the outputs, saves its own)
  interop_check.py verify DIR   loads the C++ state dicts into fresh notebook modules
                                and checks that they give the C++ outputs
"""

import os
import sys

import torch

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
    print(f"exported {len(MODULES)} notebook modules to {d}")


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
    return 0 if ok else 1


if __name__ == "__main__":
    mode, d = sys.argv[1], sys.argv[2]
    sys.exit(export(d) if mode == "export" else verify(d))
