#!/usr/bin/env python3
"""llama.cpp's side of the weight formats' benchmark (apps/bench/results/weights.md), through
llama-cpp-python (PyPI: built from source with the llama.cpp it vendors, for this CPU). The
SmolLM2 folder is converted once per type (F32 or Q8_0) by the convert_hf_to_gguf.py of that
same llama.cpp (taken from the package's source distribution, which pip downloads into
--work), and Q4_0, Q4_1 and Q4_K_M are made from the F32 file by its quantizer
(llama_model_quantize, llama-quantize's defaults); then measured as torchattn_generate_bench
measures: decoding tokens/s after a 32-token prompt (128 new tokens, greedy, the median of 3), a warm prefill of 512 tokens (its
first token, the median of 5 after a warm-up) and the peak RSS, at the given threads.

Usage: .venv/bin/python apps/bench/peers/llama_cpp_generate.py --model DIR --type q8_0 --threads 2
           --work DIR [--json out.json] [--quick]
           [--name NAME] [--new-tokens N] [--long-prompts 512,2048] [--cold-load] [--decode-only]
       .venv/bin/python apps/bench/peers/llama_cpp_generate.py --model DIR --type q4_0 --work DIR --make-only

--name: the GGUF files' name in --work (default smollm2). --long-prompts: the warm
prefills measured (each the median of its runs after a warm-up). --cold-load: the GGUF
evicted from the page cache and loaded once first (load_cold_s), then the peak RSS starts
again and the measured load is warm. --decode-only: no prefills.
"""

import ctypes
import glob
import json
import os
import random
import subprocess
import sys
import tarfile
import time

import llama_cpp
import numpy as np

from harness import measure, peer_arguments, plan, report


def converter(work):
    """convert_hf_to_gguf.py (and its gguf-py) of the llama.cpp that llama-cpp-python vendors."""
    root = os.path.join(work, f"llama_cpp_python-{llama_cpp.__version__}")
    script = os.path.join(root, "vendor", "llama.cpp", "convert_hf_to_gguf.py")
    if not os.path.exists(script):
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                        f"llama-cpp-python=={llama_cpp.__version__}", "-d", work],
                       check=True, stdout=subprocess.DEVNULL)
        sdist = glob.glob(os.path.join(work, f"llama_cpp_python-{llama_cpp.__version__}.tar.gz"))[0]
        with tarfile.open(sdist) as t:
            prefix = f"llama_cpp_python-{llama_cpp.__version__}/vendor/llama.cpp/"
            wanted = (prefix + "convert_hf_to_gguf.py", prefix + "conversion/", prefix + "gguf-py/")
            t.extractall(work, members=[m for m in t.getmembers() if m.name.startswith(wanted)], filter="data")
    return script


def staged(model, work):
    """The model folder as the converter reads it: its files linked, and config.json naming
    the architecture where the folder's leaves it out (tools/convert_smollm2.py writes
    "architectures": null)."""
    d = os.path.join(work, "model")
    os.makedirs(d, exist_ok=True)
    for name in os.listdir(model):
        if name != "config.json" and not os.path.exists(os.path.join(d, name)):
            os.symlink(os.path.abspath(os.path.join(model, name)), os.path.join(d, name))
    config = json.load(open(os.path.join(model, "config.json")))
    if not config.get("architectures"):
        config["architectures"] = ["LlamaForCausalLM"] if config.get("model_type") == "llama" else None
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump(config, f)
    return d


# The types llama.cpp's quantizer makes from its F32 file (llama-quantize's names).
QUANTIZED = {"q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0", "q4_1": "LLAMA_FTYPE_MOSTLY_Q4_1",
             "q4_k_m": "LLAMA_FTYPE_MOSTLY_Q4_K_M"}


def made(model, work, name, kind):
    """The GGUF file of `kind` in work, made when missing: F32 and Q8_0 by the converter,
    the 4-bit types by llama.cpp's quantizer (llama_model_quantize, as llama-quantize runs
    it with its defaults) from the F32 file."""
    gguf = os.path.join(work, f"{name}-{kind}.gguf")
    if os.path.exists(gguf):
        return gguf
    if kind in QUANTIZED:
        source = made(model, work, name, "f32")
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = getattr(llama_cpp, QUANTIZED[kind])
        params.nthread = os.cpu_count() or 1
        code = llama_cpp.llama_model_quantize(source.encode(), (gguf + ".part").encode(), ctypes.byref(params))
        if code != 0:
            sys.exit(f"llama_cpp_generate: llama_model_quantize to {kind} failed ({code})")
    else:
        r = subprocess.run([sys.executable, converter(work), staged(model, work), "--outtype", kind,
                            "--outfile", gguf + ".part"], capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"llama_cpp_generate: convert_hf_to_gguf.py failed ({r.returncode}):\n{r.stderr[-3000:]}")
    os.replace(gguf + ".part", gguf)
    return gguf


def main():
    ap = peer_arguments(__doc__)
    ap.add_argument("--type", default="q8_0", choices=["f32", "q8_0", "q4_0", "q4_1", "q4_k_m"])
    ap.add_argument("--work", required=True, help="where the converter and the GGUF files are kept")
    ap.add_argument("--name", default="smollm2")
    ap.add_argument("--make-only", action="store_true", help="make the GGUF file, print its path and stop")
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    gguf = made(a.model, a.work, a.name, a.type)
    if a.make_only:
        print(gguf)
        return
    new_tokens, long_prompts = plan(a)
    n_ctx = max([1024, 32 + new_tokens] + [n + 8 for n in long_prompts])
    rng = random.Random(0)

    # The last evaluated token's logits, from the context (Llama.scores holds them only
    # with logits_all, and has n_batch rows without it).
    def last_logits_argmax(llm):
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),))
        return int(np.argmax(logits))

    def decode_once(llm, prompt, new_tokens):
        llm.reset()
        llm.eval(prompt)  # the prompt and its first token, as the others time it apart
        token = last_logits_argmax(llm)
        t = time.perf_counter()
        for _ in range(new_tokens - 1):
            llm.eval([token])
            token = last_logits_argmax(llm)
        return (new_tokens - 1) / (time.perf_counter() - t)

    def prefill(llm, ids):
        llm.reset()
        llm.eval(ids)
        last_logits_argmax(llm)

    _, res = measure(
        a, lambda: llama_cpp.Llama(model_path=gguf, n_ctx=n_ctx, n_batch=512, n_ubatch=512, n_threads=a.threads,
                                   n_threads_batch=a.threads, verbose=False), gguf,
        lambda llm, n: [rng.randrange(100, llm.n_vocab() - 100) for _ in range(n)], decode_once, prefill)
    res = {"tool": "llama.cpp", "version": f"llama-cpp-python {llama_cpp.__version__}", "type": a.type,
           "threads": a.threads, "gguf_bytes": os.path.getsize(gguf), **res}
    report(a, f"llama_cpp_generate: {a.type}, {a.threads} threads", res)


if __name__ == "__main__":
    main()
