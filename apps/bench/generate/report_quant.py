#!/usr/bin/env python3
"""apps/bench/results/quant.md: four-bit weights on the Llama-3.2-1B-shaped model
(tools/make_scale_model.py: 1.07B parameters, random weights from a config). torchattn int8
and int4 from folders of their own (`torchattn_generate --dtype int8|int4 --save`), torchattn
int4 running llama.cpp's own Q4_0 and Q4_K_M files (`--dtype int4`: Q4_0's blocks as they
are; Q4_K_M's Q4_K tensors with their 4-bit values, its Q6_K ones quantized again), beside llama.cpp Q8_0, Q4_0
and Q4_K_M (llama_cpp_generate.py: its converter and its quantizer made the files): warm
and cold load, peak RSS, the prefill of 512 tokens and decoding at 1 and 2 threads, with
issue 65's targets.

Usage: report_quant.py --runs NAME:THREADS:FILE ... [--folders NAME:PATH ...] [--out DIR]
NAME: ours-int8, ours-int4, ours-int4-q4_0, ours-int4-q4_k_m, llama-q8_0, llama-q4_0,
llama-q4_k_m. A NAME:THREADS named with several files (the rounds) gets each number's
median over them. --folders: the weights each NAME loads (their size).
"""

import argparse
import datetime
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from machine import machine  # noqa: E402  (apps/bench/machine.py: the same machine line as every page)
from report_scale import cpu_family, fmt, size_of, targets_md  # noqa: E402
from report_weights import cpu_flags, load, paired  # noqa: E402

ORDER = ["ours-int8", "ours-int4", "ours-int4-q4_0", "ours-int4-q4_k_m", "llama-q8_0", "llama-q4_0", "llama-q4_k_m"]
LABEL = {"ours-int8": "torchattn int8", "ours-int4": "torchattn int4 (its own folder)",
         "ours-int4-q4_0": "torchattn int4, llama.cpp's Q4_0 file",
         "ours-int4-q4_k_m": "torchattn int4, llama.cpp's Q4_K_M file",
         "llama-q8_0": "llama.cpp Q8_0", "llama-q4_0": "llama.cpp Q4_0", "llama-q4_k_m": "llama.cpp Q4_K_M"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", nargs="+", required=True)
    ap.add_argument("--folders", nargs="*", default=[])
    ap.add_argument("--out", default="apps/bench/results")
    a = ap.parse_args()
    runs = load(a.runs)
    folders = dict(item.split(":", 1) for item in a.folders)
    sizes = {name: size_of(path) for name, path in folders.items() if os.path.exists(path)}
    names = [n for n in ORDER if any(k[0] == n for k in runs)]
    rounds = min(r["rounds"] for r in runs.values())
    one = lambda n, t, k: runs.get((n, t), {}).get(k)
    versions = sorted({r["version"] for (n, _), r in runs.items() if n.startswith("llama")})
    md = ["# Four-bit weights: a Llama-3.2-1B-shaped model, torchattn and llama.cpp", "",
          "Made by `bash apps/bench/run.sh --quant-only` (part of `make bench`). The model: "
          "`tools/make_scale_model.py` (16 layers, hidden 2048, 32 heads over 8 key/value heads, MLP 8192, tied "
          "embeddings, a vocabulary of 49152: 1.07B parameters), random weights, nothing downloaded. torchattn's int8 "
          "and int4 weights come from folders of their own (`torchattn_generate --dtype int4 --save`; an int4 model "
          "keeps its head in int8); llama.cpp's files from its own converter (F32, Q8_0) and quantizer (Q4_0, Q4_K_M, "
          "from the F32 file, llama-quantize's defaults). torchattn runs llama.cpp's Q4_0 file with `--dtype int4`, "
          "every block as it is (Q4_0's offset is -8 d), and its Q4_K_M file with the Q4_K tensors' 4-bit values "
          "kept (each sub-block's scale and minimum rounded to float16) and the Q6_K tensors quantized again to "
          "int4 (their values change). "
          f"Every configuration runs once a round, {rounds} round{'s' if rounds > 1 else ''}; each figure is the "
          "median over the rounds and a ratio the median of its per-round ratios, each side at its best thread "
          "count in that round.", "",
          "- At 2 threads each loads its weights cold (the files evicted from the page cache), lets them go, loads "
          "them again warm, decodes (greedy, after a 32-token prompt, the median of 3 runs) and, in the first round, "
          "prefills 512 tokens (the median of 5 warm runs). The peak RSS is that of the warm load and the decoding. "
          "At 1 thread each decodes only.",
          f"- machine: {machine()} ({cpu_family()})",
          f"- CPU flags: {cpu_flags()}",
          f"- {', '.join(versions + ['torchattn_generate_bench'])}, {datetime.date.today().isoformat()}", "",
          "| runtime, weights | weights, MB | load warm, s | load cold, s | peak RSS, MiB | prefill 512, s | "
          "decode 1 thread, tokens/s | decode 2 threads, tokens/s |",
          "|---|---|---|---|---|---|---|---|"]
    for n in names:
        pre = one(n, 2, "prefill") or {}
        weights = sizes.get(n)
        md.append(f"| {LABEL[n]} | {'' if weights is None else f'{weights / 1e6:.0f}'} | {fmt(one(n, 2, 'load_s'))} | "
                  f"{fmt(one(n, 2, 'load_cold_s'))} | {fmt(one(n, 2, 'peak_rss_mib'), 0)} | "
                  f"{fmt(pre.get('512'), 2)} | {fmt(one(n, 1, 'decode_tokens_per_s'), 1)} | "
                  f"{fmt(one(n, 2, 'decode_tokens_per_s'), 1)} |")
    dec = "decode_tokens_per_s"
    checks = []

    def add(name, num, den, key, op, lim, larger=True):
        if any(k[0] == num for k in runs) and any(k[0] == den for k in runs):
            checks.append((name, paired(runs, num, runs, den, key, larger), op, lim))

    add("int4 decoding >= 1.6x our int8 (best threads each)", "ours-int4", "ours-int8", dec, ">=", 1.6)
    add("llama.cpp's Q4_0 file: our decoding >= 1.0x llama.cpp's", "ours-int4-q4_0", "llama-q4_0", dec, ">=", 1.0)
    add("our int4 from the same weights >= 1.0x llama.cpp Q4_K_M", "ours-int4", "llama-q4_k_m", dec, ">=", 1.0)
    add("llama.cpp's Q4_K_M file: our decoding >= 1.0x llama.cpp's", "ours-int4-q4_k_m", "llama-q4_k_m", dec, ">=",
        1.0)
    for ours, theirs in (("ours-int4-q4_0", "llama-q4_0"), ("ours-int4", "llama-q4_k_m")):
        r, t = runs.get((ours, 2), {}), runs.get((theirs, 2), {})
        if "512" in r.get("prefill", {}) and "512" in t.get("prefill", {}):
            checks.append((f"{LABEL[ours]}: prefill of 512 >= 2x as fast as {LABEL[theirs]} (speed ratio)",
                           t["prefill"]["512"] / r["prefill"]["512"], ">=", 2.0))
    add("llama.cpp's Q4_0 file opens warm in <= 2x llama.cpp's time", "ours-int4-q4_0", "llama-q4_0", "load_s", "<=",
        2.0, larger=False)
    add("llama.cpp's Q4_K_M file opens warm in <= 2x llama.cpp's time", "ours-int4-q4_k_m", "llama-q4_k_m", "load_s",
        "<=", 2.0, larger=False)
    for n in ("ours-int4", "ours-int4-q4_0", "ours-int4-q4_k_m"):
        if (n, 2) in runs and n in sizes:
            checks.append((f"{LABEL[n]}: peak RSS of a generation <= 1.2x the weights' size",
                           runs[(n, 2)]["peak_rss_mib"] * 2**20 / sizes[n], "<=", 1.2))
    md += targets_md(checks)
    r = runs.get(("ours-int4", 2), {})
    if r.get("bandwidth_gbps") and r.get("step_bytes"):
        bound = r["bandwidth_gbps"] * 1e9 / r["step_bytes"]
        best4 = max(v for (n, _), rec in runs.items() if n == "ours-int4" for v in [rec[dec]])
        md += ["", f"The memory read bandwidth measured by the int4 run (2 threads), {r['bandwidth_gbps']:.1f} GB/s, "
                   f"bounds int4 decoding at {bound:.1f} tokens/s ({r['step_bytes'] / 1e6:.0f} MB read per token, the "
                   f"int8 head included); int4 decodes at {100 * best4 / bound:.0f}% of it at its best."]
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "quant.md")
    with open(path, "w") as f:
        f.write("\n".join(md) + "\n")
    print(f"report_quant: wrote {path}")


if __name__ == "__main__":
    main()
