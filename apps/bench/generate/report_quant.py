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
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from machine import cpu_family, cpu_flags, machine  # noqa: E402  (apps/bench/machine.py: the same machine line as every page)
from report_scale import fmt, size_of, targets_md  # noqa: E402
from report_weights import load, paired  # noqa: E402

ORDER = ["ours-int8", "ours-int4", "ours-int4-q4_0", "ours-int4-q4_k_m", "llama-q8_0", "llama-q4_0", "llama-q4_k_m"]
LABEL = {"ours-int8": "torchattn int8", "ours-int4": "torchattn int4 (its own folder)",
         "ours-int4-q4_0": "torchattn int4, llama.cpp's Q4_0 file",
         "ours-int4-q4_k_m": "torchattn int4, llama.cpp's Q4_K_M file",
         "llama-q8_0": "llama.cpp Q8_0", "llama-q4_0": "llama.cpp Q4_0", "llama-q4_k_m": "llama.cpp Q4_K_M"}


SMOL = [("ours:float32", "torchattn float32 (the folder)", "ours:float32"),
        ("ours:int8", "torchattn int8 (quantized at load)", "ours:float32"),
        ("ours:int4", "torchattn int4 (quantized at load)", "ours:float32"),
        ("ours:F32 file", "torchattn, llama.cpp's F32 file", "ours:float32"),
        ("ours:Q4_0 file", "torchattn int4, llama.cpp's Q4_0 file", "ours:float32"),
        ("ours:Q4_0 file, float32", "torchattn float32, llama.cpp's Q4_0 file", "ours:float32"),
        ("ours:Q4_1 file", "torchattn int4, llama.cpp's Q4_1 file", "ours:float32"),
        ("ours:Q4_1 file, float32", "torchattn float32, llama.cpp's Q4_1 file", "ours:float32"),
        ("llama:F32", "llama.cpp F32", "llama:F32"), ("llama:Q4_0", "llama.cpp Q4_0", "llama:F32"),
        ("llama:Q4_1", "llama.cpp Q4_1", "llama:F32")]
SCALE = [("ours:int8", "torchattn int8 (its own folder)"), ("ours:int4", "torchattn int4 (its own folder)"),
         ("ours:Q4_0 file", "torchattn int4, llama.cpp's Q4_0 file"),
         ("ours:Q4_1 file", "torchattn int4, llama.cpp's Q4_1 file"),
         ("ours:Q4_K_M file", "torchattn int4, llama.cpp's Q4_K_M file"),
         ("llama:Q4_0", "llama.cpp Q4_0"), ("llama:Q4_1", "llama.cpp Q4_1"), ("llama:Q4_K_M", "llama.cpp Q4_K_M")]


def rise(q, name, base):
    """A run's perplexity over its runtime's float32, in percent."""
    return 100 * (q["smollm2"][name]["perplexity"] / q["smollm2"][base]["perplexity"] - 1)


def quality_checks(q):
    """The quality targets: int4's rise against llama.cpp's at 5.0 bits a weight, and our runs
    of llama.cpp's files against llama.cpp's perplexity on them."""
    s = q["smollm2"]
    checks = []
    if "ours:int4" in s and "llama:Q4_1" in s:
        checks.append(("SmolLM2: our int4's perplexity rise over our float32, percent, <= llama.cpp Q4_1's over its "
                       f"F32 ({rise(q, 'llama:Q4_1', 'llama:F32'):.3f}; 5.0 bits a weight each)",
                       rise(q, "ours:int4", "ours:float32"), "<=", rise(q, "llama:Q4_1", "llama:F32")))
    k = q["scale"]
    if "ours:int4" in k and "llama:Q4_1" in k:
        checks.append(("1B-shaped: our int4's KL divergence from float32 <= llama.cpp Q4_1's (5.0 bits a weight each)",
                       k["ours:int4"]["kl_mean"], "<=", k["llama:Q4_1"]["kl_mean"]))
    for kind in ("Q4_0", "Q4_1"):
        if f"ours:{kind} file" in s and f"llama:{kind}" in s:
            ours, theirs = s[f"ours:{kind} file"]["perplexity"], s[f"llama:{kind}"]["perplexity"]
            checks.append((f"SmolLM2, llama.cpp's {kind} file: our perplexity (int4) within 1% of llama.cpp's, "
                           "percent", 100 * abs(ours / theirs - 1), "<=", 1.0))
    return checks


def quality_md(q):
    """The Quality section: SmolLM2's perplexity and the 1B-shaped model's KL divergence."""
    t, s, k = q["text"], q["smollm2"], q["scale"]
    md = ["", "## Quality", "",
          f"Perplexity of SmolLM2-135M-Instruct over {t['tokens']} tokens of {t['source']} (`quant_quality.py`: whole "
          f"topics in name order, {t['characters']} characters), in {t['windows']} windows of {t['context']} tokens "
          f"each scored alone ({t['scored']} tokens scored), the same token ids for every run: ours by "
          "`torchattn_perplexity`, llama.cpp's by llama-cpp-python "
          f"{q['llama_cpp_python']} from the logits of every position. llama.cpp's files come from its converter "
          "(F32) and quantizer (Q4_0, Q4_1) as above; its quantizer keeps the tied table in Q8_0 (576 inputs are not "
          "a multiple of Q6_K's 256).", "",
          "| SmolLM2-135M: runtime, weights | perplexity | against its runtime's float32 |", "|---|---|---|"]
    for name, label, base in SMOL:
        if name in s:
            md.append(f"| {label} | {s[name]['perplexity']:.4f} | {rise(q, name, base):+.3f}% |")
    grid = s.get("head_grid")
    if grid and "llama:Q4_1" in s and "ours:Q4_1 file, float32" in s:
        md += ["", "SmolLM2's weights here were dequantized from a GGUF file (tools/convert_smollm2.py): its layers lie "
               "on Q4_1's grid and its tied table on Q8_0's. So every Q4_1 run holds the layers exactly, and our "
               "float32 run of the Q4_1 file has float32's perplexity "
               f"({s['ours:Q4_1 file, float32']['perplexity']:.4f}): llama.cpp Q4_1's rise is its computation alone "
               "(each input quantized to int8 per 32). Ours adds the head: an int4 model keeps its head in our int8, "
               "a scale per 64 inputs, which holds the table with a relative RMS error of "
               f"{100 * grid['int8_per_64']:.2f}% where Q8_0's 32 hold it with {100 * grid['int8_per_32']:.2f}%. "
               "The int8 row (int8 everywhere) shows what that scheme costs alone. Q4_0 (no offset: each group "
               "symmetric about 0) cannot hold a Q4_1 grid, in either runtime."]
    md += ["", f"KL divergence of the next-token distributions against float32 on the 1B-shaped model, over "
           f"{k['windows']} windows of {t['context']} tokens of the same text (random weights: a perplexity in the "
           "tens of thousands, the distributions near flat, so the top token agrees less often than on a trained "
           "model): ours against our float32 folder, llama.cpp's against its F32 file, as llama-perplexity "
           "`--kl-divergence` reports it (the mean over tokens of sum p32 (log p32 - log q)).", "",
           "| 1B-shaped: runtime, weights | weights, MB | perplexity | KL mean | KL median | KL 99th percentile | same top token |",
           "|---|---|---|---|---|---|---|"]
    for name, label in SCALE:
        if name in k:
            r = k[name]
            md.append(f"| {label} | {r['bytes'] / 1e6:.0f} | {r['perplexity']:.1f} | {r['kl_mean']:.4f} | "
                      f"{r['kl_median']:.4f} | {r['kl_p99']:.4f} | {100 * r['top1_same']:.1f}% |")
    if "ours:int4" in k and "llama:Q4_1" in k:
        md += ["", f"On these weights, which lie on no grid, our int4 (5.0 bits a weight in the layers) diverges from "
               f"float32 by KL {k['ours:int4']['kl_mean']:.4f}, llama.cpp's Q4_1 (the same bits) by "
               f"{k['llama:Q4_1']['kl_mean']:.4f}; our runs of llama.cpp's Q4_0 and Q4_1 files give llama.cpp's own "
               "divergence (the same blocks, the same scheme of int8 inputs)."]
    if "ours:Q4_K_M file" in k and "llama:Q4_K_M" in k:
        md += ["", f"Our run of the Q4_K_M file diverges more than llama.cpp's ({k['ours:Q4_K_M file']['kl_mean']:.4f} "
               f"against {k['llama:Q4_K_M']['kl_mean']:.4f}): its Q4_K tensors keep their values, but its Q6_K ones "
               "(half the layers' value and down projections: the tensors llama-quantize keeps in more bits because "
               "they cost the most) are quantized again to our int4, and its output table to our int8. Running Q6_K "
               "as it is, or as int8, is what closes that gap."]
    if "llama:F32" in k and "ours:float32" in k:
        x = k["llama:F32"]["ours_float32_against_it"]
        md += ["", f"Float32 against float32: our folder's distributions against llama.cpp's F32 file's, KL "
               f"{x['kl_mean']:.2e} (perplexity {k['ours:float32']['perplexity']:.1f} and "
               f"{k['llama:F32']['perplexity']:.1f}): the two runtimes compute the same model."]
    return md


def serve_ratios(j):
    """int4's tokens/s over int8's, a round at a time."""
    by = {(r["round"], r["dtype"]): r for r in j["runs"]}
    return [by[(r, "int4")]["tokens_per_s"] / by[(r, "int8")]["tokens_per_s"] for r in range(1, j["rounds"] + 1)]


def serving_md(j):
    """The int4 server against the int8 server, round by round."""
    by = {(r["round"], r["dtype"]): r for r in j["runs"]}
    md = ["", "## The int4 server against our int8 server", "",
          f"`apps/bench/serve/bench_serve_formats.py --formats int8,int4` on SmolLM2-135M-Instruct: {j['clients']} "
          f"clients, each streaming two chat completions of {j['new_tokens']} tokens back to back, against "
          f"`torchattn_serve --dtype int8` and then `--dtype int4`, {j['rounds']} interleaved rounds, {j['threads']} "
          "server threads and the clients on the same cores. A step is one forward of the engine over every running "
          "request's rows (16 decoding rows: the few-rows kernels); its time is the run's wall time over its steps.",
          "", "| round | int8 tokens/s | int8 steps, ms a step | int4 tokens/s | int4 steps, ms a step | int4 / int8 |",
          "|---|---|---|---|---|---|"]
    for r, ratio in zip(range(1, j["rounds"] + 1), serve_ratios(j)):
        e, f = by[(r, "int8")], by[(r, "int4")]
        md.append(f"| {r} | {e['tokens_per_s']:.1f} | {e['steps']}, {e['step_ms']:.1f} | {f['tokens_per_s']:.1f} | "
                  f"{f['steps']}, {f['step_ms']:.1f} | {ratio:.2f}x |")
    md += ["", "At 16 rows a step of a 135M model is bound by the products more than by reading the weights. The "
           "few-rows kernels (`int4_rows.cpp`) unpack each pair of groups of four weight rows once for every row of "
           "x in the step, and on AVX2 sum the four rows' products of both groups into one register (vpmaddubsw, "
           "vphaddw, vpmaddwd) and scale four outputs per instruction with the portable loop's float32 operations, "
           "in its order: a request's tokens do not depend on how many others share its step."]
    if statistics.median(serve_ratios(j)) < 1.0:
        md += ["", "Where int4 falls behind: its step reads fewer bytes than int8's and takes longer, so the "
               "products, not the weights' bytes, set the step's time; the prefill's tiles (which widen a panel once "
               "for all rows) sum in another order, so more rows are not sent to them."]
    return md


def layer_products(folder):
    """Multiply-adds of the decoder layers' linear maps per token, from a folder's config.json (None without)."""
    try:
        with open(os.path.join(folder, "config.json")) as f:
            c = json.load(f)
    except (OSError, ValueError):
        return None
    h, inter, layers = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    hd = c.get("head_dim") or h // c["num_attention_heads"]
    kv = c.get("num_key_value_heads", c["num_attention_heads"]) * hd
    return layers * (h * (h + 2 * kv) + h * h + 3 * h * inter)


def shortfalls_md(runs, folders):
    """Why int4 decoding stops short of 1.6x int8, and what the int4 prefill computes at, from the runs."""
    md = []
    e, f = runs.get(("ours-int8", 2), {}), runs.get(("ours-int4", 2), {})
    if e.get("step_bytes") and f.get("step_bytes"):
        md += ["", f"int4 against int8 at the bound: each token reads {e['step_bytes'] / 1e6:.0f} MB of int8 weights "
                   f"or {f['step_bytes'] / 1e6:.0f} MB of int4 ones, {e['step_bytes'] / f['step_bytes']:.3f}x fewer "
                   "bytes: an int4 model keeps its head (the tied table, 49152 x 2048) in int8 for its quality "
                   "(below), so even two runs at the same bandwidth stay under 1.6x."]
    macs = layer_products(folders.get("ours-int4", ""))
    pre = (f.get("prefill") or {}).get("512")
    if macs and pre:
        rate = 512 * macs / pre / 1e9
        md += ["", f"The int4 prefill of 512 tokens is almost all the layers' products ({512 * macs / 1e9:.0f} G "
                   f"multiply-adds): {rate:.0f} G a second over 2 threads, by the int4 tiles (`int4_tiles.cpp`: a "
                   "panel's 4-bit values widened to bytes once, vpmaddubsw against x's bytes). AVX2 has no "
                   "instruction that multiplies bytes and accumulates in int32 (AVX-512 VNNI's vpdpbusd), so each "
                   "32 products take a vpmaddubsw and an add, and each group of 32 inputs a vpmaddwd; passing two or "
                   "four rows of x over each load of a panel's bytes (fewer loads) was tried and ran no faster, so "
                   "the tiles are bound by those instructions, not by reading memory or the caches."]
    return md


def rss_md(runs, sizes):
    """What a 4-bit generation's peak RSS holds beside its weights, from the runs' JSON."""
    md = []
    for n in ("ours-int4", "ours-int4-q4_0", "ours-int4-q4_k_m"):
        r = runs.get((n, 2), {})
        if n not in sizes or not r.get("weight_bytes") or not r.get("peak_rss_mib"):
            continue
        held, peak, size = r["weight_bytes"], r["peak_rss_mib"] * 2**20, sizes[n]
        md.append(f"- {LABEL[n]}: peak {peak / 2**20:.0f} MiB = {held / 2**20:.0f} MiB of weights held "
                  f"({held / size:.3f}x the {size / 2**20:.0f} MiB file) + {(peak - held) / 2**20:.0f} MiB beside "
                  f"them ({peak / size:.3f}x the file in all).")
    if not md:
        return []
    return ["", "## Peak RSS", "",
            "What each 4-bit run holds (the weights' bytes as the run reports them, against its file's size). Beside "
            "the weights: LibTorch's own heap and code (its operator registry alone is about 21 MB of heap, "
            "heaptrack), the tokenizer, the KV cache and the activations; the prefill's tiles repack at most 2 MB of "
            "panels a thread at a time. From llama.cpp's files our int4 holds more than the file: Q4_0's and Q4_K's "
            "blocks become a (d, m) pair per 32 weights (0.625 bytes a weight against their 0.5625), and the tied "
            "table, Q6_K in both files (0.8203 bytes a weight), becomes our int8 head (1.0625), so those two rows "
            "cannot meet 1.2x the file until those blocks run as they are and the head keeps the file's Q6_K.",
            ""] + md


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", nargs="+", required=True)
    ap.add_argument("--folders", nargs="*", default=[])
    ap.add_argument("--out", default="apps/bench/results")
    ap.add_argument("--quality", help="quant_quality.py's JSON: the perplexity and KL divergence section")
    ap.add_argument("--serve-formats", help="bench_serve_formats.py --formats int8,int4's JSON: the servers in rounds")
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
    quality = None
    if a.quality:
        with open(a.quality) as f:
            quality = json.load(f)
        checks += quality_checks(quality)
    serving = None
    if a.serve_formats:
        with open(a.serve_formats) as f:
            serving = json.load(f)
        checks.append(("torchattn_serve int4, 16 clients >= our int8 server (SmolLM2-135M; the median of the rounds' "
                       "ratios)", statistics.median(serve_ratios(serving)), ">=", 1.0))
    md += targets_md(checks)
    r = runs.get(("ours-int4", 2), {})
    if r.get("bandwidth_gbps") and r.get("step_bytes"):
        bound = r["bandwidth_gbps"] * 1e9 / r["step_bytes"]
        best4 = max(v for (n, _), rec in runs.items() if n == "ours-int4" for v in [rec[dec]])
        md += ["", f"The memory read bandwidth measured by the int4 run (2 threads), {r['bandwidth_gbps']:.1f} GB/s, "
                   f"bounds int4 decoding at {bound:.1f} tokens/s ({r['step_bytes'] / 1e6:.0f} MB read per token, the "
                   f"int8 head included); int4 decodes at {100 * best4 / bound:.0f}% of it at its best."]
    md += shortfalls_md(runs, folders)
    md += rss_md(runs, sizes)
    if quality:
        md += quality_md(quality)
    if serving:
        md += serving_md(serving)
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "quant.md")
    with open(path, "w") as f:
        f.write("\n".join(md) + "\n")
    print(f"report_quant: wrote {path}")


if __name__ == "__main__":
    main()
