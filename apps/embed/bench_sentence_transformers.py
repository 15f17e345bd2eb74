#!/usr/bin/env python3
"""sentence-transformers' encode at batch 1 (one call per sentence) and batch 32 (one
call for 32 sentences) on all-MiniLM-L6-v2, medians of repeated runs; the same
measurements as apps/embed/bench_embed.cpp, which reads the sentences this writes.

Sentences: about 20 words each, consecutive words of the fortunes text (Debian's
`fortunes` package; the first 64 chunks).

Usage: bench_sentence_transformers.py --model DIR --sentences-out FILE [--threads 2] [--json out.json] [--quick]
"""

import argparse
import json
import statistics
import time

import torch
from sentence_transformers import SentenceTransformer

FORTUNES = "/usr/share/games/fortunes/fortunes"


def sentences(n=64, words=20):
    text = open(FORTUNES, encoding="utf-8", errors="replace").read().split()
    text = [w for w in text if w != "%"]
    return [" ".join(text[i * words:(i + 1) * words]) for i in range(n)]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--sentences-out", required=True)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json")
    p.add_argument("--quick", action="store_true")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    s = sentences()
    with open(a.sentences_out, "w", encoding="utf-8") as f:
        f.write("\n".join(s) + "\n")
    model = SentenceTransformer(a.model, device="cpu")
    kw = dict(convert_to_tensor=True, show_progress_bar=False)
    batch = s[:32]
    singles = s[:16] if a.quick else s
    with torch.inference_mode():
        model.encode(batch, batch_size=32, **kw)  # warm-up
        one, many = [], []
        for _ in range(2 if a.quick else 5):
            t = time.perf_counter()
            for x in singles:
                model.encode([x], batch_size=1, **kw)
            one.append(len(singles) / (time.perf_counter() - t))
        for _ in range(2 if a.quick else 7):
            t = time.perf_counter()
            model.encode(batch, batch_size=32, **kw)
            many.append(32 / (time.perf_counter() - t))
    r = {"tool": "sentence-transformers", "threads": torch.get_num_threads(),
         "batch1_per_s": statistics.median(one), "batch32_per_s": statistics.median(many)}
    print(f"sentence-transformers: {r['threads']} threads: batch 1 {r['batch1_per_s']:.1f} sentences/s, "
          f"batch 32 {r['batch32_per_s']:.1f} sentences/s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(r, f)


if __name__ == "__main__":
    main()
