#!/usr/bin/env python3
"""Writes the reference that torchattn's transformers parity tests compare with.

Cross-attention (BART's and Whisper's decoder over the encoder's output) has cases of
its own (CROSS_CASES): the layer over a context, with the context padded, decoding
steps through transformers' EncoderDecoderCache, and gradients of the input, the
context and every weight.

For each model family (Llama, Qwen2, Mistral, Phi, GPT-J, GPT-2, BERT) and a few small
configurations each, this builds a one-layer transformers model with random weights
(offline: nothing is downloaded), and records what its attention layer does:

- full:   a forward over B x T tokens (its input hidden states and its output);
- padded: the same with left padding (right padding for BERT), position ids counted
          from each sequence's first real token as transformers' `generate` does;
- cached: that padded prompt, then tokens one at a time through transformers' own
          DynamicCache (decoders only);
- grads:  the gradients of the layer's input and of every attention weight for a
          random output gradient.

The attention input and output are read with hooks on the layer, so masks,
positions and caches are built by transformers itself. Weights are written under
torchattn's names (W_query, W_key, W_value, out_proj; GPT-2's fused Conv1D c_attn
split and transposed). Each case goes to OUT/<case>_<dtype>.pt as a plain dict,
which tests/modules/transformers_parity.cpp reads with torch::pickle_load.

float32 runs transformers' eager attention. float64 runs its SDPA attention for the
Llama family (Llama, Qwen2, Mistral, Phi): their eager attention takes the softmax in
float32 even for float64 inputs, which would bound the comparison at float32
precision. GPT-J upcasts queries and keys to float32 inside its attention, so it
runs in float32 only. RoPE's cos/sin are float32 in transformers (cast to the input's
dtype), as in torchattn.

Usage: .venv/bin/python tests/reference/make_transformers_reference.py OUT_DIR
"""

import argparse
import math
import os

import torch
import transformers
from transformers import (BartConfig, BartModel, BertConfig, BertModel, BloomConfig, BloomModel, DynamicCache,
                          EncoderDecoderCache, Gemma2Config, Gemma2Model, WhisperConfig, WhisperModel,
                          GptOssConfig, GptOssModel, GPT2Config, GPT2Model, GPTJConfig, GPTJModel,
                          LlamaConfig, LlamaModel, MistralConfig, MistralModel, PhiConfig, PhiModel, Qwen2Config,
                          Qwen2Model, Qwen3Config, Qwen3Model)

VOCAB = 97
B, T, STEPS = 2, 9, 4
LEFT_PADDING = [3, 0]  # padding tokens before each sequence's prompt


GEMMA2_QUERY_SCALAR, GEMMA2_SOFTCAP = 24, 3.0  # scores * 24^-0.5, softcapped at 3 (real: 256, 50)


def llama_like(family, hidden, heads, kv_heads, theta, window=None, partial=None, head_dim=None):
    common = dict(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=1,
                  num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=64,
                  attention_dropout=0.0, rope_theta=theta)
    if head_dim is not None:  # heads of their own size: num_heads * head_dim != hidden
        common["head_dim"] = head_dim
    if family == "llama":
        return LlamaModel, LlamaConfig(**common)
    if family == "qwen2":
        return Qwen2Model, Qwen2Config(**common)
    if family == "gemma2":  # logit softcapping, query_pre_attn_scalar; its layer 0 slides
        common.pop("rope_theta")
        return Gemma2Model, Gemma2Config(sliding_window=window, query_pre_attn_scalar=GEMMA2_QUERY_SCALAR,
                                         attn_logit_softcapping=GEMMA2_SOFTCAP,
                                         rope_parameters={"rope_type": "default", "rope_theta": theta}, **common)
    if family == "gpt_oss":  # attention sinks; its layer 0 slides (window); default RoPE here (not YaRN)
        common.pop("rope_theta")
        config = GptOssConfig(sliding_window=window, num_local_experts=2, num_experts_per_tok=1,
                              rope_parameters={"rope_type": "default", "rope_theta": theta}, **common)
        config._experts_implementation = "eager"  # its grouped_mm takes no float64
        return GptOssModel, config
    if family == "qwen3":  # QK-norm: an RMSNorm of each head's queries and keys, before RoPE
        return Qwen3Model, Qwen3Config(rms_norm_eps=1e-6, **common)
    if family == "mistral":
        return MistralModel, MistralConfig(sliding_window=window, **common)
    if family == "phi":
        return PhiModel, PhiConfig(partial_rotary_factor=partial, resid_pdrop=0.0, embd_pdrop=0.0, **common)
    raise ValueError(family)


# name -> (family, builder arguments, torchattn options)
CASES = {
    "llama_gqa": ("llama", dict(hidden=32, heads=4, kv_heads=2, theta=10000.0)),
    "llama_mqa": ("llama", dict(hidden=32, heads=4, kv_heads=1, theta=100000.0)),
    "llama_mha": ("llama", dict(hidden=48, heads=6, kv_heads=6, theta=500000.0)),
    "llama_head_dim16": ("llama", dict(hidden=32, heads=4, kv_heads=2, theta=10000.0, head_dim=16)),
    "llama_head_dim4": ("llama", dict(hidden=48, heads=6, kv_heads=3, theta=10000.0, head_dim=4)),
    "qwen2_gqa": ("qwen2", dict(hidden=32, heads=4, kv_heads=2, theta=1000000.0)),
    "qwen2_gqa4": ("qwen2", dict(hidden=64, heads=8, kv_heads=2, theta=10000.0)),
    "qwen3_qk_norm": ("qwen3", dict(hidden=32, heads=4, kv_heads=2, theta=1000000.0, head_dim=16)),
    "qwen3_qk_norm_mha": ("qwen3", dict(hidden=48, heads=6, kv_heads=6, theta=10000.0, head_dim=8)),  # Qwen3Config: 128 unless given
    "gemma2_softcap": ("gemma2", dict(hidden=32, heads=4, kv_heads=2, theta=10000.0, head_dim=16, window=5)),
    "gemma2_softcap_mha": ("gemma2", dict(hidden=48, heads=4, kv_heads=4, theta=10000.0, head_dim=8, window=3)),
    "gpt_oss_sinks": ("gpt_oss", dict(hidden=32, heads=4, kv_heads=2, theta=10000.0, head_dim=8, window=5)),
    "gpt_oss_sinks_mqa": ("gpt_oss", dict(hidden=48, heads=6, kv_heads=1, theta=150000.0, head_dim=16, window=4)),
    "mistral_window3": ("mistral", dict(hidden=32, heads=4, kv_heads=2, theta=10000.0, window=3)),
    "mistral_window5": ("mistral", dict(hidden=32, heads=4, kv_heads=1, theta=1000000.0, window=5)),
    "phi_half": ("phi", dict(hidden=32, heads=4, kv_heads=4, theta=10000.0, partial=0.5)),
    "phi_quarter": ("phi", dict(hidden=64, heads=4, kv_heads=2, theta=10000.0, partial=0.25)),
    "gptj_rot4": ("gptj", dict(hidden=32, heads=4, rotary_dim=4)),
    "gptj_rot8": ("gptj", dict(hidden=32, heads=2, rotary_dim=8)),
    "gpt2_4heads": ("gpt2", dict(hidden=32, heads=4)),
    "gpt2_2heads": ("gpt2", dict(hidden=24, heads=2)),
    "bloom_4heads": ("bloom", dict(hidden=32, heads=4)),
    "bloom_6heads": ("bloom", dict(hidden=48, heads=6)),  # not a power of two: the extra slopes
    "bert_4heads": ("bert", dict(hidden=32, heads=4)),
    "bert_2heads": ("bert", dict(hidden=24, heads=2)),
}


class Family:
    """How to build one family's model and read its attention layer."""

    def __init__(self, name, args):
        self.name, self.args = name, args
        h, heads = args["hidden"], args["heads"]
        if name in ("llama", "qwen2", "qwen3", "mistral", "phi", "gpt_oss", "gemma2"):
            self.model_class, self.config = llama_like(name, **args)
        elif name == "gptj":
            self.model_class = GPTJModel
            self.config = GPTJConfig(vocab_size=VOCAB, n_embd=h, n_layer=1, n_head=heads, n_positions=64,
                                     rotary_dim=args["rotary_dim"], attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0,
                                     bos_token_id=None, eos_token_id=None)
        elif name == "gpt2":
            self.model_class = GPT2Model
            self.config = GPT2Config(vocab_size=VOCAB, n_embd=h, n_layer=1, n_head=heads, n_positions=64,
                                     attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0, bos_token_id=None,
                                     eos_token_id=None)
        elif name == "bloom":  # ALiBi; the softmax in float32 (compared in float32 only)
            self.model_class = BloomModel
            self.config = BloomConfig(vocab_size=VOCAB, hidden_size=h, n_layer=1, n_head=heads,
                                      attention_dropout=0.0, hidden_dropout=0.0, bos_token_id=None,
                                      eos_token_id=None)
        elif name == "bert":
            self.model_class = BertModel
            self.config = BertConfig(vocab_size=VOCAB, hidden_size=h, num_hidden_layers=1, num_attention_heads=heads,
                                     intermediate_size=2 * h, max_position_embeddings=64,
                                     attention_probs_dropout_prob=0.0, hidden_dropout_prob=0.0)
        self.decoder = name != "bert"
        self.rope = name in ("llama", "qwen2", "qwen3", "mistral", "phi", "gptj", "gpt_oss", "gemma2")

    def options(self):
        """The torchattn options of this configuration, as the C++ test builds them."""
        a, c = self.args, self.config
        head_dim = a.get("head_dim") or a["hidden"] // a["heads"]
        o = dict(d_model=a["hidden"], num_heads=a["heads"], num_kv_heads=a.get("kv_heads", a["heads"]),
                 head_dim=a.get("head_dim") or 0, qk_norm_eps=1e-6 if self.name == "qwen3" else 0.0,
                 context_length=64, causal=int(self.decoder), window=a.get("window") or 0,
                 qkv_bias=int(self.name in ("qwen2", "phi", "gpt2", "bert", "bloom", "gpt_oss")),
                 out_bias=int(self.name in ("phi", "gpt2", "bert", "bloom", "gpt_oss")), alibi=int(self.name == "bloom"),
                 sinks=int(self.name == "gpt_oss"), softcap=GEMMA2_SOFTCAP if self.name == "gemma2" else 0.0,
                 scale=GEMMA2_QUERY_SCALAR ** -0.5 if self.name == "gemma2" else 0.0,
                 rope_theta=0.0, rope_interleaved=0,
                 rope_rotary_dim=0)
        if self.rope:
            o["rope_theta"] = a.get("theta", 10000.0)
            if self.name == "phi":
                o["rope_rotary_dim"] = int(head_dim * a["partial"])
            if self.name == "gptj":
                o["rope_interleaved"] = 1
                o["rope_rotary_dim"] = a["rotary_dim"]
        return o

    def attention(self, model):
        """(the module whose input is the attention's input, the module whose output is its output)."""
        if self.name == "bert":
            layer = model.encoder.layer[0].attention
            return layer.self, layer.output.dense
        if self.name in ("gpt2", "gptj"):
            return model.h[0].attn, model.h[0].attn
        if self.name == "bloom":  # its output adds the residual: read dense's
            return model.h[0].self_attention, model.h[0].self_attention.dense
        return model.layers[0].self_attn, model.layers[0].self_attn

    def raw(self, model):
        """The attention's own parameters, by their names in transformers."""
        if self.name == "bert":
            attention = model.encoder.layer[0].attention
            return {f"self.{k}": v for k, v in attention.self.named_parameters()} | \
                   {f"output.dense.{k}": v for k, v in attention.output.dense.named_parameters()}
        return dict(self.attention(model)[0].named_parameters())

    def renamed(self, raw):
        """torchattn's names for a dict shaped like raw() (the parameters, or their gradients)."""
        if self.name == "gpt2":
            d = self.args["hidden"]
            w, b = raw["c_attn.weight"], raw["c_attn.bias"]  # Conv1D: y = x @ w + b, w [d, 3d]
            out = {}
            for i, n in enumerate(("W_query", "W_key", "W_value")):
                out[f"{n}.weight"] = w[:, i * d:(i + 1) * d].t()
                out[f"{n}.bias"] = b[i * d:(i + 1) * d]
            out["out_proj.weight"] = raw["c_proj.weight"].t()
            out["out_proj.bias"] = raw["c_proj.bias"]
            return out
        if self.name == "bloom":
            # query_key_value: per head, its queries', keys' and values' rows in turn.
            h, heads = self.args["hidden"], self.args["heads"]
            hd = h // heads
            w = raw["query_key_value.weight"].view(heads, 3, hd, h)
            b = raw["query_key_value.bias"].view(heads, 3, hd)
            out = {}
            for i, n in enumerate(("W_query", "W_key", "W_value")):
                out[f"{n}.weight"] = w[:, i].reshape(heads * hd, h)
                out[f"{n}.bias"] = b[:, i].reshape(heads * hd)
            out["out_proj.weight"] = raw["dense.weight"]
            out["out_proj.bias"] = raw["dense.bias"]
            return out
        names = {"q_proj": "W_query", "k_proj": "W_key", "v_proj": "W_value", "o_proj": "out_proj",
                 "dense": "out_proj", "out_proj": "out_proj", "self.query": "W_query", "self.key": "W_key",
                 "self.value": "W_value", "output.dense": "out_proj", "q_norm": "q_norm", "k_norm": "k_norm"}
        out = {}
        for k, v in raw.items():
            if k == "sinks":  # gpt-oss: a parameter of the attention itself, the same name
                out[k] = v
                continue
            module, leaf = k.rsplit(".", 1)
            if module in names:
                out[f"{names[module]}.{leaf}"] = v
        return out

    def positions(self, position_ids):
        """The position_ids keyword of a forward (none for BLOOM: ALiBi reads the mask)."""
        return {} if self.name == "bloom" else {"position_ids": position_ids}

    def weights(self, model):
        return self.renamed(self.raw(model))


def capture(family, model):
    """Hooks that record the attention's input hidden states and its output."""
    first, last = family.attention(model)
    seen = {}

    def pre(_module, args, kwargs):
        seen["x"] = (args[0] if args else kwargs["hidden_states"]).detach().clone()
        seen["kwargs"] = {k: v for k, v in kwargs.items() if k != "hidden_states"}
        seen["args"] = args[1:]

    def post(_module, _args, output):
        seen["y"] = (output[0] if isinstance(output, tuple) else output).detach().clone()

    first.register_forward_pre_hook(pre, with_kwargs=True)
    last.register_forward_hook(post)
    return seen


def positions_from_mask(mask):
    """transformers' generate: position ids from the attention mask."""
    pos = mask.long().cumsum(-1) - 1
    return pos.masked_fill(mask == 0, 1)


def run_case(name, dtype):
    family_name, args = CASES[name]
    family = Family(family_name, args)
    implementation = "sdpa" if (dtype == torch.float64 and family.name in ("llama", "qwen2", "qwen3", "mistral", "phi")) \
        else "eager"
    family.config._attn_implementation = implementation
    seed = sum(map(ord, name))
    torch.manual_seed(seed)
    model = family.model_class(family.config).to(dtype).eval()
    # Weights of unit-scale scores (transformers' init, std 0.02, gives near-uniform attention).
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for key, p in family.weights(model).items():
            fan_in = p.shape[-1] if p.dim() == 2 else 1
            std = (1.5 / math.sqrt(fan_in)) if p.dim() == 2 else 0.2
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64).to(dtype) * std)
    seen = capture(family, model)
    out = {"case": name, "family": family.name, "dtype": str(dtype).replace("torch.", ""),
           "transformers_version": transformers.__version__, "torch_version": str(torch.__version__),
           "attn_implementation": implementation}
    out.update({f"opt.{k}": v for k, v in family.options().items()})
    out.update({f"w.{k}": v.detach().contiguous().clone() for k, v in family.weights(model).items()})

    ids = torch.randint(0, VOCAB, (B, T + STEPS), generator=gen)
    with torch.no_grad():
        model(ids[:, :T], use_cache=False)
    out["full.x"], out["full.y"] = seen["x"], seen["y"]
    full_kwargs, full_args = seen["kwargs"], seen["args"]

    # Padding: a [B, T] mask, true = a padding token (torchattn's key_padding_mask).
    pad = torch.zeros(B, T, dtype=torch.bool)
    for b, n in enumerate(LEFT_PADDING):
        if family.decoder:
            pad[b, :n] = True
        else:
            pad[b, T - n:] = True
    attention_mask = (~pad).long()
    kwargs = dict(attention_mask=attention_mask, use_cache=False)
    if family.decoder and family.name != "bloom":  # BLOOM's positions come from the mask (ALiBi)
        kwargs["position_ids"] = positions_from_mask(attention_mask)
    with torch.no_grad():
        model(ids[:, :T], **kwargs)
    out["padded.mask"], out["padded.x"], out["padded.y"] = pad, seen["x"], seen["y"]

    if family.decoder:
        cache = DynamicCache(config=family.config)
        mask = attention_mask
        with torch.no_grad():
            model(ids[:, :T], attention_mask=mask, past_key_values=cache, use_cache=True,
                  **family.positions(positions_from_mask(mask)))
            out["cached.prompt.x"], out["cached.prompt.y"] = seen["x"], seen["y"]
            for s in range(STEPS):
                mask = torch.cat([mask, torch.ones(B, 1, dtype=mask.dtype)], 1)
                model(ids[:, T + s:T + s + 1], attention_mask=mask, past_key_values=cache, use_cache=True,
                      **family.positions(positions_from_mask(mask)[:, -1:]))
                out[f"cached.step{s}.x"], out[f"cached.step{s}.y"] = seen["x"], seen["y"]
        out["cached.steps"] = STEPS

    # Gradients of the attention alone, with the masks and positions of the full run.
    x = out["full.x"].clone().requires_grad_(True)
    first, last = family.attention(model)
    y = first(x, *full_args, **full_kwargs)[0]
    if family.name == "bert":
        y = last(y)
    if family.name == "bloom":  # its output is dense's plus the residual (another tensor than x)
        y = y - (full_kwargs["residual"] if "residual" in full_kwargs else full_args[0])
    grad_out = torch.randn(y.shape, generator=gen, dtype=torch.float64).to(dtype)
    assert torch.allclose(y.detach(), out["full.y"], rtol=1e-5, atol=1e-6), "re-running the layer differs"
    raw = family.raw(model)
    grads = torch.autograd.grad(y, [x] + list(raw.values()), grad_out, allow_unused=True)
    out["grad.out"], out["grad.x"] = grad_out, grads[0]
    raw_grads = {k: (g if g is not None else torch.zeros_like(p)) for (k, p), g in zip(raw.items(), grads[1:])}
    out.update({f"grad.{k}": g.detach().contiguous().clone() for k, g in family.renamed(raw_grads).items()})
    return out


# ---- cross-attention: a decoder layer's attention over its encoder's output ----

CROSS_CASES = {
    "bart_cross_4heads": ("bart", dict(hidden=32, heads=4)),
    "whisper_cross_2heads": ("whisper", dict(hidden=24, heads=2)),  # k_proj without a bias
}
CROSS_S, CROSS_T, CROSS_STEPS = 7, 5, 3
CROSS_PADDING = [2, 0]  # padding tokens at the end of each sequence's context


def cross_layer(family, hidden, heads):
    """The decoder's encoder_attn of a one-layer model (random weights, offline)."""
    if family == "bart":
        config = BartConfig(vocab_size=VOCAB, d_model=hidden, encoder_layers=1, decoder_layers=1,
                            encoder_attention_heads=heads, decoder_attention_heads=heads, encoder_ffn_dim=2 * hidden,
                            decoder_ffn_dim=2 * hidden, max_position_embeddings=64, dropout=0.0,
                            attention_dropout=0.0, activation_dropout=0.0)
        model = BartModel(config)
    else:
        config = WhisperConfig(vocab_size=VOCAB, d_model=hidden, encoder_layers=1, decoder_layers=1,
                               encoder_attention_heads=heads, decoder_attention_heads=heads,
                               encoder_ffn_dim=2 * hidden, decoder_ffn_dim=2 * hidden, num_mel_bins=8,
                               max_source_positions=16, max_target_positions=64, pad_token_id=1, bos_token_id=0,
                               eos_token_id=2, decoder_start_token_id=0, dropout=0.0,
                               attention_dropout=0.0, activation_dropout=0.0)
        model = WhisperModel(config)
    return model, model.decoder.layers[0].encoder_attn


def run_cross_case(name, dtype):
    family, args = CROSS_CASES[name]
    seed = sum(map(ord, name))
    torch.manual_seed(seed)
    model, attn = cross_layer(family, args["hidden"], args["heads"])
    model.config._attn_implementation = "eager"
    model = model.to(dtype).eval()
    gen = torch.Generator().manual_seed(seed + 1)
    raw = dict(attn.named_parameters())
    with torch.no_grad():
        for p in raw.values():
            std = (1.5 / math.sqrt(p.shape[-1])) if p.dim() == 2 else 0.2
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64).to(dtype) * std)
    names = {"q_proj": "W_query", "k_proj": "W_key", "v_proj": "W_value", "out_proj": "out_proj"}

    def renamed(d):
        out = {f"{names[k.split('.')[0]]}.{k.split('.')[1]}": v for k, v in d.items()}
        if "W_key.bias" not in out:  # Whisper: a key bias of zeros is the same layer
            out["W_key.bias"] = torch.zeros_like(out["W_query.bias"])
        return out

    h = args["hidden"]
    out = {"case": name, "family": f"{family}_cross", "dtype": str(dtype).replace("torch.", ""),
           "transformers_version": transformers.__version__, "torch_version": str(torch.__version__),
           "attn_implementation": "eager", "opt.d_model": h, "opt.num_heads": args["heads"], "opt.kdim": h,
           "opt.context_length": 64}
    out.update({f"w.{k}": v.detach().contiguous().clone() for k, v in renamed(raw).items()})
    x = torch.randn(B, CROSS_T, h, generator=gen, dtype=torch.float64).to(dtype)
    context = torch.randn(B, CROSS_S, h, generator=gen, dtype=torch.float64).to(dtype)
    pad = torch.zeros(B, CROSS_S, dtype=torch.bool)
    for b, n in enumerate(CROSS_PADDING):
        pad[b, CROSS_S - n:] = True

    def additive(rows):  # the encoder attention mask as transformers' eager attention takes it, [B, 1, rows, S]
        return torch.zeros(B, 1, rows, CROSS_S, dtype=dtype).masked_fill(pad.view(B, 1, 1, CROSS_S),
                                                                          torch.finfo(dtype).min)

    with torch.no_grad():
        out["full.x"], out["full.context"] = x, context
        out["full.y"] = attn(x, key_value_states=context)[0]
        out["padded.mask"] = pad
        out["padded.y"] = attn(x, key_value_states=context, attention_mask=additive(CROSS_T))[0]
        # Decoding: transformers' EncoderDecoderCache computes the context's keys and
        # values at the first step and reuses them.
        cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        for s in range(CROSS_STEPS):
            step = torch.randn(B, 1, h, generator=gen, dtype=torch.float64).to(dtype)
            out[f"cached.step{s}.x"] = step
            out[f"cached.step{s}.y"] = attn(step, key_value_states=context, past_key_values=cache,
                                            attention_mask=additive(1))[0]
        out["cached.steps"] = CROSS_STEPS
    xg, cg = x.clone().requires_grad_(True), context.clone().requires_grad_(True)
    y = attn(xg, key_value_states=cg, attention_mask=additive(CROSS_T))[0]
    grad_out = torch.randn(y.shape, generator=gen, dtype=torch.float64).to(dtype)
    grads = torch.autograd.grad(y, [xg, cg] + list(raw.values()), grad_out)
    out["grad.out"], out["grad.x"], out["grad.context"] = grad_out, grads[0], grads[1]
    out.update({f"grad.{k}": g.detach().contiguous().clone()
                for k, g in renamed(dict(zip(raw.keys(), grads[2:]))).items()})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--cases", nargs="*", default=list(CASES))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.set_num_threads(1)
    written = 0
    for name in a.cases:
        for dtype in (torch.float32, torch.float64):
            if dtype == torch.float64 and CASES[name][0] in ("gptj", "bloom", "gemma2"):
                continue
            torch.save(run_case(name, dtype), os.path.join(a.out, f"{name}_{str(dtype)[6:]}.pt"))
            written += 1
    for name in CROSS_CASES:
        for dtype in (torch.float32, torch.float64):
            torch.save(run_cross_case(name, dtype), os.path.join(a.out, f"{name}_{str(dtype)[6:]}.pt"))
            written += 1
    print(f"make_transformers_reference: {written} cases from transformers {transformers.__version__} in {a.out}")


if __name__ == "__main__":
    main()
