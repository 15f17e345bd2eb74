#!/usr/bin/env python3
"""Turns the JSON of `torchattn_bench --device cuda`, bench_python_cuda.py and (optionally)
profile_cuda.py into apps/bench/results/benchmarks-cuda.md and apps/bench/results/benchmarks-cuda.png: the GPU and
versions they ran on, the issue's targets with PASS/FAIL, and the tables behind them.

    python3 apps/bench/attention/report_cuda.py --cpp cpp-cuda.json --py py-cuda.json \\
        [--profile profile-cuda.json] [--smi nvidia-smi.txt] [--out apps/bench/results]

Needs no torch. Draws the PNG with matplotlib; where it is missing (a GPU machine's
python3 may have torch only) it writes the markdown alone and says how to draw it later
from the same JSON."""

import argparse
import datetime
import json
import os
import statistics
import sys

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    plt = None

# The targets (H100, bf16).
MAX_VS_HAND = 1.00       # default / hand-assembled, forward and forward+backward
MAX_STALL_MS = 2.0       # a new length's first forward over its second
MAX_COLD_OVER_WARM = 2.0  # decode step, first pass over the same steps again
MAX_WARM_US = 120.0      # decode step, eager
MAX_GRAPH_US = 25.0      # decode step replayed from a CUDA graph
# Python's SDPA module and C++'s default module agree on the same weights and input
# within bf16's tolerance (both sides check their variants against this too).
CROSS_TOLERANCE = 2e-2


def table(headers, rows):
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def rows_of(data, section, **kw):
    return [r for r in data["rows"] if r["section"] == section and all(r.get(k) == v for k, v in kw.items())]


def one(data, section, **kw):
    found = rows_of(data, section, **kw)
    if not found:
        raise SystemExit(f"report_cuda: no {section} row with {kw} in the benchmark's JSON")
    return found[0]


def short_kernel(name, width=60):
    """A kernel's own name from its demangled signature: no return type, namespaces or
    arguments, its template arguments kept (cut to `width` characters)."""
    if "::" not in name:  # a copy's or a library kernel's plain name
        return name if len(name) <= width else name[:width - 3] + "..."
    name = name.replace("(anonymous namespace)::", "")
    if name.startswith("void "):
        name = name[len("void "):]
    depth, cut, last = 0, len(name), 0
    for i, c in enumerate(name):
        if c in "<{":
            depth += 1
        elif c in ">}":
            depth -= 1
        elif depth == 0 and c == "(":
            cut = i
            break
        elif depth == 0 and name.startswith("::", i):
            last = i + 2
    name = name[last:cut]
    return name if len(name) <= width else name[:width - 3] + "..."


def module_flops(r):
    """Useful FLOPs of one causal multi-head attention forward (as bench_cuda.cpp counts
    them): four projections and the lower triangle of q k^T and weights @ v."""
    B, T, d = r["B"], r["T"], r["d"]
    return 4 * 2.0 * B * T * d * d + 2 * 2.0 * B * (T * (T + 1) / 2) * d


def size(nbytes):
    return f"{nbytes / 2**30:g} GiB" if nbytes >= 2**30 else f"{nbytes / 2**20:g} MiB"


def ms(v):
    return f"{v:.3f}" if v < 100 else f"{v:.1f}"


def header(cpp, py, smi):
    on_gpu = cpp.get("device_type") == "cuda"
    md = ["# Benchmarks on the GPU", ""]
    if not on_gpu:
        md += ["> **Not a GPU run**: these numbers come from the harness run on the CPU "
               "(`run_device_bench` with the CPU). They test the scripts, they measure nothing.", ""]
    if cpp.get("quick"):
        md += ["> **Smoke run** (`--quick`): small sizes and few repetitions, not the issue's; "
               "the targets below are not meaningful.", ""]
    md += ["Made by `make bench DEVICE=cuda` (`bash apps/bench/run.sh --device cuda`, apps/bench/attention): "
           "`torchattn_bench --device cuda` (C++), `bench_python_cuda.py` (the Python peers) and "
           "`profile_cuda.py` (ATen alone) one after the other on the same GPU. Every variant is checked "
           "against the others (same weights, same input: outputs and input gradients within 2e-2 relative "
           "in bf16, 1e-4 in float32) and each decoding step against the full forward before anything is "
           "timed. A time is one call with the GPU idle before it, between two CUDA events: it includes the "
           "host work between launches. Medians; `default` and `hand` are timed interleaved (A, B, A, B, ...). "
           "bf16 unless stated; all modules in eval mode, dropout 0.", ""]
    gpu = cpp.get("gpu", "no GPU")
    if on_gpu:
        gpu += (f", compute capability {cpp['compute_capability']}, {cpp['gpu_memory_gib']:.0f} GiB, "
                f"{cpp['sms']} SMs")
    md += [f"- GPU: {gpu}"]
    if smi:
        md += [f"- nvidia-smi: {smi}"]
    if on_gpu:
        md += [f"- CUDA runtime {cpp['cuda_runtime']} (driver API {cpp['cuda_driver_api']}), cuDNN {cpp['cudnn']}"]
    md += [f"- LibTorch {cpp['libtorch']} (C++), torch {py['torch']} (Python"
           + (f", CUDA {py['torch_cuda']}" if py.get("torch_cuda") else "") + f"), torchattn {cpp['torchattn']}",
           f"- {datetime.date.today().isoformat()}", ""]
    return md


def targets(cpp):
    """[(target, measured text, ok)]."""
    out = []
    for p in [r for r in rows_of(cpp, "main", variant="default")]:
        shape = f"B={p['B']} T={p['T']} d={p['d']}"
        out.append((f"default forward <= {MAX_VS_HAND:.2f}x hand, {shape}", f"{p['fwd_vs_hand']:.3f}x",
                    p["fwd_vs_hand"] <= MAX_VS_HAND))
        out.append((f"default forward+backward <= {MAX_VS_HAND:.2f}x hand, {shape}", f"{p['fwdbwd_vs_hand']:.3f}x",
                    p["fwdbwd_vs_hand"] <= MAX_VS_HAND))
    stall = rows_of(cpp, "stall", variant="default")
    extra = statistics.median(r["first_ms"] - steady_ms(r) for r in stall)
    out.append((f"new-length stall <= {MAX_STALL_MS:g} ms (median over {len(stall)} new lengths, first - steady)",
                f"{extra:.3f} ms", extra <= MAX_STALL_MS))
    cold, warm, graph = (one(cpp, "decode", variant=v) for v in ("cold", "warm", "graph"))
    out.append((f"decode cold within {MAX_COLD_OVER_WARM:g}x warm (median per step)",
                f"{cold['median_us']:.1f} / {warm['median_us']:.1f} us = {cold['median_us'] / warm['median_us']:.2f}x",
                cold["median_us"] <= MAX_COLD_OVER_WARM * warm["median_us"]))
    out.append((f"decode step, warm eager <= {MAX_WARM_US:g} us", f"{warm['median_us']:.1f} us",
                warm["median_us"] <= MAX_WARM_US))
    out.append((f"decode step, CUDA graph <= {MAX_GRAPH_US:g} us", f"{graph['median_us']:.1f} us",
                graph["median_us"] <= MAX_GRAPH_US))
    mem = one(cpp, "module_memory", variant="mask_buffer_false")
    out.append((f"mask_buffer(false), context_length {mem['context_length']}: adds no more than its weights",
                f"{mem['added_mib']:.1f} MiB added, weights {mem['weights_mib']:.1f} MiB",
                bool(mem["added_le_weights"])))
    return out


def shortfalls(cpp, prof):
    """Why a target falls short, from this run's own measurements (markdown lines)."""
    md = []
    main = [p for p in rows_of(cpp, "main", variant="default")
            if p["fwd_vs_hand"] > MAX_VS_HAND or p["fwdbwd_vs_hand"] > MAX_VS_HAND]
    if main:
        stall = {v: statistics.median(r["first_ms"] - steady_ms(r) for r in rows_of(cpp, "stall", variant=v))
                 for v in ("default", "sdpa")}
        core = []
        for r in rows_of(cpp, "core", kernel="flash"):
            aten = one(cpp, "core", kernel="aten_sdpa", B=r["B"], H=r["H"], T=r["T"], hd=r["hd"])
            core.append(f"{r['fwd_ms'] / aten['fwd_ms']:.2f}x forward and {r['fwdbwd_ms'] / aten['fwdbwd_ms']:.2f}x "
                        f"forward+backward at B={r['B']} T={r['T']} hd={r['hd']} (ATen picks {aten['aten_choice']})")
        sdpa = ", ".join(f"{p['fwd_vs_hand']:.3f}x / {p['fwdbwd_vs_hand']:.3f}x at B={p['B']} T={p['T']}"
                         for p in rows_of(cpp, "main", variant="sdpa"))
        md += ["- **default vs hand.** Backend::Auto calls ATen's flash kernel where ATen would take cuDNN at a "
               "shape's first call, to spare the cuDNN plan that is built at every new length, and ATen's choice "
               "from its second (the stall table: "
               f"{stall['sdpa']:.1f} ms extra at a new length with `sdpa`, {stall['default']:.3f} ms with "
               "`default`). At a fixed shape cuDNN's kernel is the faster: flash takes " + "; ".join(core) + " of "
               "`aten_sdpa`'s time (the core table), which is the gap. Backend::SDPA (ATen's choice, cuDNN "
               f"included) runs at {sdpa} of hand: the backend for a training loop at a fixed T."]
    graph = one(cpp, "decode", variant="graph")
    if graph["median_us"] > MAX_GRAPH_US:
        line = (f"- **decode step from a CUDA graph.** {graph['median_us']:.1f} us a replayed step (one layer, "
                "static cache), timed from the host: the input's copy, the graph's launch and the wait for it. ")
        ks = rows_of(cpp, "decode_profile", variant="graph")
        if ks:
            gpu = sum(k["us_per_step"] for k in ks)
            calls = sum(k["calls_per_step"] for k in ks)
            top = ", ".join(f"{short_kernel(k['kernel'])} {k['us_per_step']:.1f} us" for k in ks[:3])
            line += (f"On the GPU the replayed step is {calls:.0f} kernels and copies taking {gpu:.1f} us in all "
                     f"(the kernel table under Decoding; the largest: {top}); the rest, "
                     f"{graph['median_us'] - gpu:.1f} us, is the gaps between them, the graph's launch and the "
                     "host's copy and wait.")
        else:
            line += "This LibTorch's profiler gave no kernel records, so the step is not broken down."
        md += [line]
    return ["## Short of target: why, measured", ""] + md + [""] if md else []


def main_points(cpp, py):
    md = ["## The main points: default vs hand-assembled vs the peers", "",
          "`default`: `torchattn::MultiHeadAttention` (Backend::Auto: ATen's flash kernel where ATen would take "
          "cuDNN). `hand`: three `torch::nn::Linear` + `at::scaled_dot_product_attention(is_causal=true)` + the "
          "out Linear on the same weights (ATen's own kernel choice). `sdpa`: the module with Backend::SDPA. "
          "`py_*`: Python on the same GPU, weights and input (`bench_python_cuda.py`): the SDPA module "
          "(Linear x3 + `F.scaled_dot_product_attention(is_causal=True)` + out Linear), the notebook's "
          "MultiHeadAttention, `torch.nn.MultiheadAttention` (`is_causal=True`). Ratios are against `hand`; "
          "peak memory is what a call adds to allocated GPU memory (caching allocator statistics).", ""]
    for hand in rows_of(cpp, "main", variant="hand"):
        key = {k: hand[k] for k in ("B", "T", "d", "H")}
        variants = rows_of(cpp, "main", **key) + rows_of(py, "main", **key)
        md += [f"### B={hand['B']}, T={hand['T']}, d={hand['d']}, {hand['H']} heads, bf16 "
               f"(median of {hand['reps']})", "",
               table(["variant", "fwd ms", "fwd vs hand", "fwd+bwd ms", "fwd+bwd vs hand", "fwd TFLOP/s",
                      "peak fwd MiB", "peak fwd+bwd MiB"],
                     [[r["variant"], ms(r["fwd_ms"]), f"{r['fwd_ms'] / hand['fwd_ms']:.3f}x", ms(r["fwdbwd_ms"]),
                       f"{r['fwdbwd_ms'] / hand['fwdbwd_ms']:.3f}x",
                       f"{module_flops(r) / r['fwd_ms'] / 1e9:.0f}",
                       f"{r['fwd_peak_mib']:.0f}", f"{r['fwdbwd_peak_mib']:.0f}"] for r in variants]), ""]
        peer = rows_of(py, "main", variant="py_sdpa_module", **key)
        if peer:
            default = one(cpp, "main", variant="default", **key)
            diff = abs(default["out_norm"] - peer[0]["out_norm"]) / peer[0]["out_norm"]
            if not diff <= CROSS_TOLERANCE:
                raise SystemExit(f"report_cuda: at B={key['B']} T={key['T']} the C++ default output's norm "
                                 f"{default['out_norm']} and Python's SDPA module's {peer[0]['out_norm']} differ by "
                                 f"{diff:.2e}: the two benchmarks did not compute the same thing")
            md += [f"Same problem on both sides: the output norms of C++ `default` and Python `py_sdpa_module` "
                   f"differ by {diff:.1e} (relative).", ""]
    return md


def core(cpp):
    gemm = one(cpp, "gemm")
    md = ["## The causal attention core against a GEMM", "",
          f"bf16 GEMM {gemm['n']}^3 in the same run: {gemm['ms']:.3f} ms = **{gemm['tflops']:.0f} TFLOP/s**. "
          "The core: q, k, v of [B, H, T, hd], causal; forward FLOPs 4·B·H·T²·hd/2, forward+backward 3.5x that. "
          "`aten_sdpa` is `at::scaled_dot_product_attention(is_causal=true)` (ATen's choice, the column beside "
          "it); `flash` is `at::_scaled_dot_product_flash_attention` called directly, the kernel Backend::Auto "
          "calls where ATen would take cuDNN (src/backends/sdpa.cpp).", "",
          table(["kernel", "ATen picks", "B", "H", "T", "hd", "fwd ms", "fwd TFLOP/s", "of GEMM", "fwd+bwd ms",
                 "fwd+bwd TFLOP/s", "of GEMM"],
                [[r["kernel"], r["aten_choice"], r["B"], r["H"], r["T"], r["hd"], ms(r["fwd_ms"]),
                  f"{r['fwd_tflops']:.0f}", f"{100 * r['fwd_vs_gemm']:.0f}%", ms(r["fwdbwd_ms"]),
                  f"{r['fwdbwd_tflops']:.0f}", f"{100 * r['fwdbwd_vs_gemm']:.0f}%"] for r in rows_of(cpp, "core")]),
          ""]
    return md


def sweep(cpp):
    rs = rows_of(cpp, "sweep")
    tokens = max(r["B"] * r["T"] for r in rs)
    with_buffer = [r["T"] for r in rs if r["mask_buffer"]]
    without = sorted({r["T"] for r in rs if not r["mask_buffer"]})
    md = ["## Against T, B·T constant", "",
          f"d={rs[0]['d']}, {rs[0]['H']} heads, B = max(1, {tokens} / T), context_length = T. "
          + (f"Modules with T above {max(with_buffer) if with_buffer else 0} are built with `mask_buffer(false)` "
             f"(no `mask` buffer): the notebooks' context_length² float32 buffer would be "
             + ", ".join(f"{size(t * t * 4)} at {t}" for t in without) + ", more than the work. "
             if without else "")
          + "Ratios are against `hand`; peak memory is what one forward+backward adds.", ""]
    for dtype in dict.fromkeys(r["dtype"] for r in rows_of(cpp, "sweep")):
        Ts = sorted({r["T"] for r in rows_of(cpp, "sweep", dtype=dtype)})
        lines = []
        for T in Ts:
            v = {r["variant"]: r for r in rows_of(cpp, "sweep", dtype=dtype, T=T)}
            d, h, s = v["default"], v["hand"], v["sdpa"]
            lines.append([T, d["B"], "yes" if d["mask_buffer"] else "no",
                          ms(d["fwd_ms"]), ms(h["fwd_ms"]), ms(s["fwd_ms"]), f"{d['fwd_ms'] / h['fwd_ms']:.3f}x",
                          ms(d["fwdbwd_ms"]), ms(h["fwdbwd_ms"]), ms(s["fwdbwd_ms"]),
                          f"{d['fwdbwd_ms'] / h['fwdbwd_ms']:.3f}x", f"{d['fwdbwd_peak_mib']:.0f}",
                          f"{h['fwdbwd_peak_mib']:.0f}"])
        md += [f"### {dtype}", "",
               table(["T", "B", "mask buffer", "fwd default", "fwd hand", "fwd sdpa", "default/hand",
                      "fwd+bwd default", "fwd+bwd hand", "fwd+bwd sdpa", "default/hand", "peak MiB default",
                      "peak MiB hand"], lines), "", "(times in ms)", ""]
    return md


def steady_ms(r):
    """A length's steady time: its third call (runs before the third call was timed: its second)."""
    return r.get("third_ms", r["second_ms"])


def stall(cpp):
    r0 = rows_of(cpp, "stall")[0]
    md = ["## A new length: the first forward, the second and the third", "",
          f"B={r0['B']}, d={r0['d']}, {r0['H']} heads, bf16, forward only, each length never seen before in the "
          "process (after a "
          "warm-up at another length, so process-wide first calls are not counted). `default` is Backend::Auto: "
          "flash at a shape's first call, ATen's choice (cuDNN, whose plan is built then) from its second; "
          "`sdpa` lets ATen take cuDNN at every call, which builds a plan at every new length. `extra` is the "
          "first call over the third (steady); `plan` the second over the third.", ""]
    lines = []
    for name in dict.fromkeys(r["variant"] for r in rows_of(cpp, "stall")):
        rs = rows_of(cpp, "stall", variant=name)
        extra = [r["first_ms"] - steady_ms(r) for r in rs]
        plan = [r["second_ms"] - steady_ms(r) for r in rs]
        lines.append([name, f"{rs[0]['T']}..{rs[-1]['T']}", ms(statistics.median(r["first_ms"] for r in rs)),
                      ms(statistics.median(r["second_ms"] for r in rs)),
                      ms(statistics.median(steady_ms(r) for r in rs)), ms(statistics.median(extra)), ms(max(extra)),
                      ms(statistics.median(plan))])
    md += [table(["variant", "lengths", "first ms (median)", "second ms (median)", "third ms (median)",
                  "extra ms (median)", "extra ms (max)", "plan ms (median)"], lines), ""]
    return md


def decode(cpp):
    first = one(cpp, "decode", variant="cold")
    md = ["## Decoding, one layer, one token per step", "",
          f"B=1, d={first['d']}, {first['H']} heads, bf16, a {first['prompt']}-token prompt, context_length "
          f"{first['context_length']}, {first['steps']:.0f} steps, each timed alone; every step's output checked "
          "against the full forward. `cold`: a dynamic cache (`make_kv_cache(1)`), the first pass, each step at a "
          "key length never seen before. `warm`: the same steps again after `reset()` and the same prompt. "
          "`static_eager`: a static-shape cache (`make_kv_cache(1, true)`) eagerly, attending over the whole "
          "context. `graph`: the static cache's step replayed from a CUDA graph (`torchattn::DecodeGraph`); its "
          "first call, the capture, is the `first` column and not in the median.", "",
          table(["variant", "median us", "min us", "first call us", "steps", "rel. error"],
                [[r["variant"], f"{r['median_us']:.1f}", f"{r['min_us']:.1f}", f"{r['first_us']:.1f}",
                  f"{r['steps']:.0f}", f"{r['rel_err']:.1e}"] for r in rows_of(cpp, "decode")]), ""]
    for variant in ("static_eager", "graph"):
        ks = rows_of(cpp, "decode_profile", variant=variant)
        if ks:
            md += [f"`{variant}` kernel by kernel (LibTorch's profiler, Kineto with CUPTI; 20 steps after the timed "
                   f"ones, per step): {sum(k['us_per_step'] for k in ks):.1f} us of GPU time in "
                   f"{sum(k['calls_per_step'] for k in ks):.0f} kernels and copies.", "",
                   table(["kernel or copy", "per step", "us per step"],
                         [[k["kernel"].replace("|", "\\|"), f"{k['calls_per_step']:.0f}", f"{k['us_per_step']:.2f}"]
                          for k in ks]), ""]
    return md


def memory(cpp):
    rs = rows_of(cpp, "module_memory")
    md = ["## Memory of a long-context module", "",
          f"`MultiHeadAttention({rs[0]['d']}, {rs[0]['d']}, context_length={rs[0]['context_length']}, "
          f"{rs[0]['H']} heads)`, "
          "float32, built and moved to the GPU: what it adds to allocated GPU memory.", "",
          table(["module", "added MiB", "weights MiB", "buffers MiB"],
                [[r["variant"].replace("mask_buffer_", "mask_buffer(") + ")", f"{r['added_mib']:.1f}",
                  f"{r['weights_mib']:.1f}", f"{r['buffers_mib']:.1f}"] for r in rs]), ""]
    return md


def profile(prof):
    md = ["## ATen alone (profile_cuda.py, Python, same GPU)", "",
          "The evidence behind Backend::Auto's kernel choice, measured with ATen and no torchattn "
          "(`python3 apps/bench/attention/profile_cuda.py`).", "",
          "Which kernel `torch._fused_sdp_choice` picks: "
          + ", ".join(f"{k} -> {v}" for k, v in prof.get("choice", {}).items()) + ".", ""]
    if prof.get("cold"):
        md += ["First call at a never-seen length vs the second (wall ms, B=1, 16 heads, hd 64, bf16; T=1 is a "
               "decode step, one query against a new key length):", "",
               table(["kernel", "T", "first ms", "second ms"],
                     [[r["kernel"], r["T"], f"{r['first_ms']:.2f}", f"{r['second_ms']:.2f}"] for r in prof["cold"]]),
               ""]
    if prof.get("core"):
        md += [f"Causal core per kernel (GEMM: {prof['gemm_tflops']:.0f} TFLOP/s):", "",
               table(["kernel", "B", "T", "hd", "fwd ms", "fwd TFLOP/s", "fwd+bwd ms", "fwd+bwd TFLOP/s"],
                     [[r["kernel"], r["B"], r["T"], r["hd"], ms(r["fwd_ms"]), f"{r['fwd_tflops']:.0f}",
                       ms(r["fwdbwd_ms"]), f"{r['fwdbwd_tflops']:.0f}"] for r in prof["core"]]), ""]
    mods = [r for r in prof.get("module", []) if "kernel" in r]
    if mods:
        md += ["Module, three projections vs one fused QKV GEMM (ms):", "",
               table(["B", "T", "d", "kernel", "projections", "fwd", "fwd+bwd"],
                     [[r["B"], r["T"], r["d"], r["kernel"], r["proj"], ms(r["fwd_ms"]), ms(r["fwdbwd_ms"])]
                      for r in mods]), ""]
    for r in (r for r in prof.get("module", []) if "proj3_ms" in r):
        md += [f"Projections alone, B={r['B']} T={r['T']} d={r['d']}: three {r['proj3_ms']:.3f} ms, one fused "
               f"{r['proj1_ms']:.3f} ms.", ""]
    if prof.get("decode"):
        md += ["One decoding step over a static cache of 2048 with 1024 tokens (Python-driven, so eager includes "
               "Python's overhead):", "",
               table(["variant", "eager us", "graph us"],
                     [[r["variant"], f"{r['eager_us']:.1f}", f"{r['graph_us']:.1f}" if "graph_us" in r else "-"]
                      for r in prof["decode"]]), ""]
    return md


def plot(cpp, path):
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.4))
    sw = rows_of(cpp, "sweep")
    for ax, key, title in [(axes[0], "fwd_ms", "forward"), (axes[1], "fwdbwd_ms", "forward+backward")]:
        for dtype, style in [("bf16", "-"), ("fp32", "--")]:
            for i, variant in enumerate(dict.fromkeys(r["variant"] for r in sw)):
                pts = sorted((r["T"], r[key]) for r in sw if r["dtype"] == dtype and r["variant"] == variant)
                if pts:
                    ax.plot([t for t, _ in pts], [v for _, v in pts], style, color=f"C{i}", marker="o", ms=3,
                            label=f"{variant} {dtype}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel(f"T (B·T = {max(r['B'] * r['T'] for r in sw)}), d={sw[0]['d']}, {sw[0]['H']} heads")
        ax.set_ylabel(f"{title}, ms (median)")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    ax = axes[2]
    for variant in dict.fromkeys(r["variant"] for r in rows_of(cpp, "decode_step")):
        pts = [(r["step"], r["us"]) for r in rows_of(cpp, "decode_step", variant=variant)]
        ax.plot([s for s, _ in pts], [u for _, u in pts], marker=".", label=variant)
    ax.set_yscale("log")
    ax.set_xlabel("decoding step (graph: after its capture)")
    ax.set_ylabel("us per step")
    ax.set_title("decode, one layer, B=1")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.suptitle(f"torchattn on {cpp.get('gpu', cpp.get('device_type'))}, LibTorch {cpp['libtorch']}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cpp", required=True, help="torchattn_bench --device cuda --json")
    ap.add_argument("--py", required=True, help="bench_python_cuda.py --json")
    ap.add_argument("--profile", help="profile_cuda.py --json")
    ap.add_argument("--smi", help="a file holding nvidia-smi's line for the GPU")
    ap.add_argument("--out", default="apps/bench/results")
    args = ap.parse_args()
    cpp = json.load(open(args.cpp))
    py = json.load(open(args.py))
    smi = open(args.smi).read().strip() if args.smi and os.path.exists(args.smi) else ""

    md = header(cpp, py, smi)
    checks = targets(cpp)
    on_gpu = cpp.get("device_type") == "cuda"
    md += ["## Targets", "", table(["target", "measured", "result"], [
        [name, value, ("PASS" if ok else "**FAIL**") if on_gpu else "n/a (not a GPU run)"]
        for name, value, ok in checks]), ""]
    if on_gpu:
        md += shortfalls(cpp, json.load(open(args.profile)) if args.profile else None)
    md += main_points(cpp, py) + core(cpp) + sweep(cpp) + stall(cpp) + decode(cpp) + memory(cpp)
    if args.profile:
        md += profile(json.load(open(args.profile)))

    os.makedirs(args.out, exist_ok=True)
    if plt is not None:
        plot(cpp, os.path.join(args.out, "benchmarks-cuda.png"))
        md += ["![forward and forward+backward against T; decoding steps](benchmarks-cuda.png)", ""]
    else:
        print(f"report_cuda: matplotlib not found: wrote {args.out}/benchmarks-cuda.md without the plot; draw it "
              f"with a Python that has matplotlib: {os.path.basename(sys.executable)} "
              + " ".join(a for a in sys.argv), file=sys.stderr)
    with open(os.path.join(args.out, "benchmarks-cuda.md"), "w") as f:
        f.write("\n".join(md))
    print("\n".join(md))


if __name__ == "__main__":
    main()
