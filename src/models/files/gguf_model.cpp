#include <torchattn/models/gguf_model.h>

#include <torchattn/packed_linear.h>

#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

namespace torchattn::models {

namespace {

// {arch}.<key> as a positive integer, an error naming it otherwise.
int64_t positive(const torchattn::GgufFile& f, const std::string& key) {
  const int64_t v = f.integer(key);
  TORCH_CHECK(v >= 1, "gguf_decoder_config: ", key, " is ", v, ", expected a positive integer");
  return v;
}

// The roles of a layer's tensors: GGUF's name after "blk.N." -> transformers' after
// "model.layers.N.".
const std::map<std::string, std::string>& layer_names() {
  static const std::map<std::string, std::string> names = {
      {"attn_norm.weight", "input_layernorm.weight"}, {"ffn_norm.weight", "post_attention_layernorm.weight"},
      {"attn_q.weight", "self_attn.q_proj.weight"},   {"attn_k.weight", "self_attn.k_proj.weight"},
      {"attn_v.weight", "self_attn.v_proj.weight"},   {"attn_output.weight", "self_attn.o_proj.weight"},
      {"attn_q.bias", "self_attn.q_proj.bias"},       {"attn_k.bias", "self_attn.k_proj.bias"},
      {"attn_v.bias", "self_attn.v_proj.bias"},       {"ffn_gate.weight", "mlp.gate_proj.weight"},
      {"ffn_up.weight", "mlp.up_proj.weight"},        {"ffn_down.weight", "mlp.down_proj.weight"},
  };
  return names;
}

// llama.cpp's converter stores a llama q (k) weight [heads * d, in] with each head's rows
// reordered from [2, d / 2] to [d / 2, 2]; transformers' GGUF loader puts them back.
// Whole rows move: the same for int4's data [rows, in / 2] and its scales [rows, groups, 2].
at::Tensor unpermute(const at::Tensor& w, int64_t heads, const std::string& name) {
  const int64_t rows = w.dim() >= 2 ? w.size(0) : 0;
  TORCH_CHECK(rows > 0 && rows % (2 * heads) == 0, "gguf_hf_tensors: tensor '", name, "' of shape ", w.sizes(),
              " is not ", heads, " heads of an even size");
  return w.reshape({heads, rows / heads / 2, 2, -1}).transpose(1, 2).reshape(w.sizes()).contiguous();
}

// The GGUF name of a tensor -> transformers' (the roles above); an error names a tensor
// of no role.
std::string hf_name(const std::string& gguf, const DecoderConfig& config) {
  if (gguf == "token_embd.weight") return "model.embed_tokens.weight";
  if (gguf == "output_norm.weight") return "model.norm.weight";
  if (gguf == "output.weight") return "lm_head.weight";
  if (gguf.starts_with("blk.") && gguf.find('.', 4) != std::string::npos) {
    const size_t dot = gguf.find('.', 4);
    const std::string layer = gguf.substr(4, dot - 4), role = gguf.substr(dot + 1);
    const auto it = layer_names().find(role);
    TORCH_CHECK(it != layer_names().end() && !layer.empty() &&
                    layer.find_first_not_of("0123456789") == std::string::npos,
                "gguf_hf_tensors: tensor '", gguf, "' has no role in a ", config.model_type, " decoder");
    return "model.layers." + layer + "." + it->second;
  }
  TORCH_CHECK(false, "gguf_hf_tensors: tensor '", gguf, "' has no role in a ", config.model_type, " decoder");
}

}  // namespace

DecoderConfig gguf_decoder_config(const torchattn::GgufFile& f) {
  const std::string& arch = f.string("general.architecture");
  TORCH_CHECK(arch == "llama" || arch == "qwen2", "gguf_decoder_config: general.architecture is '", arch,
              "'; torchattn reads llama (Llama, SmolLM2, Mistral) and qwen2 GGUF files");
  const auto key = [&](const char* k) { return arch + "." + k; };
  DecoderConfig c;
  c.model_type = arch;
  c.hidden_size = positive(f, key("embedding_length"));
  c.intermediate_size = positive(f, key("feed_forward_length"));
  c.num_layers = positive(f, key("block_count"));
  c.num_heads = positive(f, key("attention.head_count"));
  c.num_kv_heads = f.has(key("attention.head_count_kv")) ? positive(f, key("attention.head_count_kv")) : c.num_heads;
  c.max_position_embeddings = positive(f, key("context_length"));
  TORCH_CHECK(c.num_heads % c.num_kv_heads == 0, "gguf_decoder_config: ", key("attention.head_count"), " (",
              c.num_heads, ") is not a multiple of ", key("attention.head_count_kv"), " (", c.num_kv_heads, ")");
  if (f.has(key("attention.key_length"))) {
    c.own_head_dim = positive(f, key("attention.key_length"));
  } else {
    TORCH_CHECK(c.hidden_size % c.num_heads == 0, "gguf_decoder_config: ", key("embedding_length"),
                " is not a multiple of ", key("attention.head_count"), " (and no ", key("attention.key_length"), ")");
  }
  if (f.has(key("rope.dimension_count"))) {
    TORCH_CHECK(f.integer(key("rope.dimension_count")) == c.head_dim(),
                "gguf_decoder_config: ", key("rope.dimension_count"), " is ", f.integer(key("rope.dimension_count")),
                "; torchattn rotates whole heads of ", c.head_dim());
  }
  if (f.has(key("rope.scaling.type"))) {
    const std::string& scaling = f.string(key("rope.scaling.type"));
    TORCH_CHECK(scaling == "none", "gguf_decoder_config: ", key("rope.scaling.type"), " is '", scaling,
                "'; RoPE scaling is not supported (only the default)");
  }
  TORCH_CHECK(
      f.tensor("rope_freqs.weight") == nullptr,
      "gguf_decoder_config: the file holds rope_freqs.weight (Llama 3.1's RoPE scaling), which is not supported");
  c.rms_norm_eps = f.number(key("attention.layer_norm_rms_epsilon"));
  c.rope_theta = f.has(key("rope.freq_base")) ? f.number(key("rope.freq_base")) : 10000.0;
  c.vocab_size = f.has(key("vocab_size")) ? positive(f, key("vocab_size"))
                                          : static_cast<int64_t>(f.strings("tokenizer.ggml.tokens").size());
  c.tie_word_embeddings = f.tensor("output.weight") == nullptr;
  c.qkv_bias = f.tensor("blk.0.attn_q.bias") != nullptr;
  c.windows.assign(static_cast<size_t>(c.num_layers), std::nullopt);
  if (f.has("tokenizer.ggml.eos_token_id")) c.eos_token_ids = {f.integer("tokenizer.ggml.eos_token_id")};
  if (f.has("tokenizer.ggml.bos_token_id")) c.bos_token_id = f.integer("tokenizer.ggml.bos_token_id");
  return c;
}

torchattn::NamedTensors gguf_hf_tensors(const torchattn::GgufFile& f, const DecoderConfig& config) {
  const bool llama = config.model_type == "llama";
  torchattn::NamedTensors out;
  out.reserve(f.tensors().size());
  for (const auto& t : f.tensors()) {
    std::string name = hf_name(t.name, config);
    at::Tensor w = f.dequantize(t.name);
    if (llama && t.name.ends_with(".attn_q.weight")) w = unpermute(w, config.num_heads, t.name);
    if (llama && t.name.ends_with(".attn_k.weight")) w = unpermute(w, config.num_kv_heads, t.name);
    out.emplace_back(std::move(name), std::move(w));
    f.release(t.name);  // converted: its pages of the file go
  }
  return out;
}

torchattn::NamedTensors gguf_hf_int4_tensors(const torchattn::GgufFile& f, const DecoderConfig& config) {
  const bool llama = config.model_type == "llama";
  torchattn::NamedTensors out;
  out.reserve(2 * f.tensors().size());
  for (const auto& t : f.tensors()) {
    std::string name = hf_name(t.name, config);
    const bool head = name == "lm_head.weight" || (name == "model.embed_tokens.weight" && config.tie_word_embeddings);
    const bool linear = name.ends_with("_proj.weight");
    // q and k's rows back in transformers' order: a permutation of whole rows, the same
    // for the data and its scales.
    const auto rows_back = [&](at::Tensor w) {
      if (llama && t.name.ends_with(".attn_q.weight")) return unpermute(w, config.num_heads, t.name);
      if (llama && t.name.ends_with(".attn_k.weight")) return unpermute(w, config.num_kv_heads, t.name);
      return w;
    };
    // Each tensor's pages of the file go once it is converted: the peak holds the
    // converted model and one tensor's bytes, not the whole file beside it.
    if (head) {  // int8, as CausalLM keeps an int4 model's head
      TORCH_CHECK(t.shape.size() == 2, "gguf_hf_int4_tensors: tensor '", t.name, "' is not [out, in]");
      auto [q, s] = f.int8_weights(t.name);
      out.emplace_back(name + torchattn::kFrozenScaleSuffix, std::move(s));
      out.emplace_back(std::move(name), std::move(q));
      f.release(t.name);
      continue;
    }
    if (!linear) {
      out.emplace_back(std::move(name), rows_back(f.dequantize(t.name)));
      f.release(t.name);
      continue;
    }
    // Q4_0, Q4_1 and Q4_K keep their 4-bit values; the other types are quantized to
    // int4 from their float32 values, a slice of rows at a time (GgufFile::int4_weights).
    auto [data, scale] = f.int4_weights(t.name);
    out.emplace_back(name + torchattn::kFrozenScaleSuffix, rows_back(scale));
    out.emplace_back(std::move(name), rows_back(data));
    f.release(t.name);
  }
  return out;
}

bool is_gguf_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return false;
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  in.read(magic, 4);
  return in.gcount() == 4 && std::string(magic, 4) == "GGUF";
}

}  // namespace torchattn::models
