#!/usr/bin/env python3
"""Writes apps/bench/results/serve.md from bench_serve.py's JSON: torchattn_serve with
1, 4 and 16 concurrent clients, transformers' batched generate on the same prompts, the
KV memory in use, a long prompt arriving, and the targets checked.

With --soak (soak_serve.py's JSON): the server's resident memory over 5,000 requests.

Usage: report_serve.py --json serve.json [--soak soak.json] [--out DIR]
"""

import argparse
import datetime
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from machine import machine  # noqa: E402  (apps/bench/machine.py: the same machine line as every page)


def ms(s):
    return f"{s * 1e3:.1f}"


def soak_section(k):
    """The server's resident memory over a long mixed run (apps/bench/serve/soak_serve.py)."""
    growth = k["growth_last_4000_mib"]
    first, last = k["samples"][0]["rss_mib"], k["samples"][-1]["rss_mib"]
    early = next(x["rss_mib"] for x in k["samples"] if x["requests"] >= k["requests"] - 4000)
    md = ["## Memory over time", "",
          f"Made by apps/bench/serve/soak_serve.py after bench_serve.py (`run.sh --serve-only` runs both): a server with a KV pool of "
          f"{k['kv_tokens']} tokens, the pool made warm first ({k['warm_requests']} prompts of about 1,900 distinct "
          "tokens at once: the pool's blocks are taken lowest first, so its memory is touched up to the most "
          f"blocks ever held at once, and these hold more at once than the requests after), then {k['requests']} mixed requests from 8 clients at once (chat and text completions, "
          "streamed or not, prompts of 100 to 1,500 characters, 4 to 15 tokens each, sampled; one stream in ten "
          "dropped by its client after its first chunk). The server's resident memory (VmRSS) after each "
          f"{k['every']} requests, MiB; {k['errors']} requests failed, {k['kv_blocks_used_after']} KV blocks were "
          f"in use after, {k['wall_s']:.0f} s in all.", "",
          "| requests | " + " | ".join(str(x["requests"]) for x in k["samples"]) + " |",
          "|---" * (len(k["samples"]) + 1) + "|",
          "| resident MiB | " + " | ".join(f"{x['rss_mib']:.1f}" for x in k["samples"]) + " |", "",
          f"After the warm-up: {early - first:+.1f} MiB over the first {k['requests'] - min(4000, k['requests'])} "
          f"requests (most likely the pool's blocks that the prefix cache keeps, and the allocators' caches, "
          f"touched for the first time), then {growth:+.1f} MiB over the last {min(4000, k['requests'])} ({last - early:+.1f} MiB "
          "from the first of those samples to the last).", "",
          "| target | measured | met |", "|---|---|---|",
          f"| resident memory grows <= 32 MiB over the last 4,000 of 5,000 requests | {growth:.1f} MiB | "
          f"{'yes' if growth <= 32 and k['requests'] >= 5000 else '**no**'} |", ""]
    return md


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    ap.add_argument("--soak", help="soak_serve.py's JSON")
    ap.add_argument("--out", default="apps/bench/results")
    a = ap.parse_args()
    j = json.load(open(a.json))
    runs = {r["clients"]: r for r in j["runs"]}
    hf = {r["batch"]: r for r in j["transformers"]}
    one, sixteen = runs[1], runs[16]
    long = j["long_prompt"]
    scale = sixteen["tokens_per_s"] / one["tokens_per_s"]
    vs_hf = sixteen["tokens_per_s"] / hf[16]["tokens_per_s"]
    tpot_ratio = long["tpot_during_median_s"] / one["tpot_median_s"]
    bpt = j["kv_bytes_per_token"]
    mib = 1024 * 1024
    md = ["# Serving benchmark: SmolLM2-135M-Instruct on the CPU", "",
          "Made by `make bench` (apps/bench/serve/bench_serve.py): `torchattn_serve` (continuous batching over a "
          "paged KV cache, `models::Engine`) with SmolLM2-135M-Instruct in float32, and clients on the same "
          "machine over loopback, each streaming chat completions of "
          f"{j['new_tokens']} tokens (greedy, `ignore_eos`), two back to back per client, each request a prompt "
          "of its own: 1 to 8 fortunes (about 40 to 500 tokens) after the same instruction. The server's prefix "
          "cache (default) reuses the KV blocks of what prompts share (the chat template's system turn and the "
          "instruction); a second 16-client run without it gives what that saved. Tokens per second are summed over the clients (generated tokens "
          "over the wall time of the run); time to first token (TTFT) from sending the request to its first "
          "token; time per output token (TPOT) is a request's time from its first token to its last over the "
          "tokens between. Then transformers' `generate` on the same prompts (chat template, left-padded, "
          "greedy, the same number of new tokens), one batch at a time, in the same run after the server "
          "has stopped.", "",
          f"- machine: {machine()}",
          f"- threads: {j['threads']} (the server's; the clients share the cores)",
          f"- torch {j['torch']}, transformers {j['transformers_version']}, {datetime.date.today().isoformat()}",
          f"- server: context {j['context_length']} tokens, a KV pool of {j['kv_tokens']} tokens in blocks of "
          f"{sixteen['kv_block_size']}, {j.get('server_args') or 'default scheduling options'}", ""]
    if j.get("quick"):
        md += ["**A quick run (--quick): fewer tokens; not the figures to quote.**", ""]
    md += ["| clients | tokens/s | x 1 client | TTFT median ms | TTFT p99 ms | TPOT median ms | TPOT p99 ms |",
           "|---|---|---|---|---|---|---|"]
    for c in sorted(runs):
        r = runs[c]
        md.append(f"| {c} | {r['tokens_per_s']:.1f} | {r['tokens_per_s'] / one['tokens_per_s']:.2f} | "
                  f"{ms(r['ttft_median_s'])} | {ms(r['ttft_p99_s'])} | {ms(r['tpot_median_s'])} | "
                  f"{ms(r['tpot_p99_s'])} |")
    md += ["", "| transformers `generate` | tokens/s | torchattn_serve at as many clients | ratio |", "|---|---|---|---|"]
    for b in sorted(hf):
        ours = runs.get(b)
        md.append(f"| batch {b} | {hf[b]['tokens_per_s']:.1f} | "
                  + (f"{ours['tokens_per_s']:.1f} | {ours['tokens_per_s'] / hf[b]['tokens_per_s']:.2f} |"
                     if ours else "- | - |"))
    nc = j.get("no_prefix_cache_16")
    if nc:
        md += ["", f"With 16 clients the prefix cache gave {sixteen.get('prefix_reused_tokens', 0)} prompt tokens' keys "
               f"and values from earlier requests' blocks; without it (`--no-prefix-cache`) the same run made "
               f"{nc['tokens_per_s']:.1f} tokens/s ({nc['tokens_per_s'] / hf[16]['tokens_per_s']:.2f}x transformers' "
               f"batch 16), TTFT median {ms(nc['ttft_median_s'])} ms, TPOT median {ms(nc['tpot_median_s'])} ms."]
    contiguous = 16 * j["context_length"] * bpt
    md += ["", "## KV memory",
           "",
           f"One token's keys and values take {bpt / 1024:.1f} KiB over the model's layers. With 16 clients the "
           f"pool held at most {sixteen['most_tokens_held']} tokens, in {sixteen['kv_blocks_at_most_tokens']} "
           f"blocks ({sixteen['kv_bytes_at_most_tokens'] / mib:.1f} MiB); a contiguous `KVCache` for 16 sequences "
           f"of context {j['context_length']} reserves {contiguous / mib:.0f} MiB. In each of the "
           f"{sixteen['samples']} samples of `/stats` taken during the run, the blocks in use were at most the "
           f"tokens held rounded up to whole blocks per request (fewer where requests share cached prefix blocks; "
           f"at most {sixteen['most_slack_tokens']} token slots empty): " + ("yes." if sixteen["blocks_within_one_per_request"] else "**no**."), "",
           "## A long prompt arriving", "",
           f"16 clients decode while a {long['long_prompt_tokens']}-token prompt arrives; the server prefills it "
           f"in chunks beside their decoding ({long['prefill_s']:.1f} s to its first token). The clients' time "
           f"between tokens meanwhile: median {ms(long['tpot_during_median_s'])} ms, p99 "
           f"{ms(long['tpot_during_p99_s'])} ms, the slowest client's mean {ms(long['tpot_during_client_mean_max_s'])}"
           f" ms; {tpot_ratio:.2f}x the single-client median ({ms(one['tpot_median_s'])} ms).", "",
           "## Targets", "",
           "| target | measured | met |", "|---|---|---|",
           f"| 16 clients >= 4x one client's tokens/s | {scale:.2f}x | {'yes' if scale >= 4 else '**no**'} |",
           f"| 16 clients >= 2x transformers' batch 16 | {vs_hf:.2f}x | {'yes' if vs_hf >= 2 else '**no**'} |",
           f"| KV memory follows the tokens held, not context x clients | "
           f"{sixteen['kv_bytes_at_most_tokens'] / mib:.1f} MiB for {sixteen['most_tokens_held']} tokens "
           f"(not {contiguous / mib:.0f} MiB) | {'yes' if sixteen['blocks_within_one_per_request'] else '**no**'} |",
           f"| TPOT at 16 clients while a 2,000-token prompt arrives < 4x one client's | {tpot_ratio:.2f}x | "
           f"{'yes' if tpot_ratio < 4 else '**no**'} |", ""]
    floor = j.get("linear_floor")
    if floor:
        need = 16 / (2 * hf[16]["tokens_per_s"])
        md += ["## Where the time goes", "",
               f"With 16 clients decoding, a step of 16 tokens takes {ms(sixteen['tpot_median_s'])} ms (the median "
               f"TPOT): {16 / sixteen['tpot_median_s']:.0f} tokens/s while every request decodes; the prompts' "
               "prefill, in chunks between, takes the rest of the run's wall time. The model's "
               f"{floor['linear_layers']} linear layers alone (lm_head included: {floor['weight_bytes'] / mib:.0f} MiB "
               f"of float32 weights read every step) take {ms(floor['median_s'])} ms on 16 rows, measured in this run "
               "with `torch.nn.functional.linear` (the products of transformers' step); the server's products run "
               "on weights packed once (oneDNN), and its whole 16-token step takes "
               f"{sixteen['tpot_median_s'] / floor['median_s']:.2f}x that. transformers' batch 16 makes "
               f"{hf[16]['tokens_per_s']:.1f} tokens/s; twice that means 16 tokens every {ms(need)} ms for "
               f"everything, prefill included: {need / floor['median_s']:.2f}x those plain linear layers.", ""]
    if a.soak:
        md += soak_section(json.load(open(a.soak)))
    if j.get("notes"):
        md += j["notes"]
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "serve.md"), "w") as f:
        f.write("\n".join(md))
    print("\n".join(md))


if __name__ == "__main__":
    main()
