// torchattn::MultiHeadAttention against Hugging Face transformers' own attention
// layers: Llama (grouped-query heads, RoPE), Qwen2 (q/k/v biases), Mistral (sliding
// window), Phi (partial rotary), GPT-J (interleaved rotary), GPT-2 (fused c_attn)
// and BERT (bidirectional, padding), and the decoder cross-attention of BART and
// Whisper (forward_cross, CrossKV). tests/reference/make_transformers_reference.py records
// what each layer does (full forward, left-padded forward, a padded prompt then
// cached decoding through transformers' DynamicCache, gradients); ctest runs it into
// a folder and points TORCHATTN_TRANSFORMERS_REFERENCE at it.
//
// Every case runs on every backend, with and without the mask buffer, with dynamic
// and static-shape caches, on every device present. Errors are relative to the
// largest reference value: float32 <= 1e-5, float64 <= 1e-10 (1e-6 with QK-norm off the
// CPU: the norm computes in float32, as transformers' does).

#include "common/devices.h"
#include "common/tolerances.h"

#include <torchattn/torchattn.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <string>
#include <vector>

using torchattn::Backend;

namespace {

std::string reference_dir() {
  const char* dir = std::getenv("TORCHATTN_TRANSFORMERS_REFERENCE");
  return dir == nullptr ? "" : dir;
}

// The names of the reference's cases that `keep` accepts, sorted.
template <typename Keep>
std::vector<std::string> reference_cases(Keep keep) {
  std::vector<std::string> out;
  const std::string dir = reference_dir();
  if (dir.empty() || !std::filesystem::is_directory(dir)) {
    return out;
  }
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().stem().string();
    if (entry.path().extension() == ".pt" && keep(name)) out.push_back(name);
  }
  std::sort(out.begin(), out.end());
  return out;
}

bool is_cross(const std::string& name) { return name.find("_cross_") != std::string::npos; }

// The self-attention cases; decoders_only: those with cached decoding (all but BERT).
std::vector<std::string> case_files(bool decoders_only = false) {
  return reference_cases(
      [&](const std::string& name) { return !is_cross(name) && !(decoders_only && name.rfind("bert", 0) == 0); });
}

// The cross-attention cases (BART's and Whisper's decoder over the encoder's output).
std::vector<std::string> cross_case_files() { return reference_cases(is_cross); }

// The reference written by make_transformers_reference.py: a dict of tensors,
// numbers and strings.
struct Reference {
  c10::impl::GenericDict dict{c10::AnyType::get(), c10::AnyType::get()};

  explicit Reference(const std::string& name) {
    std::ifstream in(reference_dir() + "/" + name + ".pt", std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    dict = torch::pickle_load(bytes).toGenericDict();
  }
  bool has(const std::string& key) const { return dict.contains(key); }
  torch::Tensor tensor(const std::string& key) const { return dict.at(key).toTensor(); }
  int64_t integer(const std::string& key) const { return dict.at(key).toInt(); }
  double real(const std::string& key) const { return dict.at(key).toDouble(); }
  std::string text(const std::string& key) const { return dict.at(key).toStringRef(); }
};

torchattn::MultiHeadAttentionOptions options_of(const Reference& r, Backend backend, bool mask_buffer) {
  auto o = torchattn::MultiHeadAttentionOptions(r.integer("opt.d_model"), r.integer("opt.d_model"),
                                                r.integer("opt.context_length"), r.integer("opt.num_heads"))
               .num_kv_heads(r.integer("opt.num_kv_heads"))
               .causal(r.integer("opt.causal") != 0)
               .qkv_bias(r.integer("opt.qkv_bias") != 0)
               .out_bias(r.integer("opt.out_bias") != 0)
               .backend(backend)
               .mask_buffer(mask_buffer);
  if (r.integer("opt.window") > 0) {
    o.window(r.integer("opt.window"));
  }
  if (r.integer("opt.head_dim") > 0) {
    o.head_dim(r.integer("opt.head_dim"));
  }
  if (r.integer("opt.alibi") != 0) {
    o.alibi(true);
  }
  if (r.integer("opt.sinks") != 0) {
    o.sinks(true);
  }
  if (r.real("opt.softcap") > 0) {
    o.softcap(r.real("opt.softcap"));
  }
  if (r.real("opt.scale") > 0) {
    o.scale(r.real("opt.scale"));
  }
  if (r.real("opt.qk_norm_eps") > 0) {
    o.qk_norm(torchattn::QKNormOptions().eps(r.real("opt.qk_norm_eps")));
  }
  if (r.real("opt.rope_theta") > 0) {
    auto rope = torchattn::RoPEOptions(r.real("opt.rope_theta")).interleaved(r.integer("opt.rope_interleaved") != 0);
    if (r.integer("opt.rope_rotary_dim") > 0) {
      rope.rotary_dim(r.integer("opt.rope_rotary_dim"));
    }
    o.rope(rope);
  }
  return o;
}

// The largest error relative to the largest reference value, per family and dtype,
// printed at the end (the note quotes it).
struct ErrorTable {
  std::mutex mu;
  std::map<std::string, double> worst;
  void add(const std::string& key, double err) {
    std::lock_guard<std::mutex> lock(mu);
    worst[key] = std::max(worst[key], err);
  }
  ~ErrorTable() {
    if (worst.empty()) return;
    std::printf("\n[transformers] largest error relative to the reference's largest value, per family and dtype:\n");
    for (const auto& [k, v] : worst) std::printf("[transformers]   %-22s %.3e\n", k.c_str(), v);
  }
} errors;

// max |actual - expected| / scale, where scale is the largest |expected|, or the
// given one when larger.
double relative_error(const torch::Tensor& actual, const torch::Tensor& expected, double scale = 0.0) {
  const auto a = actual.detach().cpu().to(torch::kFloat64), e = expected.detach().cpu().to(torch::kFloat64);
  EXPECT_EQ(a.sizes(), e.sizes());
  if (a.sizes() != e.sizes()) return 1.0;
  scale = std::max({scale, e.abs().max().item<double>(), 1e-30});
  return (a - e).abs().max().item<double>() / scale;
}

// A case of the reference on the device of the parameter's element kDevice: the
// reference read, its dtype and error bound, and the errors recorded per family.
template <typename P, size_t kDevice>
class ReferenceFixture : public ::testing::TestWithParam<P> {
 protected:
  void SetUp() override {
    devices::skip_unless_present(device());
    if (this->IsSkipped() || this->HasFatalFailure()) return;
    ref_ = std::make_unique<Reference>(std::get<0>(this->GetParam()));
    dtype_ = ref_->text("dtype") == "float64" ? torch::kFloat64 : torch::kFloat32;
    bound_ = dtype_ == torch::kFloat64 ? 1e-10 : 1e-5;
    // QK-norm computes in float32 (as transformers' RMSNorm): off the reference's CPU,
    // float64 cases differ by the device's float32 rounding of the normalized q and k.
    if (dtype_ == torch::kFloat64 && ref_->has("w.q_norm.weight") && !device().is_cpu()) {
      bound_ = tol::float64_through_float32_norm().rtol;
    }
    key_ = ref_->text("family") + " " + ref_->text("dtype");
  }

  torch::Device device() const { return std::get<kDevice>(this->GetParam()); }

  // m with the reference's weights, in its dtype, on the device, in eval mode.
  torchattn::MultiHeadAttention with_weights(torchattn::MultiHeadAttention m) const {
    m->to(dtype_);
    torch::NoGradGuard no_grad;
    for (auto& p : m->named_parameters()) {
      TORCH_CHECK(ref_->has("w." + p.key()), "the reference has no weight ", p.key());
      p.value().copy_(ref_->tensor("w." + p.key()));
    }
    m->to(device());
    m->eval();
    return m;
  }

  torch::Tensor in(const std::string& key) const { return ref_->tensor(key).to(device()); }

  void expect_close(const std::string& what, const torch::Tensor& actual, const torch::Tensor& expected,
                    double scale = 0.0) {
    const double err = relative_error(actual, expected, scale);
    errors.add(key_, err);
    EXPECT_LE(err, bound_) << what << ": error " << err << " relative to the largest reference value";
  }

  // Each weight's gradient against the reference's, relative to the layer's largest:
  // W_key's bias gets none through the softmax (it shifts a row's scores all alike), so
  // its reference is rounding noise around 0, meaningful only on the layer's scale.
  void expect_weight_grads(torchattn::MultiHeadAttention& m) {
    double scale = 0.0;
    for (const auto& p : m->named_parameters()) {
      scale = std::max(scale, ref_->tensor("grad." + p.key()).abs().max().item<double>());
    }
    for (const auto& p : m->named_parameters()) {
      expect_close("grad of " + p.key(), p.value().grad(), ref_->tensor("grad." + p.key()), scale);
    }
  }

  std::unique_ptr<Reference> ref_;
  torch::Dtype dtype_ = torch::kFloat32;
  double bound_ = 0.0;
  std::string key_;
};

using Param = std::tuple<std::string /*case*/, Backend, bool /*mask_buffer*/, torch::Device>;

class TransformersParity : public ReferenceFixture<Param, 3> {
 protected:
  torchattn::MultiHeadAttention make() const {
    const auto& [name, backend, mask_buffer, device] = GetParam();
    return with_weights(torchattn::MultiHeadAttention(options_of(*ref_, backend, mask_buffer)));
  }

  // Rows of real tokens (not padding) of [B, T, d] outputs, as [N, d].
  static torch::Tensor real_rows(const torch::Tensor& y, const torch::Tensor& pad) {
    return y.cpu().index({pad.logical_not()});
  }
};

TEST_P(TransformersParity, FullForward) {
  auto m = make();
  torch::NoGradGuard no_grad;
  expect_close("full forward", m(in("full.x")), ref_->tensor("full.y"));
}

TEST_P(TransformersParity, PaddedForward) {
  auto m = make();
  torch::NoGradGuard no_grad;
  const auto pad = ref_->tensor("padded.mask");
  const auto y = m(in("padded.x"), pad.to(device()));
  expect_close("padded forward (real tokens)", real_rows(y, pad), real_rows(ref_->tensor("padded.y"), pad));
}

// Decoders only (BERT is an encoder: no cache).
class TransformersDecoding : public TransformersParity {};

TEST_P(TransformersDecoding, PaddedPromptThenCachedDecoding) {
  ASSERT_TRUE(ref_->has("cached.steps"));
  auto m = make();
  const auto device = this->device();
  const auto pad = ref_->tensor("padded.mask");
  for (bool static_shapes : {false, true}) {
    SCOPED_TRACE(static_shapes ? "static-shape cache" : "dynamic cache");
    torch::NoGradGuard no_grad;
    auto cache = m->make_kv_cache(pad.size(0), static_shapes);
    const auto y = m->forward_cached(in("cached.prompt.x"), cache, pad.to(device));
    expect_close("cached prompt (real tokens)", real_rows(y, pad), real_rows(ref_->tensor("cached.prompt.y"), pad));
    for (int64_t s = 0; s < ref_->integer("cached.steps"); ++s) {
      const std::string step = "cached.step" + std::to_string(s);
      expect_close(step, m->forward_cached(in(step + ".x"), cache), ref_->tensor(step + ".y"));
    }
    EXPECT_EQ(cache.length(), pad.size(1) + ref_->integer("cached.steps"));
    EXPECT_EQ(cache.key_storage().size(1), m->num_kv_heads());  // the cache holds num_kv_heads heads
  }
}

TEST_P(TransformersParity, GradientsOfInputAndWeights) {
  auto m = make();
  auto x = in("full.x").requires_grad_(true);
  auto y = m(x);
  y.backward(in("grad.out"));
  expect_close("grad of the input", x.grad(), ref_->tensor("grad.x"));
  expect_weight_grads(m);
}

std::string param_name(const ::testing::TestParamInfo<Param>& info) {
  const auto& [name, backend, mask_buffer, device] = info.param;
  return devices::prefix(device) + name + "_" + std::string(torchattn::to_string(backend)) +
         (mask_buffer ? "" : "_noBuffer");
}

INSTANTIATE_TEST_SUITE_P(Transformers, TransformersParity,
                         ::testing::Combine(::testing::ValuesIn(case_files()),
                                            ::testing::Values(Backend::Reference, Backend::SDPA, Backend::Auto),
                                            ::testing::Bool(), ::testing::ValuesIn(devices::all())),
                         param_name);
INSTANTIATE_TEST_SUITE_P(Transformers, TransformersDecoding,
                         ::testing::Combine(::testing::ValuesIn(case_files(/*decoders_only=*/true)),
                                            ::testing::Values(Backend::Reference, Backend::SDPA, Backend::Auto),
                                            ::testing::Bool(), ::testing::ValuesIn(devices::all())),
                         param_name);

// ---- cross-attention: MultiHeadAttention::forward_cross against BART's and Whisper's
// decoder encoder_attn ----

using CrossParam = std::tuple<std::string /*case*/, Backend, torch::Device>;

class TransformersCross : public ReferenceFixture<CrossParam, 2> {
 protected:
  torchattn::MultiHeadAttention make() const {
    const int64_t d = ref_->integer("opt.d_model");
    return with_weights(torchattn::MultiHeadAttention(
        torchattn::MultiHeadAttentionOptions(d, d, ref_->integer("opt.context_length"), ref_->integer("opt.num_heads"))
            .kdim(ref_->integer("opt.kdim"))
            .vdim(ref_->integer("opt.kdim"))
            .causal(false)
            .qkv_bias(true)
            .backend(std::get<1>(GetParam()))));
  }
};

TEST_P(TransformersCross, ForwardPaddedContextAndDecodingSteps) {
  auto m = make();
  torch::NoGradGuard no_grad;
  expect_close("forward over the context", m->forward_cross(in("full.x"), in("full.context")), ref_->tensor("full.y"));
  const auto pad = in("padded.mask");
  expect_close("forward over the padded context", m->forward_cross(in("full.x"), in("full.context"), pad),
               ref_->tensor("padded.y"));
  // The cross cache: the context's keys and values once, then one token at a time.
  const torchattn::CrossKV kv = m->cross_kv(in("full.context"), pad);
  EXPECT_EQ(kv.length(), pad.size(1));
  for (int64_t s = 0; s < ref_->integer("cached.steps"); ++s) {
    const std::string step = "cached.step" + std::to_string(s);
    expect_close(step, m->forward_cross(in(step + ".x"), kv), ref_->tensor(step + ".y"));
  }
}

TEST_P(TransformersCross, GradientsOfInputContextAndWeights) {
  auto m = make();
  auto x = in("full.x").requires_grad_(true);
  auto context = in("full.context").requires_grad_(true);
  m->forward_cross(x, context, in("padded.mask")).backward(in("grad.out"));
  expect_close("grad of the input", x.grad(), ref_->tensor("grad.x"));
  expect_close("grad of the context", context.grad(), ref_->tensor("grad.context"));
  expect_weight_grads(m);
}

std::string cross_param_name(const ::testing::TestParamInfo<CrossParam>& info) {
  const auto& [name, backend, device] = info.param;
  return devices::prefix(device) + name + "_" + std::string(torchattn::to_string(backend));
}

INSTANTIATE_TEST_SUITE_P(Transformers, TransformersCross,
                         ::testing::Combine(::testing::ValuesIn(cross_case_files()),
                                            ::testing::Values(Backend::Reference, Backend::SDPA, Backend::Auto),
                                            ::testing::ValuesIn(devices::all())),
                         cross_param_name);

// An empty or missing reference folder is a failure, not a suite that quietly runs nothing.
TEST(TransformersReference, IsPresentAndCoversEveryFamily) {
  auto files = case_files();
  const auto cross = cross_case_files();
  files.insert(files.end(), cross.begin(), cross.end());
  ASSERT_FALSE(files.empty())
      << "no reference in TORCHATTN_TRANSFORMERS_REFERENCE='" << reference_dir()
      << "' (ctest -R transformers makes it with tests/reference/make_transformers_reference.py)";
  for (const std::string family : {"llama", "qwen2", "qwen3", "mistral", "phi", "gptj", "gpt2", "bert", "bloom",
                                   "gpt_oss", "gemma2", "bart_cross", "whisper_cross"}) {
    EXPECT_TRUE(std::any_of(files.begin(), files.end(), [&](const std::string& f) { return f.rfind(family, 0) == 0; }))
        << "no case of " << family;
  }
  const Reference r(files.front());
  std::printf("[transformers] %zu reference cases from transformers %s (torch %s)\n", files.size(),
              r.text("transformers_version").c_str(), r.text("torch_version").c_str());
}

}  // namespace
