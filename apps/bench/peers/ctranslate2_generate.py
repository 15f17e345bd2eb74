#!/usr/bin/env python3
"""CTranslate2's side of the weight formats' benchmark (apps/bench/results/weights.md):
the same SmolLM2 folder converted once per compute type (int8 or float32), then, as
torchattn_generate_bench measures it: decoding tokens/s after a 32-token prompt (128
new tokens, greedy, the median of 3), a warm prefill of 512 tokens (its first token,
the median of 5 after a warm-up) and the peak RSS, at the given intra-op threads.

Usage: .venv/bin/python apps/bench/peers/ctranslate2_generate.py --model DIR --compute-type int8 --threads 1
           --work DIR [--json out.json] [--quick]
           [--name NAME] [--new-tokens N] [--long-prompts 512,2048] [--cold-load] [--decode-only]

The options after --quick as llama_cpp_generate.py's (--name: the converted folder's prefix
in --work, default ct2).
"""

import os
import random
import time

import ctranslate2
from transformers import AutoTokenizer

from harness import measure, peer_arguments, report


def main():
    ap = peer_arguments(__doc__)
    ap.add_argument("--compute-type", default="int8", choices=["int8", "float32"])
    ap.add_argument("--work", required=True, help="where the converted models are kept")
    ap.add_argument("--name", default="ct2")
    a = ap.parse_args()
    out = os.path.join(a.work, f"{a.name}-{a.compute_type}")
    if not os.path.exists(os.path.join(out, "model.bin")):
        ctranslate2.converters.TransformersConverter(a.model).convert(out, quantization=a.compute_type, force=True)
    tok = AutoTokenizer.from_pretrained(a.model)
    rng = random.Random(0)
    vocab = len(tok)

    def first_token(gen, prompt, max_length=1):
        return gen.generate_batch([prompt], max_length=max_length, min_length=max_length, sampling_topk=1,
                                  include_prompt_in_result=False)

    def decode_once(gen, prompt, new_tokens):
        # The first token alone, then the whole run: decoding is the difference.
        t = time.perf_counter()
        first_token(gen, prompt)
        first = time.perf_counter() - t
        t = time.perf_counter()
        r = first_token(gen, prompt, new_tokens)
        total = time.perf_counter() - t
        n = len(r[0].sequences_ids[0])
        if total <= first:  # a few tokens, timed as less than the first alone
            raise SystemExit(f"ctranslate2_generate: {n} tokens took {total:.4f} s, the first alone {first:.4f} s: "
                             "too few to time decoding; ask for more --new-tokens")
        return (n - 1) / (total - first)

    _, res = measure(
        a, lambda: ctranslate2.Generator(out, device="cpu", compute_type=a.compute_type, intra_threads=a.threads,
                                         inter_threads=1), out,
        lambda gen, n: tok.convert_ids_to_tokens([rng.randrange(100, vocab - 100) for _ in range(n)]), decode_once,
        first_token)
    res = {"tool": "ctranslate2", "version": ctranslate2.__version__, "compute_type": a.compute_type,
           "threads": a.threads, **res}
    report(a, f"ctranslate2_generate: {a.compute_type}, {a.threads} threads", res)


if __name__ == "__main__":
    main()
