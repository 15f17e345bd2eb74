#!/usr/bin/env python3
"""CTranslate2's side of the weight formats' benchmark (apps/bench/results/weights.md):
the same SmolLM2 folder converted once per compute type (int8 or float32), then, as
torchattn_generate_bench measures it: decoding tokens/s after a 32-token prompt (128
new tokens, greedy, the median of 3), a warm prefill of 512 tokens (its first token,
the median of 5 after a warm-up) and the peak RSS, at the given intra-op threads.

Usage: .venv/bin/python apps/generate/bench_ctranslate2.py --model DIR --compute-type int8 --threads 1
           --work DIR [--json out.json] [--quick]
           [--name NAME] [--new-tokens N] [--long-prompts 512,2048] [--cold-load] [--decode-only]

The options after --quick as bench_llama_cpp.py's (--name: the converted folder's prefix
in --work, default ct2).
"""

import argparse
import json
import os
import random
import statistics
import time

import ctranslate2
from transformers import AutoTokenizer

from bench_common import lengths, peak_rss_mib, prefills, timed_loads


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--compute-type", default="int8", choices=["int8", "float32"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--work", required=True, help="where the converted models are kept")
    ap.add_argument("--json")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--name", default="ct2")
    ap.add_argument("--new-tokens", type=int)
    ap.add_argument("--long-prompts")
    ap.add_argument("--cold-load", action="store_true")
    ap.add_argument("--decode-only", action="store_true")
    a = ap.parse_args()
    out = os.path.join(a.work, f"{a.name}-{a.compute_type}")
    if not os.path.exists(os.path.join(out, "model.bin")):
        ctranslate2.converters.TransformersConverter(a.model).convert(out, quantization=a.compute_type, force=True)
    tok = AutoTokenizer.from_pretrained(a.model)

    gen, load_s, load_cold_s = timed_loads(
        lambda: ctranslate2.Generator(out, device="cpu", compute_type=a.compute_type, intra_threads=a.threads,
                                      inter_threads=1), out, a.cold_load)
    rng = random.Random(0)
    vocab = len(tok)
    new_tokens = a.new_tokens or (16 if a.quick else 128)
    long_prompts = [] if a.decode_only else lengths(a.long_prompts or ("128" if a.quick else "512"))
    prompt = tok.convert_ids_to_tokens([rng.randrange(100, vocab - 100) for _ in range(32)])
    decode = []
    for _ in range(1 if a.quick else 3):
        # The first token alone, then the whole run: decoding is the difference.
        t = time.perf_counter()
        gen.generate_batch([prompt], max_length=1, min_length=1, sampling_topk=1, include_prompt_in_result=False)
        first = time.perf_counter() - t
        t = time.perf_counter()
        r = gen.generate_batch([prompt], max_length=new_tokens, min_length=new_tokens, sampling_topk=1,
                               include_prompt_in_result=False)
        total = time.perf_counter() - t
        n = len(r[0].sequences_ids[0])
        if total <= first:  # a few tokens, timed as less than the first alone
            raise SystemExit(f"bench_ctranslate2: {n} tokens took {total:.4f} s, the first alone {first:.4f} s: "
                             "too few to time decoding; ask for more --new-tokens")
        decode.append((n - 1) / (total - first))
    peak_rss = peak_rss_mib()
    prefill_s = prefills(
        long_prompts, lambda n: tok.convert_ids_to_tokens([rng.randrange(100, vocab - 100) for _ in range(n)]),
        lambda ids: gen.generate_batch([ids], max_length=1, min_length=1, sampling_topk=1,
                                       include_prompt_in_result=False), a.quick)
    long_prompt = long_prompts[0] if long_prompts else 0
    res = {"tool": "ctranslate2", "version": ctranslate2.__version__, "compute_type": a.compute_type,
           "threads": a.threads, "load_s": load_s, "load_cold_s": load_cold_s, "new_tokens": new_tokens,
           "decode_tokens_per_s": statistics.median(decode), "runs": decode, "long_prompt": long_prompt,
           "prefill_s": prefill_s.get(str(long_prompt)), "prefill": prefill_s, "peak_rss_mib": peak_rss}
    print(f"bench_ctranslate2: {a.compute_type}, {a.threads} threads: load {load_s:.2f} s"
          + (f" (cold {load_cold_s:.2f} s)" if load_cold_s is not None else "")
          + f", decode {res['decode_tokens_per_s']:.1f} tokens/s, peak RSS {peak_rss:.0f} MiB"
          + "".join(f", prefill {n} tokens {t:.3f} s" for n, t in prefill_s.items()))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f)


if __name__ == "__main__":
    main()
