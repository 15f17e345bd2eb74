#!/usr/bin/env python3
"""Merges the JSON of torchattn_bench_flex (C++) and bench_python.py (PyTorch's compiled
flex_attention) into apps/bench/results/flex.md: the machine, a table per target of issue
51 with its ratio and whether it holds, the checks each side passed, and what torch.compile
did on this CPU."""

import argparse
import datetime
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from machine import machine  # noqa: E402  (apps/bench/machine.py)

# The instruction-set flags that the kernels (ours, ATen's, inductor's) choose by.
SIMD_FLAGS = ["sse4_2", "avx", "f16c", "fma", "avx2", "avx_vnni", "avx512f", "avx512dq", "avx512cd", "avx512bw",
              "avx512vl", "avx512_vnni", "avx512_bf16", "avx512ifma", "avx512vbmi", "avx512_vbmi2",
              "avx512_fp16", "amx_tile", "amx_bf16", "amx_int8"]
# torchattn's ISA names (TORCHATTN_ISA), narrowest first.
ISAS = ["scalar", "avx2", "avx512", "avx512_vnni"]


def cpu_flags():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def torchattn_isa(flags, cap):
    """kernels/cpu/cpu_features: the widest of the CPU's sets, capped by TORCHATTN_ISA."""
    isa = "scalar"
    if {"avx2", "fma"} <= flags:
        isa = "avx2"
        if "avx512f" in flags:
            isa = "avx512_vnni" if {"avx512bw", "avx512_vnni"} <= flags else "avx512"
    if cap in ISAS and ISAS.index(cap) < ISAS.index(isa):
        isa = cap
    return isa


def prefill_max_keys(isa):
    """src/backends/selector.cpp causal_flex_max_keys: the most keys for which a causal CPU
    float32 prefill without grad runs flex's causal instance rather than ATen's kernel."""
    return {"avx512_vnni": 16384, "avx512": 16384, "avx2": 512}.get(isa, 0)


def table(headers, rows):
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def holds(value, op, bound):
    if value is None:
        return "n/a"
    ok = value >= bound if op == ">=" else value <= bound
    return "yes" if ok else "**no**"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cpp", required=True, help="torchattn_bench_flex --json")
    ap.add_argument("--py", required=True, help="bench_python.py --json")
    ap.add_argument("--cpp-avx2", help="torchattn_bench_flex --json under TORCHATTN_ISA=avx2 (the AVX2 path)")
    ap.add_argument("--out", default="apps/bench/results", help="folder of flex.md")
    args = ap.parse_args()
    cpp = json.load(open(args.cpp))
    py = json.load(open(args.py))
    rows = cpp["rows"] + py["rows"]

    def ms(section, variant):
        for r in rows:
            if r["section"] == section and r["variant"] == variant:
                return r["median_ms"]
        return None

    def row(section, variant):
        for r in rows:
            if r["section"] == section and r["variant"] == variant:
                return r
        return None

    def ratio(a, b):
        return a / b if a is not None and b else None

    def fmt_ms(x):
        return "-" if x is None else (f"{x:.1f}" if x >= 10 else f"{x:.2f}")

    def fmt_x(x):
        return "-" if x is None else f"{x:.2f}x"

    def side_table(section, first_label):
        """The sides of one C++ section: median and min ms, time over the first side's
        (ratio of medians, and the median of the round-by-round ratios)."""
        sec = [r for r in cpp["rows"] if r["section"] == section]
        return table(["side", "median ms", "min ms", f"time / {first_label}", "round-by-round median"],
                     [[f"`{r['variant']}`", fmt_ms(r["median_ms"]), fmt_ms(r["min_ms"]), fmt_x(r["time_vs_first"]),
                       fmt_x(r["round_ratio_median"])] for r in sec])

    flags = cpu_flags()
    env = cpp.get("env", {})
    isa = torchattn_isa(flags, env.get("TORCHATTN_ISA", ""))
    T = cpp["T"]
    max_keys = prefill_max_keys(isa)
    prefill_path = ("flex's kernels under `flex::Causal`, its block mask made for the call (the table's "
                    "`cpu_flex_causal`)" if T <= max_keys else
                    "ATen's flash kernel (the table's `cpu_flex_causal` stops at "
                    f"{max_keys} keys with {isa}, src/backends/selector.cpp `causal_flex_max_keys`)")
    # The figures are T=4096 from full runs of both programs.
    smoke = cpp.get("quick") or py.get("quick") or T != 4096 or py["T"] != T

    md = ["# FlexAttention on the CPU", ""]
    if smoke:
        lengths = f"T={T}" if py["T"] == T else f"T={T} (C++) and {py['T']} (Python)"
        md += [f"**A smoke run (`--quick`, or {lengths} rather than 4096): not a result.**", ""]
    md += [
        "Made by `bash apps/bench/run.sh --flex-only` (apps/bench/flex): `torchattn_bench_flex` (C++, one process) "
        "then `bench_python.py` (PyTorch's `torch.nn.attention.flex_attention` under `torch.compile`), on the same "
        "machine and the same inputs (seed 0), merged by `report.py`. Every side is checked against the others "
        "before it is timed (last table). Each section runs its sides in interleaved rounds: every side once a "
        "round, the order rotating from round to round, after a warm-up call of each; the figures are medians over "
        "the rounds, and the ratios are ratios of those medians (the median of the round-by-round ratios beside "
        "them). Ratios are of times: below 1 the first side is faster.",
        "",
        f"- machine: {machine()}",
        f"- CPU flags (SIMD): {' '.join(f for f in SIMD_FLAGS if f in flags) or 'none found'}",
        f"- torchattn's instruction set: {isa}"
        + (f" (TORCHATTN_ISA={env['TORCHATTN_ISA']})" if env.get("TORCHATTN_ISA") else "")
        + f"; PyTorch's CPU capability: {py.get('cpu_capability', '?')}"
        + (f" (ATEN_CPU_CAPABILITY={env['ATEN_CPU_CAPABILITY']})" if env.get("ATEN_CPU_CAPABILITY") else ""),
        f"- threads: {cpp['threads']} (C++ `at::set_num_threads`), {py['threads']} (Python `torch.set_num_threads`)"
        + (f"; OMP_NUM_THREADS={env['OMP_NUM_THREADS']}" if env.get("OMP_NUM_THREADS") else ""),
        f"- versions: torchattn {cpp['torchattn']} and LibTorch {cpp['libtorch']} built by {cpp['compiler']}; "
        f"torch {py['torch']} under Python {py['python']}; inductor's C++ compiler `{py.get('inductor_cxx', '?')}`",
        f"- shapes: q, k, v [B={cpp['B']}, H={cpp['H']}, T={T}, D={cpp['D']}] float32; block size "
        f"{cpp['block_size']}; rounds: {cpp['rounds']} (C++), {py['rounds']} (Python)",
        f"- {datetime.date.today().isoformat()}",
        "",
    ]

    # ---- the targets ----
    a = ratio(ms("causal_forward", "flex_causal"), ms("causal_forward", "torchattn_causal"))
    b = ratio(ms("causal_forward_backward", "flex_causal"), ms("causal_forward_backward", "aten_sdpa_causal"))
    c_f = ratio(ms("documents_forward", "flex_documents_every_block"), ms("documents_forward", "flex_documents"))
    c_b = ratio(ms("documents_forward_backward", "flex_documents_every_block"),
                ms("documents_forward_backward", "flex_documents"))
    sc_f = ratio(ms("softcap_forward", "torchattn_softcap"), ms("softcap_forward", "flex_softcap"))
    sc_b = ratio(ms("softcap_forward_backward", "torchattn_softcap"), ms("softcap_forward_backward", "flex_softcap"))
    al_f = ratio(ms("alibi_forward", "torchattn_alibi_module"), ms("alibi_forward", "flex_alibi_module"))
    al_b = ratio(ms("alibi_forward_backward", "torchattn_alibi_module"),
                 ms("alibi_forward_backward", "flex_alibi_module"))

    def attention_only(section):
        """(module - projections) / (flex module - projections): the attention's share alone,
        an estimate from three medians."""
        m, f, p = (ms(section, v) for v in ("torchattn_alibi_module", "flex_alibi_module", "projections_only"))
        if None in (m, f, p) or f - p <= 0 or m - p <= 0:
            return None
        return (m - p) / (f - p)

    mods = ["causal", "documents", "softcap", "alibi"]
    cpp_side = {"causal": ("causal_forward", "flex_causal"), "documents": ("documents_forward", "flex_documents"),
                "softcap": ("softcap_forward", "flex_softcap"), "alibi": ("alibi_forward", "flex_alibi")}
    e = {m: ratio(ms("python_forward", f"torch_flex_{m}"), ms(*cpp_side[m])) for m in mods}

    targets = [
        ("a", "flex causal forward within 1.15x of our causal prefill (`functional::attention`), time ratio", a,
         "<=", 1.15),
        ("b", "flex causal forward+backward within 1.2x of ATen SDPA is_causal, time ratio", b, "<=", 1.2),
        ("c", f"{cpp['docs']} documents: every block computed / block mask, forward", c_f, ">=", 8.0),
        ("c", f"{cpp['docs']} documents: every block computed / block mask, forward+backward", c_b, ">=", 8.0),
        ("d", "softcap 50: dedicated / flex, forward (flex's speed-up)", sc_f, ">=", 1.0),
        ("d", "softcap 50: dedicated / flex, forward+backward", sc_b, ">=", 1.0),
        ("d", "ALiBi module: dedicated / flex, forward", al_f, ">=", 1.0),
        ("d", "ALiBi module: dedicated / flex, forward+backward", al_b, ">=", 1.0),
    ] + [("e", f"PyTorch compiled flex / ours, {m} forward", e[m], ">=", 1.0) for m in mods]
    f_dec = ratio(ms("decoding", "flex_decode"), ms("decoding", "decode_kernel"))
    f_default = ratio(ms("decoding", "torchattn_decode"), ms("decoding", "decode_kernel"))
    short_keys = [int(r["variant"]) for r in cpp["rows"] if r["section"] == "decoding_short_calls"]
    short_calls = {int(r["variant"]): r["calls"] for r in cpp["rows"] if r["section"] == "decoding_short_calls"}
    decode_keys = cpp.get("decode_keys")
    if f_dec is not None:
        targets.append(("f", f"flex decoding, one query over {decode_keys} keys (GQA 32/8, D 64), within 1.1x of "
                        "the decode kernel, time ratio", f_dec, "<=", 1.1))
    if f_default is not None:
        targets.append(("f", f"the default decoding step (`cpu_flex_decode`) over {decode_keys} keys / the decode "
                        "kernel", f_default, "<=", 1.0))

    md += ["## Targets", "",
           table(["", "target", "measured", "bound", "met"],
                 [[t, name, "-" if v is None else f"{v:.2f}", f"{op} {bound}", holds(v, op, bound)]
                  for t, name, v, op, bound in targets]), ""]

    md += [f"## a. Causal forward, no grad (flex within 1.15x of our causal prefill: {fmt_x(a)})", "",
           "`flex_causal`: `torchattn::flex_attention(q, k, v, create_block_mask(flex::Causal()))`, the block mask "
           "made once. `torchattn_causal`: "
           "`torchattn::functional::attention(q, k, v, causal_mask_buffer(T), 0, {})`, which on the CPU in float32 "
           f"without grad at {T} keys runs {prefill_path}. `aten_sdpa_causal`: "
           "`at::scaled_dot_product_attention(..., is_causal=true)`.", "",
           side_table("causal_forward", "flex"), ""]
    md += [f"## b. Causal forward+backward (flex within 1.2x of ATen SDPA: {fmt_x(b)})", "",
           "Fresh leaves q, k, v that require grad, the forward, then `backward(dout)`; the gradients of both sides "
           "are checked against each other first.", "",
           side_table("causal_forward_backward", "flex"), ""]
    md += [f"## c. Documents: the block mask's skipping (>= 8x: forward {fmt_x(c_f)}, forward+backward {fmt_x(c_b)})",
           "",
           f"{cpp['docs']} equal documents of {cpp['doc_len']} tokens; `mask_mod`: same document **and causal** "
           "(`doc[q] == doc[kv] && q >= kv`). `flex_documents`: `create_block_mask` over it, so the empty blocks are "
           "skipped and the full ones computed without `mask_mod`. `flex_documents_every_block`: the same "
           "`flex_attention` call over `create_block_mask(VisibleKeys{})` (every block full, none skipped), the "
           "same pattern applied by a `score_mod` returning -inf where the mask is false. Both give the same "
           "outputs and gradients.", "",
           "Forward:", "", side_table("documents_forward", "block mask"), "",
           "Forward+backward:", "", side_table("documents_forward_backward", "block mask"), ""]
    md += [f"## d. Softcap and ALiBi against the dedicated paths (flex >= dedicated speed)", "",
           f"Softcap (Gemma 2): `score_mod` `{cpp['softcap']:g} * tanh(score / {cpp['softcap']:g})` with the causal "
           "block mask, against `functional::attention` causal with `AttentionOptions.softcap = "
           f"{cpp['softcap']:g}` on `Backend::SDPA` (the blocked path of `src/backends/blocked.cpp`; on the CPU "
           "`Backend::Auto` now takes flex's kernels for it, `src/backends/named_flex.cpp`). Speed-up of flex: forward "
           f"{fmt_x(sc_f)}, forward+backward {fmt_x(sc_b)}.", "",
           "Forward:", "", side_table("softcap_forward", "flex"), "",
           "Forward+backward:", "", side_table("softcap_forward_backward", "flex"), "",
           f"ALiBi is public only as `MultiHeadAttentionOptions::alibi` (d = {cpp['model_dim']}, {cpp['H']} heads, "
           "BLOOM's slopes; on `Backend::SDPA` the module adds a [1, H, T, T] bias through ATen's SDPA, where "
           "`Backend::Auto` now takes flex's kernels). So both sides are that "
           "module on x [1, T, d]: `torchattn_alibi_module` its `forward`; `flex_alibi_module` a module of the "
           "same weights whose `MultiHeadAttentionOptions::flex` is `flex_variant` of the ALiBi `score_mod` "
           "`score + slope[h] * (kv - q)` (the module's causal mask applies). `projections_only` times the four layers alone (what both share) and `flex_alibi` the flex "
           "call alone on q, k, v (for e.). Speed-up of flex, whole module: forward "
           f"{fmt_x(al_f)}, forward+backward {fmt_x(al_b)}; attention alone, estimated as (module - projections) "
           f"/ (flex module - projections): forward {fmt_x(attention_only('alibi_forward'))}, forward+backward "
           f"{fmt_x(attention_only('alibi_forward_backward'))}.", "",
           "Forward:", "", side_table("alibi_forward", "flex module"), "",
           "Forward+backward:", "", side_table("alibi_forward_backward", "flex module"), ""]

    # ---- e. PyTorch's flex_attention under torch.compile ----
    comp = py.get("compile", {})
    cache = "an empty inductor cache" if py.get("fresh_inductor_cache") else "the usual inductor cache"
    md += ["## e. PyTorch's flex_attention under torch.compile (ours at least as fast: PyTorch / ours >= 1.0)", "",
           f"`torch.compile(flex_attention, dynamic=False)` with torch {py['torch']}, the same mods written as "
           "PyTorch's (`score + slopes[h] * (kv_idx - q_idx)`, `50 * tanh(score / 50)`, the causal and document "
           "`mask_mod`s through `create_block_mask`); compiled from " + cache + ". The first call of each mod "
           "(its compile and one run) is timed alone; the steady state is the median of interleaved rounds "
           "afterwards, in Python's own process; our figure is the C++ side's `flex_*` median of the same mod "
           "(`flex_alibi`: the flex call alone, as here). `py_sdpa_causal` against the C++ side's "
           "`aten_sdpa_causal` shows how the two processes' machine compared.", ""]
    erows = []
    for m in mods:
        ent = comp.get(m, {})
        torch_ms = ms("python_forward", f"torch_flex_{m}")
        first = ent.get("first_call_s")
        erows.append([m, fmt_ms(ms(*cpp_side[m])), fmt_ms(torch_ms), fmt_x(e[m]),
                      "-" if first is None else f"{first:.1f} s",
                      str(ent.get("graphs_compiled", "-")),
                      ent.get("forward_error", "compiled, max abs diff "
                              + (f"{ent['max_abs_diff']:.1e}" if "max_abs_diff" in ent else "-"))])
    erows.append(["ATen SDPA is_causal", fmt_ms(ms("causal_forward", "aten_sdpa_causal")),
                  fmt_ms(ms("python_forward", "py_sdpa_causal")),
                  fmt_x(ratio(ms("python_forward", "py_sdpa_causal"), ms("causal_forward", "aten_sdpa_causal"))),
                  "-", "-", "not compiled (both processes' ATen)"])
    md += ["Forward, no grad:", "",
           table(["mod", "ours ms", "PyTorch compiled ms", "PyTorch / ours", "first call (compile + run)",
                  "graphs", "forward"], erows), ""]
    errors = {m: comp.get(m, {}).get("backward_error") for m in mods}
    if any(errors.values()):
        distinct = sorted({v for v in errors.values() if v})
        md += ["Forward+backward: PyTorch's compiled `flex_attention` refuses inputs that require grad on the CPU, "
               "for every mod (" + ", ".join(m for m in mods if errors[m]) + "), before compiling anything:", ""]
        md += ["```", *distinct, "```", ""]
    bw = [r for r in py["rows"] if r["section"] == "python_forward_backward"]
    if bw:
        cpp_fb = {"causal": ("causal_forward_backward", "flex_causal"),
                  "documents": ("documents_forward_backward", "flex_documents"),
                  "softcap": ("softcap_forward_backward", "flex_softcap"),
                  "alibi": ("alibi_forward_backward", "flex_alibi")}
        md += ["Forward+backward:", "",
               table(["mod", "ours ms", "PyTorch compiled ms", "PyTorch / ours"],
                     [[m, fmt_ms(ms(*cpp_fb[m])), fmt_ms(ms("python_forward_backward", f"torch_flex_{m}")),
                       fmt_x(ratio(ms("python_forward_backward", f"torch_flex_{m}"), ms(*cpp_fb[m])))]
                      for m in mods]), ""]

    if f_dec is not None:
        md += [f"## f. Decoding: one query over {decode_keys} cached keys (flex within 1.1x of the decode kernel: "
               f"{fmt_x(f_dec)})", "",
               f"q [1, 32, 1, 64] over k, v [1, 8, {decode_keys}, 64] float32, no grad (a decoding step of a "
               "grouped-query model). `flex_decode`: `torchattn::flex_attention(q, k, v, "
               "create_block_mask(VisibleKeys{}, 1, 1, 1, keys))`, which reads each block of keys once for the 4 "
               "query heads of its key/value head. `torchattn_decode`: `functional::attention(q, k, v, {}, 0, {})`, "
               f"whose path (`functional::attention_path`) was `{cpp.get('decode_path', '?')}`: flex's kernels, the "
               "block mask made per call. `decode_kernel`: the same call with a key padding mask that hides nothing, "
               f"whose path was `{cpp.get('kernel_path', '?')}`: torchattn's dedicated decode kernel (it keeps the "
               "steps with key masks). `aten_sdpa_decode`: `at::scaled_dot_product_attention(..., "
               "enable_gqa=true)`. Five times the other sections' rounds.", "",
               side_table("decoding", "flex"), ""]
    if short_keys:
        rows_g = []
        for keys in short_keys:
            sec = f"decoding_short_{keys}"
            calls = short_calls[keys]
            ours, aten = ms(sec, "torchattn_decode"), ms(sec, "aten_sdpa_decode")
            rows_g.append([str(keys), str(int(calls)), f"{1000 * ours / calls:.1f}", f"{1000 * aten / calls:.1f}",
                           fmt_x(ratio(ours, aten)),
                           fmt_x(next(r["round_ratio_median"] for r in cpp["rows"]
                                      if r["section"] == sec and r["variant"] == "aten_sdpa_decode"))])
        md += ["## g. Decoding steps of a small model: the default path against ATen's", "",
               "q [1, 9, 1, 64] over k, v [1, 3, keys, 64] float32, no grad (SmolLM2-135M's heads). "
               "`functional::attention(q, k, v, {}, 0, {})` (the table's `cpu_flex_decode`) against "
               "`at::scaled_dot_product_attention(..., enable_gqa=true)`. Each sample times a batch of calls; five "
               "times the other sections' rounds.", "",
               table(["keys", "calls a sample", "default us a call", "ATen us a call", "default / ATen",
                      "ATen / default, round by round"], rows_g), ""]

    if args.cpp_avx2:
        narrow = json.load(open(args.cpp_avx2))

        def ms2(section, variant):
            for r in narrow["rows"]:
                if r["section"] == section and r["variant"] == variant:
                    return r["median_ms"]
            return None

        isa2 = torchattn_isa(flags, narrow.get("env", {}).get("TORCHATTN_ISA", ""))
        path2 = ("flex under flex::Causal" if T <= prefill_max_keys(isa2) else
                 f"ATen's flash kernel (cpu_flex_causal stops at {prefill_max_keys(isa2)} keys with {isa2})")
        pairs = [
            ("a", "flex causal forward / our causal prefill (`functional::attention`: " + path2 + ")",
             ("causal_forward", "flex_causal"), ("causal_forward", "torchattn_causal"), "<=", 1.15),
            ("b", "flex causal forward+backward / ATen SDPA is_causal", ("causal_forward_backward", "flex_causal"),
             ("causal_forward_backward", "aten_sdpa_causal"), "<=", 1.2),
            ("c", "documents, forward: every block / block mask", ("documents_forward", "flex_documents_every_block"),
             ("documents_forward", "flex_documents"), ">=", 8.0),
            ("c", "documents, forward+backward: every block / block mask",
             ("documents_forward_backward", "flex_documents_every_block"),
             ("documents_forward_backward", "flex_documents"), ">=", 8.0),
            ("d", "softcap, forward: dedicated / flex", ("softcap_forward", "torchattn_softcap"),
             ("softcap_forward", "flex_softcap"), ">=", 1.0),
            ("d", "softcap, forward+backward: dedicated / flex", ("softcap_forward_backward", "torchattn_softcap"),
             ("softcap_forward_backward", "flex_softcap"), ">=", 1.0),
            ("d", "ALiBi module, forward: dedicated / flex", ("alibi_forward", "torchattn_alibi_module"),
             ("alibi_forward", "flex_alibi_module"), ">=", 1.0),
            ("d", "ALiBi module, forward+backward: dedicated / flex",
             ("alibi_forward_backward", "torchattn_alibi_module"), ("alibi_forward_backward", "flex_alibi_module"),
             ">=", 1.0),
            ("f", f"decoding over {narrow.get('decode_keys', '?')} keys: flex / the decode kernel",
             ("decoding", "flex_decode"), ("decoding", "decode_kernel"), "<=", 1.1),
            ("f", f"decoding over {narrow.get('decode_keys', '?')} keys: the default step / the decode kernel",
             ("decoding", "torchattn_decode"), ("decoding", "decode_kernel"), "<=", 1.0),
        ]
        arows = []
        for t, name, top, bottom, op, bound in pairs:
            v = ratio(ms2(*top), ms2(*bottom))
            arows.append([t, name, fmt_ms(ms2(*top)), fmt_ms(ms2(*bottom)), "-" if v is None else f"{v:.2f}",
                          f"{op} {bound}", holds(v, op, bound)])
        md += [f"## The AVX2 path (TORCHATTN_ISA={narrow.get('env', {}).get('TORCHATTN_ISA', '?')})", "",
               "The same C++ run on the same machine with torchattn's kernels capped at AVX2 (flex's kernels are "
               "instantiated for AVX2 and AVX-512; an AVX2-only CPU runs these)"
               + (f" and ATen's too (ATEN_CPU_CAPABILITY={narrow['env']['ATEN_CPU_CAPABILITY']}; run.sh caps oneDNN's "
                  "and MKL's GEMMs too: ONEDNN_MAX_CPU_ISA=AVX2, MKL_ENABLE_INSTRUCTIONS=AVX2), as on an AVX2-only CPU"
                  if narrow.get("env", {}).get("ATEN_CPU_CAPABILITY") else "; ATen's kernels keep their own "
                  "instruction set")
               + f". {narrow['rounds']} rounds.", "",
               table(["", "ratio", "numerator ms", "denominator ms", "measured", "bound", "met"], arows), ""]
        wide_aten, narrow_aten = ms("causal_forward", "aten_sdpa_causal"), ms2("causal_forward", "aten_sdpa_causal")
        if wide_aten and narrow_aten:
            md += [f"ATen's SDPA is_causal forward took {fmt_ms(narrow_aten)} ms under these caps and "
                   f"{fmt_ms(wide_aten)} ms without them: where the two are alike, the caps did not reach ATen's "
                   "flash kernel (its GEMMs), and a and b compare flex's AVX2 kernels with ATen's at full width, "
                   "not with what an AVX2-only CPU runs. Flex's AVX2 tiles hold 4 query rows x 16 keys (8 of "
                   "AVX2's 16 registers as accumulators) against AVX-512's 8 x 32.", ""]

    checks = [r for r in cpp["rows"] if r["section"] == "check"]
    md += ["## Checks before timing", "",
           "C++: max |difference| of outputs; of gradients relative past 1 (max |a - b| / max(1, max |b|)). Python: "
           "each compiled output against the same mods on whole score matrices.", "",
           table(["check", "difference", "tolerance"],
                 [[r["variant"], f"{r['max_diff']:.1e}", f"{r['tolerance']:.0e}"] for r in checks]
                 + [[f"PyTorch compiled flex, {m}: forward vs whole score matrices",
                     f"{comp[m]['max_abs_diff']:.1e}", "1e-04"] for m in mods if "max_abs_diff" in comp.get(m, {})]),
           ""]

    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "flex.md")
    with open(path, "w") as f:
        f.write("\n".join(md))
    print("\n".join(md))


if __name__ == "__main__":
    main()
