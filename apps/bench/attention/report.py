#!/usr/bin/env python3
"""Turns the JSON of torchattn_bench and bench_python.py into apps/bench/results/benchmarks.md and
apps/bench/results/benchmarks.png, with the machine they ran on and the issue's targets checked."""

import argparse
import datetime
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from machine import cpu_family, cpu_flags, machine  # noqa: E402  (apps/bench/machine.py)


def table(headers, rows):
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cpp", required=True)
    ap.add_argument("--py", required=True)
    ap.add_argument("--out", default="apps/bench/results")
    args = ap.parse_args()
    cpp = json.load(open(args.cpp))
    py = json.load(open(args.py))
    rows = cpp["rows"]

    def pick(section, variant, **kw):
        for r in rows + py["rows"]:
            if r["section"] == section and r["variant"] == variant and all(r.get(k) == v for k, v in kw.items()):
                return r
        return None

    md = ["# Benchmarks", "",
          "Made by `make bench` (apps/bench/attention): `torchattn_bench` (C++) and `bench_python.py` run one after the other "
          "on the same machine, the same weights (seed 0) and the same inputs; each variant is checked against the "
          "notebook math before it is timed. Medians of repeated runs after a warm-up; GFLOP/s count the useful "
          "work (projections plus the causal half of the attention). Regenerate with `make bench`.", "",
          f"- machine: {machine()} ({cpu_family()})",
          f"- CPU flags: {cpu_flags()}",
          f"- threads: {cpp['threads']}, float32, d_in = d_out = 768, 12 heads",
          f"- torch {py['torch']}, torchattn {cpp['torchattn']}, {datetime.date.today().isoformat()}", ""]

    for section, title in [("forward", "Forward"), ("forward_backward", "Forward + backward")]:
        main_rows = [r for r in rows + py["rows"] if r["section"] == section]
        B, T = main_rows[0]["B"], main_rows[0]["T"]
        ref = pick(section, "reference")["median_ms"]
        md += [f"## {title}, B={B}, T={T}", "",
               table(["variant", "median ms", "GFLOP/s", "speed-up vs reference"],
                     [[r["variant"], f"{r['median_ms']:.1f}", f"{r['gflops']:.1f}", f"{ref / r['median_ms']:.2f}x"]
                      for r in main_rows]), ""]

    sweep = [r for r in rows if r["section"] == "sweep"]
    Ts = sorted({r["T"] for r in sweep})
    variants = list(dict.fromkeys(r["variant"] for r in sweep))
    py_sweep = [r for r in py["rows"] if r["section"] == "sweep"]
    py_variants = list(dict.fromkeys(r["variant"] for r in py_sweep))
    cell = {}
    for r in sweep + py_sweep:
        cell[(r["variant"], r["T"])] = r
    md += ["## Forward against T, B=1 (median ms; peak RSS growth MiB for the C++ variants)", "",
           "The Reference and LibTorch's module stop at T=4096: the notebook math holds several [12, T, T] float "
           "tensors (9 GiB each at T=16384). The modules' `mask` buffer itself is [context_length, context_length] "
           "float32, as in the notebooks (1 GiB at 16384); it is allocated at construction and not counted here.", "",
           table(["T"] + variants + py_variants,
                 [[T] + [(f"{cell[(v, T)]['median_ms']:.1f} ms / {cell[(v, T)]['peak_rss_growth_mib']:.0f} MiB"
                          if (v, T) in cell else "-") for v in variants] +
                  [(f"{cell[(v, T)]['median_ms']:.1f} ms" if (v, T) in cell else "-") for v in py_variants]
                  for T in Ts]), ""]

    kv = pick("decode", "kv_cache")
    rc = pick("decode", "recompute")
    md += [f"## Decoding, B=1: a {kv['prompt']}-token prompt, then {kv['steps']} tokens one at a time", "",
           table(["variant", "tokens/s"], [["KV cache (forward_cached)", f"{kv['tokens_per_s']:.1f}"],
                                            ["full forward each step", f"{rc['tokens_per_s']:.1f}"]]), ""]

    mha, gqa = pick("gqa", "mha"), pick("gqa", "gqa_4to1")
    rope_on, rope_off = pick("rope", "with"), pick("rope", "without")
    md += [f"## Grouped-query attention, decoding: a {mha['prompt']}-token prompt, then {mha['steps']} tokens", "",
           "12 query heads over 12 key/value heads (MHA) or 3 (GQA 4:1), run alternately; the KV cache holds "
           "context_length tokens.", "",
           table(["variant", "tokens/s", "KV cache MiB"],
                 [[r["variant"], f"{r['tokens_per_s']:.1f}", f"{r['kv_cache_mib']:.2f}"] for r in (mha, gqa)]), "",
           f"## RoPE, forward B={rope_on['B']}, T={rope_on['T']} (medians of interleaved runs)", "",
           table(["variant", "median ms"], [["without RoPE", f"{rope_off['median_ms']:.1f}"],
                                            ["with RoPE", f"{rope_on['median_ms']:.1f}"]]), ""]
    # alibi and window joined the section later: a run without them leaves their rows out.
    score_variants = [v for v in ("without", "softcap", "sinks", "alibi", "window")
                      if pick("scores", v) and pick("scores_memory", v)]
    sc = {v: pick("scores", v) for v in score_variants}
    sm = {v: pick("scores_memory", v) for v in score_variants}
    if {"without", "softcap", "sinks"} <= set(score_variants):
        md += [f"## Softcapping, sinks, ALiBi and a window, forward B={sc['without']['B']}, T={sc['without']['T']} "
               "(medians of interleaved runs)", "",
               "Gemma 2's `softcap(50)`, gpt-oss' `sinks(true)`, BLOOM's `alibi(true)` and a `window(256)`. Sinks "
               "take no fused kernel: torchattn computes them a block of queries at a time (never T x T scores). On "
               "the CPU, in float32, the softcap, ALiBi and the window run on the library's flex kernels "
               "(`src/backends/named_flex.cpp`; before, the softcap took the blocked path, ALiBi a [1, H, T, T] "
               "bias through ATen's SDPA). Peak RSS growth of one forward at "
               f"B=1, T={sm['without']['T']}.", "",
               table(["variant", "median ms", "x without", f"T={sm['without']['T']}: peak MiB", "ms"],
                     [[v, f"{sc[v]['median_ms']:.1f}", f"{sc[v]['ratio']:.2f}",
                       f"{sm[v]['peak_rss_growth_mib']:.0f}", f"{sm[v]['ms']:.0f}"] for v in sc]), ""]

    auto_f, ref_f = pick("forward", "auto"), pick("forward", "reference")
    hand_f = pick("forward", "linear+aten_sdpa")
    auto_b, ref_b = pick("forward_backward", "auto"), pick("forward_backward", "reference")
    big = cell.get(("auto", max(Ts)))
    checks = [
        ("default forward >= 2x faster than Reference", ref_f["median_ms"] / auto_f["median_ms"], ">=", 2.0),
        ("default inference forward <= 1.0x Linear + ATen SDPA by hand (time ratio)",
         auto_f["median_ms"] / hand_f["median_ms"], "<=", 1.0),
        ("forward+backward >= 1.5x faster than Reference", ref_b["median_ms"] / auto_b["median_ms"], ">=", 1.5),
        (f"B=1, T={max(Ts)} forward peak RSS growth < 1024 MiB", big["peak_rss_growth_mib"], "<", 1024),
        ("decode with cache >= 10x recompute", kv["tokens_per_s"] / rc["tokens_per_s"], ">=", 10.0),
        ("GQA 4:1 KV cache = 1/4 of MHA's (ratio)", gqa["kv_cache_mib"] / mha["kv_cache_mib"], "<=", 0.25),
        ("GQA 4:1 decoding no slower than MHA (tokens/s ratio)", gqa["tokens_per_s"] / mha["tokens_per_s"], ">=", 1.0),
        ("RoPE adds <= 10% to the forward (time ratio)", rope_on["median_ms"] / rope_off["median_ms"], "<=", 1.10),
    ]
    if {"without", "softcap", "sinks"} <= set(score_variants):
        checks += [
            ("softcap forward <= 1.15x the forward without (time ratio)", sc["softcap"]["ratio"], "<=", 1.15),
            ("sinks forward <= 1.5x the forward without (time ratio)", sc["sinks"]["ratio"], "<=", 1.5),
            (f"softcap, B=1, T={sm['softcap']['T']}: peak RSS growth < 512 MiB",
             sm["softcap"]["peak_rss_growth_mib"], "<", 512),
            (f"sinks, B=1, T={sm['sinks']['T']}: peak RSS growth < 512 MiB", sm["sinks"]["peak_rss_growth_mib"], "<", 512),
        ]
        checks += [(f"{v} forward <= 1.1x the forward without (time ratio)", sc[v]["ratio"], "<=", 1.1)
                   for v in ("alibi", "window") if v in sc]
    md += ["## Targets", "", table(["target", "measured", "met"], [
        [name, f"{val:.2f}", "yes" if (val >= bound if op == ">=" else val <= bound if op == "<=" else val < bound)
         else "**no**"] for name, val, op, bound in checks]), ""]

    os.makedirs(args.out, exist_ok=True)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for v in variants + py_variants:
        pts = [(T, cell[(v, T)]) for T in Ts if (v, T) in cell]
        ax1.plot([t for t, _ in pts], [r["median_ms"] for _, r in pts], marker="o", label=v,
                 linestyle="--" if v.startswith("py_") else "-")
        if v in variants:
            ax2.plot([t for t, _ in pts], [max(r["peak_rss_growth_mib"], 0.5) for _, r in pts], marker="o", label=v)
    for ax, ylabel in [(ax1, "forward time, ms (median)"), (ax2, "peak RSS growth, MiB")]:
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("T (tokens), B=1, d=768, 12 heads")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
    ax1.legend(fontsize=7)
    ax2.legend(fontsize=7)
    fig.suptitle("torchattn MultiHeadAttention forward on CPU (%d threads)" % cpp["threads"])
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "benchmarks.png"), dpi=100)
    md += ["![time and memory against T](benchmarks.png)", ""]
    with open(os.path.join(args.out, "benchmarks.md"), "w") as f:
        f.write("\n".join(md))
    print("\n".join(md))


if __name__ == "__main__":
    main()
