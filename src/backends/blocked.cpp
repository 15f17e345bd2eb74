#include "backends/blocked.h"
#include "backends/score_scale.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/exp.h>
#include <ATen/ops/maximum.h>
#include <ATen/ops/dropout.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/tanh.h>
#include <ATen/ops/zeros_like.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace torchattn::backends {

namespace {

// Elements of one block's scores [B, H, rows, Tk]: 8 MiB in float32 (a few such temporaries live at
// once; larger blocks gain no speed and leave the allocator more to hold).
constexpr int64_t kBlockElements = int64_t{1} << 21;

int64_t rows_per_block(const at::Tensor& q, int64_t Tk) {
  const int64_t per_row = std::max<int64_t>(1, q.size(0) * q.size(1) * Tk);
  return std::clamp<int64_t>(kBlockElements / per_row, 1, std::max<int64_t>(1, q.size(2)));
}

// [B or 1, 1, rows, k1 - k0] bool, true = hidden, for the query rows r0 .. r0 + rows
// of the call and its keys k0 .. k1: positions (causal, window, a static cache's
// unwritten slots), key padding and keys whose bias is -inf; undefined when nothing is.
at::Tensor hidden_block(const MaskSpec& spec, int64_t Tq, int64_t Tk, int64_t r0, int64_t rows, int64_t k0, int64_t k1,
                        const at::Device& device) {
  const int64_t n = k1 - k0;
  at::Tensor hide;
  if (spec.is_static()) {
    hide = hidden_keys(spec, Tq, Tk, device);  // decoding: Tq is a few rows
    if (hide.defined()) {
      if (hide.size(0) == Tq) hide = hide.narrow(0, r0, rows);
      hide = hide.narrow(1, k0, n);
    }
  } else if (spec.causal) {
    const auto options = at::TensorOptions().dtype(at::kLong).device(device);
    const at::Tensor position = at::arange(spec.past + r0, spec.past + r0 + rows, options).unsqueeze(1);
    const at::Tensor key = at::arange(k0, k1, options).unsqueeze(0);
    hide = key > position;
    if (spec.window) hide = hide.logical_or(key <= position - *spec.window);
  }
  if (hide.defined()) hide = hide.view({1, 1, hide.size(0), n});
  if (spec.key_padding.defined()) {
    const at::Tensor pad = spec.key_padding.narrow(1, k0, n).view({spec.key_padding.size(0), 1, 1, n});
    hide = hide.defined() ? hide.logical_or(pad) : pad;
  }
  if (spec.key_bias.defined()) {
    const at::Tensor neg_inf = spec.key_bias.narrow(1, k0, n).isneginf().view({spec.key_bias.size(0), 1, 1, n});
    hide = hide.defined() ? hide.logical_or(neg_inf) : neg_inf;
  }
  return hide;
}

// One block of rows: q [B, H, rows, d] -> [B, H, rows, d]. With causal positions only
// the keys some row of the block sees are read (up to the last row's position, from
// the first row's window): the others would add exact zeros.
at::Tensor attend_block(const at::Tensor& q, const at::Tensor& k_all, const at::Tensor& v_all, const at::Tensor& sinks,
                        const MaskSpec& spec, const functional::AttentionOptions& config, int64_t Tq, int64_t r0) {
  const int64_t B = q.size(0), H = q.size(1), rows = q.size(2), d = q.size(3), Hkv = k_all.size(1), G = H / Hkv;
  const int64_t Tk = k_all.size(2);
  int64_t k0 = 0, k1 = Tk;
  if (!spec.is_static() && spec.causal) {
    k1 = std::clamp<int64_t>(spec.past + r0 + rows, 1, Tk);
    if (spec.window) k0 = std::clamp<int64_t>(spec.past + r0 - *spec.window + 1, 0, k1 - 1);
  }
  const int64_t n = k1 - k0;
  const at::Tensor k = k_all.narrow(2, k0, n), v = v_all.narrow(2, k0, n);
  const double scale = score_scale(config, d);
  // Grouped heads: the G query heads of a key head as G * rows rows over its keys.
  const at::Tensor qg = q.reshape({B, Hkv, G * rows, d});
  // In place where autograd allows (a block's temporaries are its memory and much of
  // its time): the scale and the division need no saved input; tanh saves its result.
  at::Tensor s = at::matmul(qg, k.transpose(-2, -1)).mul_(scale).view({B, H, rows, n});
  if (config.softcap) {
    const double cap = *config.softcap;
    s = c10::GradMode::is_enabled() ? at::tanh(s.div_(cap)).mul(cap) : s.div_(cap).tanh_().mul_(cap);
  }
  if (spec.key_bias.defined()) {
    const at::Tensor bias = spec.key_bias.narrow(1, k0, n);
    s = s + bias.masked_fill(bias.isneginf(), 0).view({bias.size(0), 1, 1, n});
  }
  if (spec.score_bias.defined()) s = s + spec.score_bias.narrow(2, r0, rows).narrow(3, k0, n);
  at::Tensor hide = hidden_block(spec, Tq, Tk, r0, rows, k0, k1, q.device());
  at::Tensor dead;
  if (hide.defined()) {
    dead = hide.all(-1, /*keepdim=*/true);
    // A row with no key: attend over all (finite softmax and gradients), then zeros.
    s.masked_fill_(hide.logical_and(dead.logical_not()), -std::numeric_limits<double>::infinity());
  }
  at::Tensor p;
  if (sinks.defined()) {
    // softmax over [s, sink] with the sink's column dropped, written out (no copy of s
    // with a column more): p = exp(s - m) / (sum exp(s - m) + exp(sink - m)).
    const at::Tensor sink = sinks.to(s.scalar_type()).view({1, H, 1, 1});
    const at::Tensor m = at::maximum(std::get<0>(s.max(-1, /*keepdim=*/true)), sink);
    const at::Tensor sink_term = at::exp(sink - m);
    if (c10::GradMode::is_enabled()) {
      const at::Tensor e = at::exp(s - m);
      p = e / (e.sum(-1, /*keepdim=*/true) + sink_term);
    } else {
      s.sub_(m).exp_();
      p = s.div_(s.sum(-1, /*keepdim=*/true).add_(sink_term));
    }
  } else {
    p = at::softmax(s, -1);
  }
  if (config.training && config.dropout > 0.0) p = at::dropout(p, config.dropout, /*train=*/true);
  at::Tensor out = at::matmul(p.reshape({B, Hkv, G * rows, n}), v).view({B, H, rows, v.size(-1)});
  if (dead.defined()) out = out.masked_fill(dead, 0);
  return out;
}

// Every block, in order, into one [B, H, Tq, d]. Without gradients each block is
// written into an output allocated once: small results kept between the blocks'
// large temporaries would pin the heap and let it grow block after block.
at::Tensor all_blocks(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& sinks,
                      const MaskSpec& spec, const functional::AttentionOptions& config) {
  const int64_t Tq = q.size(2), step = rows_per_block(q, k.size(2));
  if (step >= Tq) return attend_block(q, k, v, sinks, spec, config, Tq, 0);
  // Keys and values dense once (the modules' are views of [B, T, heads, d] projections):
  // else every block's products would copy the keys it reads again.
  const at::Tensor k_dense = k.contiguous(), v_dense = v.contiguous();
  const bool grad = c10::GradMode::is_enabled();
  std::vector<at::Tensor> parts;
  at::Tensor out;
  if (!grad) out = at::empty({q.size(0), q.size(1), Tq, v.size(-1)}, q.options());
  for (int64_t r0 = 0; r0 < Tq; r0 += step) {
    const int64_t rows = std::min(step, Tq - r0);
    at::Tensor block = attend_block(q.narrow(2, r0, rows), k_dense, v_dense, sinks, spec, config, Tq, r0);
    if (grad) {
      parts.push_back(std::move(block));
    } else {
      out.narrow(2, r0, rows).copy_(block);
    }
  }
  return grad ? at::cat(parts, 2) : out;
}

// What backward needs of the call's masks and configuration, as the context keeps it.
void save_call(torch::autograd::AutogradContext* ctx, const MaskSpec& spec, const functional::AttentionOptions& c) {
  auto& d = ctx->saved_data;
  d["causal"] = spec.causal;
  d["past"] = spec.past;
  d["positions"] = spec.positions;
  d["window"] = spec.window.value_or(0);
  d["key_padding"] = spec.key_padding;
  d["key_bias"] = spec.key_bias;
  d["score_bias"] = spec.score_bias;
  d["scale"] = c.scale.value_or(0.0);
  d["softcap"] = c.softcap.value_or(0.0);
}

std::pair<MaskSpec, functional::AttentionOptions> saved_call(torch::autograd::AutogradContext* ctx) {
  auto& d = ctx->saved_data;
  MaskSpec spec;
  spec.causal = d["causal"].toBool();
  spec.past = d["past"].toInt();
  spec.positions = d["positions"].toTensor();
  if (d["window"].toInt() > 0) spec.window = d["window"].toInt();
  spec.key_padding = d["key_padding"].toTensor();
  spec.key_bias = d["key_bias"].toTensor();
  spec.score_bias = d["score_bias"].toTensor();
  functional::AttentionOptions config;  // no dropout: that case keeps its blocks instead
  if (d["scale"].toDouble() > 0.0) config.scale = d["scale"].toDouble();
  if (d["softcap"].toDouble() > 0.0) config.softcap = d["softcap"].toDouble();
  return {spec, config};
}

// Forward without keeping the blocks; backward recomputes one block at a time.
struct Checkpointed : public torch::autograd::Function<Checkpointed> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const at::Tensor& sinks, const MaskSpec* spec,
                            const functional::AttentionOptions* config) {
    ctx->save_for_backward({q, k, v, sinks});
    save_call(ctx, *spec, *config);
    at::NoGradGuard no_grad;
    return all_blocks(q, k, v, sinks.numel() > 0 ? sinks : at::Tensor(), *spec, *config);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto [spec, config] = saved_call(ctx);
    const at::Tensor &q = saved[0], &k = saved[1], &v = saved[2];
    const at::Tensor sinks = saved[3].numel() > 0 ? saved[3] : at::Tensor();  // empty: none
    const at::Tensor grad = grads[0].contiguous();
    const int64_t Tq = q.size(2), step = rows_per_block(q, k.size(2));
    at::Tensor gq = at::zeros_like(q), gk = at::zeros_like(k), gv = at::zeros_like(v);
    at::Tensor gs = sinks.defined() ? at::zeros_like(sinks) : at::Tensor();
    at::AutoGradMode grad_mode(true);
    const at::Tensor kk = k.detach().requires_grad_(true), vv = v.detach().requires_grad_(true);
    const at::Tensor ss = sinks.defined() ? sinks.detach().requires_grad_(true) : at::Tensor();
    for (int64_t r0 = 0; r0 < Tq; r0 += step) {
      const int64_t rows = std::min(step, Tq - r0);
      const at::Tensor qb = q.narrow(2, r0, rows).detach().requires_grad_(true);
      const at::Tensor out = attend_block(qb, kk, vv, ss, spec, config, Tq, r0);
      torch::autograd::variable_list inputs{qb, kk, vv};
      if (ss.defined()) inputs.push_back(ss);
      const auto g = torch::autograd::grad({out}, inputs, {grad.narrow(2, r0, rows)}, /*retain_graph=*/false,
                                           /*create_graph=*/false, /*allow_unused=*/true);
      if (g[0].defined()) gq.narrow(2, r0, rows).copy_(g[0]);
      if (g[1].defined()) gk.add_(g[1]);
      if (g[2].defined()) gv.add_(g[2]);
      if (ss.defined() && g[3].defined()) gs.add_(g[3]);
    }
    return {gq, gk, gv, gs.defined() ? gs : at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

bool needs_blocked_attention(const functional::AttentionOptions& config) {
  return config.softcap.has_value() || config.sinks.defined();
}

at::Tensor blocked_attention(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                             const MaskSpec& spec, const functional::AttentionOptions& config) {
  const bool single_head = q_in.dim() == 3;
  const at::Tensor q = single_head ? q_in.unsqueeze(1) : q_in;
  const at::Tensor k = single_head ? k_in.unsqueeze(1) : k_in;
  const at::Tensor v = single_head ? v_in.unsqueeze(1) : v_in;
  TORCH_CHECK(!config.softcap || (*config.softcap > 0.0 && std::isfinite(*config.softcap)),
              "attention: expected softcap > 0, got ", config.softcap.value_or(0.0));
  if (config.sinks.defined()) {
    TORCH_CHECK(config.sinks.dim() == 1 && config.sinks.size(0) == q.size(1) && config.sinks.device() == q.device(),
                "attention: expected sinks [num_heads] = [", q.size(1), "] on ", q.device(), ", got ",
                config.sinks.sizes(), " on ", config.sinks.device());
  }
  const bool grad = c10::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad() ||
                                                    (config.sinks.defined() && config.sinks.requires_grad()));
  const bool biases_need_grad = (spec.key_bias.defined() && spec.key_bias.requires_grad()) ||
                                (spec.score_bias.defined() && spec.score_bias.requires_grad());
  at::Tensor out;
  if (!grad || biases_need_grad || (config.training && config.dropout > 0.0)) {
    out = all_blocks(q, k, v, config.sinks, spec, config);  // autograd through the blocks, if any
  } else {
    // An undefined tensor cannot be an input of a custom function: no sinks is empty.
    const at::Tensor sinks = config.sinks.defined() ? config.sinks : at::empty({0}, q.options());
    out = Checkpointed::apply(q, k, v, sinks, &spec, &config);
  }
  return single_head ? out.squeeze(1) : out;
}

}  // namespace torchattn::backends
