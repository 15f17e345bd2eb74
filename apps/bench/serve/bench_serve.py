#!/usr/bin/env python3
"""The serving benchmark (make bench): torchattn_serve with SmolLM2-135M-Instruct in
float32 on this machine's CPU, against transformers' batched generate on the same
prompts, batch sizes and machine, in one run. Writes a JSON for report_serve.py.

1. 1, 4 and 16 concurrent clients over loopback, each streaming two chat completions
   of 64 tokens (ignore_eos, greedy) back to back: summed tokens/s, time to first
   token, time per output token (median and p99 over requests), and the KV memory in
   use against the tokens held (sampled from /stats).
2. 16 clients decoding 160 tokens each while a 2,000-token prompt arrives: their time
   per output token while it is prefilled in chunks, against the single-client figure.
3. transformers' generate on the same 16 prompts at batch 1, 4 and 16 (left-padded,
   greedy, 64 new tokens each), tokens/s, after the server has stopped.

The clients are light (http.client, server-sent events parsed by hand) and share the
machine's cores with the server, as they would on one host.

Usage: bench_serve.py --server build/apps/serve/torchattn_serve --model .cache/smollm2 --json out.json [--quick]
"""

import argparse
import http.client
import json
import os
import platform
import random
import shlex
import statistics
import subprocess
import threading
import time

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer


def percentile(values, q):
    v = sorted(values)
    if not v:
        return float("nan")
    return v[min(len(v) - 1, int(round(q / 100 * (len(v) - 1))))]


def prompts(n, seed=3):
    base = open("/usr/share/games/fortunes/fortunes").read().split("\n%\n")
    rng = random.Random(seed)
    return ["Summarize this in one sentence:\n" + "\n".join(rng.sample(base, [1, 2, 4, 8][i % 4])) for i in range(n)]


class Server:
    def __init__(self, exe, model, *args):
        self.proc = subprocess.Popen([exe, model, "--port", "0", "--quiet", *args], stdout=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if "listening on http://" not in line:
            raise RuntimeError(f"the server did not start: {line!r}")
        self.port = int(line.split("http://")[1].split(",")[0].split(":")[1])
        print(f"bench_serve: {line.strip()}", flush=True)

    def stats(self):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        c.request("GET", "/stats")
        s = json.loads(c.getresponse().read())
        c.close()
        return s

    def stream(self, messages, max_tokens, t0=None):
        """Streams one chat completion; returns (send time, [arrival time of each token])."""
        body = json.dumps({"model": "smollm2", "messages": messages, "max_tokens": max_tokens, "temperature": 0,
                           "stream": True, "ignore_eos": True, "return_token_ids": True})
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=600)
        sent = time.perf_counter()
        c.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
        r = c.getresponse()
        arrivals = []
        while True:
            line = r.readline()
            if not line:
                break
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            now = time.perf_counter()
            choices = json.loads(line[6:]).get("choices") or [{}]
            arrivals += [now] * len(choices[0].get("token_ids", []))
        c.close()
        return sent, arrivals

    def stop(self):
        self.proc.terminate()
        self.proc.wait(60)


def clients_run(srv, texts, clients, rounds, max_tokens):
    """`clients` threads, each `rounds` requests back to back; the stats sampled meanwhile."""
    results, samples, done = [], [], threading.Event()

    def client(i):
        for r in range(rounds):
            text = texts[(i + r * clients) % len(texts)]
            sent, arrivals = srv.stream([{"role": "user", "content": text}], max_tokens)
            results.append((sent, arrivals))

    def sampler():
        while not done.is_set():
            s = srv.stats()
            samples.append((s["tokens_held"], s["kv_bytes_used"], s["kv_blocks_used"], s["running"], s["kv_block_size"]))
            time.sleep(0.05)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    watcher = threading.Thread(target=sampler)
    start = time.perf_counter()
    watcher.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    done.set()
    watcher.join()
    tokens = sum(len(a) for _, a in results)
    ttft = [a[0] - s for s, a in results if a]
    tpot = [(a[-1] - a[0]) / (len(a) - 1) for _, a in results if len(a) > 1]
    held = max(samples, key=lambda x: x[0]) if samples else (0, 0, 0, 0, 1)
    # Each running request leaves at most one block partly empty: the blocks in use are
    # the tokens held, rounded up per request, never a reservation of the context.
    # (Fewer where requests share prefix-cached blocks.)
    slack = [blocks * bs - tokens for tokens, _, blocks, running, bs in samples]
    within = all(s < max(1, running) * bs for s, (_, _, _, running, bs) in zip(slack, samples))
    return {"clients": clients, "requests": len(results), "tokens": tokens, "wall_s": wall,
            "tokens_per_s": tokens / wall, "ttft_median_s": statistics.median(ttft), "ttft_p99_s": percentile(ttft, 99),
            "tpot_median_s": statistics.median(tpot), "tpot_p99_s": percentile(tpot, 99),
            "most_tokens_held": held[0], "kv_bytes_at_most_tokens": held[1], "kv_blocks_at_most_tokens": held[2],
            "kv_block_size": held[4], "samples": len(samples), "blocks_within_one_per_request": within,
            "most_slack_tokens": max(slack, default=0),
            "kv_bytes_max": max((x[1] for x in samples), default=0)}


def long_prompt_run(srv, texts, clients, max_tokens, long_tokens):
    """`clients` decode while one long prompt arrives: their token gaps while it prefills."""
    results, marks = [], {}
    base = open("/usr/share/games/fortunes/fortunes").read()
    long_text = "Summarize this:\n" + base[: int(long_tokens * 3.35)]

    def client(i):
        results.append(srv.stream([{"role": "user", "content": texts[i % len(texts)]}], max_tokens))

    def long_client():
        time.sleep(1.5)  # the others are decoding by then
        sent, arrivals = srv.stream([{"role": "user", "content": long_text}], 8)
        marks["sent"], marks["first"] = sent, arrivals[0] if arrivals else sent

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)] + [threading.Thread(target=long_client)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    gaps = []  # each client's time between tokens, while the long prompt was being prefilled
    per_client = []
    for _, a in results:
        g = [b - x for x, b in zip(a, a[1:]) if marks["sent"] <= x and b <= marks["first"]]
        gaps += g
        if g:
            per_client.append(statistics.mean(g))
    chat = AUTOTOK.apply_chat_template([{"role": "user", "content": long_text}], tokenize=False, add_generation_prompt=True)
    prompt_tokens = len(AUTOTOK(chat, add_special_tokens=False)["input_ids"])
    return {"clients": clients, "long_prompt_tokens": prompt_tokens, "prefill_s": marks["first"] - marks["sent"],
            "tpot_during_median_s": statistics.median(gaps) if gaps else float("nan"),
            "tpot_during_p99_s": percentile(gaps, 99), "tpot_during_client_mean_max_s": max(per_client, default=float("nan"))}


def transformers_runs(model_dir, texts, sizes, max_tokens):
    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    chats = [tok.apply_chat_template([{"role": "user", "content": t}], tokenize=False, add_generation_prompt=True)
             for t in texts]
    # The floor under a decoding step of 16 requests: the model's linear layers alone
    # (lm_head included) on 16 rows, torch.nn.functional.linear with its weights.
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    x16 = {m.in_features: torch.randn(16, m.in_features) for m in linears}
    times = []
    with torch.inference_mode():
        for _ in range(9):
            start = time.perf_counter()
            for m in linears:
                torch.nn.functional.linear(x16[m.in_features], m.weight, m.bias)
            times.append(time.perf_counter() - start)
    floor = {"linear_layers": len(linears), "rows": 16, "median_s": statistics.median(times),
             "weight_bytes": sum(m.weight.numel() * m.weight.element_size() for m in linears)}
    print(f"bench_serve: {len(linears)} linear layers on 16 rows: {floor['median_s'] * 1e3:.1f} ms", flush=True)
    out = []
    for b in sizes:
        enc = tok(chats[:b], return_tensors="pt", padding=True, add_special_tokens=False)
        with torch.inference_mode():
            model.generate(**enc, max_new_tokens=2, do_sample=False)  # warm-up
            start = time.perf_counter()
            g = model.generate(**enc, max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False)
            wall = time.perf_counter() - start
        new = (g.shape[1] - enc["input_ids"].shape[1]) * b
        out.append({"batch": b, "tokens": new, "wall_s": wall, "tokens_per_s": new / wall})
        print(f"bench_serve: transformers batch {b}: {new / wall:.1f} tokens/s", flush=True)
    return out, floor


def main():
    global AUTOTOK
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--server-args", default="", help="more arguments for torchattn_serve, one string")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    AUTOTOK = AutoTokenizer.from_pretrained(a.model)
    n_new = 16 if a.quick else 64
    # Each request a prompt of its own (a client's second request another text), so that
    # the prefix cache shares only what the prompts share: the chat template's system turn
    # and the instruction. transformers' batches take the first 16.
    texts = prompts(32)
    context, kv_tokens = 4096, 32768
    srv = Server(a.server, a.model, "--threads", str(a.threads), "--context-length", str(context), "--kv-tokens",
                 str(kv_tokens), *shlex.split(a.server_args))
    bytes_per_token = None
    try:
        srv.stream([{"role": "user", "content": "Hi"}], 4)  # warm-up
        runs = []
        for clients in (1, 4, 16):
            reused = srv.stats()["prefix_reused_tokens"]
            r = clients_run(srv, texts, clients, 1 if a.quick else 2, n_new)
            r["prefix_reused_tokens"] = srv.stats()["prefix_reused_tokens"] - reused
            runs.append(r)
            print(f"bench_serve: {clients} clients: {r['tokens_per_s']:.1f} tokens/s, TTFT median "
                  f"{r['ttft_median_s'] * 1e3:.0f} ms, TPOT median {r['tpot_median_s'] * 1e3:.1f} ms", flush=True)
            if r["kv_blocks_at_most_tokens"]:
                bytes_per_token = r["kv_bytes_at_most_tokens"] / (r["kv_blocks_at_most_tokens"] * r["kv_block_size"])
        long = long_prompt_run(srv, texts, 16, 40 if a.quick else 160, 500 if a.quick else 2000)
        print(f"bench_serve: 16 clients while a {long['long_prompt_tokens']}-token prompt arrives: TPOT median "
              f"{long['tpot_during_median_s'] * 1e3:.1f} ms, p99 {long['tpot_during_p99_s'] * 1e3:.1f} ms", flush=True)
        stats = srv.stats()
    finally:
        srv.stop()
    # 16 clients again with every prompt computed in full: what the prefix cache saved.
    plain = Server(a.server, a.model, "--threads", str(a.threads), "--context-length", str(context), "--kv-tokens",
                   str(kv_tokens), "--no-prefix-cache", *shlex.split(a.server_args))
    try:
        plain.stream([{"role": "user", "content": "Hi"}], 4)
        no_cache = clients_run(plain, texts, 16, 1 if a.quick else 2, n_new)
        print(f"bench_serve: 16 clients without the prefix cache: {no_cache['tokens_per_s']:.1f} tokens/s", flush=True)
    finally:
        plain.stop()
    hf, floor = transformers_runs(a.model, texts, (1, 4, 16), n_new)
    info = {"machine": platform.processor() or platform.machine(), "threads": a.threads, "new_tokens": n_new,
            "context_length": context, "kv_tokens": kv_tokens, "server_args": a.server_args, "kv_bytes_per_token": bytes_per_token,
            "runs": runs, "no_prefix_cache_16": no_cache, "long_prompt": long, "transformers": hf, "linear_floor": floor, "final_stats": stats,
            "torch": torch.__version__, "transformers_version": transformers.__version__, "quick": a.quick}
    with open(a.json, "w") as f:
        json.dump(info, f, indent=1)
    print(f"bench_serve: wrote {a.json}")


if __name__ == "__main__":
    main()
