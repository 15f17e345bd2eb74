#!/usr/bin/env python3
"""torchattn_serve in int8 against torchattn_serve in float32 (make bench, the weights
page): the same 16 clients as bench_serve.py (each streaming two chat completions of 64
tokens back to back, greedy, ignore_eos) against a server started with each --dtype in
turn, in interleaved rounds (float32, int8, float32, int8, ...), so that a busy machine
slows both sides alike. Per round and side: tokens/s, the engine's steps (/stats) and
the mean time a step took (wall / steps), the median time per output token. Writes a
JSON for report_weights.py (--serve-formats).

Usage: bench_serve_formats.py --server build/apps/serve/torchattn_serve --model .cache/smollm2 --json out.json
       [--rounds 3] [--threads 2] [--quick]
"""

import argparse
import json
import platform
import statistics
import time

import bench_serve  # apps/bench/serve/bench_serve.py: the server, the clients and the prompts
from transformers import AutoTokenizer

FORMATS = ("float32", "int8")


def one_run(a, dtype, texts, n_new):
    srv = bench_serve.Server(a.server, a.model, "--threads", str(a.threads), "--context-length", "4096", "--kv-tokens",
                             "32768", "--dtype", dtype)
    try:
        srv.stream([{"role": "user", "content": "Hi"}], 4)  # warm-up
        steps, start = srv.stats()["steps"], time.perf_counter()
        r = bench_serve.clients_run(srv, texts, 16, 1 if a.quick else 2, n_new)
        wall, steps = time.perf_counter() - start, srv.stats()["steps"] - steps
    finally:
        srv.stop()
    return {"dtype": dtype, "tokens": r["tokens"], "tokens_per_s": r["tokens_per_s"], "steps": steps,
            "step_ms": wall / max(steps, 1) * 1e3, "tpot_median_s": r["tpot_median_s"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="one round of 16 tokens a request")
    a = ap.parse_args()
    if a.rounds < 1:
        ap.error(f"--rounds must be at least 1, got {a.rounds}")
    bench_serve.AUTOTOK = AutoTokenizer.from_pretrained(a.model)
    texts = bench_serve.prompts(32)
    n_new, rounds = (16, 1) if a.quick else (64, a.rounds)
    runs = []
    for r in range(rounds):
        for dtype in FORMATS:
            run = one_run(a, dtype, texts, n_new)
            run["round"] = r + 1
            runs.append(run)
            print(f"bench_serve_formats: round {r + 1} {dtype}: {run['tokens_per_s']:.1f} tokens/s, "
                  f"{run['steps']} steps of {run['step_ms']:.1f} ms", flush=True)
    medians = {d: statistics.median(x["tokens_per_s"] for x in runs if x["dtype"] == d) for d in FORMATS}
    info = {"machine": platform.processor() or platform.machine(), "threads": a.threads, "clients": 16,
            "new_tokens": n_new, "rounds": rounds, "runs": runs, "median_tokens_per_s": medians, "quick": a.quick}
    with open(a.json, "w") as f:
        json.dump(info, f, indent=1)
    print(f"bench_serve_formats: int8 {medians['int8']:.1f} against float32 {medians['float32']:.1f} tokens/s "
          f"(medians of {rounds}); wrote {a.json}")


if __name__ == "__main__":
    main()
