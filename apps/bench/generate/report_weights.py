#!/usr/bin/env python3
"""apps/bench/results/weights.md: SmolLM2-135M's weight formats on the CPU. torchattn
in float32, bfloat16, int8 and dynamic-int8 (torchattn_generate_bench --dtype, at 1 and 2 threads)
beside CTranslate2 int8 and float32 (ctranslate2_generate.py, the same threads) and, with
--llama, llama.cpp F32 and Q8_0 (llama_cpp_generate.py, the same threads), with the
perplexity each format gives (check_perplexity.py --json), and the issue's targets.

With --serve FILE (bench_serve.py --server-args "--dtype int8"), torchattn_serve's 16
clients in int8 against transformers' batch-16 generate (float32) from that run; with
--serve-formats FILE (bench_serve_formats.py), the int8 server against our float32 server in
interleaved rounds; with --divergence FILE (greedy_divergence.py), where greedy tokens first differ from float32's.

Usage: report_weights.py --ours D:T:FILE ... --ct2 D:T:FILE ... [--llama D:T:FILE ...] --ppl FILE
       [--serve FILE] [--serve-formats FILE] [--divergence FILE] [--out DIR]
"""

import argparse
import datetime
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from machine import cpu_flags, machine  # noqa: E402  (apps/bench/machine.py: the same machine line as every page)


def load(items):
    """TYPE:THREADS:FILE items -> {(type, threads): record}. A (type, threads) named with
    several files (the bench's rounds) gets each number's median over them, and "rounds"."""
    groups = {}
    for item in items:
        dtype, threads, path = item.split(":", 2)
        groups.setdefault((dtype, int(threads)), []).append(json.load(open(path)))
    runs = {}
    for key, recs in groups.items():
        merged = dict(recs[0])
        for k, v in recs[0].items():
            if all(isinstance(r.get(k), (int, float)) and not isinstance(r.get(k), bool) for r in recs):
                merged[k] = statistics.median(r[k] for r in recs)
        merged["rounds"] = len(recs)
        merged["per_round"] = recs
        runs[key] = merged
    return runs


def paired(num, num_d, den, den_d, key, larger=True):
    """num_d's figure over den_d's, round by round (each side at its best thread count in
    that round), the median of those ratios: one round's runs are minutes apart, so the
    drift of a shared machine between rounds cancels out of each ratio. Without the same
    number of rounds on both sides, the ratio of the two sides' bests."""
    pick = max if larger else min

    def per_round(runs, d):
        recs = [r for (dd, _), r in runs.items() if dd == d]
        n = min(len(r["per_round"]) for r in recs)
        return [pick(r["per_round"][i][key] for r in recs) for i in range(n)]

    a, b = per_round(num, num_d), per_round(den, den_d)
    if len(a) != len(b):
        return best(num, num_d, key, larger)[0] / best(den, den_d, key, larger)[0]
    return statistics.median(x / y for x, y in zip(a, b))


def best(runs, dtype, key, larger=True):
    """The best of a format's thread counts: (value, threads)."""
    cands = [(r[key], t) for (d, t), r in runs.items() if d == dtype]
    return max(cands) if larger else min(cands)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ours", nargs="+", required=True)
    ap.add_argument("--ct2", nargs="+", required=True)
    ap.add_argument("--llama", nargs="+", default=[], help="llama_cpp_generate.py's JSON files as TYPE:THREADS:FILE")
    ap.add_argument("--ppl", required=True)
    ap.add_argument("--serve", help="bench_serve.py's JSON of an int8 server")
    ap.add_argument("--serve-formats", help="bench_serve_formats.py's JSON: int8 and float32 servers in rounds")
    ap.add_argument("--divergence", help="greedy_divergence.py's JSON")
    ap.add_argument("--out", default="apps/bench/results")
    a = ap.parse_args()
    ours, ct2, llama, ppl = load(a.ours), load(a.ct2), load(a.llama), json.load(open(a.ppl))
    # Decoding with the kernels capped to a narrower instruction set (TORCHATTN_ISA):
    # rows of their own, out of the ratios.
    capped = {k: r for k, r in ours.items() if "@" in k[0]}
    ours = {k: r for k, r in ours.items() if "@" not in k[0]}
    rounds = min(r["rounds"] for r in list(ours.values()) + list(ct2.values()) + list(llama.values()))
    md = ["# Weight formats: SmolLM2-135M-Instruct on the CPU", "",
          "Made by `bash apps/bench/run.sh --weights-only` (part of `make bench`): torchattn_generate_bench "
          "`--dtype float32|bfloat16|int8|dynamic-int8` (bfloat16 or int8 weights, float32 activations; int8 on an "
          "x86 CPU with AVX2 or AVX-512 VNNI quantizes its inputs per group of 64 too, in prefill and decoding, and "
          "sums int8 products; "
          "dynamic-int8: PyTorch's quantize_dynamic scheme, int8 inputs too; docs/models.md) and CTranslate2 (`ctranslate2_generate.py`, the folder converted with its own "
          "converter) one after the other, each at 1 and at 2 intra-op threads, in "
          f"{rounds} round{'s' if rounds > 1 else ''}: every runtime, format and thread count runs once a round, "
          "and each figure is that configuration's median over the rounds, so that a shared machine's drift "
          "falls on every side alike. Decoding: 128 new tokens after a "
          "32-token prompt, greedy, median of 3; prefill: the first token of a 512-token prompt, warm, median of 5; "
          "peak RSS after loading and generating, and the RSS then. torchattn's bfloat16 and int8 load from folders "
          "of their own weights (`torchattn_generate --dtype int8 --save DIR`, include/torchattn/models/"
          "saved_folder.h), which never build the float32 model; dynamic-int8 is quantized at load from the float32 "
          "folder (its packed form is not saved), and keeps the float32 embedding table as quantize_dynamic does.",
          "",
          f"- machine: {machine()}",
          f"- CPU flags: {cpu_flags()}",
          f"- CTranslate2 {next(iter(ct2.values()))['version']}"
          + (f", {next(iter(llama.values()))['version']} (llama.cpp built from its source for this CPU; GGUF "
             "files from its convert_hf_to_gguf.py, the weights column their size)" if llama else "")
          + f", {datetime.date.today().isoformat()}", "",
          "| runtime, weights | threads | decode, tokens/s | prefill 512, s | peak RSS, MiB | RSS after, MiB | "
          "weights, MB |",
          "|---|---|---|---|---|---|---|"]
    for (d, t), r in sorted(ours.items(), key=lambda kv: (["float32", "bfloat16", "int8", "dynamic-int8"].index(kv[0][0]), kv[0][1])):
        md.append(f"| torchattn {d} | {t} | {r['decode_tokens_per_s']:.1f} | {r['prefill_s']:.3f} | "
                  f"{r['peak_rss_mib']:.0f} | {r['rss_mib']:.0f} | {r['weight_bytes'] / 1e6:.0f} |")
    for (d, t), r in sorted(ct2.items()):
        md.append(f"| CTranslate2 {d} | {t} | {r['decode_tokens_per_s']:.1f} | {r['prefill_s']:.3f} | "
                  f"{r['peak_rss_mib']:.0f} | | |")
    for (d, t), r in sorted(llama.items()):
        md.append(f"| llama.cpp {d.upper()} | {t} | {r['decode_tokens_per_s']:.1f} | {r['prefill_s']:.3f} | "
                  f"{r['peak_rss_mib']:.0f} | | {r['gguf_bytes'] / 1e6:.0f} |")
    if capped:
        md += ["", "The kernels capped to a narrower instruction set than this CPU's (`TORCHATTN_ISA`, with ATen's "
               "`ATEN_CPU_CAPABILITY` and oneDNN's `ONEDNN_MAX_CPU_ISA` alike), as a CPU without the wider one runs "
               "them: decoding, 2 threads, one run.", "",
               "| weights, instruction set | decode, tokens/s |", "|---|---|"]
        for (d, t), r in sorted(capped.items()):
            fmt_d, isa = d.split("@")
            md.append(f"| torchattn {fmt_d}, TORCHATTN_ISA={isa} | {r['decode_tokens_per_s']:.1f} |")
    i8 = best(ours, "int8", "decode_tokens_per_s")
    # The bound of the best int8 run: the bandwidth it measured on its own threads.
    i8_run = ours[("int8", i8[1])]
    i8_bytes = i8_run.get("step_bytes", i8_run["weight_bytes"])
    bound = i8_run["bandwidth_gbps"] * 1e9 / i8_bytes
    md += ["", f"The memory read bandwidth measured by the best int8 run ({i8[1]} threads), "
               f"{i8_run['bandwidth_gbps']:.1f} GB/s, bounds int8 decoding at {bound:.0f} tokens/s ({i8_bytes / 1e6:.0f} "
               f"MB read per token); int8 decodes at {100 * i8[0] / bound:.0f}% of it.", "",
           f"## Perplexity", "",
           f"`torchattn_perplexity --context {ppl['context']}` over {ppl['text_tokens']} tokens of README.md and "
           f"docs/ ({ppl['scored']} scored), against transformers' float32 by the same definition "
           f"(tests/reference/check_perplexity.py):", "",
           "| weights | perplexity | against float32 |", "|---|---|---|",
           f"| transformers float32 | {ppl['transformers_float32']:.4f} | |"]
    p32 = ppl["torchattn"]["float32"]
    if "transformers_dynamic_int8" in ppl:
        for name, key in (("transformers quantize_dynamic'd", "transformers_dynamic_int8"),
                          ("the same, embeddings times 1 + 1e-7", "transformers_dynamic_int8_nudged")):
            md.append(f"| {name} | {ppl[key]:.4f} | {100 * (ppl[key] / p32 - 1):+.3f}% |")
    for d, p in ppl["torchattn"].items():
        md.append(f"| torchattn {d} | {p:.4f} | {100 * (p / p32 - 1):+.3f}% |")
    dec = "decode_tokens_per_s"
    rss = lambda d: min(r["peak_rss_mib"] for (dd, _), r in ours.items() if dd == d)
    checks = [
        ("int8 decoding >= 2.0x our float32 (best threads each)", paired(ours, "int8", ours, "float32", dec), ">=", 2.0),
        ("int8 decoding >= 1.3x CTranslate2 int8 (best threads each)", paired(ours, "int8", ct2, "int8", dec), ">=", 1.3),
        ("bfloat16 decoding >= 1.5x our float32", paired(ours, "bfloat16", ours, "float32", dec), ">=", 1.5),
        ("int8 prefill of 512 at least as fast as CTranslate2 int8 (time ratio)",
         paired(ours, "int8", ct2, "int8", "prefill_s", larger=False), "<=", 1.0),
        ("int8 peak RSS <= 0.45x float32's", rss("int8") / rss("float32"), "<=", 0.45),
        ("(not a target) int8 RSS after loading and generating, against float32's",
         min(r["rss_mib"] for (d, _), r in ours.items() if d == "int8") /
         min(r["rss_mib"] for (d, _), r in ours.items() if d == "float32"), "<=", 0.45),
        ("float32 perplexity equals transformers' (relative difference)",
         abs(p32 / ppl["transformers_float32"] - 1), "<=", 1e-4),
        ("bfloat16 perplexity rise", ppl["torchattn"]["bfloat16"] / p32 - 1, "<=", 0.005),
        ("int8 perplexity rise", ppl["torchattn"]["int8"] / p32 - 1, "<=", 0.010),
        ("moonshot: int8 decoding at >= 60% of its bandwidth bound", i8[0] / bound, ">=", 0.60),
    ]
    if ("dynamic-int8", 1) in ours or ("dynamic-int8", 2) in ours:
        checks.insert(4, ("(PyTorch's scheme, not a target) dynamic-int8 prefill of 512 at least as fast as "
                          "CTranslate2 int8 (time ratio)", paired(ours, "dynamic-int8", ct2, "int8", "prefill_s", larger=False), "<=", 1.0))
        checks.insert(5, ("(PyTorch's scheme, not a target) dynamic-int8 decoding against our float32",
                          paired(ours, "dynamic-int8", ours, "float32", dec), ">=", 2.0))
        md += ["", "PyTorch's scheme (dynamic-int8) quantizes each layer's input to 7 bits with one scale for the "
               "whole call: a prompt's outlier features set the step for all of it. It runs a prefill on int8 "
               "products (fbgemm), and its perplexity above shows what that costs on this model; a last-bit change "
               "of its float32 inputs moves its perplexity by the difference between the two transformers rows."]
    if llama:
        checks.insert(-1, ("float32 decoding >= 1.0x llama.cpp F32 (best threads each)",
                           paired(ours, "float32", llama, "f32", dec), ">=", 1.0))
        checks.append(("moonshot: int8 decoding ahead of llama.cpp Q8_0 (best threads each)",
                       paired(ours, "int8", llama, "q8_0", dec), ">=",
                       1.0))
    if a.serve:
        j = json.load(open(a.serve))
        runs = {r["clients"]: r for r in j["runs"]}
        hf = {r["batch"]: r for r in j["transformers"]}
        md += ["", "## Serving in int8", "",
               f"`apps/bench/serve/bench_serve.py --server-args \"{j['server_args']}\"` (the serving page's benchmark, "
               f"{j['threads']} server threads, the clients on the same cores), in the same run as transformers' "
               "batched `generate` in float32 on the same prompts:", "",
               "| clients | torchattn_serve int8, tokens/s | transformers batch, tokens/s | ratio |", "|---|---|---|---|"]
        for c in sorted(runs):
            if c in hf:
                md.append(f"| {c} | {runs[c]['tokens_per_s']:.1f} | {hf[c]['tokens_per_s']:.1f} | "
                          f"{runs[c]['tokens_per_s'] / hf[c]['tokens_per_s']:.2f}x |")
        after_rss = next(i for i, c in enumerate(checks) if c[0].startswith("(not a target) int8 RSS"))
        checks.insert(after_rss, ("torchattn_serve int8, 16 clients >= 2x transformers' batch-16 generate (float32)",
                          runs[16]["tokens_per_s"] / hf[16]["tokens_per_s"], ">=", 2.0))
    if a.serve_formats:
        j = json.load(open(a.serve_formats))
        by = {(r["round"], r["dtype"]): r for r in j["runs"]}
        md += ["", "## The int8 server against our float32 server", "",
               f"`apps/bench/serve/bench_serve_formats.py`: {j['clients']} clients, each streaming two chat completions "
               f"of {j['new_tokens']} tokens back to back, against `torchattn_serve --dtype float32` and then "
               f"`--dtype int8`, {j['rounds']} interleaved rounds, {j['threads']} server threads and the clients on "
               "the same cores. A step is one forward of the engine over every running request's rows (decoding "
               "rows and prompt chunks together); its time is the run's wall time over its steps.", "",
               "| round | float32 tokens/s | float32 steps, ms a step | int8 tokens/s | int8 steps, ms a step | "
               "int8 / float32 |", "|---|---|---|---|---|---|"]
        ratios = []
        for r in range(1, j["rounds"] + 1):
            f, q = by[(r, "float32")], by[(r, "int8")]
            ratios.append(q["tokens_per_s"] / f["tokens_per_s"])
            md.append(f"| {r} | {f['tokens_per_s']:.1f} | {f['steps']}, {f['step_ms']:.1f} | {q['tokens_per_s']:.1f} | "
                      f"{q['steps']}, {q['step_ms']:.1f} | {ratios[-1]:.2f}x |")
        checks.insert(next((i + 1 for i, c in enumerate(checks) if c[0].startswith("torchattn_serve int8")), len(checks)),
                      ("torchattn_serve int8, 16 clients >= our float32 server (median of the rounds' ratios)",
                       statistics.median(ratios), ">=", 1.0))
    if a.divergence:
        div = json.load(open(a.divergence))
        rows = div["prompts"]
        md += ["", "## Greedy tokens against float32", "",
               f"`apps/bench/generate/greedy_divergence.py`: `torchattn_generate --greedy` on {len(rows)} prompts, "
               f"{div['tokens']} new tokens each, in each format; the first new token (0-based) that differs from "
               "float32's, or `-` where all are equal.", "",
               "| prompt | bfloat16 | int8 |", "|---|---|---|"]
        for r in rows:
            cell = lambda v: "-" if v is None else str(v)
            md.append(f"| {r['prompt'].replace('|', '/')} | {cell(r['bfloat16'])} | {cell(r['int8'])} |")
        md += ["", "Equal to float32 over all " + str(div["tokens"]) + " tokens: " + ", ".join(
            f"{d} {sum(r[d] is None for r in rows)} of {len(rows)} prompts" for d in ("bfloat16", "int8")) + "."]
    md += ["", "## Targets", "",
           "A ratio of two runtimes or formats is taken round by round, each side at its best thread count in "
           "that round, and the median over the rounds is the figure; the table above gives each "
           "configuration's median over the rounds.", "",
           "| target | measured | met |", "|---|---|---|"]
    for name, val, op, lim in checks:
        ok = val >= lim if op == ">=" else val <= lim
        md.append(f"| {name} | {val:.4g} | {'yes' if ok else '**no**'} |")
    missing = (([] if a.serve else ["`torchattn_serve` in int8 (no --serve)"])
               + ([] if a.serve_formats else ["the int8 server against the float32 server (no --serve-formats)"])
               + ([] if llama else ["llama.cpp (no --llama)"]))
    if missing:
        md += ["", "Not measured here: " + ", ".join(missing) + "."]
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "weights.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print(f"wrote {os.path.join(a.out, 'weights.md')}")


if __name__ == "__main__":
    main()
