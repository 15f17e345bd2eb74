#!/usr/bin/env python3
"""Where the time goes on a CUDA GPU, measured with ATen alone (no torchattn): which
SDPA kernel ATen picks, what each kernel costs the first time it meets a sequence
length, the attention core against a GEMM, three projections against one fused GEMM,
and the ways to run one decoding step over a fixed-size cache (eager and graph-replayed).

    python3 apps/bench/attention/profile_cuda.py [--quick] [--json out.json]

It is the evidence behind torchattn's CUDA kernel choice (apps/bench/results/benchmarks-cuda.md)."""

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

dev = "cuda"
BACKENDS = {
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}
CHOICE_NAMES = {0: "math", 1: "flash", 2: "efficient", 3: "cudnn", 4: "overrideable"}


def bench(fn, reps=20, warmup=3):
    """Median milliseconds of fn() over reps, timed with CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def wall_once(fn):
    """Wall-clock milliseconds of one synchronised call (the cold cost)."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3


def rel_err(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "cudnn": torch.backends.cudnn.version()}
    print(f"profile_cuda: {out['device']}, torch {out['torch']}, cuDNN {out['cudnn']}")
    bf = torch.bfloat16

    # ---- 1. which kernel ATen picks ----
    print("\n[choice] torch._fused_sdp_choice for typical calls")
    choices = {}
    for name, (B, H, Tq, Tk, hd, dt, causal, mask) in {
        "bf16 causal square": (8, 16, 2048, 2048, 64, bf, True, None),
        "bf16 decode Tq=1": (1, 16, 1, 1025, 64, bf, False, None),
        "bf16 bool mask": (2, 16, 64, 64, 64, bf, False, "bool"),
        "bf16 float mask": (2, 16, 64, 64, 64, bf, False, "float"),
        "fp32 causal": (2, 16, 256, 256, 64, torch.float32, True, None),
        "fp16 hd128 causal": (4, 16, 4096, 4096, 128, torch.float16, True, None),
        "fp64 causal": (2, 4, 64, 64, 16, torch.float64, True, None),
    }.items():
        q = torch.randn(B, H, Tq, hd, device=dev, dtype=dt)
        k = torch.randn(B, H, Tk, hd, device=dev, dtype=dt)
        m = None
        if mask == "bool":
            m = torch.rand(B, 1, Tq, Tk, device=dev) > 0.2
        elif mask == "float":
            m = torch.randn(B, 1, Tq, Tk, device=dev, dtype=dt)
        c = torch._fused_sdp_choice(q, k, k, m, 0.0, causal)
        choices[name] = CHOICE_NAMES.get(c, str(c))
        print(f"  {name:<22} -> {choices[name]}")
    out["choice"] = choices

    # ---- 2. first call at a new length, per kernel ----
    print("\n[cold] first forward at a never-seen length vs the second (ms, wall, B=1 H=16 hd=64 bf16 causal)")
    cold = []
    base = 1000
    for bname, be in BACKENDS.items():
        if bname == "math":
            continue
        for i in range(3):
            T = base + i * 7
            base += 100
            q = torch.randn(1, 16, T, 64, device=dev, dtype=bf)
            try:
                with sdpa_kernel([be]):
                    first = wall_once(lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True))
                    second = wall_once(lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True))
            except RuntimeError as e:
                print(f"  {bname}: unavailable ({str(e).splitlines()[0][:80]})")
                break
            cold.append({"kernel": bname, "T": T, "first_ms": first, "second_ms": second})
            print(f"  {bname:<10} T={T:<5} first {first:8.2f}  second {second:6.2f}")
        # decode shape: Tq=1 against a new key length
        q1 = torch.randn(1, 16, 1, 64, device=dev, dtype=bf)
        kk = torch.randn(1, 16, 1500 + base % 97, 64, device=dev, dtype=bf)
        try:
            with sdpa_kernel([be]):
                first = wall_once(lambda: F.scaled_dot_product_attention(q1, kk, kk))
                second = wall_once(lambda: F.scaled_dot_product_attention(q1, kk, kk))
            cold.append({"kernel": bname, "T": 1, "first_ms": first, "second_ms": second})
            print(f"  {bname:<10} decode Tq=1 Tk={kk.shape[2]} first {first:8.2f}  second {second:6.2f}")
        except RuntimeError as e:
            print(f"  {bname}: decode unavailable ({str(e).splitlines()[0][:80]})")
    out["cold"] = cold

    # ---- 3. the causal core per kernel, and a GEMM ----
    n = 4096 if args.quick else 8192
    a = torch.randn(n, n, device=dev, dtype=bf)
    b2 = torch.randn(n, n, device=dev, dtype=bf)
    gemm_ms = bench(lambda: a @ b2, reps=10)
    gemm_tflops = 2 * n**3 / gemm_ms / 1e9
    print(f"\n[gemm] {n}^3 bf16: {gemm_ms:.3f} ms = {gemm_tflops:.0f} TFLOP/s")
    out["gemm_tflops"] = gemm_tflops
    del a, b2
    print("\n[core] causal attention, bf16: forward / forward+backward TFLOP/s per kernel")
    core = []
    for B, H, T, hd in [(8, 16, 2048, 64), (4, 16, 4096, 128)]:
        q, k, v = (torch.randn(B, H, T, hd, device=dev, dtype=bf, requires_grad=True) for _ in range(3))
        g = torch.randn(B, H, T, hd, device=dev, dtype=bf)
        flops = 4 * B * H * T * T / 2 * hd
        ref = None
        for bname, be in BACKENDS.items():
            if bname == "math" and T > 2048:
                continue
            try:
                with sdpa_kernel([be]):
                    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                    if ref is None:
                        ref = o.detach()
                    err = rel_err(o, ref)
                    f = bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
                    fb = bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(g))
            except RuntimeError as e:
                print(f"  {bname}: unavailable ({str(e).splitlines()[0][:80]})")
                continue
            row = {"kernel": bname, "B": B, "H": H, "T": T, "hd": hd, "fwd_ms": f, "fwdbwd_ms": fb,
                   "fwd_tflops": flops / f / 1e9, "fwdbwd_tflops": 3.5 * flops / fb / 1e9, "rel_err": err}
            core.append(row)
            print(f"  B={B} T={T} hd={hd} {bname:<10} fwd {f:7.3f} ms ({row['fwd_tflops']:4.0f} TF/s)  "
                  f"fwd+bwd {fb:7.3f} ms ({row['fwdbwd_tflops']:4.0f})  rel err {err:.1e}")
        del q, k, v, g
    out["core"] = core

    # ---- 4. the module: three projections vs one fused GEMM, per kernel ----
    print("\n[module] Linear x3 + SDPA + out_proj vs fused QKV GEMM (ms, bf16)")
    mod = []
    for B, T, d, H in [(8, 2048, 1024, 16), (4, 4096, 2048, 16)]:
        hd = d // H
        Wq, Wk, Wv, Wo = (torch.randn(d, d, device=dev, dtype=bf) * d**-0.5 for _ in range(4))
        for W in (Wq, Wk, Wv, Wo):
            W.requires_grad_(True)
        bo = torch.zeros(d, device=dev, dtype=bf, requires_grad=True)
        x = torch.randn(B, T, d, device=dev, dtype=bf, requires_grad=True)
        g = torch.randn(B, T, d, device=dev, dtype=bf)

        def heads(t):
            return t.view(B, T, H, hd).transpose(1, 2)

        def three():
            q, k, v = heads(x @ Wq.t()), heads(x @ Wk.t()), heads(x @ Wv.t())
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return F.linear(o.transpose(1, 2).reshape(B, T, d), Wo, bo)

        def fused():
            qkv = F.linear(x, torch.cat([Wq, Wk, Wv]))
            q, k, v = (heads(t) for t in qkv.split(d, -1))
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return F.linear(o.transpose(1, 2).reshape(B, T, d), Wo, bo)

        for bname in ["cudnn", "flash"]:
            with sdpa_kernel([BACKENDS[bname]]):
                for vname, fn in [("three", three), ("fused", fused)]:
                    with torch.no_grad():
                        f = bench(fn)
                    fb = bench(lambda: fn().backward(g))
                    mod.append({"B": B, "T": T, "d": d, "kernel": bname, "proj": vname, "fwd_ms": f, "fwdbwd_ms": fb})
                    print(f"  B={B} T={T} d={d} {bname:<6} {vname:<6} fwd {f:7.3f}  fwd+bwd {fb:7.3f}")
        with torch.no_grad():
            proj3 = bench(lambda: (x @ Wq.t(), x @ Wk.t(), x @ Wv.t()))
            Wc = torch.cat([Wq, Wk, Wv])
            proj1 = bench(lambda: x @ Wc.t())
            catw = bench(lambda: torch.cat([Wq, Wk, Wv]))
        print(f"  B={B} T={T} d={d} projections: three {proj3:.3f} ms, one fused {proj1:.3f} ms, cat of weights {catw:.3f} ms")
        mod.append({"B": B, "T": T, "d": d, "proj3_ms": proj3, "proj1_ms": proj1, "cat_ms": catw})
        del Wq, Wk, Wv, Wo, x, g
    out["module"] = mod

    # ---- 5. one decoding step over a static cache ----
    print("\n[decode] one layer, B=1, d=1024, 16 heads, cache of 2048, 1024 tokens in it (us per step)")
    d, H, C, hd = 1024, 16, 2048, 64
    Wqkv = torch.randn(3 * d, d, device=dev, dtype=bf) * d**-0.5
    Wo = torch.randn(d, d, device=dev, dtype=bf) * d**-0.5
    bo = torch.zeros(d, device=dev, dtype=bf)
    K = torch.randn(1, H, C, hd, device=dev, dtype=bf)
    V = torch.randn(1, H, C, hd, device=dev, dtype=bf)
    pos = torch.tensor([1024], device=dev)
    ar = torch.arange(C, device=dev)
    x = torch.randn(1, 1, d, device=dev, dtype=bf)
    dec = []

    def step(attn):
        qkv = F.linear(x, Wqkv)
        q, k, v = (t.view(1, 1, H, hd).transpose(1, 2) for t in qkv.split(d, -1))
        K.index_copy_(2, pos, k)
        V.index_copy_(2, pos, v)
        o = attn(q)
        return F.linear(o.transpose(1, 2).reshape(1, 1, d), Wo, bo)

    def math_attn(q):
        s = (q @ K.transpose(-2, -1)).float() * hd**-0.5
        s = s.masked_fill(ar > pos, float("-inf"))
        return (torch.softmax(s, -1).to(bf)) @ V

    def sdpa_mask(q):
        return F.scaled_dot_product_attention(q, K, V, attn_mask=(ar <= pos).view(1, 1, 1, C))

    def eff_mask(q):
        with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
            return F.scaled_dot_product_attention(q, K, V, attn_mask=(ar <= pos).view(1, 1, 1, C))

    def flash_narrow(q):  # dynamic shape: reads pos on the host, not capturable
        n = 1025
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            return F.scaled_dot_product_attention(q, K[:, :, :n], V[:, :, :n])

    with torch.no_grad():
        ref = step(math_attn)
        for name, attn, capturable in [("math_fullcache", math_attn, True), ("sdpa_mask", sdpa_mask, True),
                                       ("efficient_mask", eff_mask, True), ("flash_narrow", flash_narrow, False)]:
            try:
                y = step(attn)
                err = rel_err(y, ref)
                eager = bench(lambda: step(attn), reps=50) * 1e3
                row = {"variant": name, "eager_us": eager, "rel_err": err}
                if capturable:
                    s = torch.cuda.Stream()
                    s.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(s):
                        for _ in range(3):
                            step(attn)
                    torch.cuda.current_stream().wait_stream(s)
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph):
                        step(attn)
                    row["graph_us"] = bench(graph.replay, reps=200) * 1e3
                dec.append(row)
                print(f"  {name:<16} eager {eager:7.1f} us  graph {row.get('graph_us', float('nan')):6.1f} us  rel err {err:.1e}")
            except RuntimeError as e:
                print(f"  {name}: failed ({str(e).splitlines()[0][:100]})")
    out["decode"] = dec
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
