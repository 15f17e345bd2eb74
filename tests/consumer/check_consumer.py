#!/usr/bin/env python3
"""Checks a program built against the installed torchattn package (tests/consumer)
against the notebooks' Python code, on seeds and shapes the unit tests do not use.
Exits non-zero on any mismatch beyond 1e-5 relative (float32)."""

import argparse
import os
import subprocess
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
import notebook_reference as nr  # noqa: E402

# (module, seed, B, T, d_in, d_out, context_length, num_heads)
CASES = [
    ("SelfAttentionV2", 31337, 2, 5, 7, 3, 0, 0),
    ("CausalAttention", 4242, 3, 13, 9, 5, 16, 0),
    ("CausalAttention", 99, 1, 32, 32, 16, 32, 0),
    ("MultiHeadAttention", 2024, 2, 19, 24, 12, 20, 4),
    ("MultiHeadAttention", 7, 4, 33, 16, 32, 64, 8),
]


def reference(module, seed, B, T, d_in, d_out, C, H):
    torch.manual_seed(seed)
    if module == "SelfAttentionV2":
        m = nr.SelfAttentionV2(d_in, d_out)
    elif module == "CausalAttention":
        m = nr.CausalAttention(d_in, d_out, C, 0.0)
    else:
        m = nr.MultiHeadAttention(d_in, d_out, C, 0.0, H)
    torch.manual_seed(seed + 1)
    x = torch.randn(B, T, d_in)
    with torch.no_grad():
        return m(x).flatten()


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--exe", required=True)
    args = ap.parse_args()
    failures = 0
    for case in CASES:
        out = subprocess.run([args.exe, *map(str, case)], capture_output=True, text=True)
        if out.returncode != 0:
            print(f"FAIL {case}: exit {out.returncode}: {out.stderr.strip()}")
            failures += 1
            continue
        got = torch.tensor([float.fromhex(v) for v in out.stdout.split()], dtype=torch.float64)
        want = reference(*case).double()
        if got.shape != want.shape:
            print(f"FAIL {case}: {got.numel()} values, expected {want.numel()}")
            failures += 1
            continue
        abs_err = (got - want).abs()
        # Relative to the output's scale: elementwise ratios blow up near zero.
        rel = (abs_err.max() / want.abs().max()).item()
        ok = torch.allclose(got, want, rtol=1e-5, atol=1e-6)
        print(f"{'ok  ' if ok else 'FAIL'} {case[0]:<18} seed={case[1]:<6} shape=({case[2]},{case[3]},{case[4]})"
              f" -> {case[5]}: max abs error {abs_err.max().item():.2e}, relative to max |y| {rel:.2e}")
        failures += not ok
    print(f"{len(CASES) - failures} passed, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
