#!/usr/bin/env python3
"""Packed documents (issue: padding-free training): apps/bench/results/packed.md.

Runs, one process each, on this machine:
- torchattn_bench_packed: MultiHeadAttention(768, 12 heads) forward and
  forward+backward on 64 documents of 256 tokens packed (forward_packed, N = 16384)
  against the same documents as a [64, 256] batch (time and peak RSS); the attention
  core alone (functional::attention_packed) against ATen's causal
  scaled_dot_product_attention over one sequence of 16384 tokens;
- train_gpt on the fortunes (each one a document) with --pack and with --pad: the same
  documents a step, useful tokens per second (padding not counted), eval loss, peak RSS;
- train_gpt at context 2048 with and without --checkpoint-activations: time and peak RSS.
Each ratio is taken from one run of each side, the sides interleaved, --rounds times;
the page gives the median ratio over the rounds and each side's median.

Usage: bench_packed.py --build DIR [--rounds 3] [--out apps/bench/results/packed.md] [--quick]
"""

import argparse
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..")


def cpu_model_and_flags():
    model, flags = platform.processor() or "unknown CPU", []
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
        m = re.search(r"^model name\s*:\s*(.*)$", text, re.M)
        if m:
            model = m.group(1).strip()
        m = re.search(r"^flags\s*:\s*(.*)$", text, re.M)
        if m:
            have = set(m.group(1).split())
            flags = [f for f in ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_tile")
                     if f in have]
    except OSError:
        pass
    return model, flags


def run_case(bench, case, threads, reps, extra=()):
    out = subprocess.run([bench, "--case", case, "--threads", str(threads), "--reps", str(reps), *extra],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_train(train_gpt, args, threads, env=None):
    with tempfile.TemporaryDirectory() as out_dir:
        cmd = [train_gpt, "--threads", str(threads), "--out", out_dir, "--sample-tokens", "0", "--save-every", "0",
               *args]
        r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})})
        if r.returncode != 0:
            sys.exit(f"bench_packed: {' '.join(cmd)} failed:\n{r.stderr}")
    err = r.stderr
    m = re.search(r"(\d+) useful tokens in ([\d.]+) s \(([\d.]+) tokens/s\); peak RSS ([\d.]+) MiB", err)
    evals = re.findall(r"eval loss ([\d.]+)", err)
    lengths = re.search(r"training text: (.*)", err)
    return {"tokens": int(m.group(1)), "seconds": float(m.group(2)), "tokens_per_s": float(m.group(3)),
            "peak_rss_mib": float(m.group(4)), "eval_loss": float(evals[-1]) if evals else float("nan"),
            "lengths": lengths.group(1) if lengths else ""}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=os.path.join(ROOT, "apps", "bench", "results", "packed.md"))
    ap.add_argument("--json")
    ap.add_argument("--quick", action="store_true", help="small shapes, one round (a smoke run)")
    a = ap.parse_args()
    bench = os.path.join(a.build, "apps", "bench", "packed", "torchattn_bench_packed")
    train_gpt = os.path.join(a.build, "apps", "train_gpt", "train_gpt")
    rounds = 1 if a.quick else a.rounds
    shape = ["--docs", "8", "--len", "64"] if a.quick else []
    reps = 1 if a.quick else 3
    doc_steps = "3" if a.quick else "40"
    ckpt_ctx, ckpt_steps = ("256", "2") if a.quick else ("2048", "3")
    model = ["--d-model", "256", "--layers", "4", "--heads", "4"]

    res = {k: [] for k in ("module-packed", "module-batch", "core-packed", "core-long", "pack", "pad", "plain",
                           "checkpointed", "plain-glibc", "checkpointed-glibc")}
    # train_gpt fixes glibc's mmap threshold at 1 MiB (--mmap-threshold), so that large
    # tensors are mapped and unmapped and the peak RSS follows what is live; the -glibc
    # runs keep glibc's own threshold, which rises as large blocks are freed (the heap
    # then keeps freed activations, and the peak RSS counts that fragmentation too).
    glibc = ["--mmap-threshold", "0"]
    for r in range(rounds):
        print(f"[packed] round {r + 1}/{rounds}", file=sys.stderr, flush=True)
        for case in ("module-packed", "module-batch", "core-packed", "core-long"):
            res[case].append(run_case(bench, case, a.threads, reps, shape))
            print(f"[packed]   {case}: {res[case][-1]}", file=sys.stderr, flush=True)
        docs_args = ["--steps", doc_steps, "--batch-size", "16", "--context", "512", "--eval-every", "0",
                     "--eval-batches", "4", *model]
        res["pack"].append(run_train(train_gpt, docs_args + ["--pack"], a.threads))
        res["pad"].append(run_train(train_gpt, docs_args + ["--pad"], a.threads))
        print(f"[packed]   pack {res['pack'][-1]['tokens_per_s']:.0f} tok/s, pad {res['pad'][-1]['tokens_per_s']:.0f}",
              file=sys.stderr, flush=True)
        ckpt_args = ["--steps", ckpt_steps, "--batch-size", "4", "--context", ckpt_ctx, "--eval-every", "0",
                     "--eval-batches", "1", "--warmup", "1", "--d-model", "256", "--layers", "8", "--heads", "4"]
        res["plain"].append(run_train(train_gpt, ckpt_args, a.threads))
        res["checkpointed"].append(run_train(train_gpt, ckpt_args + ["--checkpoint-activations"], a.threads))
        res["plain-glibc"].append(run_train(train_gpt, ckpt_args + glibc, a.threads))
        res["checkpointed-glibc"].append(
            run_train(train_gpt, ckpt_args + glibc + ["--checkpoint-activations"], a.threads))
        print(f"[packed]   checkpointing: {res['plain'][-1]['peak_rss_mib']:.0f} -> "
              f"{res['checkpointed'][-1]['peak_rss_mib']:.0f} MiB", file=sys.stderr, flush=True)

    def med(case, key):
        return statistics.median(x[key] for x in res[case])

    def ratio(num, den, key):
        return statistics.median(n[key] / d[key] for n, d in zip(res[num], res[den]))

    targets = [
        ("module forward+backward, packed against the [64, 256] batch (time ratio)",
         ratio("module-packed", "module-batch", "forward_backward_s"), "<= 1.5", lambda x: x <= 1.5),
        ("module forward+backward, packed against the [64, 256] batch (peak RSS ratio)",
         ratio("module-packed", "module-batch", "peak_rss_mib"), "<= 1.2", lambda x: x <= 1.2),
        ("attention core, one 16384-token sequence against packed (forward speed-up)",
         ratio("core-long", "core-packed", "forward_s"), ">= 20", lambda x: x >= 20),
        ("attention core, one 16384-token sequence against packed (forward+backward speed-up)",
         ratio("core-long", "core-packed", "forward_backward_s"), ">= 20", lambda x: x >= 20),
        ("train_gpt --pack against --pad, useful tokens/s", ratio("pack", "pad", "tokens_per_s"), ">= 1.5",
         lambda x: x >= 1.5),
        ("train_gpt --checkpoint-activations at context 2048, peak RSS ratio",
         ratio("checkpointed", "plain", "peak_rss_mib"), "<= 0.5", lambda x: x <= 0.5),
        ("train_gpt --checkpoint-activations at context 2048, time ratio",
         ratio("checkpointed", "plain", "seconds"), "<= 1.4", lambda x: x <= 1.4),
        ("(not a target: glibc's own mmap threshold on both sides) checkpointing's peak RSS ratio",
         ratio("checkpointed-glibc", "plain-glibc", "peak_rss_mib"), "<= 0.5", lambda x: x <= 0.5),
        ("(not a target: glibc's own mmap threshold on both sides) checkpointing's time ratio",
         ratio("checkpointed-glibc", "plain-glibc", "seconds"), "<= 1.4", lambda x: x <= 1.4),
    ]
    cpu, flags = cpu_model_and_flags()
    import torch  # the versions line only
    md = ["# Packed documents: no padding, attention within each document", "",
          "Made by `bash apps/bench/run.sh --packed-only` (apps/bench/packed/bench_packed.py): each configuration in a process "
          f"of its own, the sides interleaved, {rounds} round{'s' if rounds > 1 else ''}; each figure below is that "
          "configuration's median over the rounds and each ratio the median of the rounds' ratios. "
          f"{a.threads} intra-op threads.", "",
          f"- machine: {cpu}, {os.cpu_count()} cores, Linux {platform.machine()}",
          f"- CPU flags: {', '.join(flags)}",
          f"- torch {torch.__version__} (LibTorch), {datetime.date.today().isoformat()}", "",
          "## The module and the attention core", "",
          "`torchattn_bench_packed`: MultiHeadAttention(768, 768, 12 heads, qkv bias), x with a gradient, "
          f"forward and forward+backward (every weight's gradient too), median of {reps} after a warm-up. "
          "Packed: 64 documents of 256 tokens end to end (`forward_packed`, N = 16384); batch: the same as x "
          "[64, 256, 768]. The core: q, k, v [1, 12, 16384, 64] through `functional::attention_packed` (causal "
          "within each document) against ATen's `scaled_dot_product_attention(is_causal=true)` over them as one "
          "sequence. Peak RSS: the process's.", "",
          "| configuration | forward, s | forward+backward, s | peak RSS, MiB |", "|---|---|---|---|"]
    names = {"module-packed": "module, 64 documents packed", "module-batch": "module, [64, 256] batch",
             "core-packed": "core, packed (attention_packed)", "core-long": "core, one sequence of 16384 (ATen SDPA)"}
    for case, name in names.items():
        md.append(f"| {name} | {med(case, 'forward_s'):.4f} | {med(case, 'forward_backward_s'):.4f} | "
                  f"{med(case, 'peak_rss_mib'):.0f} |")
    md += ["", "## Training: packed, padded, checkpointed", "",
           "train_gpt (d_model 256, 4 layers, 4 heads) on the fortunes, each fortune a document (longer ones cut at "
           f"513 bytes): {res['pack'][0]['lengths']}.", "",
           f"`--pack` and `--pad` draw the same 16 documents a step for {doc_steps} steps, context 512: the same "
           "documents, the same loss (the mean over tokens with a target), one packed row against a batch padded to "
           "the step's longest. Useful tokens: those with a target (padding not counted). Eval loss: held-out "
           "documents, after the same documents.", "",
           "| train_gpt | useful tokens/s | eval loss | peak RSS, MiB | seconds |", "|---|---|---|---|---|"]
    for case, name in (("pack", "--pack"), ("pad", "--pad")):
        md.append(f"| {name} | {med(case, 'tokens_per_s'):.0f} | {med(case, 'eval_loss'):.4f} | "
                  f"{med(case, 'peak_rss_mib'):.0f} | {med(case, 'seconds'):.1f} |")
    md += ["", f"Activation checkpointing: the default fixed windows at context {ckpt_ctx}, batch 4, {ckpt_steps} "
           "steps, d_model 256, 8 blocks, with and without `--checkpoint-activations` (torchattn::checkpoint around "
           "each block). train_gpt fixes glibc's mmap threshold at 1 MiB (`--mmap-threshold`, its default): "
           "tensors of 1 MiB or more are mapped and unmapped, and the RSS follows what is live (at the cost of "
           "page faults). Each also with glibc's own threshold (`--mmap-threshold 0`), which rises as large blocks "
           "are freed, so that a step's activations come from the heap, which keeps what it freed: the peak RSS "
           "then counts the heap's fragmentation too.", "",
           "| activations | tokens/s | peak RSS, MiB | seconds |", "|---|---|---|---|"]
    for case, name in (("plain", "kept (the default)"), ("checkpointed", "recomputed (--checkpoint-activations)"),
                       ("plain-glibc", "kept, glibc's own mmap threshold"),
                       ("checkpointed-glibc", "recomputed, glibc's own mmap threshold")):
        md.append(f"| {name} | {med(case, 'tokens_per_s'):.0f} | {med(case, 'peak_rss_mib'):.0f} | "
                  f"{med(case, 'seconds'):.1f} |")
    md += ["", "## Targets", "", "| target | measured | met |", "|---|---|---|"]
    for name, value, want, ok in targets:
        md.append(f"| {name} {want} | {value:.3f} | {'yes' if ok(value) else '**no**'} |")
    md.append("")
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        f.write("\n".join(md))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    print(f"bench_packed: wrote {a.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
