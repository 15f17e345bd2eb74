#pragma once

// A decoder in a GGUF file (llama.cpp's format; include/torchattn/gguf.h): its config
// from the metadata and its weights under Hugging Face's names, as transformers' GGUF
// loader makes them, so that LanguageModel::from_pretrained("model.gguf") builds the
// same CausalLM as from the folder transformers would write (docs/models.md).
//
//   auto file = torchattn::GgufFile::open("SmolLM2-135M-Instruct.Q4_1.gguf");
//   auto config = torchattn::models::gguf_decoder_config(file);
//   torchattn::models::CausalLM model(config, 2048, torchattn::models::Init::ForLoading);
//   model->load_hf_tensors(torchattn::models::gguf_hf_tensors(file, config), "SmolLM2.gguf");

#include <torchattn/gguf.h>
#include <torchattn/models/config.h>
#include <torchattn/safetensors.h>

namespace torchattn::models {

/// A decoder's config from `file`'s metadata: general.architecture llama (Llama,
/// SmolLM2, Mistral) or qwen2, its sizes ({arch}.block_count, .embedding_length,
/// .feed_forward_length, .attention.head_count(_kv), .context_length), RoPE base
/// (.rope.freq_base), norm epsilon, tied embeddings (no output.weight) and the
/// tokenizer's BOS and EOS ids. Another architecture, RoPE scaling, or a rotary
/// dimension other than the heads' is an error naming the key.
DecoderConfig gguf_decoder_config(const torchattn::GgufFile& file);

/// `file`'s tensors dequantized to float32 (GgufFile::dequantize) under transformers'
/// names ("blk.3.attn_q.weight" -> "model.layers.3.self_attn.q_proj.weight"), a llama
/// file's q and k weights un-permuted as transformers does (llama.cpp's converter
/// interleaves each head's rotary halves): the state dict transformers loads from the
/// file. A tensor of no known role is an error naming it.
torchattn::NamedTensors gguf_hf_tensors(const torchattn::GgufFile& file, const DecoderConfig& config);

/// The same for a model frozen to int4 (torchattn::WeightFormat::Int4): each decoder
/// layer's linear weight (the projections and the MLP) as int4 data (uint8 [out, in /
/// 2]) under its name and its (d, m) pairs (float16 [out, in / 32, 2]) under name +
/// kFrozenScaleSuffix, from GgufFile::int4_weights for Q4_0, Q4_1 and Q4_K: a Q4_1
/// tensor's blocks are these bytes as they are, a Q4_0 tensor's with m = -8 d (no
/// weight's value changes), a Q4_K tensor's sub-blocks with d sc and -dmin m rounded to
/// float16 (its 4-bit values kept). A tensor of another type (Q6_K, Q8_0, ...) is
/// quantized to int4 from its dequantized values (as PackedLinear::freeze does), a slice
/// of rows at a time. The output head (or
/// the tied embedding table) in int8 (an int4 model's head: CausalLM::weight_format),
/// from its dequantized values, a few thousand rows at a time; the other tensors (norms,
/// biases, an untied table) float32 as gguf_hf_tensors gives them. Each tensor's pages
/// of the file are given back once it is converted (GgufFile::release), so a load's
/// peak holds the converted model, not the file beside it. CausalLM::load_frozen_state
/// takes them after hf_weights()' renames.
torchattn::NamedTensors gguf_hf_int4_tensors(const torchattn::GgufFile& file, const DecoderConfig& config);

/// Whether `path` names a GGUF file (a regular file beginning with "GGUF").
bool is_gguf_file(const std::string& path);

}  // namespace torchattn::models
