#!/usr/bin/env python3
"""Seeds for the tokenizer fuzzer (tests/fuzz/fuzz_tokenizer.cpp): texts for each of its
modes (the first byte picks one) and small tokenizer.json files, written into DIR.

Usage: tokenizer_seeds.py DIR
"""

import json
import os
import sys

TEXTS = ["Hello, World! Café naïve \u4e2d\u6587 don't", "ab c 123 <|end|> a!", "It's 42 apples\r\n  ok\t\tend  ",
         "tab\there\x00null\u200b zero\ufffd", "\U0001F355 ÅNGSTRÖM ﬁ ＡＢＣ"]


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    n = 0
    for mode in (0x00, 0x60, 0x80, 0xA0):
        for t in TEXTS:
            with open(os.path.join(out, f"seed{n}"), "wb") as f:
                f.write(bytes([mode]) + t.encode("utf-8", "surrogatepass"))
            n += 1
    wordpiece = {"model": {"type": "WordPiece", "unk_token": "[UNK]", "vocab": {"[UNK]": 0, "a": 1, "##b": 2}},
                 "normalizer": {"type": "BertNormalizer"}, "pre_tokenizer": {"type": "BertPreTokenizer"},
                 "decoder": {"type": "WordPiece"}, "post_processor": None, "added_tokens": []}
    bpe = {"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]},
           "pre_tokenizer": {"type": "ByteLevel", "use_regex": True}, "decoder": {"type": "ByteLevel"},
           "normalizer": None, "post_processor": None, "added_tokens": [{"id": 3, "content": "<s>", "special": True}]}
    sentencepiece = {"model": {"type": "BPE", "byte_fallback": True, "fuse_unk": True, "unk_token": "<unk>",
                               "vocab": {"<unk>": 0, "<s>": 1, "<0x41>": 2, "\u2581": 3, "a": 4, "\u2581a": 5},
                               "merges": [["\u2581", "a"]]},
                     "normalizer": None, "post_processor": None,
                     "pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first",
                                       "split": True},
                     "decoder": {"type": "Sequence", "decoders": [
                         {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
                         {"type": "ByteFallback"}, {"type": "Fuse"},
                         {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
                     "added_tokens": [{"id": 1, "content": "<s>", "special": True}]}
    for t in (wordpiece, bpe, sentencepiece):
        with open(os.path.join(out, f"seed{n}"), "wb") as f:
            f.write(bytes([0xC0]) + json.dumps(t).encode())
        n += 1
    print(f"tokenizer_seeds: {n} seeds in {out}")


if __name__ == "__main__":
    main()
