#!/usr/bin/env python3
"""What four-bit weights cost in quality, torchattn's and llama.cpp's (apps/bench/results/quant.md).

Two measures, as llama.cpp's own perplexity tool gives them:
- perplexity on SmolLM2-135M (the real model) over a text of at least --tokens tokens:
  our float32 and int4 (quantized at load from the float32 folder), our runs of
  llama.cpp's F32, Q4_0 and Q4_1 files, and llama.cpp's perplexity on the same files
  (llama-cpp-python, the logits of every position). The rise of each four-bit format over
  its runtime's float32 is the cost; our int4 (4 bits and a float16 step and offset per 32
  weights: 5.0 bits a weight) is set beside Q4_1 (5.0) and Q4_0 (4.5);
- the KL divergence of the next-token distributions of four-bit weights against float32
  on the Llama-3.2-1B-shaped model (tools/make_scale_model.py, random weights), over
  --kl-chunks windows: ours (int8 and int4 folders, llama.cpp's Q4_0, Q4_1 and Q4_K_M
  files run with --dtype int4) against our float32, llama.cpp's on the same files against
  its F32,
  as llama-perplexity's --kl-divergence reports it (the mean over tokens of
  sum p_f32 (log p_f32 - log p_q), and how often the most likely token is the same).

Every run scores the same token ids (the SmolLM2 tokenizer's, no special tokens), cut
into consecutive windows of --context tokens, each scored alone: tokens 2..context given
the ones before (torchattn_perplexity's definition). The text: the topics of Python's
own documentation (pydoc_data, the venv's Python), whole topics in name order until the
token count is reached: the same text on every machine with the same Python.

Usage: quant_quality.py --cli build/apps/perplexity/torchattn_perplexity --smollm2 DIR
           --scale DIR --work DIR --llama-work DIR --json OUT [--quick]
"""

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "peers"))

import llama_cpp  # noqa: E402
from llama_cpp_generate import made  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402


def make_text(tokenizer, tokens):
    """Python's documentation topics, whole, in name order, until `tokens` tokens."""
    from pydoc_data.topics import topics
    parts, count = [], 0
    for name in sorted(topics):
        parts.append(topics[name].strip())
        count += len(tokenizer(parts[-1], add_special_tokens=False)["input_ids"]) + 2
        if count >= tokens:
            break
    return "\n\n".join(parts) + "\n"


def ours(cli, model, text_path, dtype, context, chunks=0, logits=None):
    """torchattn_perplexity's (perplexity, tokens scored, seconds)."""
    cmd = [cli, "--model", model, "--file", text_path, "--dtype", dtype, "--context", str(context), "--threads", "2"]
    if chunks:
        cmd += ["--chunks", str(chunks)]
    if logits:
        cmd += ["--save-logits", logits]
    t = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    last = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else ""
    if p.returncode != 0 or not last.startswith("perplexity "):
        sys.exit(f"quant_quality: {' '.join(cmd)}: exit {p.returncode}\n{p.stderr[-2000:]}")
    words = last.split()
    return float(words[1]), int(words[3]), time.perf_counter() - t


def read_logits(path):
    """torchattn_perplexity --save-logits's rows, float32 [rows, vocab] (memory-mapped)."""
    with open(path, "rb") as f:
        header = f.readline()
    words = header.split()
    assert words[:2] == [b"torchattn-logits", b"float32"], header
    rows, vocab = int(words[2]), int(words[3])
    return np.memmap(path, dtype="<f4", mode="r", offset=len(header), shape=(rows, vocab))


def llama_logits(gguf, ids, context, windows):
    """llama.cpp's float32 logits of every scored token [windows * (context - 1), vocab]."""
    llm = llama_cpp.Llama(model_path=gguf, n_ctx=context, n_batch=context, n_ubatch=context, n_threads=2,
                          n_threads_batch=2, logits_all=True, verbose=False)
    out = np.empty((windows * (context - 1), llm.n_vocab()), dtype=np.float32)
    for w in range(windows):
        llm.reset()
        llm.eval(ids[w * context:(w + 1) * context])
        out[w * (context - 1):(w + 1) * (context - 1)] = llm.scores[:context - 1]
    del llm
    return out


def scored(ids, context, windows):
    """The token each logits row predicts."""
    return torch.tensor([ids[w * context + t + 1] for w in range(windows) for t in range(context - 1)])


def perplexity_of(logits, targets, step=2048):
    """exp of the mean negative log-likelihood of targets under float32 logits (float64 sums)."""
    total = 0.0
    for i in range(0, len(targets), step):
        logp = torch.log_softmax(torch.from_numpy(np.asarray(logits[i:i + step])).double(), -1)
        total -= logp.gather(-1, targets[i:i + step, None]).sum().item()
    return math.exp(total / len(targets))


def kl_against(base, other, step=1024):
    """{kl_mean, kl_median, kl_p99, top1_same}: KL(base || other) per token, as llama-perplexity."""
    kls, same = [], 0
    for i in range(0, base.shape[0], step):
        p = torch.log_softmax(torch.from_numpy(np.asarray(base[i:i + step])).double(), -1)
        q = torch.log_softmax(torch.from_numpy(np.asarray(other[i:i + step])).double(), -1)
        kls.append((p.exp() * (p - q)).sum(-1))
        same += (p.argmax(-1) == q.argmax(-1)).sum().item()
    kl = torch.cat(kls)
    return {"kl_mean": kl.mean().item(), "kl_median": kl.median().item(),
            "kl_p99": torch.quantile(kl, 0.99).item(), "top1_same": same / base.shape[0]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cli", required=True, help="torchattn_perplexity")
    ap.add_argument("--smollm2", required=True, help="SmolLM2-135M's float32 folder")
    ap.add_argument("--scale", required=True, help="the 1B-shaped float32 folder (its -int8 and -int4 beside it)")
    ap.add_argument("--scale-gguf", required=True,
                    help="the folder of llama.cpp's scale-{f32,q4_0,q4_1,q4_k_m}.gguf (made when missing)")
    ap.add_argument("--llama-work", required=True, help="where SmolLM2's GGUF files are kept (made when missing)")
    ap.add_argument("--work", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=20480, help="the SmolLM2 text's length in tokens, at least")
    ap.add_argument("--kl-chunks", type=int, default=4, help="windows of the 1B-shaped model's KL divergence")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 2,048 tokens, 1 KL window")
    a = ap.parse_args()
    if a.quick:
        a.tokens, a.kl_chunks = 2048, 1
    torch.set_num_threads(2)
    os.makedirs(a.work, exist_ok=True)
    tok = AutoTokenizer.from_pretrained(a.smollm2)
    text = make_text(tok, a.tokens)
    text_path = os.path.join(a.work, "text.txt")
    with open(text_path, "w", encoding="utf-8") as f:
        f.write(text)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    windows = len(ids) // a.context
    print(f"[quality] text: {len(text)} characters, {len(ids)} tokens, {windows} windows of {a.context}")
    result = {"text": {"source": f"pydoc_data.topics (Python {platform.python_version()})", "characters": len(text),
                       "tokens": len(ids), "windows": windows, "scored": windows * (a.context - 1),
                       "context": a.context},
              "llama_cpp_python": llama_cpp.__version__, "smollm2": {}, "scale": {}}

    # SmolLM2-135M: perplexity.
    gguf = {k: made(a.smollm2, a.llama_work, "smollm2", k) for k in ("f32", "q4_0", "q4_1")}
    targets = scored(ids, a.context, windows)
    runs = [("ours", "float32", a.smollm2, "float32"), ("ours", "int4", a.smollm2, "int4"),
            ("ours", "F32 file", gguf["f32"], "float32"), ("ours", "Q4_0 file", gguf["q4_0"], "int4"),
            ("ours", "Q4_0 file, float32", gguf["q4_0"], "float32"), ("ours", "Q4_1 file", gguf["q4_1"], "int4"),
            ("ours", "Q4_1 file, float32", gguf["q4_1"], "float32"), ("ours", "int8", a.smollm2, "int8")]
    for side, name, model, dtype in runs:
        ppl, n, s = ours(a.cli, model, text_path, dtype, a.context)
        assert n == len(targets), (name, n, len(targets))
        result["smollm2"][f"{side}:{name}"] = {"perplexity": ppl, "seconds": s, "bytes": size_of(model)}
        print(f"[quality] SmolLM2 {side} {name}: {ppl:.4f} ({s:.0f} s)")
    for kind in ("f32", "q4_0", "q4_1"):
        t = time.perf_counter()
        ppl = perplexity_of(llama_logits(gguf[kind], ids, a.context, windows), targets)
        result["smollm2"][f"llama:{kind.upper()}"] = {"perplexity": ppl, "seconds": time.perf_counter() - t,
                                                      "bytes": os.path.getsize(gguf[kind])}
        print(f"[quality] SmolLM2 llama.cpp {kind}: {ppl:.4f}")

    result["smollm2"]["head_grid"] = head_grid(a.smollm2)

    # The 1B-shaped model: KL divergence against float32, each runtime against its own.
    kl_ids = ids[:a.kl_chunks * a.context]
    kl_targets = scored(ids, a.context, a.kl_chunks)
    kl_text = os.path.join(a.work, "text.txt")
    base_path = os.path.join(a.work, "scale-float32.logits")
    ours(a.cli, a.scale, kl_text, "float32", a.context, a.kl_chunks, base_path)
    base = read_logits(base_path)
    result["scale"]["ours:float32"] = {"perplexity": perplexity_of(base, kl_targets)}
    sg = {k: made(a.scale, a.scale_gguf, "scale", k) for k in ("f32", "q4_0", "q4_1", "q4_k_m")}
    for name, model, dtype in (("int8", a.scale + "-int8", "int8"), ("int4", a.scale + "-int4", "int4"),
                               ("Q4_0 file", sg["q4_0"], "int4"), ("Q4_1 file", sg["q4_1"], "int4"),
                               ("Q4_K_M file", sg["q4_k_m"], "int4")):
        path = os.path.join(a.work, "scale-other.logits")
        ours(a.cli, model, kl_text, dtype, a.context, a.kl_chunks, path)
        other = read_logits(path)
        result["scale"][f"ours:{name}"] = {"perplexity": perplexity_of(other, kl_targets), **kl_against(base, other),
                                           "bytes": size_of(model)}
        print(f"[quality] 1B ours {name}: {result['scale'][f'ours:{name}']}")
        del other
        os.remove(path)
    llama_base = llama_logits(sg["f32"], kl_ids, a.context, a.kl_chunks)
    result["scale"]["llama:F32"] = {"perplexity": perplexity_of(llama_base, kl_targets),
                                    "ours_float32_against_it": kl_against(llama_base, base)}
    del base
    os.remove(base_path)
    for kind in ("q4_0", "q4_1", "q4_k_m"):
        other = llama_logits(sg[kind], kl_ids, a.context, a.kl_chunks)
        result["scale"][f"llama:{kind.upper()}"] = {"perplexity": perplexity_of(other, kl_targets),
                                                    **kl_against(llama_base, other),
                                                    "bytes": os.path.getsize(sg[kind])}
        print(f"[quality] 1B llama.cpp {kind}: {result['scale'][f'llama:{kind.upper()}']}")
    result["scale"]["windows"] = a.kl_chunks
    with open(a.json, "w") as f:
        json.dump(result, f, indent=1)
    print(f"[quality] wrote {a.json}")


def head_grid(folder):
    """How far SmolLM2's tied table is from int8 with a scale per 32 inputs (llama.cpp's
    Q8_0, the head of its four-bit files here) and per 64 (torchattn's Int8, an int4
    model's head): the relative RMS error of each quantization."""
    from safetensors.torch import load_file
    w = load_file(os.path.join(folder, "model.safetensors"))["model.embed_tokens.weight"].float()
    out = {}
    for group in (32, 64):
        x = w.reshape(-1, group)
        d = x.abs().amax(1, keepdim=True) / 127
        if group == 32:
            d = d.half().float()  # Q8_0 keeps d in float16
        q = torch.round(x / torch.where(d == 0, torch.ones_like(d), d)).clamp(-127, 127)
        out[f"int8_per_{group}"] = ((q * d - x).norm() / x.norm()).item()
    return out


def size_of(model):
    """The weights' bytes on disk: a GGUF file's size, a folder's safetensors."""
    if os.path.isfile(model):
        return os.path.getsize(model)
    return sum(os.path.getsize(os.path.join(model, f)) for f in os.listdir(model) if f.endswith(".safetensors"))


if __name__ == "__main__":
    main()
