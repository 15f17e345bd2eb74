#!/usr/bin/env python3
"""torchattn_serve's memory over time (make bench, the serve page): a server with a KV
pool of 32,768 tokens, the pool made warm first (16 prompts of about 1,900 distinct tokens
at once: more blocks held at once than ever after), then 5,000 mixed requests from 8 clients at once:
chat and text completions, streamed or not, prompts of 100 to 1,500 characters, 4 to 15
tokens each, sampled with a seed; one stream in ten is dropped by its client after its
first chunk. The server's resident memory (VmRSS) after each 500 requests, and its
growth over the last 4,000. Writes a JSON for report_serve.py (--soak).

Usage: soak_serve.py --server build/apps/serve/torchattn_serve --model .cache/smollm2 --json out.json
       [--requests 5000] [--threads 2]
"""

import argparse
import json
import platform
import random
import time
from concurrent.futures import ThreadPoolExecutor

import bench_serve  # apps/bench/serve/bench_serve.py: the server and the prompts
import openai

KV_TOKENS = 32768


def warm_pool(client):
    """16 prompts of about 1,900 distinct tokens at once: the pool's blocks are taken lowest
    first, so its memory is touched up to the most blocks ever held at once; these hold
    more at once (about 30,000 tokens) than the mixed requests after ever do."""
    base = open("/usr/share/games/fortunes/fortunes").read().split("\n%\n")
    rng = random.Random(5)
    count = 16
    texts = [f"{i}: " + "\n".join(rng.sample(base, 40)) for i in range(count)]

    def one(i):
        client.completions.create(model="smollm2", prompt=texts[i][:8000], max_tokens=1, temperature=0)

    with ThreadPoolExecutor(count) as pool:
        list(pool.map(one, range(count)))
    return count


def request(client, texts, i):
    rng = random.Random(i)
    text = texts[i % len(texts)][: rng.randint(100, 1500)]
    kw = dict(model="smollm2", max_tokens=4 + i % 12, temperature=0.7, seed=i)
    kind = i % 4
    drop = kind % 2 == 1 and i % 10 == 1  # a stream its client leaves after the first chunk
    if kind == 0:
        return len(client.chat.completions.create(messages=[{"role": "user", "content": text}], **kw).choices)
    if kind == 2:
        return len(client.completions.create(prompt=text, **kw).choices)
    stream = (client.chat.completions.create(messages=[{"role": "user", "content": text}], stream=True, **kw)
              if kind == 1 else client.completions.create(prompt=text, stream=True, **kw))
    got = 0
    for _ in stream:
        got += 1
        if drop:
            stream.close()
            break
    return got


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--every", type=int, default=500)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    srv = bench_serve.Server(a.server, a.model, "--threads", str(a.threads), "--context-length", "4096",
                             "--kv-tokens", str(KV_TOKENS))
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{srv.port}/v1", api_key="none", max_retries=0, timeout=300)
    texts = bench_serve.prompts(64)
    samples = []
    try:
        start = time.perf_counter()
        warm = warm_pool(client)
        samples.append({"requests": 0, "rss_mib": rss_mib(srv.proc.pid)})
        errors = 0
        with ThreadPoolExecutor(8) as pool:
            for first in range(0, a.requests, a.every):
                for r in pool.map(lambda i: _safe(request, client, texts, i), range(first, first + a.every)):
                    errors += r is None
                samples.append({"requests": first + a.every, "rss_mib": rss_mib(srv.proc.pid)})
                print(f"soak: {first + a.every} requests, resident {samples[-1]['rss_mib']:.1f} MiB", flush=True)
        stats = srv.stats()
        wall = time.perf_counter() - start
    finally:
        srv.stop()
    tail = [s["rss_mib"] for s in samples if s["requests"] >= a.requests - 4000]
    out = {"machine": platform.processor() or platform.machine(), "requests": a.requests, "every": a.every,
           "warm_requests": warm, "kv_tokens": KV_TOKENS, "samples": samples, "errors": errors,
           "growth_last_4000_mib": max(tail) - tail[0], "kv_blocks_used_after": stats["kv_blocks_used"],
           "wall_s": wall}
    json.dump(out, open(a.json, "w"), indent=1)
    print(f"soak: growth over the last 4000 requests {out['growth_last_4000_mib']:.1f} MiB, {errors} errors, "
          f"{wall:.0f} s")


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _safe(fn, *args):
    try:
        return fn(*args)
    except openai.APIError:
        return None


if __name__ == "__main__":
    main()
