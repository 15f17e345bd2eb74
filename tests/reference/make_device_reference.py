#!/usr/bin/env python3
"""The reference of `make test-gpu`'s generate stage (and of ctest -R generate_device on
the CPU): a Llama model with SmolLM2-135M-Instruct's configuration and random weights
(real weights do not travel to a GPU machine), and what transformers computes with it
on a device:

- OUT/model/: config.json and model.safetensors (float32), save_pretrained's;
- OUT/prompt_ids.txt: the prompt, 64 token ids, comma-separated (--prompt-ids);
- OUT/expected.pt: the prompt's logits in float32 and in bfloat16 (stored as float32),
  and 32 greedy tokens with each step's top-two margin (float32), all computed by
  transformers on --device;
- OUT/speed.json: transformers' generate in bfloat16 on --device, batch 1, greedy,
  256 new tokens: decoding tokens/s (median of 3 runs after a warm-up).

With --compare-speed FILE (torchattn_generate's stderr) it prints, instead, one line
`speed: torchattn X tokens/s, transformers Y tokens/s, Zx` from the two runs.

--layers N keeps SmolLM2's widths with N layers (the CPU check uses 2). When a
converted SmolLM2 folder is at .cache/smollm2 (make generate), its config.json is
checked against the one written here.

Usage: make_device_reference.py OUT [--device cuda|cpu] [--layers N] [--compare-speed FILE]
"""

import argparse
import json
import math
import os
import re
import statistics
import sys
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

# SmolLM2-135M-Instruct's architecture (its config.json): a Llama with 30 layers of
# width 576, 9 query heads and 3 key/value heads of 64, tied embeddings.
SMOLLM2 = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
               num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192, rope_theta=100000.0,
               rms_norm_eps=1e-5, tie_word_embeddings=True, hidden_act="silu", bos_token_id=1, eos_token_id=2,
               pad_token_id=2, initializer_range=0.02, attention_bias=False, mlp_bias=False)


def check_against_converted(config):
    path = os.path.join(os.path.dirname(__file__), "..", "..", ".cache", "smollm2", "config.json")
    if not os.path.exists(path):
        return
    with open(path) as f:
        real = json.load(f)
    if "rope_theta" not in real:
        real["rope_theta"] = real.get("rope_parameters", {}).get("rope_theta")
    for k, v in SMOLLM2.items():
        if k not in real or k == "num_hidden_layers":
            continue
        same = math.isclose(real[k], v, rel_tol=1e-6) if isinstance(v, float) else real[k] == v
        if not same:
            sys.exit(f"make_device_reference: SmolLM2's {k} is {real[k]}, this script says {v}")
    # What this model writes must say the same as SmolLM2 says of itself.
    mine = config.to_dict()
    theta = mine.get("rope_theta") or mine.get("rope_parameters", {}).get("rope_theta")
    if theta is None or real["rope_theta"] is None or not math.isclose(theta, real["rope_theta"]):
        sys.exit(f"make_device_reference: rope_theta {theta} is not SmolLM2's {real['rope_theta']}")


def timed_generate(model, ids, new_tokens):
    mask = torch.ones_like(ids)
    model.generate(ids, attention_mask=mask, max_new_tokens=8, min_new_tokens=8, do_sample=False)  # warm-up
    runs = []
    for _ in range(3):
        if ids.is_cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
        if ids.is_cuda:
            torch.cuda.synchronize()
        runs.append(time.perf_counter() - t0)
    # Prefill is in the time; for a 64-token prompt it is one step's worth.
    return new_tokens / statistics.median(runs)


def make(out, device, layers):
    # No end-of-sequence token: every run decodes all its tokens (the greedy comparison
    # and the timing alike), whatever the random weights favour.
    config = LlamaConfig(**{**SMOLLM2, "num_hidden_layers": layers, "eos_token_id": None})
    check_against_converted(config)
    torch.manual_seed(2026)
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(os.path.join(out, "model"))
    g = torch.Generator().manual_seed(11)
    prompt = torch.randint(3, config.vocab_size, (1, 64), generator=g)
    with open(os.path.join(out, "prompt_ids.txt"), "w") as f:
        f.write(",".join(str(i) for i in prompt[0].tolist()))
    ids = prompt.to(device)
    model.to(device)
    ref = {"device": device, "layers": torch.tensor(layers)}
    with torch.no_grad():
        ref["prompt"] = prompt[0].clone()
        ref["logits.float32"] = model(ids).logits[0].float().cpu()
        gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=32, min_new_tokens=32,
                             do_sample=False, output_logits=True, return_dict_in_generate=True, pad_token_id=2)
        top2 = torch.stack([s[0].float().topk(2).values for s in gen.logits])
        ref["tokens"] = gen.sequences[0, ids.shape[1]:].cpu()
        ref["margins"] = (top2[:, 0] - top2[:, 1]).cpu()
        model.to(torch.bfloat16)
        ref["logits.bfloat16"] = model(ids).logits[0].float().cpu()
        speed = timed_generate(model, ids, 256) if device != "cpu" else None
    del ref["device"]
    torch.save(ref, os.path.join(out, "expected.pt"))
    with open(os.path.join(out, "speed.json"), "w") as f:
        json.dump({"transformers_tokens_per_s": speed, "device": device,
                   "gpu": torch.cuda.get_device_name() if device == "cuda" else None,
                   "torch": torch.__version__}, f)
    print(f"make_device_reference: {layers} layers of SmolLM2-135M's shape on {device}"
          + (f"; transformers generate bf16: {speed:.1f} tokens/s" if speed else ""))


def compare_speed(out, stderr_file):
    with open(os.path.join(out, "speed.json")) as f:
        theirs = json.load(f)["transformers_tokens_per_s"]
    text = open(stderr_file).read()
    m = re.search(r"decode (\d+) tokens in ([\d.]+) s \(([\d.]+) tokens/s\)", text)
    if not m or not theirs:
        sys.exit(f"speed: no decoding figure in {stderr_file} or no transformers figure")
    ours = float(m.group(3))
    print(f"speed: torchattn_generate {ours:.1f} tokens/s, transformers generate {theirs:.1f} tokens/s, "
          f"{ours / theirs:.2f}x (target >= 5x)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--layers", type=int, default=SMOLLM2["num_hidden_layers"])
    ap.add_argument("--compare-speed", metavar="FILE")
    a = ap.parse_args()
    if a.compare_speed:
        compare_speed(a.out, a.compare_speed)
        return
    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("make_device_reference: --device cuda, but this torch sees no CUDA device")
    os.makedirs(a.out, exist_ok=True)
    torch.set_num_threads(min(os.cpu_count() or 1, 8))
    make(a.out, a.device, a.layers)


if __name__ == "__main__":
    main()
