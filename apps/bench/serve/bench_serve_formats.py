#!/usr/bin/env python3
"""torchattn_serve in one weight format against another (make bench: int8 against float32
on the weights page, int4 against int8 on the quant page): the same 16 clients as bench_serve.py (each streaming two chat completions of 64
tokens back to back, greedy, ignore_eos) against a server started with each --dtype in
turn, in interleaved rounds (float32, int8, float32, int8, ...), so that a busy machine
slows both sides alike (--formats: the two, the baseline first; default float32,int8). Per round and side: tokens/s, the engine's steps (/stats) and
the mean time a step took (wall / steps), the median time per output token. Writes a
JSON for report_weights.py and report_quant.py (--serve-formats).

Usage: bench_serve_formats.py --server build/apps/serve/torchattn_serve --model .cache/smollm2 --json out.json
       [--formats float32,int8] [--rounds 3] [--threads 2] [--quick]
"""

import argparse
import json
import platform
import statistics
import time

import bench_serve  # apps/bench/serve/bench_serve.py: the server, the clients and the prompts
from transformers import AutoTokenizer

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
    ap.add_argument("--formats", default="float32,int8", help="the baseline's --dtype, then the other's")
    a = ap.parse_args()
    formats = a.formats.split(",")
    if len(formats) != 2 or len(set(formats)) != 2:
        ap.error(f"--formats takes two different --dtype values, got {a.formats!r}")
    if a.rounds < 1:
        ap.error(f"--rounds must be at least 1, got {a.rounds}")
    bench_serve.AUTOTOK = AutoTokenizer.from_pretrained(a.model)
    texts = bench_serve.prompts(32)
    n_new, rounds = (16, 1) if a.quick else (64, a.rounds)
    runs = []
    for r in range(rounds):
        for dtype in formats:
            run = one_run(a, dtype, texts, n_new)
            run["round"] = r + 1
            runs.append(run)
            print(f"bench_serve_formats: round {r + 1} {dtype}: {run['tokens_per_s']:.1f} tokens/s, "
                  f"{run['steps']} steps of {run['step_ms']:.1f} ms", flush=True)
    medians = {d: statistics.median(x["tokens_per_s"] for x in runs if x["dtype"] == d) for d in formats}
    info = {"machine": platform.processor() or platform.machine(), "threads": a.threads, "clients": 16,
            "new_tokens": n_new, "rounds": rounds, "runs": runs, "median_tokens_per_s": medians, "quick": a.quick,
            "formats": formats}
    with open(a.json, "w") as f:
        json.dump(info, f, indent=1)
    print(f"bench_serve_formats: {formats[1]} {medians[formats[1]]:.1f} against {formats[0]} "
          f"{medians[formats[0]]:.1f} tokens/s "
          f"(medians of {rounds}); wrote {a.json}")


if __name__ == "__main__":
    main()
