#!/usr/bin/env python3
"""The Python peers of `torchattn_bench --device cuda`, on the same GPU: notebook 003's
MultiHeadAttention, torch.nn.MultiheadAttention (causal) and an SDPA module (three Linear
+ F.scaled_dot_product_attention(is_causal=True) + the out Linear), bf16, forward and
forward+backward at the C++ benchmark's main points, on its weights (seed 0) and inputs
(seed 1). Each is checked against the SDPA module before it is timed; writes JSON.

    python3 apps/bench/attention/bench_python_cuda.py [--quick] [--json out.json] [--device cuda]

Times are CUDA events around one call with the GPU idle before it (as the C++ side),
the variants called round-robin; medians. --device cpu runs the same checks, with
wall-clock times, to test the script without a GPU: not a benchmark."""

import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "tests", "reference"))
import notebook_reference as nr  # noqa: E402
from bench_python import SDPAAttention  # noqa: E402  (this folder)

# (B, T, d, heads): torchattn_bench's main points (sizes_for in bench_cuda.cpp).
MAIN_POINTS = [(8, 2048, 1024, 16), (4, 4096, 2048, 16)]
QUICK_POINTS = [(2, 256, 256, 4), (1, 512, 512, 8)]
# Two computations of the same bf16 result agree within this, relative (as the C++ side).
TOLERANCE = 2e-2


def peers(T, d, H, device, dtype):
    """{name: fn(x) -> y}, the parameters their backward fills. The SDPA module comes
    first: the others are checked against it."""
    torch.manual_seed(0)  # as torchattn_bench: same seed, same weights
    ref = nr.MultiHeadAttention(d, d, T, 0.0, H)
    mha = nn.MultiheadAttention(d, H, batch_first=True)
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.cat([ref.W_query.weight, ref.W_key.weight, ref.W_value.weight]))
        mha.in_proj_bias.zero_()
        mha.out_proj.weight.copy_(ref.out_proj.weight)
        mha.out_proj.bias.copy_(ref.out_proj.bias)
    for m in (ref, mha):
        m.to(device, dtype).eval()
    sdpa = SDPAAttention(ref)
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool, device=device), 1)  # True: may not attend
    return {
        "py_sdpa_module": sdpa,
        "py_notebook_mha": ref,
        # is_causal with the mask: the module hands SDPA is_causal=True and no mask.
        "py_nn_multihead": lambda x: mha(x, x, x, attn_mask=mask, need_weights=False, is_causal=True)[0],
    }, [*ref.parameters(), *mha.parameters()]


class Timer:
    """Milliseconds of one call with the device idle before it: CUDA events around it
    (kept from call to call), else the wall clock."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.start = torch.cuda.Event(enable_timing=True)
            self.stop = torch.cuda.Event(enable_timing=True)

    def ms(self, fn):
        if not self.cuda:
            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1e3
        torch.cuda.synchronize()
        self.start.record()
        fn()
        self.stop.record()
        self.stop.synchronize()
        return self.start.elapsed_time(self.stop)


def interleaved(timer, fns, reps, warmup):
    """fns called round-robin reps times after warmup rounds -> (median, min) ms each."""
    for _ in range(warmup):
        for fn in fns:
            fn()
    ms = [[] for _ in fns]
    for _ in range(reps):
        for i, fn in enumerate(fns):
            ms[i].append(timer.ms(fn))
    return [(statistics.median(m), min(m)) for m in ms]


class Memory:
    """Peak allocated bytes a call adds over what was allocated before it (0 off CUDA)."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def peak_mib(self, fn):
        if not self.cuda:
            return fn(), 0.0
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = fn()
        torch.cuda.synchronize()
        return out, (torch.cuda.max_memory_allocated() - base) / 2**20


def rel_err(a, b):
    """||a - b|| / ||b|| in float64; NaN fails every check."""
    a, b = a.detach().double(), b.detach().double()
    return ((a - b).norm() / b.norm()).item()


def forward_backward(fn, params, x, g):
    xi = x.detach().requires_grad_(True)
    fn(xi).backward(g)
    for p in params:
        p.grad = None
    return xi.grad


def meta(device):
    out = {"tool": "bench_python_cuda", "device_type": device.type, "torch": torch.__version__,
           "torch_cuda": torch.version.cuda}
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        out.update({"gpu": p.name, "compute_capability": f"{p.major}.{p.minor}",
                    "cudnn": torch.backends.cudnn.version()})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--json")
    ap.add_argument("--quick", action="store_true", help="smoke sizes and few repetitions")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit(f"bench_python_cuda: --device cuda, but torch {torch.__version__} sees no CUDA device")
    device = torch.device(args.device, 0) if args.device == "cuda" else torch.device("cpu")
    dtype = torch.bfloat16
    reps, warmup = (5, 1) if args.quick else (50, 3)
    timer, memory = Timer(device), Memory(device)
    print(f"bench_python_cuda: torch {torch.__version__} on {meta(device).get('gpu', device.type)}")
    rows = []
    for B, T, d, H in QUICK_POINTS if args.quick else MAIN_POINTS:
        mods, params = peers(T, d, H, device, dtype)
        torch.manual_seed(1)  # as torchattn_bench: the same input and output gradient
        x = torch.randn(B, T, d).to(device, dtype)
        g = torch.randn(B, T, d).to(device, dtype)
        checked = {}
        for name, fn in mods.items():
            with torch.no_grad():
                out, fwd_peak = memory.peak_mib(lambda: fn(x))
            dx, fwdbwd_peak = memory.peak_mib(lambda: forward_backward(fn, params, x, g))
            checked[name] = (out, dx, fwd_peak, fwdbwd_peak)
        first = next(iter(checked))
        for name, (out, dx, _, _) in checked.items():
            for what, a, b in [("output", out, checked[first][0]), ("input gradient", dx, checked[first][1])]:
                err = rel_err(a, b)
                if not err <= TOLERANCE:
                    sys.exit(f"bench_python_cuda: B={B} T={T}: {name} {what} disagrees with {first} by {err} "
                             f"(relative), more than {TOLERANCE}")

        def no_grad(fn):
            def run():
                with torch.no_grad():
                    fn(x)
            return run

        fns = list(mods.values())
        tf = interleaved(timer, [no_grad(fn) for fn in fns], reps, warmup)
        tb = interleaved(timer, [lambda fn=fn: forward_backward(fn, params, x, g) for fn in fns], reps, warmup)
        print(f"\n[main] B={B} T={T} d={d} H={H} bf16, interleaved, median of {reps} (ms)")
        for (name, (out, dx, fwd_peak, fwdbwd_peak)), (f, fmin), (b, bmin) in zip(checked.items(), tf, tb):
            print(f"  {name:<16} fwd {f:8.3f}  fwd+bwd {b:8.3f}  peak {fwd_peak:7.1f} / {fwdbwd_peak:7.1f} MiB")
            rows.append({"section": "main", "variant": name, "dtype": "bf16", "B": B, "T": T, "d": d, "H": H,
                         "reps": reps, "fwd_ms": f, "fwd_min_ms": fmin, "fwdbwd_ms": b, "fwdbwd_min_ms": bmin,
                         "fwd_peak_mib": fwd_peak, "fwdbwd_peak_mib": fwdbwd_peak,
                         "rel_err": rel_err(out, checked[first][0]), "grad_rel_err": rel_err(dx, checked[first][1]),
                         "out_norm": out.double().norm().item()})
        del mods, params, checked, x, g
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**meta(device), "quick": args.quick, "rows": rows}, f, indent=1)
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
