#!/usr/bin/env python3
"""The Python side of `make bench`: on the same machine and weights as torchattn_bench,
times notebook 003's MultiHeadAttention, torch.nn.MultiheadAttention with a causal
mask, and a module of Linear projections plus F.scaled_dot_product_attention.
Checks each against the notebook code before timing; writes JSON."""

import argparse
import json
import os
import resource
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "tests", "reference"))
import notebook_reference as nr  # noqa: E402

D, H = 768, 12


class SDPAAttention(nn.Module):
    """The notebook module with its attention core replaced by F.scaled_dot_product_attention."""

    def __init__(self, ref):
        super().__init__()
        self.ref = ref

    def forward(self, x):
        b, t, _ = x.shape
        r = self.ref
        q, k, v = (m(x).view(b, t, r.num_heads, r.head_dim).transpose(1, 2) for m in (r.W_query, r.W_key, r.W_value))
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return r.out_proj(o.transpose(1, 2).reshape(b, t, r.d_out))


def models(T):
    torch.manual_seed(0)  # as torchattn_bench: same seed, same weights
    ref = nr.MultiHeadAttention(D, D, T, 0.0, H)
    mha = nn.MultiheadAttention(D, H, batch_first=True)
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.cat([ref.W_query.weight, ref.W_key.weight, ref.W_value.weight]))
        mha.in_proj_bias.zero_()
        mha.out_proj.weight.copy_(ref.out_proj.weight)
        mha.out_proj.bias.copy_(ref.out_proj.bias)
    mask = torch.triu(torch.full((T, T), float("-inf")), 1)
    return {
        "py_notebook_mha": ref,
        "py_nn_multihead": lambda x: mha(x, x, x, attn_mask=mask, need_weights=False)[0],
        "py_sdpa_module": SDPAAttention(ref),
    }, [*ref.parameters(), *mha.parameters()]


def timeit(fn, reps, warmup=1):
    for _ in range(warmup):
        fn()
    ms = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ms.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ms), min(ms)


def useful_flops(B, T):
    return 4 * 2.0 * B * T * D * D + 2 * 2.0 * B * H * (T * (T + 1) / 2) * (D // H)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    reps = 2 if args.quick else 5
    rows = []
    B, T = (1, 256) if args.quick else (4, 1024)
    mods, params = models(T)
    torch.manual_seed(1)
    x = torch.randn(B, T, D)
    g = torch.randn(B, T, D)
    with torch.no_grad():
        ref = mods["py_notebook_mha"](x)
    print(f"bench_python: {torch.get_num_threads()} threads, torch {torch.__version__}")
    print(f"\n[main] B={B} T={T} forward / forward+backward (ms, median of {reps})")
    for name, fn in mods.items():
        with torch.no_grad():
            err = (fn(x) - ref).abs().max().item()
        assert err < 1e-4, f"{name} disagrees with the notebook code by {err}"
        with torch.no_grad():
            fwd, fwd_min = timeit(lambda: fn(x), reps)

        def fb():
            xi = x.detach().requires_grad_(True)
            fn(xi).backward(g)
            for p in params:
                p.grad = None
        bwd, bwd_min = timeit(fb, reps)
        print(f"  {name:<18} forward {fwd:8.1f} ms  forward+backward {bwd:8.1f} ms  (max |diff| {err:.1e})")
        rows.append({"section": "forward", "variant": name, "B": B, "T": T, "median_ms": fwd, "min_ms": fwd_min,
                     "reps": reps, "gflops": useful_flops(B, T) / (fwd * 1e6), "max_abs_diff": err})
        rows.append({"section": "forward_backward", "variant": name, "B": B, "T": T, "median_ms": bwd,
                     "min_ms": bwd_min, "reps": reps, "gflops": 3 * useful_flops(B, T) / (bwd * 1e6)})
    print("\n[sweep] B=1 forward (ms)")
    for T in [128, 256, 512, 1024, 2048, 4096] if not args.quick else [128, 256]:
        mods, _ = models(T)
        x = torch.randn(1, T, D)
        for name, fn in mods.items():
            with torch.no_grad():
                med, mn = timeit(lambda: fn(x), 2 if T >= 2048 else reps)
            print(f"  T={T:<6} {name:<18} {med:9.1f} ms")
            rows.append({"section": "sweep", "variant": name, "B": 1, "T": T, "median_ms": med, "min_ms": mn,
                         "gflops": useful_flops(1, T) / (med * 1e6)})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"tool": "bench_python", "torch": torch.__version__, "threads": args.threads,
                       "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "rows": rows},
                      f, indent=1)
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
