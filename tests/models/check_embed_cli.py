#!/usr/bin/env python3
"""torchattn_embed as a user runs it (ctest -R models): texts as arguments, from a file
and from stdin; JSON lines and --format npy; each against sentence-transformers'
embeddings in the reference (tests/reference/make_models_reference.py); --dtype bfloat16 and
int8 by their cosine with those, --dtype dynamic-int8 against sentence-transformers' model
quantize_dynamic'd here (PyTorch's scheme: the same batch of texts, the same numbers); and
the errors of bad arguments, each a clear message and exit status 1 (CLI11's own: 105 / 106 / 109...).

Usage: check_embed_cli.py --cli PATH --reference DIR
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
from safetensors.numpy import load_file


def dynamic_int8_embeddings(model, texts):
    """sentence-transformers' embeddings of `texts` in one batch, every nn.Linear
    quantize_dynamic'd (the quantized engine at its default)."""
    import warnings

    import torch
    from sentence_transformers import SentenceTransformer
    with warnings.catch_warnings():  # torch.ao.quantization's deprecation notices
        warnings.simplefilter("ignore")
        st = torch.ao.quantization.quantize_dynamic(SentenceTransformer(model, device="cpu"), {torch.nn.Linear},
                                                    dtype=torch.qint8)
        return st.encode(texts, batch_size=len(texts), convert_to_numpy=True).astype(np.float64)


def run(cmd, stdin=None):
    return subprocess.run(cmd, input=stdin, capture_output=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--cli", required=True)
    p.add_argument("--reference", required=True)
    a = p.parse_args()
    ref = json.load(open(os.path.join(a.reference, "minilm.json")))
    want = load_file(os.path.join(a.reference, "minilm.safetensors"))["embeddings"]
    model = ref["model"]
    texts = [t for t in ref["sentences"] if "\n" not in t and "\r" not in t][:12]
    index = [ref["sentences"].index(t) for t in texts]
    failures = []

    def check(name, got):
        got = np.asarray(got, dtype=np.float32)
        if got.shape != (len(texts), 384):
            failures.append(f"{name}: shape {got.shape}")
            return
        diff = float(np.abs(got - want[index]).max())
        print(f"check_embed_cli: {name}: {len(texts)} texts, largest difference {diff:.2e} from sentence-transformers")
        if diff > 1e-5:
            failures.append(f"{name}: largest difference {diff}")

    r = run([a.cli, "--model", model, *texts])
    if r.returncode != 0:
        failures.append(f"arguments: exit {r.returncode}: {r.stderr.decode()}")
    else:
        check("arguments, JSON lines", [json.loads(line) for line in r.stdout.decode().splitlines()])
    # Weights in bfloat16 and int8: each embedding's cosine with sentence-transformers'
    # float32 one at least 0.999 (docs/models.md, weight formats).
    for dtype in ("bfloat16", "int8", "dynamic-int8"):
        r = run([a.cli, "--model", model, "--dtype", dtype, *texts])
        if r.returncode != 0:
            failures.append(f"--dtype {dtype}: exit {r.returncode}: {r.stderr.decode()}")
            continue
        got = np.asarray([json.loads(line) for line in r.stdout.decode().splitlines()], dtype=np.float64)
        ref_rows = want[index].astype(np.float64)
        cos = (got * ref_rows).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(ref_rows, axis=1)
        print(f"check_embed_cli: --dtype {dtype}: {len(texts)} texts, lowest cosine {cos.min():.6f} with "
              "sentence-transformers' float32")
        if dtype == "dynamic-int8":
            # PyTorch's scheme is its own reference: one scale for each call's inputs, so
            # the texts go as one batch, as the CLI sends them.
            diff = float(np.abs(got - dynamic_int8_embeddings(model, texts)).max())
            print(f"check_embed_cli: --dtype dynamic-int8: largest difference {diff:.2e} from sentence-transformers "
                  "quantize_dynamic'd")
            if diff > 1e-5:
                failures.append(f"--dtype dynamic-int8: largest difference {diff} from quantize_dynamic's")
        elif cos.min() < 0.999:
            failures.append(f"--dtype {dtype}: lowest cosine {cos.min():.6f} < 0.999")
    with tempfile.TemporaryDirectory() as d:
        f = os.path.join(d, "texts.txt")
        with open(f, "w", encoding="utf-8") as out:
            out.write("\n".join(texts) + "\n")
        npy = os.path.join(d, "e.npy")
        r = run([a.cli, "--model", model, "--file", f, "--format", "npy", "--output", npy, "--batch-size", "5"])
        if r.returncode != 0:
            failures.append(f"--file --format npy: exit {r.returncode}: {r.stderr.decode()}")
        else:
            check("--file, --format npy", np.load(npy))
            if "[embedded 12 of 12 texts]" not in r.stderr.decode():
                failures.append(f"--batch-size 5: no progress line on stderr: {r.stderr.decode()!r}")
        r = run([a.cli, "--model", model], stdin=("\n".join(texts) + "\n").encode())
        if r.returncode != 0:
            failures.append(f"stdin: exit {r.returncode}: {r.stderr.decode()}")
        else:
            check("stdin", [json.loads(line) for line in r.stdout.decode().splitlines()])

        bad_utf8 = os.path.join(d, "latin1.txt")
        with open(bad_utf8, "wb") as out:
            out.write(b"fine\nok \xff\n")
        swapped = os.path.join(d, "minilm_with_a_bpe_tokenizer")
        os.makedirs(swapped)
        for name in os.listdir(model):
            src = os.path.join(model, name)
            if name.endswith(".safetensors"):
                os.symlink(os.path.abspath(src), os.path.join(swapped, name))
            elif os.path.isdir(src):
                shutil.copytree(src, os.path.join(swapped, name))
            else:
                shutil.copy(src, os.path.join(swapped, name))
        with open(os.path.join(swapped, "tokenizer.json"), "w") as out:
            json.dump({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []},
                       "pre_tokenizer": {"type": "ByteLevel"}, "decoder": {"type": "ByteLevel"}}, out)
        errors = [
            ([a.cli, "--model", model, "--batch-size", "0", "x"], "--batch-size: expected at least 1, got 0"),
            ([a.cli, "--model", model, "--format", "csv", "x"], "--format: csv not in {jsonl,npy}"),
            ([a.cli, "--model", model, "--file", os.path.join(d, "missing.txt")], "--file: cannot open"),
            ([a.cli, "--model", model, "--file", f, "x"], "give texts as arguments or --file, not both"),
            ([a.cli, "--model", os.path.join(d, "nothing"), "x"], "--model: Directory does not exist"),
            ([a.cli, "--model", d, "x"], "--model: config: cannot open"),
        ]
        for cmd, expected in errors:
            r = run(cmd, stdin=b"")
            err = r.stderr.decode()
            if r.returncode == 0 or expected not in err:
                failures.append(f"{' '.join(cmd[1:])}: exit {r.returncode}, expected '{expected}' in: {err!r}")
        # Errors of the texts and the folder: one line each, exit status 1.
        one_line_errors = [
            # The command line's own flag, not the library's EmbedOptions().truncate(true).
            ([a.cli, "--model", model, "x", ref["long_text"]],
             "text 2 has 411 tokens, more than the model's max_length of 256; shorten it, or pass --truncate to keep "
             "its first 256 tokens"),
            ([a.cli, "--model", model, "--file", bad_utf8],
             f"line 2 of {bad_utf8} is not valid UTF-8: the byte 0xFF at offset 3 (texts must be UTF-8)"),
            # Another model's tokenizer.json in the folder: an error naming it, not garbage.
            ([a.cli, "--model", swapped, "x"], f"--model: tokenizer: '{swapped}/tokenizer.json' is a BPE tokenizer; "
             f"'{swapped}/config.json' holds a bert model, which expects a WordPiece tokenizer"),
        ]
        for cmd, expected in one_line_errors:
            r = run(cmd, stdin=b"")
            err = r.stderr.decode()
            if r.returncode != 1 or expected not in err or err.count("\n") != 1 or "EmbedOptions" in err:
                failures.append(f"{' '.join(cmd[1:])}: exit {r.returncode}, expected the one line '{expected}' and "
                                f"exit status 1, got: {err!r}")
        r = run([a.cli, "--model", model], stdin=b"")
        if r.returncode == 0 or "no texts: give them as arguments, with --file, or on stdin" not in r.stderr.decode():
            failures.append(f"empty stdin: exit {r.returncode}: {r.stderr.decode()!r}")
        r = run([a.cli, "--model", model, "--truncate", ref["long_text"]])
        if r.returncode != 0:
            failures.append(f"--truncate: exit {r.returncode}: {r.stderr.decode()}")
        else:
            got = np.asarray(json.loads(r.stdout.decode()), dtype=np.float32)
            long_want = load_file(os.path.join(a.reference, "minilm.safetensors"))["long_text"][0]
            diff = float(np.abs(got - long_want).max())
            print(f"check_embed_cli: --truncate: largest difference {diff:.2e} from sentence-transformers")
            if diff > 1e-5:
                failures.append(f"--truncate: largest difference {diff}")
    print(f"check_embed_cli: {len(errors) + len(one_line_errors) + 1} bad invocations refused with their messages")
    for f in failures:
        print("FAILED:", f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
