#!/usr/bin/env python3
"""Makes a Llama-3.2-1B-shaped model with random weights, from a config, with transformers
(nothing downloaded): 16 layers, hidden 2048, 32 heads over 8 key/value heads, MLP 8192,
tied embeddings, SmolLM2-135M's tokenizer (49152 tokens) from a converted SmolLM2 folder
(tools/convert_smollm2.py). 1.07B parameters; float32 safetensors of 4.3 GB.

The weights are transformers' own initialisation (normal, std 0.02) from a fixed seed, so
two runs write the same file. The scale benchmark (apps/bench/results/scale.md) measures
loading, prefill and decoding on it; the tokens it generates mean nothing.

Usage: .venv/bin/python tools/make_scale_model.py --tokenizer SMOLLM2_DIR OUT_DIR
       [--layers N] [--dtype float32|bfloat16]   (does nothing if OUT_DIR is complete)
"""

import argparse
import json
import os
import shutil
import sys

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--tokenizer", required=True, help="a folder with SmolLM2's tokenizer files")
    ap.add_argument("--layers", type=int, default=16, help="decoder layers (16: Llama-3.2-1B)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    weights = os.path.join(a.out, "model.safetensors")
    if os.path.exists(weights) and os.path.exists(os.path.join(a.out, "config.json")):
        print(f"make_scale_model: {a.out} is already made")
        return 0
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    vocab = json.load(open(os.path.join(a.tokenizer, "config.json")))["vocab_size"]
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=a.layers,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=64,
        hidden_act="silu",
        max_position_embeddings=8192,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        architectures=["LlamaForCausalLM"],
    )
    torch.manual_seed(a.seed)
    dtype = torch.float32 if a.dtype == "float32" else torch.bfloat16
    model = LlamaForCausalLM(config).to(dtype).eval()
    os.makedirs(a.out, exist_ok=True)
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(config.to_dict(), f, indent=2)
    for name in TOKENIZER_FILES:
        src = os.path.join(a.tokenizer, name)
        if os.path.exists(src):
            shutil.copyfile(src, os.path.join(a.out, name))
    tmp = weights + ".tmp"
    save_file(state, tmp, metadata={"format": "pt"})
    os.replace(tmp, weights)  # last: marks the folder complete
    params = sum(v.numel() for v in state.values())
    print(f"make_scale_model: wrote {a.out} ({params / 1e9:.3f}B parameters, "
          f"{os.path.getsize(weights) / 1e9:.2f} GB of {a.dtype})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
