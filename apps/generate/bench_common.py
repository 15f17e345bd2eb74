"""What the generation benchmarks' peers share (bench_llama_cpp.py, bench_ctranslate2.py,
bench_transformers.py; torchattn_generate_bench does the same in C++): a cold load (the
model's files evicted from the page cache first), the peak RSS of what follows it, and
the prompt lengths they prefill."""

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
        runs = []
        for i in range(2 if quick or n > 1024 else 6):
            t = time.perf_counter()
            run_once(ids)
            if i > 0:
                runs.append(time.perf_counter() - t)
        out[str(n)] = statistics.median(runs)
    return out
