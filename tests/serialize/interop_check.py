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

And PyTorch's own torch.nn.MultiheadAttention (MHA_CASES), in float64: export saves each
module's state dict as PyTorch names it (DIR/py_mha_NAME.pt: in_proj_weight or
q/k/v_proj_weight, in_proj_bias, out_proj.*), its inputs, masks, outputs and the
gradients of the inputs and of every parameter (DIR/py_mha_NAME_io.pt), which C++ loads
with torchattn::load_torch_multihead_attention and compares; verify loads what
torchattn::save_torch_multihead_attention wrote (DIR/cpp_mha_NAME.pt) with plain
torch.load into a fresh nn.MultiheadAttention and compares with the C++ outputs.
"""

import os
import sys

import torch
from safetensors.torch import load_file, save_file

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import notebook_reference as nr  # noqa: E402
import torchattn_interop  # noqa: E402

MODULES = {
    "self_attention_v2": lambda: nr.SelfAttentionV2(5, 4, qkv_bias=True),
    "causal_attention": lambda: nr.CausalAttention(5, 4, 9, 0.0, qkv_bias=True),
    "multi_head_attention": lambda: nr.MultiHeadAttention(5, 6, 9, 0.0, 3, qkv_bias=True),
}


# nn.MultiheadAttention(embed_dim, num_heads, bias=, kdim=, vdim=, batch_first=True), and
# how it is called: self-attention (query = key = value) or cross-attention over a
# context of its own length, a key_padding_mask, or a causal attn_mask (what a
# causal(true) MultiHeadAttention applies).
MHA_CASES = {
    "self": dict(embed_dim=8, num_heads=2, bias=True),
    "self_padding": dict(embed_dim=8, num_heads=4, bias=True, padding=True),
    "self_no_bias": dict(embed_dim=6, num_heads=3, bias=False, padding=True),
    "self_causal": dict(embed_dim=8, num_heads=2, bias=True, causal=True),
    "cross": dict(embed_dim=8, num_heads=2, bias=True, kdim=5, vdim=3, cross=True, padding=True),
    "cross_no_bias": dict(embed_dim=6, num_heads=2, bias=False, kdim=4, vdim=7, cross=True),
    "cross_same_dims": dict(embed_dim=8, num_heads=4, bias=True, cross=True, padding=True),
}
MHA_BATCH, MHA_TOKENS, MHA_CONTEXT = 2, 5, 7
MHA_TOLERANCE = 1e-10  # float64 on both sides: room for reordered sums only


def mha_config(c):
    e = c["embed_dim"]
    return dict(embed_dim=e, num_heads=c["num_heads"], bias=int(c["bias"]), kdim=c.get("kdim", e),
                vdim=c.get("vdim", e), causal=int(c.get("causal", False)), cross=int(c.get("cross", False)))


def make_mha(cfg):
    return torch.nn.MultiheadAttention(cfg["embed_dim"], cfg["num_heads"], bias=bool(cfg["bias"]), kdim=cfg["kdim"],
                                       vdim=cfg["vdim"], batch_first=True, dtype=torch.float64).eval()


def mha_call(m, cfg, io):
    """PyTorch's output for the inputs of `io`, as the C++ module is called."""
    q = io["query"]
    k, v = (io["key"], io["value"]) if cfg["cross"] else (q, q)
    attn_mask = torch.ones(q.shape[1], q.shape[1], dtype=torch.bool).triu(1) if cfg["causal"] else None
    return m(q, k, v, key_padding_mask=io.get("key_padding_mask"), attn_mask=attn_mask, need_weights=False)[0]


def mha_export(d):
    names = []
    for i, (name, c) in enumerate(MHA_CASES.items()):
        cfg = mha_config(c)
        torch.manual_seed(200 + i)
        m = make_mha(cfg)
        g = torch.Generator().manual_seed(300 + i)
        B, T, S, E = MHA_BATCH, MHA_TOKENS, MHA_CONTEXT, cfg["embed_dim"]
        io = {"query": torch.randn(B, T, E, generator=g, dtype=torch.float64).requires_grad_()}
        if cfg["cross"]:
            io["key"] = torch.randn(B, S, cfg["kdim"], generator=g, dtype=torch.float64).requires_grad_()
            io["value"] = torch.randn(B, S, cfg["vdim"], generator=g, dtype=torch.float64).requires_grad_()
        if c.get("padding"):
            pad = torch.zeros(B, S if cfg["cross"] else T, dtype=torch.bool)
            pad[1, -2:] = True  # the second sequence's last two keys; the first has none
            io["key_padding_mask"] = pad
        y = mha_call(m, cfg, io)
        grad_output = torch.randn(y.shape, generator=g, dtype=torch.float64)
        y.backward(grad_output)
        saved = {k: v.detach() for k, v in io.items()}
        saved.update({f"grad.{k}": io[k].grad for k in ("query", "key", "value") if k in io})
        saved.update({f"grad.{n}": p.grad for n, p in m.named_parameters()})
        saved.update(cfg, grad_output=grad_output, output=y.detach())
        torch.save(dict(m.state_dict()), os.path.join(d, f"py_mha_{name}.pt"))
        torch.save(saved, os.path.join(d, f"py_mha_{name}_io.pt"))
        names.append(name)
    torch.save({"cases": names}, os.path.join(d, "py_mha_cases.pt"))
    return len(names)


def mha_verify(d):
    worst = 0.0
    same_keys = True
    for name, c in MHA_CASES.items():
        cfg = mha_config(c)
        io = torch.load(os.path.join(d, f"py_mha_{name}_io.pt"))
        m = make_mha(cfg)
        state = torch.load(os.path.join(d, f"cpp_mha_{name}.pt"))  # plain torch.load, weights_only
        same_keys = same_keys and list(state) == list(m.state_dict())
        m.load_state_dict(state)  # strict
        y_cpp = torchattn_interop.load(os.path.join(d, f"cpp_mha_{name}_out.pt"))["y"]
        with torch.no_grad():
            err = (mha_call(m, cfg, io) - y_cpp).abs().max().item()
        print(f"C++ -> nn.MultiheadAttention {name:<16} max |diff| {err:.2e}")
        worst = max(worst, err)
    ok = worst <= MHA_TOLERANCE and same_keys
    print(f"{'ok' if ok else 'FAIL'}: torchattn::save_torch_multihead_attention files in nn.MultiheadAttention "
          f"give the C++ outputs (<= {MHA_TOLERANCE:g}), keys {'in' if same_keys else 'NOT in'} PyTorch's order")
    return ok


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
    mha = mha_export(d)
    print(f"exported {len(MODULES)} notebook modules, {mha} nn.MultiheadAttention cases and {len(tensors)} "
          f"safetensors to {d}")


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
    mha_ok = mha_verify(d)
    return 0 if ok and same and mha_ok else 1


if __name__ == "__main__":
    mode, d = sys.argv[1], sys.argv[2]
    sys.exit(export(d) if mode == "export" else verify(d))
