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
    # GGUF files' tokenizers (mode 0xE0): a SentencePiece vocabulary (pieces, scores, types,
    # byte tokens) and a byte-level one (tokens and merges).
    import tempfile
    import gguf
    import numpy as np
    spm_tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + \
        ["\u2581", "a", "b", "\u2581a", "ab", "\u2581ab", "c"]
    spm_types = [2, 3, 3] + [6] * 256 + [1] * 7
    for model, tokens, extra in (("llama", spm_tokens, None), ("gpt2", ["a", "b", "ab", "\u0120", "c"], ["a b"])):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "t.gguf")
            w = gguf.GGUFWriter(path, "llama")
            w.add_tokenizer_model(model)
            w.add_token_list(tokens)
            if model == "llama":
                w.add_token_scores([-float(i) for i in range(len(tokens))])
                w.add_token_types(spm_types)
                w.add_bos_token_id(1)
                w.add_eos_token_id(2)
                w.add_unk_token_id(0)
            else:
                w.add_token_merges(extra)
            w.add_tensor("x", np.zeros((4,), np.float32))
            w.write_header_to_file()
            w.write_kv_data_to_file()
            w.write_tensors_to_file()
            w.close()
            with open(path, "rb") as f, open(os.path.join(out, f"seed{n}"), "wb") as o:
                o.write(bytes([0xE0]) + f.read())
        n += 1
    print(f"tokenizer_seeds: {n} seeds in {out}")


if __name__ == "__main__":
    main()
