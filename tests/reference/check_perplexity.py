#!/usr/bin/env python3
"""ctest -R perplexity: torchattn_perplexity against transformers on SmolLM2-135M.

Writes a text of README.md and docs/*.md (its first --chars characters, cut at a line:
more than 5,000 tokens), computes its
perplexity with transformers in float32 by the tool's definition (tokenize the whole
text without special tokens, consecutive windows of --context tokens, a last partial
window dropped, each scored alone: the mean negative log-likelihood of tokens 2..C given
the tokens before them), then runs the tool in float32, bfloat16, int8 and dynamic-int8 and
checks: float32 equal to transformers within 1e-4 relative and the same token count;
bfloat16 at most 0.5% and int8 at most 1.0% above float32; the last line
`perplexity P tokens N`; dynamic-int8 within 10% of transformers' model
quantize_dynamic'd (PyTorch's scheme). Not closer: that scheme quantizes each layer's
input to 7 bits over the whole window, so a last-bit difference in a float32 sum moves
a value across a rounding step, and the perplexity with it. How far, is measured here:
PyTorch's own, with its embeddings scaled by 1 + 1e-7, printed and written beside it
(measured on SmolLM2 over four windows: up to 5.6%).

Usage: check_perplexity.py --cli torchattn_perplexity --model DIR --work DIR [--context 512]
"""

import argparse
import glob
import math
import os
import re
import subprocess
import sys
import warnings

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def reference(model_dir, text, context, dynamic_int8=False, nudge=0.0, kept=None):
    """kept: a list that receives the first windows' float32 logits [context - 1, vocab]
    (as many as it has Nones)."""
    tok = AutoTokenizer.from_pretrained(model_dir)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    if dynamic_int8:
        with warnings.catch_warnings():  # torch.ao.quantization's deprecation notices
            warnings.simplefilter("ignore")
            model = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
    if nudge:
        model.model.embed_tokens.register_forward_hook(lambda module, inputs, out: out * (1.0 + nudge))
    windows = len(ids) // context
    total = 0.0
    with torch.no_grad():
        for w in range(windows):
            x = torch.tensor([ids[w * context:(w + 1) * context]])
            logits = model(x).logits[0, :-1].float()
            if kept is not None and w < len(kept):
                kept[w] = logits.clone()
            logp = torch.log_softmax(logits, -1)
            total -= logp.gather(-1, x[0, 1:, None]).double().sum().item()
    tokens = windows * (context - 1)
    return math.exp(total / tokens), tokens, len(ids)


def run_tool(cli, model_dir, path, dtype, context, extra=()):
    p = subprocess.run([cli, "--model", model_dir, "--file", path, "--dtype", dtype, "--context", str(context),
                        *extra], capture_output=True, text=True, timeout=1200)
    last = p.stdout.strip().splitlines()[-1] if p.stdout.strip() else ""
    m = re.fullmatch(r"perplexity (\d+\.\d{4}) tokens (\d+)", last)
    if p.returncode != 0 or not m:
        sys.exit(f"torchattn_perplexity --dtype {dtype}: exit {p.returncode}, last line {last!r}\n{p.stderr[-2000:]}")
    if "[1/" not in p.stderr:
        sys.exit(f"torchattn_perplexity --dtype {dtype}: no progress line on stderr: {p.stderr[-500:]!r}")
    return float(m.group(1)), int(m.group(2))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cli", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--chars", type=int, default=21000, help="the text's length (0: all of it)")
    ap.add_argument("--json", help="write the figures here (apps/bench/generate/report_weights.py reads them)")
    args = ap.parse_args()
    torch.set_num_threads(2)
    os.makedirs(args.work, exist_ok=True)
    parts = [os.path.join(ROOT, "README.md")] + sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))
    text = "\n\n".join(open(p, encoding="utf-8").read() for p in parts)
    if args.chars and len(text) > args.chars:
        text = text[:text.rindex("\n", 0, args.chars) + 1]
    path = os.path.join(args.work, "text.txt")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    kept = [None, None]
    ref, ref_tokens, all_tokens = reference(args.model, text, args.context, kept=kept)
    print(f"[perplexity] text: {all_tokens} tokens; transformers float32: {ref:.6f} over {ref_tokens} tokens")
    ref_dynamic = reference(args.model, text, args.context, dynamic_int8=True)[0]
    nudged = reference(args.model, text, args.context, dynamic_int8=True, nudge=1e-7)[0]
    print(f"[perplexity] transformers quantize_dynamic'd: {ref_dynamic:.6f}; with its embeddings times 1 + 1e-7: "
          f"{nudged:.6f} ({100 * (nudged / ref_dynamic - 1):+.2f}%)")
    failures = []
    if all_tokens < 5000:
        failures.append(f"the text has {all_tokens} tokens, fewer than 5,000")
    got = {d: run_tool(args.cli, args.model, path, d, args.context) for d in ("float32", "bfloat16", "int8", "dynamic-int8")}
    for d, (p, n) in got.items():
        print(f"[perplexity] torchattn {d}: {p:.4f} over {n} tokens ({100 * (p / got['float32'][0] - 1):+.3f}% "
              "against float32)")
        if n != ref_tokens:
            failures.append(f"{d}: {n} tokens scored, transformers {ref_tokens}")
    # --chunks 2 --save-logits: the first two windows' logits, against transformers'.
    saved = os.path.join(args.work, "logits.bin")
    p2, n2 = run_tool(args.cli, args.model, path, "float32", args.context, ("--chunks", "2", "--save-logits", saved))
    with open(saved, "rb") as f:
        header = f.readline().split()
        body = f.read()
    want = torch.cat(kept)
    if header != [b"torchattn-logits", b"float32", str(want.shape[0]).encode(), str(want.shape[1]).encode()]:
        failures.append(f"--save-logits: header {header}, expected rows {want.shape[0]} vocab {want.shape[1]}")
    elif n2 != 2 * (args.context - 1) or len(body) != want.numel() * 4:
        failures.append(f"--chunks 2: {n2} tokens scored and {len(body)} bytes of logits for {tuple(want.shape)}")
    else:
        diff = (torch.frombuffer(bytearray(body), dtype=torch.float32).reshape(want.shape) - want).abs().max().item()
        print(f"[perplexity] --chunks 2: {p2:.4f} over {n2} tokens; --save-logits against transformers' logits: "
              f"largest difference {diff:.2e}")
        if diff > 1e-3:
            failures.append(f"--save-logits: logits differ from transformers' by {diff:.2e} (bound 1e-3)")
    f32 = got["float32"][0]
    # The tool prints 4 decimals: the rounding (5e-5) is within the bound for P > 0.5.
    if abs(f32 - ref) / ref > 1e-4:
        failures.append(f"float32 {f32:.4f} differs from transformers' {ref:.6f} by more than 1e-4 relative")
    dynamic = got["dynamic-int8"][0]
    if abs(dynamic - ref_dynamic) / ref_dynamic > 0.10:
        failures.append(f"dynamic-int8 {dynamic:.4f} differs from transformers' quantize_dynamic'd {ref_dynamic:.6f} "
                        "by more than 10%")
    for d, bound in (("bfloat16", 0.005), ("int8", 0.010)):
        if got[d][0] > f32 * (1 + bound):
            failures.append(f"{d} {got[d][0]:.4f} is more than {100 * bound:.1f}% above float32 {f32:.4f}")
    if args.json:
        import json
        with open(args.json, "w") as f:
            json.dump({"text_tokens": all_tokens, "scored": ref_tokens, "context": args.context,
                       "transformers_float32": ref, "transformers_dynamic_int8": ref_dynamic,
                       "transformers_dynamic_int8_nudged": nudged,
                       "torchattn": {d: p for d, (p, _) in got.items()}}, f)
    for f in failures:
        print(f"[perplexity] FAIL {f}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
