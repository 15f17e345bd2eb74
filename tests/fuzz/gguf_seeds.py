#!/usr/bin/env python3
"""Writes small GGUF files with llama.cpp's own writer (the gguf package): a tensor of
every type torchattn reads and metadata of every value type, and one with a custom
alignment: the seed corpus of tests/fuzz/fuzz_gguf.cpp (tests/reference/
make_gguf_reference.py makes them, at its smallest).

Usage: .venv/bin/python tests/fuzz/gguf_seeds.py DIR
"""

import os
import shutil
import subprocess
import sys
import tempfile


def main(d):
    os.makedirs(d, exist_ok=True)
    with tempfile.TemporaryDirectory() as work:
        script = os.path.join(os.path.dirname(__file__), "..", "reference", "make_gguf_reference.py")
        subprocess.run([sys.executable, script, work], check=True, stdout=subprocess.DEVNULL)
        names = [n for n in sorted(os.listdir(work)) if n.endswith(".gguf")]
        for n in names:
            shutil.copy(os.path.join(work, n), os.path.join(d, n))
    print(f"gguf_seeds: {len(names)} files in {d}")


if __name__ == "__main__":
    main(sys.argv[1])
