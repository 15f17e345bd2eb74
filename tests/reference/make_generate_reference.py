#!/usr/bin/env python3
"""Writes what tests/models/generate_checks.cpp compares torchattn_generate's model, tokenizer
and chat template with, all from transformers (offline, float32, CPU):

- tiny/<name>/: small random Llama, Qwen2, Qwen3, Mistral and Gemma 2 checkpoints
  (save_pretrained: config.json and model.safetensors), covering grouped-query heads,
  several RoPE thetas, a sliding window shorter than the prompt, tied and untied
  embeddings, Qwen2's q/k/v biases, Qwen3's QK-norm, and Gemma 2's softcapped scores and
  logits, query_pre_attn_scalar, alternating sliding layers and norms around each
  sublayer; with expected.pt: a prompt's logits and 32 greedy tokens from
  transformers' generate, and each step's margin between its top two logits, and the
  prompt's logits of the model quantize_dynamic'd (PyTorch's own int8 scheme, every
  nn.Linear, the engine's default) as `dynamic_int8_logits`; and four documents packed
  end to end in transformers' padding-free form (`packed_ids`, `packed_cu_seqlens`,
  `packed_logits`, `packed_loss`);
- tiny_seq2seq/<name>/: small random BART checkpoints (GELU and ReLU, scaled
  embeddings, encoder and decoder of different depths and head counts, forced BOS and
  EOS tokens, a non-zero final_logits_bias), with expected.pt: two prompts, the
  logits of a teacher-forced decoding (float32 and float64), 32 greedy tokens of each prompt alone and of
  both in one right-padded batch from generate (no EOS, no forced tokens), and a
  short generate with the config's EOS and forced tokens; a training step's loss and
  the gradient of every parameter (float64, dropout off, a padded batch);
- tokenizer_smollm2.json and tokenizer_qwen2style/: every line of the fortunes text
  (Debian's `fortunes`, the text train_gpt learns) with its ids under SmolLM2's
  tokenizer and under a Qwen2-style tokenizer (NFC, Qwen2's split regex, byte-level
  BPE) trained here on that text with the `tokenizers` package;
- smollm2.pt: SmolLM2-135M-Instruct (converted by tools/convert_smollm2.py): three chat
  prompts' ids from transformers' chat template, their prompt logits, and 48 greedy
  tokens each from generate, with each step's top-two margin (a near tie, < 1e-4, is
  the only place where the tokens may part), and the first prompt's logits quantize_dynamic'd.

Usage: .venv/bin/python tests/reference/make_generate_reference.py OUT_DIR --smollm2 DIR
"""

import argparse
import copy
import glob
import json
import os
import warnings

import torch
import transformers
from transformers import (AutoModelForCausalLM, AutoTokenizer, BartConfig, BartForConditionalGeneration, Gemma2Config, Gemma2ForCausalLM, LlamaConfig,
                          LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config,
                          Qwen3ForCausalLM)

FORTUNES = "/usr/share/games/fortunes"
PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain in one sentence why the sky is blue.",
]

TINY = {
    # name: (config class, model class, config arguments)
    "llama_gqa_tied": (LlamaConfig, LlamaForCausalLM,
                       dict(num_attention_heads=4, num_key_value_heads=2, rope_theta=10000.0, tie_word_embeddings=True)),
    "llama_untied_theta5e5": (LlamaConfig, LlamaForCausalLM,
                              dict(num_attention_heads=4, num_key_value_heads=1, rope_theta=500000.0,
                                   tie_word_embeddings=False)),
    "qwen2_bias_gqa": (Qwen2Config, Qwen2ForCausalLM,
                       dict(num_attention_heads=8, num_key_value_heads=2, rope_theta=1000000.0,
                            tie_word_embeddings=True)),
    "mistral_window4": (MistralConfig, MistralForCausalLM,
                        dict(num_attention_heads=4, num_key_value_heads=2, rope_theta=10000.0, sliding_window=4,
                             tie_word_embeddings=False)),
    # heads of their own size: 4 x 32 = 128 query features for a hidden size of 64
    "llama_head_dim32": (LlamaConfig, LlamaForCausalLM,
                         dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32, rope_theta=10000.0,
                              tie_word_embeddings=True)),
    # Qwen3: QK-norm (q_norm, k_norm of each head) and heads of their own size
    "qwen3_qk_norm": (Qwen3Config, Qwen3ForCausalLM,
                      dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32, rope_theta=1000000.0,
                           tie_word_embeddings=True)),
    # Gemma 2: caps small enough to bite (raw logits reach 8 against a cap of 10), a scale
    # of its own (query_pre_attn_scalar 24, heads of 16), layer 0 sliding over 4 tokens;
    # untied (tied, this random model repeats one token)
    "gemma2_softcap": (Gemma2Config, Gemma2ForCausalLM,
                       dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16, rope_theta=10000.0,
                            query_pre_attn_scalar=24, attn_logit_softcapping=3.0, final_logit_softcapping=10.0,
                            sliding_window=4, tie_word_embeddings=False)),
}


def dynamic_int8_logits(model, ids):
    """PyTorch's dynamic quantization of every nn.Linear (int8 weights, one symmetric scale
    each; 8-bit inputs per call), the quantized engine left at its default: the logits of
    WeightFormat::DynamicInt8."""
    with warnings.catch_warnings():  # torch.ao.quantization's deprecation notices
        warnings.simplefilter("ignore")
        quantized = torch.ao.quantization.quantize_dynamic(copy.deepcopy(model), {torch.nn.Linear}, dtype=torch.qint8)
        with torch.no_grad():
            return quantized(ids).logits[0].clone()


def packed_reference(model, g):
    """Documents packed end to end, transformers' padding-free form: one row, position_ids
    restarting at 0 in each document, no attention mask and no cache (transformers then
    finds the documents from the positions, as in training), labels with -100 at each
    document's first token (as its DataCollatorWithFlattening). Checked here against
    each document run alone."""
    lengths = [6, 1, 9, 3]
    ids = torch.randint(3, 211, (sum(lengths),), generator=g)
    cu = torch.tensor([0] + lengths).cumsum(0)
    positions = torch.cat([torch.arange(n) for n in lengths])
    labels = ids.clone()
    labels[cu[:-1]] = -100
    with torch.no_grad():
        out = model(input_ids=ids[None], position_ids=positions[None], labels=labels[None], use_cache=False)
        alone = torch.cat([model(ids[None, a:b]).logits[0] for a, b in zip(cu[:-1], cu[1:])])
    logits = out.logits[0]
    err = ((logits - alone).abs().max() / alone.abs().max()).item()
    assert err < 1e-5, f"packed logits differ from each document alone by {err:.2e}"
    return {"packed_ids": ids.clone(), "packed_cu_seqlens": cu.clone(), "packed_logits": logits.clone(),
            "packed_loss": out.loss.clone()}


def tiny_models(out):
    for i, (name, (config_class, model_class, extra)) in enumerate(TINY.items()):
        torch.manual_seed(100 + i)
        config = config_class(vocab_size=211, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                              max_position_embeddings=128, initializer_range=0.25, rms_norm_eps=1e-6, **extra)
        model = model_class(config).eval()
        with torch.no_grad():  # norms' weights are ones at first (Gemma 2's zeros): make them count
            for key, p in model.named_parameters():
                if key.endswith(("q_norm.weight", "k_norm.weight")):
                    p.copy_(1.0 + 0.3 * torch.randn(p.shape))
                elif config_class is Gemma2Config and key.endswith("norm.weight"):
                    p.copy_(0.3 * torch.randn(p.shape))
        d = os.path.join(out, "tiny", name)
        model.save_pretrained(d)
        g = torch.Generator().manual_seed(7 + i)
        prompt = torch.randint(3, 211, (1, 10), generator=g)
        with torch.no_grad():
            logits = model(prompt).logits[0]
            # 32 tokens with no end-of-sequence token, as the checks generate them (stop_at_eos
            # false): EOS may be chosen like any other (min_new_tokens would mask it instead).
            model.generation_config.eos_token_id = None
            gen = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=32, do_sample=False,
                                 output_logits=True, return_dict_in_generate=True, pad_token_id=0)
        new = gen.sequences[0, prompt.shape[1]:]
        top2 = torch.stack([s[0].topk(2).values for s in gen.logits])
        torch.save({"prompt": prompt[0].clone(), "logits": logits.clone(), "tokens": new.clone(),
                    "margins": (top2[:, 0] - top2[:, 1]).clone(),
                    "dynamic_int8_logits": dynamic_int8_logits(model, prompt), **packed_reference(model, g)},
                   os.path.join(d, "expected.pt"))
    print(f"make_generate_reference: {len(TINY)} tiny models")


SEQ2SEQ = {
    # name: BartConfig arguments besides the shared ones
    "bart_gelu": dict(encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
                      encoder_ffn_dim=128, decoder_ffn_dim=128, activation_function="gelu"),
    # ReLU, embeddings times sqrt(d_model), a deeper encoder of more heads, the first new
    # token forced to BOS
    "bart_relu_scaled": dict(encoder_layers=3, decoder_layers=1, encoder_attention_heads=8, decoder_attention_heads=2,
                             encoder_ffn_dim=96, decoder_ffn_dim=160, activation_function="relu", scale_embedding=True,
                             forced_bos_token_id=0),
}


def greedy_seq2seq(model, ids, mask, n):
    gen = model.generate(ids, attention_mask=mask, max_new_tokens=n, do_sample=False, output_logits=True,
                         return_dict_in_generate=True)
    top2 = torch.stack([s.topk(2).values for s in gen.logits], 1)  # [B, n, 2]
    return gen.sequences[:, 1:].clone(), (top2[..., 0] - top2[..., 1]).clone()  # without decoder_start_token_id


def random_bart(extra, seed):
    """A random BART whose greedy tokens vary: small embeddings under large positions and
    layers (at one scale for all, a random tied model repeats one token)."""
    torch.manual_seed(seed)
    config = BartConfig(vocab_size=211, d_model=64, max_position_embeddings=64, init_std=0.5, dropout=0.1,
                        **{k: v for k, v in extra.items() if k != "forced_bos_token_id"})
    model = BartForConditionalGeneration(config).eval()
    with torch.no_grad():  # norms and the logits' bias start as ones and zeros: make them count
        for key, p in model.named_parameters():
            if "norm" in key:
                p.copy_((1.0 if key.endswith("weight") else 0.0) + 0.3 * torch.randn(p.shape))
        model.model.shared.weight.normal_(0.0, 0.1)
        model.model.encoder.embed_positions.weight.normal_(0.0, 1.0)
        model.model.decoder.embed_positions.weight.normal_(0.0, 1.0)
        model.final_logits_bias.normal_(0.0, 0.1)
    # transformers 5 keeps forced_bos_token_id in the generation config only.
    model.generation_config.forced_bos_token_id = extra.get("forced_bos_token_id")
    return config, model


def tiny_seq2seq(out):
    for i, (name, extra) in enumerate(SEQ2SEQ.items()):
        # The first seed from 200 + 10 i whose prompt gets 32 greedy tokens of 4 kinds or more.
        g = torch.Generator().manual_seed(30 + i)
        lengths = [11, 6]
        prompts = [torch.randint(3, 211, (n,), generator=g) for n in lengths]
        for seed in range(200 + 10 * i, 210 + 10 * i):
            config, model = random_bart(extra, seed)
            with torch.no_grad():
                ids = prompts[0].unsqueeze(0)
                free = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=32, do_sample=False,
                                      eos_token_id=None, forced_eos_token_id=None, forced_bos_token_id=None)
            if len(set(free[0, 1:].tolist())) >= 4:
                break
        d = os.path.join(out, "tiny_seq2seq", name)
        model.save_pretrained(d)
        batch = torch.full((2, max(lengths)), config.pad_token_id)  # right-padded, as BART's tokenizers pad
        mask = torch.zeros(2, max(lengths), dtype=torch.long)
        for b, p in enumerate(prompts):
            batch[b, :len(p)] = p
            mask[b, :len(p)] = 1
        expected = {"prompt0": prompts[0].clone(), "prompt1": prompts[1].clone()}
        with torch.no_grad():
            decoder_ids = torch.cat([torch.tensor([config.decoder_start_token_id]),
                                     torch.randint(3, 211, (9,), generator=g)]).unsqueeze(0)
            expected["decoder_ids"] = decoder_ids[0].clone()
            expected["logits"] = model(input_ids=prompts[0].unsqueeze(0), decoder_input_ids=decoder_ids).logits[0].clone()
            expected["logits64"] = copy.deepcopy(model).double()(input_ids=prompts[0].unsqueeze(0),
                                                                 decoder_input_ids=decoder_ids).logits[0].clone()
        # Training's gradients in float64 (eval mode: no dropout): a teacher-forced
        # cross-entropy over the padded batch against random labels, to every parameter.
        m64 = copy.deepcopy(model).double()
        train_ids = torch.randint(3, 211, (2, 8), generator=g)
        train_ids[1, -2:] = config.pad_token_id  # the pad token's embedding row gets no gradient from them
        labels = torch.randint(3, 211, (2, 8), generator=g)
        loss = torch.nn.functional.cross_entropy(
            m64(input_ids=batch, attention_mask=mask, decoder_input_ids=train_ids).logits.flatten(0, 1), labels.flatten())
        loss.backward()
        expected.update({"train.batch": batch.clone(), "train.mask": mask.clone(), "train.decoder_ids": train_ids,
                         "train.labels": labels, "train.loss": loss.detach().clone()})
        for k, p in m64.named_parameters():
            expected["grad." + k] = p.grad.clone()
        with torch.no_grad():
            # The config's EOS and forced tokens, over 12 new tokens (the last one forced to EOS).
            for b, p in enumerate(prompts):
                ids = p.unsqueeze(0)
                expected[f"short{b}"] = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12,
                                                       do_sample=False)[0, 1:].clone()
            # 32 tokens with no EOS and no forced tokens, as the checks generate them
            # (stop_at_eos and forced_tokens false).
            gc = model.generation_config
            gc.eos_token_id = gc.forced_eos_token_id = gc.forced_bos_token_id = None
            for b, p in enumerate(prompts):
                ids = p.unsqueeze(0)
                tokens, margins = greedy_seq2seq(model, ids, torch.ones_like(ids), 32)
                expected[f"tokens{b}"], expected[f"margins{b}"] = tokens[0], margins[0]
            tokens, margins = greedy_seq2seq(model, batch, mask, 32)
            expected["batch_tokens"], expected["batch_margins"] = tokens, margins
        torch.save(expected, os.path.join(d, "expected.pt"))
    print(f"make_generate_reference: {len(SEQ2SEQ)} tiny encoder-decoders")


def fortune_lines():
    """Every line of the fortunes text (valid UTF-8; undecodable bytes replaced)."""
    lines, replaced = [], 0
    for path in sorted(glob.glob(os.path.join(FORTUNES, "*"))):
        if path.endswith((".dat", ".u8")) or not os.path.isfile(path):
            continue
        for raw in open(path, "rb").read().split(b"\n"):
            text = raw.decode("utf-8", errors="replace")
            replaced += "\ufffd" in text and b"\xef\xbf\xbd" not in raw
            if text:
                lines.append(text)
    return lines, replaced


def tokenizers_reference(out, smollm2):
    lines, replaced = fortune_lines()
    tok = AutoTokenizer.from_pretrained(smollm2)
    with open(os.path.join(out, "tokenizer_smollm2.json"), "w") as f:
        json.dump({"lines": lines, "ids": [tok(line)["input_ids"] for line in lines]}, f)

    # A Qwen2-style tokenizer trained on the same text: NFC, Qwen2's split regex,
    # byte-level BPE, <|im_start|>-style special tokens.
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    qwen_split = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                  r"\s*[\r\n]+|\s+(?!\S)|\s+")
    t = Tokenizer(models.BPE())
    t.normalizer = normalizers.NFC()
    t.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(qwen_split), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    t.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=3000, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    t.train_from_iterator(lines, trainer)
    d = os.path.join(out, "tokenizer_qwen2style")
    os.makedirs(d, exist_ok=True)
    t.save(os.path.join(d, "tokenizer.json"))
    extra = ["Café naïve ﬁnal 12345 <|im_start|>user\nhi<|im_end|>", "ＡＢＣ １２３ — “quotes” \r\n\n  tabs\t\tend  "]
    with open(os.path.join(d, "expected.json"), "w") as f:
        json.dump({"lines": lines + extra, "ids": [t.encode(line).ids for line in lines + extra]}, f)
    print(f"make_generate_reference: {len(lines)} fortune lines ({replaced} with bytes that are not UTF-8 replaced)")


# Texts beyond the fortune lines for the SentencePiece vocabulary: spaces at either end
# and in runs, tabs, newlines, characters outside its vocabulary (byte fallback), the
# control and user-defined tokens inside text, an empty text.
SENTENCEPIECE_EXTRA = [
    "", " ", "  ", "\n", "Hello world", " leading", "trailing  ", "two  spaces\tand\ttabs\n\nnewlines",
    "Café naïve ﬁnal 12345 67", "漢字 かな 🙂👍🏽 Ωμέγα", "<|im_start|>user\nhi<|im_end|>", "<s>x</s>", "a<tool>b <tool> c",
    "<|im_start|>", " <|im_end|> ", "x\u0301 e\u0301 \u00e9", "def f(x):\n\treturn x ** 2  # comment",
]


def sentencepiece_reference(out):
    """A SentencePiece BPE vocabulary (Llama 2's recipe: byte fallback, digits split, no
    normalization) trained on the fortune lines with the `sentencepiece` package, written
    as llama.cpp's converter writes one (tokenizer.ggml.model "llama": pieces, scores,
    token types), and its ids and texts by transformers' tokenizer of the file."""
    import io
    import gguf
    import numpy as np
    import sentencepiece as spm
    lines, _ = fortune_lines()
    proto = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=proto, vocab_size=3000, model_type="bpe", byte_fallback=True,
        split_digits=True, normalization_rule_name="identity", remove_extra_whitespaces=False,
        allow_whitespace_only_pieces=True, character_coverage=0.999, num_threads=1, minloglevel=2,
        control_symbols=["<|im_start|>", "<|im_end|>"], user_defined_symbols=["<tool>"])
    sp = spm.SentencePieceProcessor(model_proto=proto.getvalue())
    tokens, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        # llama.cpp's token types: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.
        types.append(2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 5 if sp.is_unused(i)
                     else 6 if sp.is_byte(i) else 4 if tokens[-1] == "<tool>" else 1)
    d = os.path.join(out, "tokenizer_sentencepiece")
    os.makedirs(d, exist_ok=True)

    def write(name, bos=True, eos=False, with_scores=True, space_prefix=None):
        w = gguf.GGUFWriter(os.path.join(d, name), "llama")
        w.add_tokenizer_model("llama")
        w.add_token_list(tokens)
        if with_scores:
            w.add_token_scores(scores)
        w.add_token_types(types)
        w.add_bos_token_id(sp.bos_id())
        w.add_eos_token_id(sp.eos_id())
        w.add_unk_token_id(sp.unk_id())
        w.add_add_bos_token(bos)
        w.add_add_eos_token(eos)
        if space_prefix is not None:
            w.add_add_space_prefix(space_prefix)
        w.add_tensor("unused", np.zeros((4,), np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()

    write("vocab.gguf")
    write("eos_not_bos.gguf", bos=False, eos=True, space_prefix=False)  # EOS after the text, no BOS, no "▁" first
    write("no_scores.gguf", with_scores=False)  # refused: no merges can be derived
    # Refused: a token whose bytes are not UTF-8 (the first "▁" cut short).
    with open(os.path.join(d, "vocab.gguf"), "rb") as f:
        data = f.read()
    at = data.index("\u2581".encode())
    with open(os.path.join(d, "not_utf8.gguf"), "wb") as f:
        f.write(data[:at + 2] + b" " + data[at + 3:])
    # transformers' tokenizer of the file (its pieces, the merges their scores imply, its
    # special tokens), with the normalizer Llama 2's and Mistral's own tokenizer.json
    # have (and transformers' GGUF loader gives Phi-3's): a "▁" before every stretch of
    # text, special tokens' neighbours included, as sentencepiece and llama.cpp encode.
    # (transformers' Metaspace for a "llama" file puts none before a text that begins
    # with a space, nor after a special token.)
    from tokenizers import decoders, normalizers

    def transformers_tokenizer(name, space_prefix=True):
        t = AutoTokenizer.from_pretrained(d, gguf_file=name)
        replace = normalizers.Replace(pattern=" ", content="\u2581")
        t.backend_tokenizer.normalizer = normalizers.Sequence(
            [normalizers.Prepend(prepend="\u2581"), replace] if space_prefix else [replace])
        t.backend_tokenizer.pre_tokenizer = None
        if not space_prefix:  # nor a space stripped from the text
            t.backend_tokenizer.decoder = decoders.Sequence(
                [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()])
        return t

    tok = transformers_tokenizer("vocab.gguf")
    texts = lines + SENTENCEPIECE_EXTRA
    ids = [tok(t)["input_ids"] for t in texts]
    eos_not_bos = transformers_tokenizer("eos_not_bos.gguf", space_prefix=False)
    eos_ids = [eos_not_bos(t)["input_ids"] for t in SENTENCEPIECE_EXTRA]
    with open(os.path.join(d, "eos_not_bos_expected.json"), "w") as f:
        json.dump({"lines": SENTENCEPIECE_EXTRA, "ids": eos_ids,
                   "decoded": [eos_not_bos.decode(i) for i in eos_ids]}, f)
    # The same ids as sentencepiece's own encoding of each stretch between special tokens.
    added = sorted((t for t, ty in zip(tokens, types) if ty in (2, 3, 4)), key=len, reverse=True)
    for text, got in zip(texts, ids):
        want, i, start = [sp.bos_id()], 0, 0
        while i <= len(text):
            hit = next((a for a in added if text.startswith(a, i)), None) if i < len(text) else ""
            if hit is None:
                i += 1
                continue
            if i > start:
                want += sp.encode(text[start:i])
            if hit:
                want.append(sp.piece_to_id(hit))
            i += max(len(hit), 1)
            start = i
        assert got == want, (text, got, want)
    # Id sequences no text encodes to: byte tokens that are not UTF-8 (alone, cut short,
    # between pieces), pieces of spaces first, special tokens first and between.
    byte = {b: tok.convert_tokens_to_ids(f"<0x{b:02X}>") for b in range(256)}
    piece = tok.convert_tokens_to_ids
    odd = [[byte[0xE2]], [byte[0xE2], byte[0x96]], [byte[0xE2], byte[0x96], byte[0x81]],
           [piece("\u2581"), byte[0xFF], piece("\u2581the")], [piece("\u2581\u2581"), piece("\u2581the")],
           [sp.bos_id(), piece("\u2581the"), sp.eos_id(), piece("\u2581the")], [sp.eos_id(), piece("\u2581the")],
           [byte[0x20], piece("\u2581the")], [byte[0xC3], byte[0xA9], byte[0xC3]]]
    decode_ids = ids + odd
    # tokenizers' DecodeStream, a token at a time ("" where it gives None), on the first
    # 2000 lines, the extra texts and the odd id lists.
    from tokenizers.decoders import DecodeStream
    streamed = {}
    for skip in (False, True):
        lists = decode_ids[:2000] + decode_ids[len(lines):]
        streams = []
        for i in lists:
            stream = DecodeStream(skip_special_tokens=skip)
            streams.append([stream.step(tok.backend_tokenizer, t) or "" for t in i])
        streamed["streamed_skipping_special" if skip else "streamed"] = streams
    # The tokenizer.json shapes of Hugging Face folders: transformers' LlamaTokenizer as it
    # is (Metaspace, "▁" first only at the text's start, the text one word) and an older
    # one (Metaspace with add_prefix_space, split before each "▁"), each saved and
    # encoding the first 2000 lines and the extra texts.
    from tokenizers import pre_tokenizers
    shaped = AutoTokenizer.from_pretrained(d, gguf_file="vocab.gguf")
    shapes = {"metaspace_first": pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False),
              "metaspace_split": pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always", split=True)}
    some = lines[:2000] + SENTENCEPIECE_EXTRA
    for name, pre in shapes.items():
        shaped.backend_tokenizer.pre_tokenizer = pre
        shaped.backend_tokenizer.save(os.path.join(d, f"{name}.json"))
        with open(os.path.join(d, f"{name}_expected.json"), "w") as f:
            json.dump({"lines": some, "ids": [shaped(t)["input_ids"] for t in some]}, f)
    # What each piece adds after another (transformers' decode of "a" and it, less "a"'s):
    # the logprobs' token strings. Byte tokens apart (alone they are no text).
    anchor = piece("a")
    token_texts = {i: tok.decode([anchor, i])[len(tok.decode([anchor])):] for i in range(len(tokens)) if types[i] != 6}
    with open(os.path.join(d, "expected.json"), "w") as f:
        json.dump({"texts": texts, "ids": ids, "decode_ids": decode_ids, "token_texts": token_texts,
                   "decoded": [tok.decode(i) for i in decode_ids],
                   "decoded_skipping_special": [tok.decode(i, skip_special_tokens=True) for i in decode_ids],
                   "streamed_lists": list(range(2000)) + list(range(len(lines), len(decode_ids))), **streamed}, f)
    print(f"make_generate_reference: a SentencePiece vocabulary of {len(tokens)} pieces, {len(texts)} texts")

    # A tiny random Llama with this vocabulary in one GGUF file (float32, llama.cpp's
    # names, q and k rows permuted as its converter permutes them), and what the model
    # generates greedily (no EOS stop) from three prompts, their ids by the tokenizer above.
    torch.manual_seed(300)
    config = LlamaConfig(vocab_size=len(tokens), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         initializer_range=0.25, rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=1,
                         eos_token_id=2)
    model = LlamaForCausalLM(config).eval()
    w = gguf.GGUFWriter(os.path.join(d, "tiny_llama.gguf"), "llama")
    w.add_context_length(256)
    w.add_embedding_length(64)
    w.add_feed_forward_length(128)
    w.add_block_count(2)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_rope_dimension_count(16)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(sp.bos_id())
    w.add_eos_token_id(sp.eos_id())
    w.add_unk_token_id(sp.unk_id())

    def permute(t, heads):  # llama.cpp's convert_hf_to_gguf.py LlamaModel.permute
        return t.reshape(heads, 2, t.shape[0] // heads // 2, *t.shape[1:]).swapaxes(1, 2).reshape(t.shape)

    roles = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
             "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for key, p in model.state_dict().items():
        t = p.numpy().astype(np.float32)
        if key == "model.embed_tokens.weight":
            name = "token_embd.weight"
        elif key == "model.norm.weight":
            name = "output_norm.weight"
        elif key == "lm_head.weight":
            name = "output.weight"
        else:
            layer, rest = key[len("model.layers."):].split(".", 1)
            role = rest.rsplit(".", 1)[0]
            name = f"blk.{layer}.{roles[role]}.weight"
            if role == "self_attn.q_proj":
                t = permute(t, 4)
            elif role == "self_attn.k_proj":
                t = permute(t, 2)
        w.add_tensor(name, np.ascontiguousarray(t))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    ref = {"count": 3}
    prompts = ["What is a fortune cookie?", "  Two spaces, a tab\tand caf\u00e9", "<|im_start|>user\nhi 🙂<|im_end|>"]
    for i, prompt in enumerate(prompts):
        ids = torch.tensor([tok(prompt)["input_ids"]])
        with torch.no_grad():
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False,
                                 output_logits=True, return_dict_in_generate=True, eos_token_id=None, pad_token_id=0)
        new = gen.sequences[0, ids.shape[1]:]
        top2 = torch.stack([s[0].topk(2).values for s in gen.logits])
        ref[f"prompt{i}.text"] = prompt
        ref[f"prompt{i}.ids"] = ids[0].clone()
        ref[f"prompt{i}.tokens"] = new.clone()
        ref[f"prompt{i}.margins"] = (top2[:, 0] - top2[:, 1]).clone()
        # The text the new tokens add after the prompt (as transformers' TextStreamer shows
        # it: the first token's space kept).
        whole, before = tok.decode(gen.sequences[0]), tok.decode(ids[0])
        assert whole.startswith(before)
        ref[f"prompt{i}.generated"] = whole[len(before):]
    torch.save(ref, os.path.join(d, "tiny_llama.pt"))
    # What `torchattn_generate --model tiny_llama.gguf --greedy --print-ids` prints for the
    # first prompt: its tokens up to an EOS, where the program stops.
    first = ref["prompt0.tokens"].tolist()
    first = first[:first.index(sp.eos_id())] if sp.eos_id() in first else first
    assert float(ref["prompt0.margins"].min()) > 1e-4, "a near tie in the first prompt's greedy tokens"
    with open(os.path.join(d, "tiny_llama_cli_expected.txt"), "w") as f:
        f.write("ids: " + " ".join(str(t) for t in first) + "\n")


def smollm2_reference(out, smollm2):
    tok = AutoTokenizer.from_pretrained(smollm2)
    model = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32).eval()
    ref = {"transformers_version": transformers.__version__, "count": len(PROMPTS)}
    for i, prompt in enumerate(PROMPTS):
        ids = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                      return_tensors="pt")
        if not isinstance(ids, torch.Tensor):
            ids = ids["input_ids"]
        with torch.no_grad():
            logits = model(ids).logits[0]
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=48, do_sample=False,
                                 output_logits=True, return_dict_in_generate=True)
        top2 = torch.stack([s[0].topk(2).values for s in gen.logits])
        ref[f"prompt{i}.text"] = prompt
        ref[f"prompt{i}.ids"] = ids[0].clone()
        ref[f"prompt{i}.logits"] = logits.clone()
        ref[f"prompt{i}.tokens"] = gen.sequences[0, ids.shape[1]:].clone()
        ref[f"prompt{i}.margins"] = (top2[:, 0] - top2[:, 1]).clone()
        if i == 0:
            ref["prompt0.dynamic_int8_logits"] = dynamic_int8_logits(model, ids)
    # Conversations through the chat template, as text: with and without a system turn.
    conversations = [
        [{"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello. How can I help?"},
         {"role": "user", "content": "Name a colour."}],
        [{"role": "system", "content": "You answer in French."}, {"role": "user", "content": "Bonjour ?"}],
    ]
    ref["conversations"] = json.dumps([{"messages": m, "text": tok.apply_chat_template(
        m, tokenize=False, add_generation_prompt=True)} for m in conversations])
    torch.save(ref, os.path.join(out, "smollm2.pt"))
    # What `torchattn_generate --chat --greedy --print-ids` prints for the first prompt.
    with open(os.path.join(out, "cli_expected.txt"), "w") as f:
        f.write("ids: " + " ".join(str(t) for t in ref["prompt0.tokens"].tolist()) + "\n")
    print(f"make_generate_reference: SmolLM2, {len(PROMPTS)} prompts")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--smollm2", required=True, help="the converted SmolLM2 folder (tools/convert_smollm2.py)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.set_num_threads(2)
    tiny_models(a.out)
    tiny_seq2seq(a.out)
    tokenizers_reference(a.out, a.smollm2)
    sentencepiece_reference(a.out)
    smollm2_reference(a.out, a.smollm2)


if __name__ == "__main__":
    main()
