#!/usr/bin/env python3
"""The command lines of every app as a user mistypes them (ctest -R cli): each bad flag
value or combination is refused before any work, with exit status non-zero, a message
on stderr naming the flag, and no crash (no signal, no 'terminate called'); each in
seconds. torchattn_embed's and torchattn_serve's model-dependent errors are checked by
tests/models/check_embed_cli.py and tests/serve/serve_checks.py; here the flags alone.

Usage: cli_checks.py --bin BUILD_DIR/apps
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time

FAILURES = []


def expect_refused(exe, args, needle, timeout=60):
    start = time.time()
    try:
        p = subprocess.run([exe, *args], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        FAILURES.append(f"{os.path.basename(exe)} {' '.join(args)}: still running after {timeout} s")
        print(f"[cli] FAIL {os.path.basename(exe)} {' '.join(args)}: still running after {timeout} s")
        return
    took = time.time() - start
    err = p.stderr.strip()
    ok = p.returncode > 0 and needle in err and "terminate called" not in err and "Segmentation" not in err
    line = err.splitlines()[0] if err else ""
    print(f"[cli] {'ok  ' if ok else 'FAIL'} {os.path.basename(exe)} {' '.join(args)}: exit {p.returncode} "
          f"({took:.1f} s): {line}", flush=True)
    if not ok:
        FAILURES.append(f"{os.path.basename(exe)} {' '.join(args)} -> exit {p.returncode}, {err[-300:]!r} "
                        f"(expected a message with {needle!r})")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True, help="the build's apps folder")
    a = ap.parse_args()
    app = lambda sub, name: os.path.join(a.bin, sub, name)
    empty = tempfile.mkdtemp(prefix="cli_checks_")
    # Bytes that are not text (0x80 is a stray continuation byte).
    binary = os.path.join(empty, "bytes.bin")
    with open(binary, "wb") as f:
        f.write(bytes(range(256)) * 64)
    # Valid UTF-8 that is not text: control characters, a few letters between them.
    controls = os.path.join(empty, "controls.txt")
    with open(controls, "wb") as f:
        f.write((bytes(range(1, 9)) * 7 + b"ab\n") * 400)
    # A decoder's config of 8 positions (no weights: the flags are checked first).
    short = tempfile.mkdtemp(prefix="cli_checks_short_")
    with open(os.path.join(short, "config.json"), "w") as f:
        f.write('{"model_type": "llama", "vocab_size": 96, "hidden_size": 48, "intermediate_size": 64, '
                '"num_hidden_layers": 2, "num_attention_heads": 6, "num_key_value_heads": 2, '
                '"max_position_embeddings": 8, "rope_theta": 10000.0, "rms_norm_eps": 1e-5}')
    cases = {
        app("demo", "torchattn_demo"): [
            (["--device", "tpu"], "--device"), (["--seed", "x"], "--seed"), (["--bogus"], "--bogus")],
        app("bench/attention", "torchattn_bench"): [
            (["--threads", "0"], "--threads"), (["--max-T", "0"], "--max-T"), (["--device", "gpu"], "--device")],
        app("train_gpt", "train_gpt"): [
            (["--steps", "0"], "--steps: expected at least 1, got 0"), (["--heads", "-2"], "--heads"), (["--dropout", "1"], "--dropout"), (["--dropout", "-0.5"], "--dropout"),
            (["--lr", "0"], "--lr"), (["--lr", "-1"], "--lr"), (["--warmup", "-1"], "--warmup"),
            (["--weight-decay", "-1"], "--weight-decay"), (["--clip", "-1"], "--clip"),
            (["--eval-every", "-1"], "--eval-every"), (["--eval-batches", "0"], "--eval-batches"),
            (["--save-every", "-1"], "--save-every"), (["--threads", "0"], "--threads"),
            (["--sample-tokens", "-1"], "--sample-tokens"), (["--temperature", "0"], "--temperature"),
            (["--top-k", "-1"], "--top-k"), (["--timeout", "0"], "--timeout"), (["--master-port", "0"], "--master-port"),
            (["--world-size", "0"], "--world-size"), (["--rank", "2", "--world-size", "2"], "--rank"),
            (["--precision", "fp8"], "--precision"), (["--data", os.path.join(empty, "none.txt")], "--data"),
            (["--context", "1"], "--context: expected at least 2, got 1"),
            (["--pack", "--context", "1"], "--context: expected at least 2, got 1"),
            (["--d-model", "10", "--heads", "4"], "train_gpt: expected --d-model divisible by --heads (4), got --d-model 10"),
            (["--prompt", "abcdefgh", "--context", "4"], "expected a --prompt of 1 to 3 bytes (below --context 4), got 8"),
            (["--data", binary], "train_gpt: --data '" + binary + "': expected UTF-8 text, got the byte 0x80 at offset 128"),
            (["--data", empty], "train_gpt: --data '" + empty + "' is a folder"),
            (["--data", controls], "train_gpt: --data '" + controls + "': expected text, got 5.1% printable characters")],
        app("generate", "torchattn_generate"): [
            ([], "--model"), (["--model", os.path.join(empty, "none")], "--model"),
            (["--model", empty, "--max-new-tokens", "0"], "--max-new-tokens"),
            (["--model", empty, "--temperature", "0"], "--temperature"),
            (["--model", empty, "--temperature", "inf"], "--temperature: expected a finite number"),
            (["--model", empty, "--top-p", "1.5"], "--top-p"),
            (["--model", empty, "--greedy", "--temperature", "0.7"], "--greedy"),
            (["--model", empty, "--prompt", "a", "--prompt-ids", "1"], "--prompt"),
            (["--model", empty, "--dtype", "int2"], "--dtype"),
            (["--model", empty, "--device", "cuda", "--dtype", "int8"], "--dtype int8: int8 weights run on the CPU only"),
            (["--model", empty, "--device", "cuda", "--dtype", "dynamic-int8"],
             "--dtype dynamic-int8: int8 weights run on the CPU only"),
            (["--model", empty, "--device", "cuda", "--dtype", "int4"], "--dtype int4: int4 weights run on the CPU only"),
            (["--model", short, "--dtype", "int8", "--save", os.path.join(binary, "sub")],
             "--save: cannot make the folder '" + os.path.join(binary, "sub") + "': ")],
        app("bench/generate", "torchattn_generate_bench"): [
            ([], "--model"), (["--model", empty, "--new-tokens", "1"], "--new-tokens"),
            (["--model", empty, "--dtype", "int2"], "--dtype"),
            (["--model", empty, "--decode-only", "--prefill-only"], "--prefill-only")],
        app("perplexity", "torchattn_perplexity"): [
            ([], "--model"), (["--model", empty, "--file", os.path.join(empty, "none.txt")], "--file: cannot read"),
            (["--model", empty, "--file", "x", "--context", "1"], "--context"),
            (["--model", empty, "--file", "x", "--dtype", "int2"], "--dtype"),
            (["--model", empty, "--file", "x", "--threads", "0"], "--threads"),
            (["--model", empty, "--file", "x", "--chunks", "0"], "--chunks"),
            (["--model", short, "--file", __file__, "--context", "4", "--save-logits", os.path.join(empty, "none", "logits.bin")],
             "--save-logits: cannot write '" + os.path.join(empty, "none", "logits.bin") + "'"),
            (["--model", os.path.join(empty, "none"), "--file", __file__], "--model: "),
            (["--model", empty, "--file", empty], "--file: '" + empty + "' is a folder; expected a text file"),
            (["--model", short, "--file", __file__, "--context", "9"],
             "--context: expected at most 8 tokens (the max_position_embeddings of '")],
        app("embed", "torchattn_embed"): [
            ([], "--model"), (["--model", empty, "--batch-size", "0"], "--batch-size"),
            (["--model", empty, "--format", "csv"], "--format"), (["--model", empty, "--dtype", "int2"], "--dtype"),
            (["--model", empty, "--device", "cuda", "--dtype", "int8"], "--dtype int8: bfloat16, int8 and int4 weights run"),
            (["--model", empty, "--device", "cuda", "--dtype", "int4"], "--dtype int4: bfloat16, int8 and int4 weights run")],
        app("serve", "torchattn_serve"): [
            ([], "model"), ([os.path.join(empty, "none")], "none"), ([empty, "--port", "70000"], "--port"),
            ([empty, "--model", empty], "model: the model folder was given twice ('" + empty + "' and --model '" +
             empty + "'); give it once, as the argument or as --model"),
            ([empty, "--kv-tokens", "0"], "--kv-tokens"), ([empty, "--dtype", "int2"], "--dtype"), ([empty, "--max-running", "0"], "--max-running"),
            ([empty, "--max-body-bytes", "0"], "--max-body-bytes"), ([empty, "--context-length", "0"], "--context-length"),
            ([empty, "--max-connections", "0"], "--max-connections"), ([empty, "--timeout", "0"], "--timeout"),
            ([empty, "--block-size", "0"], "--block-size")],
    }
    for exe, items in cases.items():
        if not os.path.exists(exe):
            FAILURES.append(f"{exe} was not built")
            print(f"[cli] FAIL {exe} was not built")
            continue
        for args, needle in items:
            expect_refused(exe, args, needle)
    total = sum(len(v) for v in cases.values())
    print(f"cli: {total - len(FAILURES)} passed, {len(FAILURES)} failed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
