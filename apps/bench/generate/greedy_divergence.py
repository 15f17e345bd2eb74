#!/usr/bin/env python3
"""Greedy tokens with bfloat16 and int8 weights against float32, over 20 prompts: where
each first differs. torchattn_generate --greedy --print-ids on each prompt in each
format (weights.md's quality section); writes JSON.

    python3 apps/bench/generate/greedy_divergence.py --cli build/apps/generate/torchattn_generate \
        --model .cache/smollm2 [--tokens 32] [--json bench-out/divergence.json]

For each prompt and format: the index of the first generated token that differs from
float32's (0 is the first new token), or null when all --tokens are equal.
"""

import argparse
import json
import subprocess
import sys

PROMPTS = [
    "The capital of France is",
    "Water boils at a temperature of",
    "The largest planet in our solar system is",
    "To make a cup of tea, first",
    "The main ingredient of guacamole is",
    "In 1969, astronauts landed on",
    "A triangle has three sides, and a square has",
    "The opposite of hot is",
    "Photosynthesis is the process by which plants",
    "The author of Romeo and Juliet is",
    "def fibonacci(n):",
    "The chemical symbol for gold is",
    "Once upon a time, in a small village,",
    "The three primary colors are",
    "To sort a list in Python, you can use",
    "The speed of light is about",
    "Monday, Tuesday, Wednesday,",
    "The human heart has four",
    "A good way to learn a new language is",
    "The Great Wall of China was built to",
]
FORMATS = ["float32", "bfloat16", "int8"]


def generate(cli, model, prompt, dtype, tokens):
    out = subprocess.run([cli, "--model", model, "--prompt", prompt, "--greedy", "--max-new-tokens", str(tokens),
                          "--dtype", dtype, "--print-ids"], capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        if line.startswith("ids:"):
            return [int(t) for t in line[len("ids:"):].split()]
    sys.exit(f"greedy_divergence: no 'ids:' line from {cli} --dtype {dtype} on {prompt!r}")


def first_difference(ours, ref):
    for i, (a, b) in enumerate(zip(ours, ref)):
        if a != b:
            return i
    return None if len(ours) == len(ref) else min(len(ours), len(ref))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cli", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--json", default="bench-out/divergence.json")
    a = ap.parse_args()
    rows = []
    for prompt in PROMPTS:
        ids = {d: generate(a.cli, a.model, prompt, d, a.tokens) for d in FORMATS}
        row = {"prompt": prompt, **{d: first_difference(ids[d], ids["float32"]) for d in FORMATS[1:]}}
        rows.append(row)
        print(f"greedy_divergence: {prompt!r}: " + ", ".join(f"{d} {row[d]}" for d in FORMATS[1:]), file=sys.stderr)
    with open(a.json, "w") as f:
        json.dump({"tokens": a.tokens, "prompts": rows}, f, indent=1)
    for d in FORMATS[1:]:
        same = sum(r[d] is None for r in rows)
        print(f"greedy_divergence: {d}: {same} of {len(rows)} prompts equal to float32 over {a.tokens} tokens")


if __name__ == "__main__":
    main()
