#!/usr/bin/env python3
"""Compares two train_gpt loss curves (loss.csv) of the same configuration and seed:
a reference (the CPU, float32) and a candidate (CUDA, bf16 autocast). The candidate
follows the reference when

- both evaluate at the same steps;
- the candidate's eval loss falls as the reference's does: from its first eval to its
  last it falls by at least `--fall` (default 0.9) of the reference's fall over the same
  steps, and the reference's does fall;
- at every eval step its loss is within `--rel` (default 10%) of the reference's, and
  at the last within `--rel-final` (default 5%).

Prints the curves side by side and one line, `compare_loss: PASS ...` or
`compare_loss: FAIL ...`; exits 1 on FAIL. Standard library only.

Usage: compare_loss.py REFERENCE.csv CANDIDATE.csv [--rel R] [--rel-final R] [--fall F]
"""

import argparse
import csv
import sys


def eval_losses(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return {int(r["step"]): float(r["eval_loss"]) for r in rows if r.get("eval_loss")}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("reference")
    ap.add_argument("candidate")
    ap.add_argument("--rel", type=float, default=0.10)
    ap.add_argument("--rel-final", type=float, default=0.05)
    ap.add_argument("--fall", type=float, default=0.9)
    a = ap.parse_args()
    ref, cand = eval_losses(a.reference), eval_losses(a.candidate)
    problems = []
    if not ref or sorted(ref) != sorted(cand):
        problems.append(f"eval steps differ: {sorted(ref)} vs {sorted(cand)}")
    steps = sorted(set(ref) & set(cand))
    print(f"{'step':>6} {'reference':>10} {'candidate':>10} {'rel':>7}")
    worst = 0.0
    for s in steps:
        rel = abs(cand[s] - ref[s]) / ref[s]
        worst = max(worst, rel)
        print(f"{s:>6} {ref[s]:>10.4f} {cand[s]:>10.4f} {rel:>7.2%}")
        if rel > a.rel:
            problems.append(f"step {s}: {cand[s]:.4f} is {rel:.1%} from {ref[s]:.4f}")
    if steps:
        first, last = steps[0], steps[-1]
        final_rel = abs(cand[last] - ref[last]) / ref[last]
        if final_rel > a.rel_final:
            problems.append(f"final eval loss {cand[last]:.4f} is {final_rel:.1%} from {ref[last]:.4f}")
        ref_fall, cand_fall = ref[first] - ref[last], cand[first] - cand[last]
        if ref_fall <= 0:
            problems.append(f"the reference's eval loss did not fall ({ref[first]:.4f} -> {ref[last]:.4f})")
        elif cand_fall < a.fall * ref_fall:
            problems.append(f"the candidate's eval loss fell by {cand_fall:.4f} ({cand[first]:.4f} -> {cand[last]:.4f}), "
                            f"less than {a.fall:g} of the reference's {ref_fall:.4f}")
        summary = (f"eval loss {cand[first]:.3f} -> {cand[last]:.3f} (reference {ref[first]:.3f} -> {ref[last]:.3f}), "
                   f"largest gap {worst:.1%} over {len(steps)} evals")
    else:
        summary = "no eval losses"
    if problems:
        print(f"compare_loss: FAIL: {summary}; " + "; ".join(problems))
        sys.exit(1)
    print(f"compare_loss: PASS: {summary}")


if __name__ == "__main__":
    main()
