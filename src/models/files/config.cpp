#include <torchattn/models/config.h>

#include "models/files/json_file.h"

#include <nlohmann/json.hpp>

#include <c10/util/Exception.h>

#include <cmath>
#include <filesystem>

namespace torchattn::models {

namespace {

using json = nlohmann::json;

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  TORCH_CHECK(false, "config: '" + path + "': " + what);
}

int64_t positive(const json& c, const std::string& path, const char* key) {
  if (!c.contains(key) || !c[key].is_number_integer() || c[key].get<int64_t>() <= 0) {
    fail(path, std::string("expected a positive integer ") + key);
  }
  return c[key].get<int64_t>();
}

std::vector<int64_t> ids(const json& v) {
  std::vector<int64_t> out;
  if (v.is_number_integer()) out.push_back(v.get<int64_t>());
  if (v.is_array()) {
    for (const auto& x : v) out.push_back(x.get<int64_t>());
  }
  return out;
}

}  // namespace

const char* supported_model_types() {
  return "llama, qwen2, qwen3, mistral, gemma2 (decoders); bert (encoders); bart (encoder-decoders)";
}

std::string read_model_type(const std::string& path) {
  const json c = files::read_json_file(path, "config");
  if (!c.is_object() || !c.contains("model_type") || !c["model_type"].is_string()) fail(path, "no model_type");
  return c["model_type"].get<std::string>();
}

static DecoderConfig read_decoder_config_unchecked(const std::string& path) {
  const json c = files::read_json_file(path, "config");
  DecoderConfig m;
  m.model_type = c.value("model_type", std::string());
  if (m.model_type != "llama" && m.model_type != "qwen2" && m.model_type != "qwen3" && m.model_type != "mistral" &&
      m.model_type != "gemma2") {
    fail(path,
         "model_type '" + m.model_type + "' is not a decoder this library runs; supported: " + supported_model_types());
  }
  m.vocab_size = positive(c, path, "vocab_size");
  m.hidden_size = positive(c, path, "hidden_size");
  m.intermediate_size = positive(c, path, "intermediate_size");
  m.num_layers = positive(c, path, "num_hidden_layers");
  m.num_heads = positive(c, path, "num_attention_heads");
  m.num_kv_heads = c.contains("num_key_value_heads") && !c["num_key_value_heads"].is_null()
                       ? positive(c, path, "num_key_value_heads")
                       : m.num_heads;
  m.max_position_embeddings = positive(c, path, "max_position_embeddings");
  if (c.contains("head_dim") && !c["head_dim"].is_null()) {
    m.own_head_dim = positive(c, path, "head_dim");  // heads of their own size
  } else if (m.hidden_size % m.num_heads != 0) {
    fail(path, "hidden_size is not a multiple of num_attention_heads (and no head_dim)");
  }
  if (m.model_type == "gemma2") {
    // Gemma 2 names its activation hidden_activation (hidden_act where older configs give it).
    const json act = c.contains("hidden_activation") && !c["hidden_activation"].is_null()
                         ? c["hidden_activation"]
                         : c.value("hidden_act", json());
    if (!act.is_string() || act.get<std::string>() != "gelu_pytorch_tanh") {
      fail(path, "hidden_activation is not gelu_pytorch_tanh");
    }
    m.activation = "gelu_tanh";
    m.gemma_norms = true;
    auto cap = [&](const char* key, double fallback) {
      if (!c.contains(key)) return fallback;
      if (c[key].is_null()) return 0.0;
      if (!c[key].is_number() || c[key].get<double>() <= 0.0)
        fail(path, std::string(key) + " is not a positive number");
      return c[key].get<double>();
    };
    m.attn_softcap = cap("attn_logit_softcapping", 50.0);
    m.final_softcap = cap("final_logit_softcapping", 30.0);
    if (c.contains("query_pre_attn_scalar") && !c["query_pre_attn_scalar"].is_number()) {
      fail(path, "query_pre_attn_scalar is not a number");
    }
    const double scalar = c.value("query_pre_attn_scalar", 256.0);
    if (!(scalar > 0.0)) fail(path, "query_pre_attn_scalar is not positive");
    m.attn_scale = std::pow(scalar, -0.5);
  } else if (c.value("hidden_act", std::string("silu")) != "silu") {
    fail(path, "hidden_act is not silu");
  }
  m.rms_norm_eps = c.value("rms_norm_eps", 1e-6);
  // RoPE: rope_parameters (transformers 5) or rope_theta; only the default kind.
  const json rope = c.contains("rope_parameters") && c["rope_parameters"].is_object() ? c["rope_parameters"] : c;
  m.rope_theta = rope.value("rope_theta", c.value("rope_theta", 10000.0));
  const json scaling = c.value("rope_scaling", json());
  const std::string rope_type = rope.value("rope_type", scaling.is_object()
                                                            ? scaling.value("rope_type", std::string("default"))
                                                            : std::string("default"));
  if (rope_type != "default") fail(path, "RoPE type '" + rope_type + "' is not supported (only the default)");
  m.tie_word_embeddings = c.value("tie_word_embeddings", false);
  if (m.model_type == "qwen2") {
    m.qkv_bias = true;
  } else {
    m.qkv_bias = m.o_bias = c.value("attention_bias", false);
  }
  m.qk_norm = m.model_type == "qwen3";  // each head's queries and keys, eps rms_norm_eps
  m.mlp_bias = c.value("mlp_bias", false);
  m.windows.assign(static_cast<size_t>(m.num_layers), std::nullopt);
  const json window = c.value("sliding_window", json());
  if (window.is_number_integer()) {
    if (m.model_type == "mistral") {
      m.windows.assign(static_cast<size_t>(m.num_layers), window.get<int64_t>());
    } else if (c.contains("layer_types") && c["layer_types"].is_array()) {
      for (size_t i = 0; i < c["layer_types"].size() && i < m.windows.size(); ++i) {
        if (c["layer_types"][i] == "sliding_attention") m.windows[i] = window.get<int64_t>();
      }
    }
  }
  m.eos_token_ids = ids(c.value("eos_token_id", json()));
  if (c.contains("bos_token_id") && c["bos_token_id"].is_number_integer())
    m.bos_token_id = c["bos_token_id"].get<int64_t>();
  return m;
}

static BertConfig read_bert_config_unchecked(const std::string& path) {
  const json c = files::read_json_file(path, "config");
  const std::string type = c.value("model_type", std::string());
  if (type != "bert") {
    fail(path, "model_type '" + type + "' is not an encoder this library runs; supported: " + supported_model_types());
  }
  BertConfig m;
  m.vocab_size = positive(c, path, "vocab_size");
  m.hidden_size = positive(c, path, "hidden_size");
  m.intermediate_size = positive(c, path, "intermediate_size");
  m.num_layers = positive(c, path, "num_hidden_layers");
  m.num_heads = positive(c, path, "num_attention_heads");
  m.max_position_embeddings = positive(c, path, "max_position_embeddings");
  m.type_vocab_size = c.contains("type_vocab_size") ? positive(c, path, "type_vocab_size") : 2;
  if (m.hidden_size % m.num_heads != 0) fail(path, "hidden_size is not a multiple of num_attention_heads");
  const std::string act = c.value("hidden_act", std::string("gelu"));
  if (act != "gelu") fail(path, "hidden_act '" + act + "' is not supported (only gelu)");
  const std::string positions = c.value("position_embedding_type", std::string("absolute"));
  if (positions != "absolute")
    fail(path, "position_embedding_type '" + positions + "' is not supported (only absolute)");
  if (c.value("is_decoder", false)) fail(path, "is_decoder: a BERT decoder is not supported (only encoders)");
  m.layer_norm_eps = c.value("layer_norm_eps", 1e-12);
  m.hidden_dropout = c.value("hidden_dropout_prob", 0.1);
  m.attention_dropout = c.value("attention_probs_dropout_prob", 0.1);
  m.pad_token_id = c.contains("pad_token_id") && c["pad_token_id"].is_number_integer()
                       ? c["pad_token_id"].get<int64_t>()
                       : 0;
  return m;
}

static BartConfig read_bart_config_unchecked(const std::string& path) {
  const json c = files::read_json_file(path, "config");
  const std::string type = c.value("model_type", std::string());
  if (type != "bart") {
    fail(path, "model_type '" + type +
                   "' is not an encoder-decoder this library runs; supported: " + supported_model_types());
  }
  BartConfig m;
  m.vocab_size = positive(c, path, "vocab_size");
  m.d_model = positive(c, path, "d_model");
  m.encoder_layers = positive(c, path, "encoder_layers");
  m.decoder_layers = positive(c, path, "decoder_layers");
  m.encoder_attention_heads = positive(c, path, "encoder_attention_heads");
  m.decoder_attention_heads = positive(c, path, "decoder_attention_heads");
  m.encoder_ffn_dim = positive(c, path, "encoder_ffn_dim");
  m.decoder_ffn_dim = positive(c, path, "decoder_ffn_dim");
  m.max_position_embeddings = positive(c, path, "max_position_embeddings");
  if (m.d_model % m.encoder_attention_heads != 0 || m.d_model % m.decoder_attention_heads != 0) {
    fail(path, "d_model is not a multiple of encoder_attention_heads and decoder_attention_heads");
  }
  m.activation = c.value("activation_function", std::string("gelu"));
  if (m.activation != "gelu" && m.activation != "relu") {
    fail(path, "activation_function '" + m.activation + "' is not supported (gelu or relu)");
  }
  // mBART's pre-norm layers (normalize_before) are another architecture.
  if (c.value("normalize_before", false))
    fail(path, "normalize_before: pre-norm layers are not supported (BART's are post-norm)");
  m.scale_embedding = c.value("scale_embedding", false);
  // Untied, transformers gives the encoder, the decoder and the head embeddings of their own.
  if (!c.value("tie_word_embeddings", true))
    fail(path, "tie_word_embeddings false is not supported (only BART's tied embeddings)");
  m.dropout = c.value("dropout", 0.1);
  m.attention_dropout = c.value("attention_dropout", 0.0);
  m.activation_dropout = c.value("activation_dropout", 0.0);
  auto id = [&](const json& j, const std::string& file, const char* key) -> std::optional<int64_t> {
    if (!j.contains(key) || j[key].is_null()) return std::nullopt;
    if (!j[key].is_number_integer() || j[key].get<int64_t>() < 0 || j[key].get<int64_t>() >= m.vocab_size) {
      fail(file, std::string("expected ") + key + " to be a token id in [0, vocab_size " +
                     std::to_string(m.vocab_size) + "), got " + j[key].dump());
    }
    return j[key].get<int64_t>();
  };
  m.pad_token_id = id(c, path, "pad_token_id").value_or(1);
  m.bos_token_id = id(c, path, "bos_token_id");
  // generate's settings come from generation_config.json where the folder has one (in
  // place of config.json's: transformers reads that file alone, fields it lacks are
  // none), else from config.json.
  auto generation = [&](const json& j, const std::string& file) {
    m.eos_token_ids.clear();
    if (j.contains("eos_token_id") && !j["eos_token_id"].is_null()) {
      const json& eos = j["eos_token_id"];
      for (const json& e : eos.is_array() ? eos : json::array({eos})) {
        if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() >= m.vocab_size) {
          fail(file, "expected eos_token_id to be token ids in [0, vocab_size " + std::to_string(m.vocab_size) +
                         "), got " + eos.dump());
        }
        m.eos_token_ids.push_back(e.get<int64_t>());
      }
    }
    m.forced_bos_token_id = id(j, file, "forced_bos_token_id");
    m.forced_eos_token_id = id(j, file, "forced_eos_token_id");
    // transformers starts the decoder with bos_token_id where no decoder_start_token_id is given.
    std::optional<int64_t> start = id(j, file, "decoder_start_token_id");
    if (!start) start = id(j, file, "bos_token_id");
    if (!start) fail(file, "expected a decoder_start_token_id or a bos_token_id (the decoder's first input)");
    m.decoder_start_token_id = *start;
  };
  const std::filesystem::path generation_file = std::filesystem::path(path).parent_path() / "generation_config.json";
  if (std::filesystem::exists(generation_file)) {
    const std::string gpath = generation_file.string();
    try {
      const json g = files::read_json_file(gpath, "config");
      if (!g.is_object()) fail(gpath, "expected a JSON object");
      generation(g, gpath);
    } catch (const nlohmann::json::exception& e) {
      fail(gpath, e.what());
    }
  } else {
    generation(c, path);
  }
  return m;
}

// A field of the wrong JSON type (a string for a number, ...) is named by the JSON
// library; the error says which file.
template <typename F>
auto with_json_errors(const std::string& path, F&& read) {
  try {
    return read(path);
  } catch (const nlohmann::json::exception& e) {
    fail(path, e.what());
  }
}

DecoderConfig read_decoder_config(const std::string& path) {
  return with_json_errors(path, read_decoder_config_unchecked);
}

BertConfig read_bert_config(const std::string& path) { return with_json_errors(path, read_bert_config_unchecked); }

BartConfig read_bart_config(const std::string& path) { return with_json_errors(path, read_bart_config_unchecked); }

}  // namespace torchattn::models
