"""The one harness of the peers the benchmarks set torchattn beside: rounds(), the timed
runs every peer takes medians of; for generation (llama_cpp_generate.py,
ctranslate2_generate.py, transformers_generate.py; torchattn_generate_bench does the same
in C++) their command line, and measure(), which takes a cold load (the model's files
evicted from the page cache first) and a warm one, decodes after a 32-token prompt, reads
the peak RSS of what follows the cold load, and prefills the long prompts. A generation
peer brings only how it loads, decodes and prefills; sentence_transformers_embed.py its
encode calls."""

import argparse
import json
import os
import resource
import statistics
import time


def evict(path):
    """Drops the page-cache pages of `path` (a file, or every file of a folder, links
    followed) with posix_fadvise(DONTNEED): the next read comes from the disk. Pages
    that a process maps stay; returns the bytes asked to go."""
    files = [path] if os.path.isfile(path) else [os.path.join(path, n) for n in sorted(os.listdir(path))]
    total = 0
    for f in files:
        f = os.path.realpath(f)
        if not os.path.isfile(f):
            continue
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd) if os.access(f, os.W_OK) else None
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            total += os.fstat(fd).st_size
        finally:
            os.close(fd)
    return total


def reset_peak_rss():
    """Starts the peak RSS (VmHWM) again from the current RSS (Linux: clear_refs 5)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def peak_rss_mib():
    """The peak RSS since the start or the last reset_peak_rss, in MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def timed_loads(load, path, cold):
    """(model, warm seconds, cold seconds or None) of load(), which returns a model: with
    `cold`, a first load after evicting `path`'s pages, dropped, and the peak RSS started
    again after it; then the warm load that the benchmark keeps."""

    def timed():
        t0 = time.perf_counter()
        m = load()
        return m, time.perf_counter() - t0

    cold_s = None
    if cold:
        evict(path)
        m, cold_s = timed()
        del m
        reset_peak_rss()
    m, warm_s = timed()
    return m, warm_s, cold_s


def rounds(n, run):
    """The seconds of n calls of run(), in order (a caller drops a warm-up or takes the
    median)."""
    out = []
    for _ in range(n):
        t = time.perf_counter()
        run()
        out.append(time.perf_counter() - t)
    return out


def lengths(text):
    """'512,2048' -> [512, 2048]."""
    out = [int(t) for t in text.split(",") if t]
    if not out or min(out) < 1:
        raise SystemExit(f"expected prompt lengths like 512,2048, got '{text}'")
    return out


def prefills(lengths_, make_ids, run_once, quick):
    """Warm prefills: {"n": median seconds} of run_once(make_ids(n)) for each length n, the
    first run of each a warm-up (2 runs with --quick or past 1024 tokens, else 6)."""
    out = {}
    for n in lengths_:
        ids = make_ids(n)
        runs = rounds(2 if quick or n > 1024 else 6, lambda: run_once(ids))[1:]
        out[str(n)] = statistics.median(runs)
    return out


def peer_arguments(doc, threads=1):
    """The options every peer takes (its own added by the caller): --model, --threads,
    --json, --quick, --new-tokens (default 128; 16 with --quick), --long-prompts (the warm
    prefills measured, default 512; 128 with --quick), --cold-load (the files evicted
    from the page cache and loaded once first; then the peak RSS starts again and the
    measured load is warm), --decode-only (no prefills)."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=threads)
    ap.add_argument("--json")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--new-tokens", type=int)
    ap.add_argument("--long-prompts")
    ap.add_argument("--cold-load", action="store_true")
    ap.add_argument("--decode-only", action="store_true")
    return ap


def plan(a):
    """(new tokens, long prompt lengths) of the parsed options."""
    new_tokens = a.new_tokens or (16 if a.quick else 128)
    return new_tokens, [] if a.decode_only else lengths(a.long_prompts or ("128" if a.quick else "512"))


def measure(a, load, path, make_ids, decode_once, prefill_once):
    """What every peer measures, in this order: load() timed (timed_loads over `path`);
    a prompt of 32 ids, make_ids(model, 32); decode_once(model, prompt, new_tokens) ->
    tokens/s, 3 times (1 with --quick), the median kept; the peak RSS; then the warm
    prefills, prefill_once(model, make_ids(model, n)) for each long prompt n (prefills).
    Returns (model, the measurements as the JSON files name them)."""
    new_tokens, long_prompts = plan(a)
    model, load_s, load_cold_s = timed_loads(lambda: load(), path, a.cold_load)
    prompt = make_ids(model, 32)
    decode = [decode_once(model, prompt, new_tokens) for _ in range(1 if a.quick else 3)]
    peak_rss = peak_rss_mib()
    prefill = prefills(long_prompts, lambda n: make_ids(model, n), lambda ids: prefill_once(model, ids), a.quick)
    long_prompt = long_prompts[0] if long_prompts else 0
    return model, {"load_s": load_s, "load_cold_s": load_cold_s, "new_tokens": new_tokens,
                   "decode_tokens_per_s": statistics.median(decode), "runs": decode, "long_prompt": long_prompt,
                   "prefill_s": prefill.get(str(long_prompt)), "prefill": prefill, "peak_rss_mib": peak_rss}


def report(a, head, res, tail=""):
    """Prints "<head>: load ... s (cold ...), decode ... tokens/s, peak RSS ..., prefill
    ...<tail>" and writes res to --json."""
    print(f"{head}: load {res['load_s']:.2f} s"
          + (f" (cold {res['load_cold_s']:.2f} s)" if res["load_cold_s"] is not None else "")
          + f", decode {res['decode_tokens_per_s']:.1f} tokens/s, peak RSS {res['peak_rss_mib']:.0f} MiB"
          + "".join(f", prefill {n} tokens {t:.3f} s" for n, t in res["prefill"].items()) + tail)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
