#!/usr/bin/env python3
"""sentence-transformers' encode at batch 1 (one call per sentence) and batch 32 (one
call for 32 sentences) on all-MiniLM-L6-v2, medians of repeated runs; the same
measurements as torchattn_embed_bench (apps/bench/embed/bench_embed.cpp), which reads the
sentences this writes; the timed rounds are the peers' harness's (harness.py).

Sentences: about 20 words each, consecutive words of the fortunes text (Debian's
`fortunes` package; the first 64 chunks).

Usage: sentence_transformers_embed.py --model DIR --sentences-out FILE [--threads 2] [--json out.json] [--quick]
"""

import argparse
import json
import statistics

import torch
from harness import rounds
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
        one = [len(singles) / t for t in rounds(2 if a.quick else 5, lambda: [
            model.encode([x], batch_size=1, **kw) for x in singles])]
        many = [32 / t for t in rounds(2 if a.quick else 7, lambda: model.encode(batch, batch_size=32, **kw))]
        # The floor under batch 1: the model's linear layers alone (torch.addmm with its
        # weights) on one sentence's rows, and transformers' forward without the rest
        # of encode.
        tok = model.tokenizer
        bert = model[0].auto_model
        rows = int(statistics.median(len(tok(x)["input_ids"]) for x in singles))
        linears = [m for name, m in bert.named_modules() if isinstance(m, torch.nn.Linear) and "pooler" not in name]
        inputs = {m.in_features: torch.randn(rows, m.in_features) for m in linears}

        def gemms():
            for m in linears:
                torch.addmm(m.bias, inputs[m.in_features], m.weight.t())

        encoded = [tok(x, return_tensors="pt") for x in singles]
        per_sentence_ms = 1e3 / len(singles)
        gemm_ms = [t * per_sentence_ms for t in rounds(2 if a.quick else 5, lambda: [gemms() for _ in singles])]
        forward_ms = [t * per_sentence_ms for t in rounds(2 if a.quick else 5, lambda: [bert(**e) for e in encoded])]
    r = {"tool": "sentence-transformers", "threads": torch.get_num_threads(),
         "batch1_per_s": statistics.median(one), "batch32_per_s": statistics.median(many),
         "batch1_rows": rows, "linear_layers": len(linears), "batch1_gemm_ms": statistics.median(gemm_ms),
         "batch1_transformers_forward_ms": statistics.median(forward_ms),
         "torch": torch.__version__, "sentence_transformers": __import__("sentence_transformers").__version__,
         "transformers": __import__("transformers").__version__}
    print(f"sentence-transformers: {r['threads']} threads: batch 1 {r['batch1_per_s']:.1f} sentences/s, "
          f"batch 32 {r['batch32_per_s']:.1f} sentences/s; the {len(linears)} linear layers alone on {rows} rows: "
          f"{r['batch1_gemm_ms']:.2f} ms")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(r, f)


if __name__ == "__main__":
    main()
