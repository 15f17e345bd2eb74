#!/usr/bin/env python3
"""Writes tests/golden/flex.txt: PyTorch's flex_attention (torch.nn.attention.flex_attention,
eager, CPU) and create_block_mask on the mods that tests/backends/test_flex_attention.cpp
writes as C++ lambdas, for the C++ flex_attention to equal.

Each case: the seed of q, k, v, dout and dlse (float64, drawn in that order; float32
their rounding) and their sums, the block mask's four tensors, PyTorch's output and
log-sum-exp in float64 and float32, the gradients of q, k and v for dout in float64, and
for dout and dlse together (the output's and the log-sum-exp's gradients) in float64
(PyTorch's flex_attention has no backward on the CPU: autograd through the same math on
whole score matrices, whose output equals flex_attention's). The mods here and in the C++ test are the same formulas; a
case's parameters say which (`mod`) and with what numbers.

Run `make golden` (or `.venv/bin/python tests/reference/make_flex_golden.py`)."""

import argparse
import math
import os
import warnings

import torch
from make_golden import OUT, Writer
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

# Case: name, (B, H, Hkv, Tq, Tk, D), block size, mask (None: no block mask), score mod,
# whether the block mask is made per batch (B) or for every batch (1).
DOCS = [0, 70, 150, 257]  # the documents' starts (cu_seqlens) of the packed cases
DOCS_B1 = [0, 30, 200, 257]  # batch 1's own documents (per-batch masks)


def doc_of(starts, n):
    ids = torch.zeros(n, dtype=torch.long)
    for d, (a, b) in enumerate(zip(starts[:-1], starts[1:])):
        ids[a:b] = d
    return ids


def mods(name, H, Tq, Tk):
    """(mask_mod or None, score_mod or None, per_batch) of a mod's name; the same formulas
    as the C++ test's."""
    docs = torch.stack([doc_of(DOCS, max(Tq, Tk)), doc_of(DOCS_B1, max(Tq, Tk))])
    slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / H) for h in range(H)])
    bias = torch.tensor([math.sin(0.37 * i) for i in range(Tq + Tk - 1)])
    causal = lambda b, h, q, kv: q >= kv  # noqa: E731
    table = {
        "causal": (causal, None, False),
        "window": (lambda b, h, q, kv: (q >= kv) & (q - kv < 64), None, False),
        "prefix": (lambda b, h, q, kv: (kv < 50) | (q >= kv), None, False),
        "documents": (lambda b, h, q, kv: (docs[b, q] == docs[b, kv]) & (q >= kv), None, True),
        "dilated": (lambda b, h, q, kv: ((q - kv) % 2 == 0) & (q >= kv), None, False),
        "alibi": (causal, lambda s, b, h, q, kv: s + slopes[h] * (kv - q), False),
        "softcap": (None, lambda s, b, h, q, kv: 20.0 * torch.tanh(s / 20.0), False),
        "relative": (None, lambda s, b, h, q, kv: s + bias[q - kv + Tk - 1], False),
        "none": (None, None, False),
    }
    return table[name]


CASES = [
    # name, mod, B, H, Hkv, Tq, Tk, D, block: lengths not a multiple of the block, Tq != Tk,
    # grouped heads, one query row.
    ("causal_edges", "causal", 1, 2, 2, 100, 150, 8, 64),
    ("causal_grouped", "causal", 2, 2, 1, 100, 100, 8, 32),
    ("window", "window", 1, 2, 1, 120, 120, 8, 32),
    ("prefix", "prefix", 1, 2, 2, 100, 100, 8, 32),
    ("documents", "documents", 2, 1, 1, 150, 150, 8, 32),
    ("dilated", "dilated", 1, 2, 2, 70, 70, 8, 16),
    ("alibi", "alibi", 1, 4, 2, 80, 80, 8, 32),
    ("softcap", "softcap", 2, 2, 1, 50, 70, 8, 32),
    ("relative", "relative", 1, 2, 2, 60, 77, 8, 16),
    ("decode_row", "causal", 1, 4, 1, 1, 300, 16, 128),
    ("no_mask", "none", 1, 2, 2, 33, 45, 8, 128),
]


def inputs(name, B, H, Hkv, Tq, Tk, D):
    """q, k, v, the output's gradient dout and the log-sum-exp's dlse in float64 from a
    generator of the case's own seed: the C++ test draws the same (torch::randn with that
    generator, in this order) and checks their sums."""
    gen = torch.Generator().manual_seed(seed_of(name))
    q = torch.randn(B, H, Tq, D, generator=gen, dtype=torch.float64)
    k = torch.randn(B, Hkv, Tk, D, generator=gen, dtype=torch.float64)
    v = torch.randn(B, Hkv, Tk, D, generator=gen, dtype=torch.float64)
    dout = torch.randn(B, H, Tq, D, generator=gen, dtype=torch.float64)
    dlse = torch.randn(B, H, Tq, generator=gen, dtype=torch.float64)
    return q, k, v, dout, dlse


def dense(q, k, v, mask_mod, score_mod):
    """flex_attention's math on whole score matrices (PyTorch's flex_attention has no
    backward on the CPU, so its gradients come from autograd through this): the mods
    broadcast over index tensors, as create_block_mask's vmap calls them one by one."""
    B, H, Tq, _ = q.shape
    Tk = k.shape[2]
    group = H // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    b = torch.arange(B)[:, None, None, None]
    h = torch.arange(H)[None, :, None, None]
    qi = torch.arange(Tq)[None, None, :, None]
    ki = torch.arange(Tk)[None, None, None, :]
    if score_mod is not None:
        s = score_mod(s, b, h, qi, ki)
    if mask_mod is not None:
        s = s.masked_fill(~mask_mod(b, h, qi, ki).expand_as(s), float("-inf"))
    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)


def seed_of(name):
    return sum(ord(c) * (i + 1) for i, c in enumerate(name))


def flex_cases(w):
    for name, mod, B, H, Hkv, Tq, Tk, D, block in CASES:
        mask_mod, score_mod, per_batch = mods(mod, H, Tq, Tk)
        q, k, v, dout, dlse = inputs(name, B, H, Hkv, Tq, Tk, D)
        tensors = {"q_sum": q.sum(), "k_sum": k.sum(), "v_sum": v.sum(), "dout_sum": dout.sum(),
                   "dlse_sum": dlse.sum()}
        bm = None
        if mask_mod is not None:
            bm = create_block_mask(mask_mod, B if per_batch else None, None, Tq, Tk, device="cpu", BLOCK_SIZE=block)
            tensors.update({"kv_num_blocks": bm.kv_num_blocks, "kv_indices": bm.kv_indices,
                            "full_kv_num_blocks": bm.full_kv_num_blocks, "full_kv_indices": bm.full_kv_indices})
        for dtype in (torch.float64, torch.float32):
            tag = "f64" if dtype == torch.float64 else "f32"
            o, lse = flex_attention(q.to(dtype), k.to(dtype), v.to(dtype), score_mod=score_mod, block_mask=bm,
                                    return_lse=True, enable_gqa=H != Hkv)
            tensors[f"out_{tag}"] = o
            tensors[f"lse_{tag}"] = lse
        # The gradients in float64 (autograd through dense(), checked against flex's output).
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        o, lse = dense(*leaves, mask_mod, score_mod)
        assert (o - tensors["out_f64"]).abs().max() < 1e-12, name
        assert torch.isfinite(lse).all(), name  # every query sees a key: lse's gradient is defined
        for t, g in zip(("q", "k", "v"), torch.autograd.grad(o, leaves, dout, retain_graph=True)):
            tensors[f"d{t}_f64"] = g
        for t, g in zip(("q", "k", "v"), torch.autograd.grad((o, lse), leaves, (dout, dlse))):
            tensors[f"d{t}_lse_f64"] = g
        w.case(f"flex_{name}", {"mod": mod, "seed": seed_of(name), "B": B, "H": H, "Hkv": Hkv, "Tq": Tq, "Tk": Tk, "D": D, "block": block,
                                "per_batch": int(per_batch)}, tensors)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=OUT)
    args = ap.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")  # eager flex_attention asks for torch.compile
    w = Writer(os.path.join(args.out, "flex.txt"), "PyTorch's flex_attention (eager, CPU)", encoding="base64")
    flex_cases(w)
    w.close()
    print(f"wrote {args.out}/flex.txt with torch {torch.__version__}")


if __name__ == "__main__":
    main()
