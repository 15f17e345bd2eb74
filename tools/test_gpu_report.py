#!/usr/bin/env python3
"""The results page of `make test-gpu` (tools/test_gpu.sh): what each stage showed on
the GPU, from the folder its stages wrote (--out DIR): the machine, each stage's last
verdict, the training figures (train_gpt and its PyTorch peer on the same GPU) and the
generation figures. Standard library only.

    python3 tools/test_gpu_report.py GPU_OUT [--out apps/bench/results/test-gpu.md]

The machine is read from GPU_OUT/machine.txt (test_gpu.sh writes it). A stage that did
not run is listed as such; a figure that is missing reads "not measured".
"""

import argparse
import csv
import os
import re
import sys


def read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def last_verdicts(text):
    """{stage: (result, seconds, note)}: the last verdict of each stage."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"test-gpu: (\w+): (PASS|FAIL) \((\d+) s\)(?:; |: )?(.*)$", line)
        if m:
            note = re.sub(r";? ?log: \S+$", "", m.group(4)).strip().rstrip(";")
            out[m.group(1)] = (m.group(2), int(m.group(3)), note)
    return out


def last_row(path):
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError:
        return None
    return rows[-1] if rows else None


def final_eval(path):
    try:
        with open(path, newline="") as f:
            rows = [r for r in csv.DictReader(f) if r.get("eval_loss")]
    except OSError:
        return None
    return float(rows[-1]["eval_loss"]) if rows else None


def fmt(v, spec, missing="not measured"):
    return missing if v is None else format(v, spec)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gpu_out")
    ap.add_argument("--out", default=None, help="the page (default GPU_OUT/test-gpu.md)")
    a = ap.parse_args()
    d = a.gpu_out
    verdicts = last_verdicts(read(os.path.join(d, "verdicts.txt")))
    if not verdicts:
        sys.exit(f"test_gpu_report: no verdicts in {d}/verdicts.txt")
    machine = [line.strip() for line in read(os.path.join(d, "machine.txt")).splitlines() if line.strip()]
    lines = ["# `make test-gpu` on a GPU", "",
             "Made by `python3 tools/test_gpu_report.py GPU_OUT` from the folder of `make test-gpu` "
             "(`bash tools/test_gpu.sh`, its stages' logs and verdicts); docs/gpu.md says what each stage does.", ""]
    lines += [f"- {m}" for m in machine] + [""]

    lines += ["## Stages", "", "| stage | result | seconds | what it showed |", "|---|---|---|---|"]
    for stage in ("build", "test", "memcheck", "train", "generate", "bench"):
        if stage in verdicts:
            result, secs, note = verdicts[stage]
            note = note.replace("|", "/")
            if len(note) > 400:
                note = note[:400] + " ... (the stage's log has the rest)"
            lines.append(f"| {stage} | {'**FAIL**' if result == 'FAIL' else result} | {secs} | {note} |")
        else:
            lines.append(f"| {stage} | not run | | |")
    lines.append("")

    ours, peer = last_row(os.path.join(d, "loss-cuda.csv")), last_row(os.path.join(d, "loss-peer-cuda.csv"))
    cpu = os.path.join(d, "loss-cpu.csv")
    lines += ["## Training on the GPU", "",
              "`train_gpt --device cuda` (bf16 autocast) and `tools/train_gpt_peer.py --device cuda` (the same model, "
              "data, batches and optimizer in PyTorch), the train stage's configuration; tokens/s over the whole run "
              "(loss.csv's last `tokens_per_s`, the same definition on both sides); the CPU's float32 curve is the "
              "reference.", "",
              "| figure | train_gpt (CUDA) | PyTorch peer (CUDA) | train_gpt (CPU, float32) |", "|---|---|---|---|",
              f"| tokens/s | {fmt(ours and float(ours['tokens_per_s']), '.0f')} | "
              f"{fmt(peer and float(peer['tokens_per_s']), '.0f')} | (the reference curve) |",
              f"| final eval loss | {fmt(final_eval(os.path.join(d, 'loss-cuda.csv')), '.4f')} | "
              f"{fmt(final_eval(os.path.join(d, 'loss-peer-cuda.csv')), '.4f')} | {fmt(final_eval(cpu), '.4f')} |", ""]
    if ours and peer:
        ratio = float(ours["tokens_per_s"]) / float(peer["tokens_per_s"])
        lines += [f"train_gpt runs at {ratio:.2f}x the PyTorch peer's tokens/s.", ""]

    gen = read(os.path.join(d, "generate.log"))
    lines += ["## Generation on the GPU", "",
              "A model of SmolLM2-135M's shape with random weights (tests/reference/make_device_reference.py), "
              "against transformers on the same GPU.", ""]
    found = [line for line in gen.splitlines()
             if line.startswith(("generate_device_check:", "speed:", "make_device_reference:"))
             or line.startswith("[llama")]
    lines += [f"    {line}" for line in found] if found else ["not run"]
    lines.append("")
    out = a.out or os.path.join(d, "test-gpu.md")
    with open(out, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
    print(f"test_gpu_report: wrote {out}")


if __name__ == "__main__":
    main()
