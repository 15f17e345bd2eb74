#!/usr/bin/env python3
"""ctest checks of train_gpt (a tiny model, a few steps each).

  train_checks.py ddp     --exe E --dir D   2 ranks for K steps == 1 process on the union
                                            of their batches (<= 1e-5); ranks identical
  train_checks.py failure --exe E --dir D   a rank that dies makes the others exit with a
                                            clear error within a bounded time
  train_checks.py resume  --exe E --dir D   a run interrupted and resumed ends with the
                                            same weights as an uninterrupted one
  train_checks.py pack    --exe E --dir D   --pack and --pad (the same documents, one packed
                                            row against a padded batch) end with the same
                                            weights (<= 1e-5); --checkpoint-activations
                                            changes no weight, packed or not (bit for bit)
  train_checks.py optimizer --exe E --dir D --optimizer fused (at::_fused_adamw_, the
                                            foreach clip) against loop (LibTorch's AdamW
                                            and clip_grad_norm_): the same weights within
                                            float32 rounding (<= 1e-5); an interrupted fused
                                            run resumes exactly; a loop checkpoint resumes
                                            under fused
"""

import argparse
import os
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
import torchattn_interop  # noqa: E402

TINY = ["--layers", "2", "--d-model", "32", "--heads", "2", "--context", "32", "--eval-every", "0",
        "--sample-tokens", "0", "--warmup", "2", "--timeout", "20", "--threads", "1"]


def run(exe, *args, expect=0):
    t0 = time.time()
    p = subprocess.run([exe, *TINY, *args], capture_output=True, text=True, timeout=300)
    took = time.time() - t0
    if expect is not None and p.returncode != expect:
        print(p.stdout, p.stderr)
        raise SystemExit(f"FAIL: {' '.join(args)} exited {p.returncode}, expected {expect}")
    return p, took


def max_diff(a, b):
    sa, sb = torchattn_interop.load(a), torchattn_interop.load(b)
    assert sa.keys() == sb.keys(), f"{a} and {b} hold different keys"
    return max((sa[k] - sb[k]).abs().max().item() for k in sa)


def ddp(exe, d):
    steps = ["--steps", "8"]
    run(exe, *steps, "--batch-size", "4", "--out", f"{d}/one")
    run(exe, *steps, "--batch-size", "2", "--nproc", "2", "--out", f"{d}/two")
    union = max_diff(f"{d}/one/final_rank0.pt", f"{d}/two/final_rank0.pt")
    ranks = max_diff(f"{d}/two/final_rank0.pt", f"{d}/two/final_rank1.pt")
    print(f"2 ranks x 2 sequences vs 1 process x 4 sequences, 8 steps: max |param diff| {union:.2e}")
    print(f"rank 0 vs rank 1: max |param diff| {ranks:.2e}")
    ok = union <= 1e-5 and ranks == 0.0
    print("ok" if ok else "FAIL")
    return 0 if ok else 1


def failure(exe, d):
    p, took = run(exe, "--steps", "50", "--batch-size", "2", "--nproc", "2", "--out", f"{d}/die",
                  "--die-at-step", "3", "--die-rank", "1", expect=None)
    err = p.stderr
    ok = (p.returncode != 0 and took < 60 and "rank 1 exited with status 3" in err
          and "train_gpt rank 0:" in err and "failed (did another rank exit?)" in err)
    print(f"rank 1 died at step 3; the run exited {p.returncode} after {took:.1f} s")
    print("\n".join(line for line in err.splitlines() if "rank" in line))
    print("ok" if ok else "FAIL")
    return 0 if ok else 1


def resume(exe, d):
    args = ["--steps", "10", "--batch-size", "4", "--dropout", "0.1"]
    run(exe, *args, "--out", f"{d}/straight")
    run(exe, *args, "--out", f"{d}/resumed", "--save-every", "5", "--die-at-step", "7", "--die-rank", "0", expect=3)
    p, _ = run(exe, *args, "--out", f"{d}/resumed", "--resume", f"{d}/resumed")
    diff = max_diff(f"{d}/straight/final_rank0.pt", f"{d}/resumed/final_rank0.pt")
    rows = open(f"{d}/resumed/loss.csv").read().split()[1:]
    print(f"interrupted at step 7, resumed from the step-5 checkpoint: max |param diff| {diff:.1e}; "
          f"loss.csv has {len(rows)} rows")
    ok = diff == 0.0 and len(rows) == 10
    print("ok" if ok else "FAIL")
    return 0 if ok else 1


def pack(exe, d):
    args = ["--steps", "6", "--batch-size", "4"]
    p, _ = run(exe, *args, "--pack", "--out", f"{d}/pack")
    run(exe, *args, "--pad", "--out", f"{d}/pad")
    run(exe, *args, "--pack", "--checkpoint-activations", "--out", f"{d}/pack-ckpt")
    run(exe, *args, "--out", f"{d}/windows")
    run(exe, *args, "--checkpoint-activations", "--out", f"{d}/windows-ckpt")
    p_both, _ = run(exe, *args, "--pack", "--pad", "--out", f"{d}/both", expect=None)
    padded = max_diff(f"{d}/pack/final_rank0.pt", f"{d}/pad/final_rank0.pt")
    ckpt_packed = max_diff(f"{d}/pack/final_rank0.pt", f"{d}/pack-ckpt/final_rank0.pt")
    ckpt_windows = max_diff(f"{d}/windows/final_rank0.pt", f"{d}/windows-ckpt/final_rank0.pt")
    lengths = [line for line in p.stderr.splitlines() if "training text:" in line]
    print(f"--pack vs --pad, 6 steps of 4 documents: max |param diff| {padded:.2e}")
    print(f"--checkpoint-activations: max |param diff| {ckpt_packed:.1e} packed, {ckpt_windows:.1e} windows")
    print("\n".join(lengths))
    ok = (padded <= 1e-5 and ckpt_packed == 0.0 and ckpt_windows == 0.0 and len(lengths) == 1
          and "documents, bytes min / median / mean / 90th percentile / max" in lengths[0]
          and p_both.returncode != 0 and "--pack excludes --pad" in p_both.stderr)
    print("ok" if ok else "FAIL")
    return 0 if ok else 1


def optimizer(exe, d):
    args = ["--steps", "10", "--batch-size", "4", "--clip", "0.05"]  # a clip that acts
    run(exe, *args, "--optimizer", "loop", "--out", f"{d}/loop")
    p, _ = run(exe, *args, "--optimizer", "fused", "--out", f"{d}/fused")
    run(exe, *args, "--optimizer", "fused", "--out", f"{d}/resumed", "--save-every", "5", "--die-at-step", "7",
        "--die-rank", "0", expect=3)
    run(exe, *args, "--optimizer", "fused", "--out", f"{d}/resumed", "--resume", f"{d}/resumed")
    run(exe, *args, "--optimizer", "loop", "--out", f"{d}/switched", "--save-every", "5", "--die-at-step", "7",
        "--die-rank", "0", expect=3)
    run(exe, *args, "--optimizer", "fused", "--out", f"{d}/switched", "--resume", f"{d}/switched")
    fused_vs_loop = max_diff(f"{d}/loop/final_rank0.pt", f"{d}/fused/final_rank0.pt")
    resumed = max_diff(f"{d}/fused/final_rank0.pt", f"{d}/resumed/final_rank0.pt")
    switched = max_diff(f"{d}/loop/final_rank0.pt", f"{d}/switched/final_rank0.pt")
    named = "train_gpt: optimizer fused (at::_fused_adamw_, foreach clip)" in p.stderr
    print(f"--optimizer fused vs loop, 10 steps: max |param diff| {fused_vs_loop:.2e}")
    print(f"fused, interrupted at step 7 and resumed from step 5: max |param diff| {resumed:.1e}")
    print(f"loop's step-5 checkpoint resumed under fused: max |param diff| against loop {switched:.2e}")
    ok = fused_vs_loop <= 1e-5 and resumed == 0.0 and switched <= 1e-5 and named
    print("ok" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("check", choices=["ddp", "failure", "resume", "pack", "optimizer"])
    ap.add_argument("--exe", required=True)
    ap.add_argument("--dir", required=True)
    a = ap.parse_args()
    shutil.rmtree(a.dir, ignore_errors=True)
    os.makedirs(a.dir)
    sys.exit({"ddp": ddp, "failure": failure, "resume": resume, "pack": pack,
              "optimizer": optimizer}[a.check](a.exe, a.dir))
