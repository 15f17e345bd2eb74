#include <torchattn/models/sentence_encoder.h>

#include <torchattn/models/config.h>
#include <torchattn/models/folder_checks.h>
#include <torchattn/models/weights.h>

#include "models/files/json_file.h"
#include "models/pretrained/load_checks.h"
#include "models/text/utf8_check.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/clamp_min.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/tensor.h>
#include <c10/core/InferenceMode.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <filesystem>
#include <numeric>

namespace torchattn::models {

namespace fs = std::filesystem;

SentenceEncoder::SentenceEncoder(BertModel model, Tokenizer tokenizer, int64_t max_length, Pooling pooling,
                                 bool normalize)
    : model_(std::move(model)), tokenizer_(std::move(tokenizer)), max_length_(max_length), pooling_(pooling),
      normalize_(normalize) {
  pad_id_ = tokenizer_.id_of("[PAD]").value_or(model_->config().pad_token_id);
}

SentenceEncoder SentenceEncoder::from_pretrained(const std::string& folder, const LoadOptions& options) {
  pretrained::check_load_options(options);
  TORCH_CHECK(fs::is_directory(folder), "SentenceEncoder::from_pretrained: '", folder, "' is not a folder");
  const fs::path dir(folder);
  const std::string type = read_model_type((dir / "config.json").string());
  TORCH_CHECK(type == "bert", "SentenceEncoder::from_pretrained: '", folder, "' holds a ", type,
              " model; SentenceEncoder runs bert encoders",
              type == "llama" || type == "qwen2" || type == "qwen3" || type == "mistral" || type == "gemma2"
                  ? " (load a decoder with LanguageModel::from_pretrained)"
                  : "",
              "; supported: ", supported_model_types());
  const BertConfig config = read_bert_config((dir / "config.json").string());
  Tokenizer tokenizer((dir / "tokenizer.json").string());
  check_tokenizer(folder, config, tokenizer);

  // sentence-transformers' description of the pipeline, when the folder has one.
  Pooling pooling = Pooling::Mean;
  bool normalize = false;
  int64_t max_length = config.max_position_embeddings;
  try {
    if (fs::exists(dir / "modules.json")) {
      const auto modules = files::read_json_file((dir / "modules.json").string(), "SentenceEncoder");
      TORCH_CHECK(modules.is_array(), "SentenceEncoder: '", (dir / "modules.json").string(),
                  "' is not a list of modules");
      for (const auto& m : modules) {
        const std::string kind = m.value("type", std::string());
        const std::string path = m.value("path", std::string());
        if (kind == "sentence_transformers.models.Normalize") {
          normalize = true;
        } else if (kind == "sentence_transformers.models.Pooling") {
          const auto p = files::read_json_file((dir / path / "config.json").string(), "SentenceEncoder");
          const bool cls = p.value("pooling_mode_cls_token", false), mean = p.value("pooling_mode_mean_tokens", false);
          TORCH_CHECK(cls != mean && !p.value("pooling_mode_max_tokens", false) &&
                          !p.value("pooling_mode_mean_sqrt_len_tokens", false),
                      "SentenceEncoder: '", (dir / path / "config.json").string(),
                      "' asks for a pooling other than exactly one of mean or cls");
          pooling = cls ? Pooling::CLS : Pooling::Mean;
        } else {
          TORCH_CHECK(kind == "sentence_transformers.models.Transformer", "SentenceEncoder: '",
                      (dir / "modules.json").string(), "' has a module ", kind,
                      "; supported: Transformer, Pooling, Normalize");
        }
      }
    }
    if (fs::exists(dir / "sentence_bert_config.json")) {
      const auto c = files::read_json_file((dir / "sentence_bert_config.json").string(), "SentenceEncoder");
      if (c.contains("max_seq_length") && c["max_seq_length"].is_number_integer()) {
        max_length = std::min<int64_t>(max_length, c["max_seq_length"].get<int64_t>());
      }
    }
  } catch (const nlohmann::json::exception& e) {
    TORCH_CHECK(false, "SentenceEncoder::from_pretrained: '", folder,
                "': a sentence-transformers file is not as "
                "expected: ",
                e.what());
  }
  TORCH_CHECK(max_length >= 2, "SentenceEncoder::from_pretrained: '", folder, "': expected a max_seq_length >= 2, got ",
              max_length);
  BertModel model(config, options.pack_weights().value_or(true));
  load_weights(*model, folder, BertModelImpl::hf_weights());
  if (options.device() != model->embeddings->word_embeddings->weight.device() || options.dtype() != at::kFloat) {
    model->to(options.device(), options.dtype());
  }
  model->eval();
  if (options.weight_format() != WeightFormat::Float32) model->freeze_weights(options.weight_format());
  return SentenceEncoder(std::move(model), std::move(tokenizer), max_length, pooling, normalize);
}

at::Tensor SentenceEncoder::embed(const std::vector<std::string>& texts, const EmbedOptions& options) {
  std::vector<std::vector<int64_t>> ids;
  ids.reserve(texts.size());
  for (size_t i = 0; i < texts.size(); ++i) {
    text::check_utf8("SentenceEncoder::embed", texts[i], "text " + std::to_string(i));
    if (options.truncate()) {
      ids.push_back(tokenizer_.encode(texts[i], true, max_length_));
      continue;
    }
    ids.push_back(tokenizer_.encode(texts[i]));
    TORCH_CHECK(static_cast<int64_t>(ids.back().size()) <= max_length_, "SentenceEncoder::embed: text ", i, " has ",
                ids.back().size(), " tokens, more than the model's max_length of ", max_length_,
                "; shorten it, or pass EmbedOptions().truncate(true) to keep its first ", max_length_, " tokens");
  }
  return embed_ids(ids, options);
}

void SentenceEncoder::check_special_tokens(size_t i, const std::vector<int64_t>& ids) const {
  const auto& prefix = tokenizer_.prefix_ids();
  const auto& suffix = tokenizer_.suffix_ids();
  // The messages are built only when a check fails.
  auto name = [&](const std::vector<int64_t>& t) { return tokenizer_.decode(t); };
  auto expected = [&] {
    return "expected ids as tokenizer().encode(text) gives them, " + name(prefix) + " ... " + name(suffix) +
           " (sentence-transformers always adds them)";
  };
  TORCH_CHECK(ids.size() >= prefix.size() + suffix.size(), "SentenceEncoder::embed_ids: text ", i, " has ", ids.size(),
              " ids, fewer than its special tokens; ", expected());
  for (size_t k = 0; k < prefix.size(); ++k) {
    TORCH_CHECK(ids[k] == prefix[k], "SentenceEncoder::embed_ids: text ", i, " starts with id ", ids[k], " (",
                name({ids[k]}), ") where ", name({prefix[k]}), " (id ", prefix[k], ") belongs; ", expected());
  }
  const size_t start = ids.size() - suffix.size();
  for (size_t k = 0; k < suffix.size(); ++k) {
    TORCH_CHECK(ids[start + k] == suffix[k], "SentenceEncoder::embed_ids: text ", i, " ends with id ", ids[start + k],
                " (", name({ids[start + k]}), ") where ", name({suffix[k]}), " (id ", suffix[k], ") belongs; ",
                expected());
  }
}

at::Tensor SentenceEncoder::embed_ids(const std::vector<std::vector<int64_t>>& ids, const EmbedOptions& options) {
  TORCH_CHECK(options.batch_size() >= 1, "SentenceEncoder::embed: expected batch_size >= 1, got ",
              options.batch_size());
  const int64_t vocab = model_->config().vocab_size;
  for (size_t i = 0; i < ids.size(); ++i) {
    TORCH_CHECK(!ids[i].empty(), "SentenceEncoder::embed: text ", i, " has no tokens");
    TORCH_CHECK(static_cast<int64_t>(ids[i].size()) <= max_length_, "SentenceEncoder::embed: text ", i, " has ",
                ids[i].size(), " tokens, more than the model's max_length of ", max_length_);
    for (const int64_t id : ids[i]) {
      TORCH_CHECK(id >= 0 && id < vocab, "SentenceEncoder::embed: text ", i, " has token id ", id,
                  ", outside the vocabulary [0, ", vocab, ")");
    }
    // The model was trained on [CLS] text [SEP]: without them (CLS pooling reads the
    // first token) the embedding is another one, with no error to say so.
    check_special_tokens(i, ids[i]);
  }
  const Pooling pooling = options.pooling().value_or(pooling_);
  const bool normalize = options.normalize().value_or(normalize_);
  c10::InferenceMode inference;
  const auto device = model_->embeddings->word_embeddings->weight.device();
  const int64_t n = static_cast<int64_t>(ids.size());
  at::Tensor out = at::empty({n, dimension()}, at::TensorOptions().dtype(at::kFloat).device(device));
  // Longest first, so that each batch pads little.
  std::vector<int64_t> order(ids.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return ids[static_cast<size_t>(a)].size() > ids[static_cast<size_t>(b)].size();
  });
  for (int64_t first = 0; first < n; first += options.batch_size()) {
    const int64_t count = std::min(options.batch_size(), n - first);
    const int64_t T = static_cast<int64_t>(ids[static_cast<size_t>(order[static_cast<size_t>(first)])].size());
    std::vector<int64_t> flat(static_cast<size_t>(count * T), pad_id_);
    std::vector<uint8_t> pad(flat.size(), 0);
    std::vector<int64_t> rows(static_cast<size_t>(count));
    bool padded = false;
    for (int64_t r = 0; r < count; ++r) {
      const auto& seq = ids[static_cast<size_t>(order[static_cast<size_t>(first + r)])];
      rows[static_cast<size_t>(r)] = order[static_cast<size_t>(first + r)];
      std::copy(seq.begin(), seq.end(), flat.begin() + r * T);
      for (int64_t t = static_cast<int64_t>(seq.size()); t < T; ++t) {
        pad[static_cast<size_t>(r * T + t)] = 1;
        padded = true;
      }
    }
    const at::Tensor batch = at::tensor(flat, at::kLong).view({count, T}).to(device);
    const at::Tensor mask =
        padded ? at::tensor(at::ArrayRef<uint8_t>(pad), at::kByte).view({count, T}).to(device, at::kBool)
               : at::Tensor();
    const at::Tensor hidden = model_->forward(batch, mask).to(at::kFloat);  // [count, T, H]
    at::Tensor e;
    if (pooling == Pooling::CLS) {
      e = hidden.select(1, 0);
    } else if (!padded) {
      e = hidden.sum(1) / static_cast<double>(T);
    } else {
      // sentence-transformers' mean: the sum over real tokens / their count (>= 1e-9).
      const at::Tensor real = mask.logical_not().unsqueeze(-1).to(at::kFloat);
      e = (hidden * real).sum(1) / at::clamp_min(real.sum(1), 1e-9);
    }
    if (normalize) e = e / at::clamp_min(e.norm(2, 1, /*keepdim=*/true), 1e-12);
    out.index_copy_(0, at::tensor(rows, at::kLong).to(device), e);
    if (options.on_progress()) options.on_progress()(first + count, n);
  }
  return out;
}

}  // namespace torchattn::models
