#!/usr/bin/env python3
"""PyTorch's torch.nn.attention.flex_attention under torch.compile on the CPU, on the mods
of torchattn_bench_flex (causal, documents, softcap 50, ALiBi), for apps/bench/results/flex.md.

Each mod's first compiled call is timed alone (the compile, from an empty inductor cache
unless --keep-cache, plus one run); then a second call, and then the steady state: every
mod once a round, the order rotating from round to round, medians over the rounds.
F.scaled_dot_product_attention(is_causal=True) runs in the same rounds, beside
torchattn_bench_flex's ATen SDPA side, to show how the two processes' machine compares.
Each compiled output is checked against the same mods on whole score matrices first.
Forward+backward is tried on each mod; where PyTorch refuses it (no CPU backward), the
exact error is recorded. Writes JSON (report.py merges it with the C++ one)."""

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

H, D = 12, 64
SOFTCAP = 50.0


def alibi_slopes(heads):
    """BLOOM's slopes, as torchattn_bench_flex (and MultiHeadAttention's alibi) computes them."""
    n = 1
    while n * 2 <= heads:
        n *= 2
    base = 2.0 ** (-8.0 / n)
    slopes = [base ** i for i in range(1, n + 1)]
    extra = 2.0 ** (-4.0 / n)
    slopes += [extra ** (2 * i + 1) for i in range(min(n, heads - n))]
    return slopes


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--T", type=int, help="tokens (default 4096; 1024 with --quick)")
    ap.add_argument("--rounds", type=int, help="rounds (default 7; 2 with --quick)")
    ap.add_argument("--docs", type=int, default=16, help="equal documents (T a multiple)")
    ap.add_argument("--json")
    ap.add_argument("--quick", action="store_true", help="a smoke run: T 1024 and 2 rounds unless given")
    ap.add_argument("--keep-cache", action="store_true",
                    help="use the usual inductor cache (default: a fresh one, so that the compile is timed cold)")
    args = ap.parse_args()
    T = args.T or (1024 if args.quick else 4096)
    rounds = args.rounds or (2 if args.quick else 7)
    if T % args.docs:
        sys.exit(f"bench_python: --T {T} is not a multiple of --docs {args.docs}")
    cache_dir = None
    if not args.keep_cache:  # before torch is imported: inductor reads it then
        cache_dir = tempfile.mkdtemp(prefix="flex-inductor-")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache_dir
    try:
        result = run(args, T, rounds, cache_dir)
    finally:
        if cache_dir:
            shutil.rmtree(cache_dir, ignore_errors=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
        print(f"\nwrote {args.json}")


def run(args, T, rounds, cache_dir):
    import torch
    import torch.nn.functional as F
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    torch.set_num_threads(args.threads)
    doc_len = T // args.docs
    print(f"bench_python (flex): torch {torch.__version__}, {torch.get_num_threads()} threads, float32, "
          f"B=1 H={H} T={T} D={D}, {rounds} rounds, CPU capability {torch.backends.cpu.get_cpu_capability()}")

    torch.manual_seed(0)  # as torchattn_bench_flex
    q, k, v, dout = (torch.randn(1, H, T, D) for _ in range(4))
    doc = torch.arange(T) // doc_len
    slopes = torch.tensor(alibi_slopes(H), dtype=torch.float32)

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    def documents(b, h, q_idx, kv_idx):
        return (doc[q_idx] == doc[kv_idx]) & (q_idx >= kv_idx)

    def softcap(score, b, h, q_idx, kv_idx):
        return SOFTCAP * torch.tanh(score / SOFTCAP)

    def alibi(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx)

    causal_mask = create_block_mask(causal, None, None, T, T, device="cpu")
    documents_mask = create_block_mask(documents, None, None, T, T, device="cpu")
    mods = {  # name: (score_mod, mask_mod, block mask); names as torchattn_bench_flex's flex sides
        "causal": (None, causal, causal_mask),
        "documents": (None, documents, documents_mask),
        "softcap": (softcap, causal, causal_mask),
        "alibi": (alibi, causal, causal_mask),
    }

    def reference(score_mod, mask_mod):
        """The mods on whole score matrices (the definition flex_attention computes)."""
        b = torch.zeros(1, 1, 1, 1, dtype=torch.long)
        h = torch.arange(H).view(1, H, 1, 1)
        qi, ki = torch.arange(T).view(1, 1, T, 1), torch.arange(T).view(1, 1, 1, T)
        s = (q @ k.transpose(-1, -2)) * D ** -0.5
        if score_mod is not None:
            s = score_mod(s, b, h, qi, ki)
        s = s.masked_fill(~mask_mod(b, h, qi, ki), float("-inf"))
        return torch.softmax(s, -1) @ v

    from torch._dynamo.utils import counters

    compiled = torch.compile(flex_attention, dynamic=False)
    info = {}
    forward = {}
    for name, (score_mod, mask_mod, bm) in mods.items():
        entry = info.setdefault(name, {})
        call = (lambda sm=score_mod, bm=bm: compiled(q, k, v, score_mod=sm, block_mask=bm))
        graphs = counters["stats"]["unique_graphs"]
        try:
            with torch.no_grad():
                t0 = time.perf_counter()
                y = call()
                entry["first_call_s"] = time.perf_counter() - t0
                t0 = time.perf_counter()
                call()
                entry["second_call_ms"] = (time.perf_counter() - t0) * 1e3
                entry["max_abs_diff"] = (y - reference(score_mod, mask_mod)).abs().max().item()
        except Exception as e:  # noqa: BLE001  (recorded: the page says why)
            entry["forward_error"] = f"{type(e).__name__}: {e}"
            print(f"  {name:<10} forward: {entry['forward_error']}")
            continue
        # Graphs that dynamo compiled for this mod: 0 would mean the call ran eagerly.
        entry["graphs_compiled"] = counters["stats"]["unique_graphs"] - graphs
        assert entry["max_abs_diff"] < 1e-4, f"{name}: compiled flex_attention differs by {entry['max_abs_diff']}"
        forward[f"torch_flex_{name}"] = lambda call=call: no_grad(torch, call)
        print(f"  {name:<10} forward: first call (compile + run) {entry['first_call_s']:.1f} s, second "
              f"{entry['second_call_ms']:.1f} ms, {entry['graphs_compiled']} graph(s) compiled, "
              f"max |diff| {entry['max_abs_diff']:.1e}")
    forward["py_sdpa_causal"] = lambda: no_grad(torch, lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))

    rows = []
    timed(forward, "python_forward", rounds, T, rows)

    # Forward+backward last: a call that dynamo gives up on may leave flex_attention to
    # run eagerly from then on, which must not touch the forward's figures above.
    backward = {}
    for name, (score_mod, mask_mod, bm) in mods.items():
        entry = info[name]
        if "forward_error" in entry:
            continue

        def fb(sm=score_mod, bm=bm):
            qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
            compiled(qg, kg, vg, score_mod=sm, block_mask=bm).backward(dout)

        try:
            t0 = time.perf_counter()
            fb()
            entry["backward_first_call_s"] = time.perf_counter() - t0
            backward[f"torch_flex_{name}"] = fb
            print(f"  {name:<10} forward+backward: first call {entry['backward_first_call_s']:.1f} s")
        except Exception as e:  # noqa: BLE001
            entry["backward_error"] = f"{type(e).__name__}: {e}"
            print(f"  {name:<10} forward+backward: {entry['backward_error']}")
    if backward:
        def sdpa_fb():
            qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
            F.scaled_dot_product_attention(qg, kg, vg, is_causal=True).backward(dout)
        backward["py_sdpa_causal"] = sdpa_fb
        timed(backward, "python_forward_backward", rounds, T, rows)

    try:  # the C++ compiler inductor builds its CPU kernels with, and its version line
        from torch._inductor import cpp_builder
        cxx = cpp_builder.get_cpp_compiler()
        cxx_version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout.split("\n")[0]
    except Exception as e:  # noqa: BLE001
        cxx_version = f"unknown ({type(e).__name__}: {e})"
    return {"tool": "bench_python_flex", "torch": torch.__version__, "python": platform.python_version(),
            "threads": torch.get_num_threads(), "B": 1, "H": H, "D": D, "T": T, "rounds": rounds,
            "docs": args.docs, "doc_len": doc_len, "softcap": SOFTCAP, "alibi_slopes": slopes.tolist(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "fresh_inductor_cache": cache_dir is not None,
            "inductor_cxx": cxx_version, "compile": info, "quick": args.quick,
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "rows": rows}


def timed(sides, section, rounds, T, rows):
    """A warm-up call of each side, then every side once a round (round r starting at
    side r % n); a row per side with the median over the rounds."""
    print(f"\n[{section}] median ms over {rounds} interleaved rounds")
    names = list(sides)
    for n in names:
        sides[n]()
    ms = {n: [] for n in names}
    for r in range(rounds):
        for i in range(len(names)):
            n = names[(i + r) % len(names)]
            t0 = time.perf_counter()
            sides[n]()
            ms[n].append((time.perf_counter() - t0) * 1e3)
    for n in names:
        med = statistics.median(ms[n])
        print(f"  {n:<22} {med:10.1f} ms  (min {min(ms[n]):.1f})")
        rows.append({"section": section, "variant": n, "T": T, "median_ms": med, "min_ms": min(ms[n]),
                     "rounds": rounds, "runs_ms": ms[n]})


def no_grad(torch, fn):
    with torch.no_grad():
        return fn()


if __name__ == "__main__":
    main()
