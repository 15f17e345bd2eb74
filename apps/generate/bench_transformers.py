#!/usr/bin/env python3
"""transformers' side of the generation benchmark: the same model folder, threads and
measurements as torchattn_generate_bench (peak RSS after loading and generating,
decoding tokens/s after a 32-token prompt, a warm 512-token prefill, and the memory
read bandwidth), with transformers' own generate and forward, float32 on the CPU.

Usage: .venv/bin/python apps/generate/bench_transformers.py --model DIR [--threads 2] [--json out.json] [--quick]
           [--new-tokens N] [--long-prompts 512,2048] [--cold-load] [--decode-only]

The options after --quick as bench_llama_cpp.py's.
"""

import argparse
import json
import statistics
import time

import torch
import transformers
from transformers import AutoModelForCausalLM
from transformers.generation.streamers import BaseStreamer

from bench_common import lengths, peak_rss_mib, prefills, timed_loads


class Clock(BaseStreamer):
    """Times the tokens generate hands out: the prompt first, then each new token."""

    def __init__(self):
        self.times = []

    def put(self, value):
        self.times.append(time.perf_counter())

    def end(self):
        pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--new-tokens", type=int)
    ap.add_argument("--long-prompts")
    ap.add_argument("--cold-load", action="store_true")
    ap.add_argument("--decode-only", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    prompt_len, new_tokens = 32, a.new_tokens or (16 if a.quick else 128)
    long_prompts = [] if a.decode_only else lengths(a.long_prompts or ("128" if a.quick else "512"))

    model, load_s, load_cold_s = timed_loads(lambda: AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32).eval(), a.model, a.cold_load)
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(100, vocab - 100, (1, prompt_len), generator=g)
    decode, first = [], []
    with torch.no_grad():
        for _ in range(1 if a.quick else 3):
            clock = Clock()
            start = time.perf_counter()
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                           min_new_tokens=new_tokens, do_sample=False, streamer=clock, pad_token_id=0)
            # times[0]: the prompt; times[1]: the first new token; then one per token.
            first.append(clock.times[1] - start)
            decode.append((len(clock.times) - 2) / (clock.times[-1] - clock.times[1]))
    peak_rss = peak_rss_mib()

    with torch.no_grad():
        prefill_s = prefills(long_prompts, lambda n: torch.randint(100, vocab - 100, (1, n), generator=g),
                             lambda ids: model(ids, logits_to_keep=1), a.quick)
    long_prompt = long_prompts[0] if long_prompts else 0

    big = torch.ones(128 << 20)
    bandwidth = []
    for r in range(6):
        t = time.perf_counter()
        big.sum().item()
        if r > 0:
            bandwidth.append(big.numel() * 4 / (time.perf_counter() - t) / 1e9)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    out = {"tool": "bench_transformers.py", "transformers": transformers.__version__, "torch": str(torch.__version__),
           "threads": torch.get_num_threads(), "weight_bytes": weight_bytes, "load_s": load_s,
           "load_cold_s": load_cold_s, "peak_rss_mib": peak_rss, "prompt": prompt_len, "new_tokens": new_tokens,
           "decode_tokens_per_s": statistics.median(decode), "first_prefill_s": statistics.median(first),
           "long_prompt": long_prompt, "prefill_s": prefill_s.get(str(long_prompt)), "prefill": prefill_s,
           "bandwidth_gbps": statistics.median(bandwidth)}
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, {out['threads']} threads: "
          f"load {load_s:.2f} s" + (f" (cold {load_cold_s:.2f} s)" if load_cold_s is not None else "")
          + f", decode {out['decode_tokens_per_s']:.1f} tokens/s, peak RSS {peak_rss:.0f} MiB"
          + "".join(f", prefill {n} tokens {t:.3f} s" for n, t in prefill_s.items())
          + f", bandwidth {out['bandwidth_gbps']:.1f} GB/s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
