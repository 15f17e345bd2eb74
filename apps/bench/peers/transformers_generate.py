#!/usr/bin/env python3
"""transformers' side of the generation benchmark: the same model folder, threads and
measurements as torchattn_generate_bench (peak RSS after loading and generating,
decoding tokens/s after a 32-token prompt, a warm 512-token prefill, and the memory
read bandwidth), with transformers' own generate and forward, float32 on the CPU.

Usage: .venv/bin/python apps/bench/peers/transformers_generate.py --model DIR [--threads 2] [--json out.json] [--quick]
           [--new-tokens N] [--long-prompts 512,2048] [--cold-load] [--decode-only]

The options after --quick as llama_cpp_generate.py's.
"""

import statistics
import time

import torch
import transformers
from transformers import AutoModelForCausalLM
from transformers.generation.streamers import BaseStreamer

from harness import measure, peer_arguments, report


class Clock(BaseStreamer):
    """Times the tokens generate hands out: the prompt first, then each new token."""

    def __init__(self):
        self.times = []

    def put(self, value):
        self.times.append(time.perf_counter())

    def end(self):
        pass


def main():
    a = peer_arguments(__doc__, threads=2).parse_args()
    torch.set_num_threads(a.threads)
    g = torch.Generator().manual_seed(0)
    first = []

    def decode_once(model, ids, new_tokens):
        clock = Clock()
        start = time.perf_counter()
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                       min_new_tokens=new_tokens, do_sample=False, streamer=clock, pad_token_id=0)
        # times[0]: the prompt; times[1]: the first new token; then one per token.
        first.append(clock.times[1] - start)
        return (len(clock.times) - 2) / (clock.times[-1] - clock.times[1])

    with torch.no_grad():
        model, res = measure(
            a, lambda: AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32).eval(), a.model,
            lambda model, n: torch.randint(100, model.config.vocab_size - 100, (1, n), generator=g), decode_once,
            lambda model, ids: model(ids, logits_to_keep=1))

    big = torch.ones(128 << 20)
    bandwidth = []
    for r in range(6):
        t = time.perf_counter()
        big.sum().item()
        if r > 0:
            bandwidth.append(big.numel() * 4 / (time.perf_counter() - t) / 1e9)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    res = {"tool": "transformers_generate.py", "transformers": transformers.__version__, "torch": str(torch.__version__),
           "threads": torch.get_num_threads(), "weight_bytes": weight_bytes, "prompt": 32, **res,
           "first_prefill_s": statistics.median(first), "bandwidth_gbps": statistics.median(bandwidth)}
    report(a, f"transformers {transformers.__version__}, torch {torch.__version__}, {res['threads']} threads", res,
           f", bandwidth {res['bandwidth_gbps']:.1f} GB/s")


if __name__ == "__main__":
    main()
