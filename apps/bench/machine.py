"""The machine line every results page opens with (the reports of each subject import it):
the CPU's model name, its cores, memory and system; and the CPU's family and model and the
SIMD flags the kernels choose by, which a page writes beside its figures."""

import os
import platform


def machine():
    cpu = "unknown CPU"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{cpu}, {os.cpu_count()} cores, {mem:.0f} GiB, {platform.system()} {platform.machine()}"


def cpu_family():
    """'cpu family 25, model 1' from /proc/cpuinfo (AMD's family 25 is Zen 3 and 4, 26 Zen 5)."""
    fields = {}
    try:
        for line in open("/proc/cpuinfo"):
            key, _, value = line.partition(":")
            key = key.strip()
            if key in ("cpu family", "model") and key not in fields:
                fields[key] = value.strip()
            if len(fields) == 2:
                break
    except OSError:
        pass
    return f"cpu family {fields.get('cpu family', '?')}, model {fields.get('model', '?')}"


def cpu_flags():
    """The SIMD flags of /proc/cpuinfo the kernels choose by, those the CPU has."""
    want = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile",
            "amx_int8", "amx_bf16")
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("flags"):
                have = set(line.split(":", 1)[1].split())
                return ", ".join(f for f in want if f in have) or "none of " + ", ".join(want)
    except OSError:
        pass
    return "unknown"
