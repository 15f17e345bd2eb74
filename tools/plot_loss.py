#!/usr/bin/env python3
"""Plots the loss.csv that train_gpt writes: train loss per step and eval loss."""

import argparse
import csv
import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("csv")
    ap.add_argument("png")
    args = ap.parse_args()
    steps, train, eval_steps, evals = [], [], [], []
    with open(args.csv) as f:
        for row in csv.DictReader(f):
            steps.append(int(row["step"]))
            train.append(float(row["train_loss"]))
            if row["eval_loss"]:
                eval_steps.append(int(row["step"]))
                evals.append(float(row["eval_loss"]))
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, train, lw=0.8, alpha=0.6, label="train loss (per step)")
    k = max(1, len(train) // 50)
    smooth = [sum(train[max(0, i - k):i + 1]) / len(train[max(0, i - k):i + 1]) for i in range(len(train))]
    ax.plot(steps, smooth, lw=1.6, label=f"train loss ({k + 1}-step mean)")
    ax.plot(eval_steps, evals, "o-", label="eval loss (held-out 10%)")
    ax.axhline(math.log(256), ls="--", c="gray", label="uniform guess ln 256")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats per byte)")
    ax.set_title("train_gpt: byte-level GPT on torchattn::MultiHeadAttention")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.png, dpi=100)
    print(f"wrote {args.png}")


if __name__ == "__main__":
    main()
