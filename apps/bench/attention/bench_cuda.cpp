// torchattn_bench --device cuda: the GPU benchmark behind apps/bench/results/benchmarks-cuda.md.
//
//   torchattn_bench --device cuda [--json out.json] [--quick] [--max-T 32768]
//
// Every variant is checked against the others (same weights, same input, outputs and
// input gradients within a relative tolerance) before it is timed; a disagreement
// aborts. A time is one call with the GPU idle before it, between two CUDA events on
// the current stream: it includes the host work between launches, as a caller waits
// for it. Medians of many calls. bf16, d=1024, 16 heads unless stated.
//
// Sections:
//   device   the GPU, CUDA runtime and driver API, cuDNN and LibTorch versions
//   main     B=8 T=2048 d=1024 and B=4 T=4096 d=2048: the default module
//            (Backend::Auto) vs the hand-assembled one (three nn::Linear +
//            at::scaled_dot_product_attention(is_causal) + out_proj, the same
//            weights) vs Backend::SDPA, timed interleaved; peak GPU memory of each
//   core     the causal attention core alone: at::scaled_dot_product_attention
//            (ATen's kernel: cuDNN on Hopper) and at::_scaled_dot_product_flash_attention
//            (the kernel Auto calls where ATen would take cuDNN), in TFLOP/s against
//            an 8192^3 bf16 GEMM of the same run
//   sweep    T = 128 .. 32768 with B*T = 16384, bf16 and float32, forward and
//            forward+backward; mask_buffer(false) above T=8192, where the notebooks'
//            context_length^2 buffer would cost more than the work
//   stall    the default module's first forward at lengths never seen before vs the
//            same lengths again (and Backend::SDPA, which lets ATen take cuDNN)
//   decode   one layer, B=1, 1024-token prompt, context 2048, 64 steps: dynamic cache
//            cold (first pass) and warm (again after reset()), static cache eager,
//            and replayed from a CUDA graph (DecodeGraph); each step checked; then
//            the static and replayed steps kernel by kernel (CUPTI through Kineto)
//   memory   what constructing a context_length 32768 module and moving it to the
//            GPU adds to allocated memory, mask_buffer(false) vs (true)

#include "bench_cuda.h"
#include "fmt.h"
#include "bench_json.h"

#include <torchattn/torchattn.h>

#include <c10/core/Event.h>
#include <torch/torch.h>
#include <torch/version.h>

#ifdef TORCHATTN_BENCH_CUDA
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#endif

#include <algorithm>
#include <chrono>
#include <exception>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

namespace bench {
namespace {

using torchattn::Backend;
using torchattn::MultiHeadAttention;

constexpr double kMiB = 1024.0 * 1024.0;

// ---- sizes: the issue's, or a smoke run's ----
struct ModulePoint {
  int64_t B, T, d, heads;
};
struct CorePoint {
  int64_t B, heads, T, head_dim;
};
struct Sizes {
  std::vector<ModulePoint> main;
  std::vector<CorePoint> core;
  int64_t gemm_n;
  int64_t sweep_d, sweep_heads, sweep_tokens, sweep_max_T, mask_buffer_max_T;
  int64_t stall_d, stall_heads, stall_warmup_T, stall_auto_T0, stall_sdpa_T0, stall_lengths;
  int64_t decode_d, decode_heads, decode_context, decode_prompt, decode_steps;
  int64_t memory_d, memory_heads, memory_context;
  int main_reps, core_reps, sweep_reps, warmup;
};

// bench_python_cuda.py uses the same main points (its MAIN_POINTS), so the peers'
// rows line up with these.
Sizes sizes_for(bool quick, int64_t max_T) {
  Sizes z;
  if (quick) {
    z.main = {{2, 256, 256, 4}, {1, 512, 512, 8}};
    z.core = {{2, 4, 256, 64}, {1, 4, 512, 128}};
    z.gemm_n = 1024;
    z.sweep_d = 256, z.sweep_heads = 4, z.sweep_tokens = 2048, z.sweep_max_T = std::min<int64_t>(max_T, 1024);
    z.mask_buffer_max_T = 512;
    z.stall_d = 256, z.stall_heads = 4, z.stall_warmup_T = 64, z.stall_auto_T0 = 300, z.stall_sdpa_T0 = 400;
    z.stall_lengths = 4;
    z.decode_d = 256, z.decode_heads = 4, z.decode_context = 256, z.decode_prompt = 128, z.decode_steps = 16;
    z.memory_d = 256, z.memory_heads = 4, z.memory_context = 4096;
    z.main_reps = 5, z.core_reps = 5, z.sweep_reps = 3, z.warmup = 1;
  } else {
    z.main = {{8, 2048, 1024, 16}, {4, 4096, 2048, 16}};
    z.core = {{8, 16, 2048, 64}, {4, 16, 4096, 128}};
    z.gemm_n = 8192;
    z.sweep_d = 1024, z.sweep_heads = 16, z.sweep_tokens = 16384, z.sweep_max_T = max_T;
    z.mask_buffer_max_T = 8192;
    // Lengths no other section uses (they are powers of two, or 1024 + a step).
    z.stall_d = 1024, z.stall_heads = 16, z.stall_warmup_T = 512, z.stall_auto_T0 = 1000, z.stall_sdpa_T0 = 1100;
    z.stall_lengths = 11;
    z.decode_d = 1024, z.decode_heads = 16, z.decode_context = 2048, z.decode_prompt = 1024, z.decode_steps = 64;
    z.memory_d = 1024, z.memory_heads = 16, z.memory_context = 32768;
    z.main_reps = 50, z.core_reps = 20, z.sweep_reps = 10, z.warmup = 3;
  }
  return z;
}

// ---- the device: synchronisation, timing, memory ----
void synchronize(const c10::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

// Milliseconds of one call of fn with the device idle before it. CUDA: two events
// recorded around the call on the current stream, kept from call to call so no
// event is created inside the measured span; elsewhere the wall clock.
class DeviceTimer {
 public:
  explicit DeviceTimer(const c10::Device& device) : device_(device) {
    if (device_.is_cuda()) {
      start_.emplace(c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT);  // timing on
      stop_.emplace(c10::DeviceType::CUDA, c10::EventFlag::BACKEND_DEFAULT);
      ms([] {});  // creates the events
    }
  }

  double ms(const std::function<void()>& fn) {
    synchronize(device_);
#ifdef TORCHATTN_BENCH_CUDA
    if (device_.is_cuda()) {
      const c10::Stream stream = c10::cuda::getCurrentCUDAStream(device_.index()).unwrap();
      start_->record(stream);
      fn();
      stop_->record(stream);
      stop_->synchronize();
      return start_->elapsedTime(*stop_);
    }
#endif
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }

 private:
  c10::Device device_;
  std::optional<c10::Event> start_, stop_;
};

struct Timing {
  double median_ms = 0, min_ms = 0;
  int reps = 0;
};

Timing summarize(std::vector<double> ms) {
  std::sort(ms.begin(), ms.end());
  return {ms[ms.size() / 2], ms.front(), static_cast<int>(ms.size())};
}

// fns called round-robin (A, B, C, A, B, C, ...) `reps` times after `warmup` rounds,
// so that clock and temperature drift hit every variant alike -> one Timing each.
std::vector<Timing> interleaved(DeviceTimer& timer, const std::vector<std::function<void()>>& fns, int reps,
                                int warmup) {
  for (int r = 0; r < warmup; ++r) {
    for (const auto& fn : fns) fn();
  }
  std::vector<std::vector<double>> ms(fns.size());
  for (int r = 0; r < reps; ++r) {
    for (size_t i = 0; i < fns.size(); ++i) ms[i].push_back(timer.ms(fns[i]));
  }
  std::vector<Timing> out;
  for (auto& m : ms) out.push_back(summarize(m));
  return out;
}

// Allocated bytes on the device now and at their peak since reset_peak (the caching
// allocator's statistics: tensors, not the cache it keeps). 0 off CUDA.
#ifdef TORCHATTN_BENCH_CUDA
constexpr size_t kAggregate = static_cast<size_t>(c10::CachingDeviceAllocator::StatType::AGGREGATE);
#endif
// peak: the high-water mark since reset_peak; else what is allocated now.
int64_t allocator_bytes(const c10::Device& device, [[maybe_unused]] bool peak) {
  synchronize(device);
#ifdef TORCHATTN_BENCH_CUDA
  if (device.is_cuda()) {
    // getDeviceStats returns by value: keep the copy (a reference into the temporary's
    // array would dangle).
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    const auto& stat = stats.allocated_bytes[kAggregate];
    return peak ? stat.peak : stat.current;
  }
#endif
  return 0;
}
int64_t allocated_bytes(const c10::Device& device) { return allocator_bytes(device, false); }
int64_t peak_allocated_bytes(const c10::Device& device) { return allocator_bytes(device, true); }
void reset_peak(const c10::Device& device) {
  synchronize(device);
#ifdef TORCHATTN_BENCH_CUDA
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
#endif
}

// The "device" block of the JSON: what ran, as JSON fields.
std::string device_meta(const c10::Device& device) {
  std::ostringstream o;
  o << "\"device_type\": \"" << (device.is_cuda() ? "cuda" : "cpu") << "\", \"libtorch\": \"" << TORCH_VERSION_MAJOR
    << "." << TORCH_VERSION_MINOR << "." << TORCH_VERSION_PATCH << "\"";
#ifdef TORCHATTN_BENCH_CUDA
  if (device.is_cuda()) {
    cudaDeviceProp p;
    C10_CUDA_CHECK(cudaGetDeviceProperties(&p, device.index()));
    int runtime = 0, driver = 0;
    C10_CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
    C10_CUDA_CHECK(cudaDriverGetVersion(&driver));
    auto version = [](int v) { return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10); };
    o << ", \"gpu\": \"" << p.name << "\", \"compute_capability\": \"" << p.major << "." << p.minor
      << "\", \"gpu_memory_gib\": " << p.totalGlobalMem / (kMiB * 1024) << ", \"sms\": " << p.multiProcessorCount
      << ", \"cuda_runtime\": \"" << version(runtime) << "\", \"cuda_driver_api\": \"" << version(driver)
      << "\", \"cudnn\": " << at::detail::getCUDAHooks().versionCuDNN();
  }
#endif
  return o.str();
}

// ---- checks ----
// ||a - b|| / ||b|| in float64. NaN anywhere makes it NaN, which fails every check.
double rel_err(const at::Tensor& a, const at::Tensor& b) {
  const at::Tensor a64 = a.detach().to(at::kDouble), b64 = b.detach().to(at::kDouble);
  return ((a64 - b64).norm() / b64.norm()).item<double>();
}

// Two computations of the same thing in `dtype` agree within this, relative: bf16
// keeps 8 bits of mantissa; float32 kernels differ by their summation order only.
double tolerance(at::ScalarType dtype) { return dtype == at::kBFloat16 ? 2e-2 : 1e-4; }

void check_close(const std::string& what, double err, double tol) {
  TORCH_CHECK(err <= tol, "check failed: ", what, " disagrees by ", err, " (relative error), more than the tolerance ",
              tol);
}

std::string dtype_name(at::ScalarType dtype) {
  return dtype == at::kBFloat16 ? "bf16" : dtype == at::kFloat ? "fp32" : std::string(c10::toString(dtype));
}

// at::_fused_sdp_choice's answer, an at::SDPBackend value, by name.
std::string sdp_choice_name(int64_t choice) {
  switch (choice) {
    case 0:
      return "math";
    case 1:
      return "flash";
    case 2:
      return "efficient";
    case 3:
      return "cudnn";
    case 4:
      return "overrideable";
    default:
      return "none";
  }
}

// ---- the module and its variants, all on one set of weights ----
// A MultiHeadAttention d -> d with `heads` heads and context_length C, built with
// seed 0 as bench_python_cuda.py builds the notebook's (same weights), in eval mode,
// moved to device and dtype.
MultiHeadAttention make_mha(int64_t d, int64_t heads, int64_t C, bool mask_buffer, const c10::Device& device,
                            at::ScalarType dtype) {
  torch::manual_seed(0);
  MultiHeadAttention m(torchattn::MultiHeadAttentionOptions(d, d, C, heads).mask_buffer(mask_buffer));
  m->to(device, dtype);
  m->eval();
  return m;
}

MultiHeadAttention with_backend(const MultiHeadAttention& m, Backend backend) {
  auto c = std::dynamic_pointer_cast<torchattn::MultiHeadAttentionImpl>(m->clone());
  c->options.backend(backend);
  c->eval();
  return MultiHeadAttention(c);
}

// x: [B, T, d] -> [B, T, d]: three nn::Linear, at::scaled_dot_product_attention with
// is_causal, out_proj, on m's weights. What a user writes with LibTorch alone; the
// floor the default module is held to.
at::Tensor hand_forward(torchattn::MultiHeadAttentionImpl& m, const at::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), heads = m.options.num_heads(), hd = m.head_dim();
  auto split = [&](const at::Tensor& t) { return t.view({B, T, heads, hd}).transpose(1, 2); };
  const at::Tensor q = split(m.W_query(x)), k = split(m.W_key(x)), v = split(m.W_value(x));
  const at::Tensor o = at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true);
  return m.out_proj(o.transpose(1, 2).reshape({B, T, heads * hd}));
}

struct Variant {
  std::string name;
  std::function<at::Tensor(const at::Tensor&)> forward;  // [B, T, d] -> [B, T, d]
  std::vector<at::Tensor> params;                        // the gradients a backward fills
};

// default (Backend::Auto), hand (on the default's weights), sdpa (a clone with
// Backend::SDPA): the order every section uses; index 1 is the floor.
std::vector<Variant> module_variants(const MultiHeadAttention& autob, const MultiHeadAttention& sdpa) {
  auto a = autob.ptr(), b = sdpa.ptr();
  return {
      {"default", [a](const at::Tensor& x) { return a->forward(x); }, a->parameters()},
      {"hand", [a](const at::Tensor& x) { return hand_forward(*a, x); }, a->parameters()},
      {"sdpa", [b](const at::Tensor& x) { return b->forward(x); }, b->parameters()},
  };
}

// One forward and backward of v on x with output gradient g, x requiring grad as a
// layer's input does in training; the parameters' gradients are dropped after.
at::Tensor forward_backward(const Variant& v, const at::Tensor& x, const at::Tensor& g) {
  at::Tensor xi = x.detach().requires_grad_(true);
  v.forward(xi).backward(g);
  for (const at::Tensor& p : v.params) p.mutable_grad() = at::Tensor();
  return xi.grad();
}

struct Probe {
  at::Tensor out, dx;
  double fwd_peak_mib = 0, fwdbwd_peak_mib = 0;  // above what was allocated before
};

// One forward (no grad) and one forward+backward of v: the output and dx for the
// checks, and the peak memory each adds over what was allocated before it.
Probe probe(const Variant& v, const at::Tensor& x, const at::Tensor& g, const c10::Device& device) {
  Probe p;
  int64_t base = allocated_bytes(device);
  reset_peak(device);
  {
    torch::NoGradGuard no_grad;
    p.out = v.forward(x);
  }
  p.fwd_peak_mib = (peak_allocated_bytes(device) - base) / kMiB;
  base = allocated_bytes(device);
  reset_peak(device);
  p.dx = forward_backward(v, x, g);
  p.fwdbwd_peak_mib = (peak_allocated_bytes(device) - base) / kMiB;
  return p;
}

// Probes every variant and checks outputs and input gradients against variants[0].
std::vector<Probe> probe_and_check(const std::vector<Variant>& vs, const at::Tensor& x, const at::Tensor& g,
                                   const c10::Device& device, const std::string& where) {
  std::vector<Probe> probes;
  for (const Variant& v : vs) probes.push_back(probe(v, x, g, device));
  const double tol = tolerance(x.scalar_type());
  for (size_t i = 1; i < vs.size(); ++i) {
    check_close(where + ": " + vs[i].name + " output vs " + vs[0].name, rel_err(probes[i].out, probes[0].out), tol);
    check_close(where + ": " + vs[i].name + " input gradient vs " + vs[0].name, rel_err(probes[i].dx, probes[0].dx),
                tol);
  }
  return probes;
}

// Useful FLOPs of one causal multi-head attention forward: four projections and the
// lower triangle of q k^T and weights @ v. A backward is twice that.
double module_flops(int64_t B, int64_t T, int64_t d) {
  return 4.0 * 2.0 * B * T * d * d + 2.0 * 2.0 * B * (T * (T + 1) / 2.0) * d;
}

struct Setup {
  c10::Device device;
  DeviceTimer& timer;
  const Sizes& z;
  std::vector<Row>& rows;
};

// ---- main: default vs hand vs sdpa, interleaved ----
void section_main(Setup& s) {
  const auto dtype = at::kBFloat16;
  for (const ModulePoint& p : s.z.main) {
    auto autob = make_mha(p.d, p.heads, p.T, /*mask_buffer=*/true, s.device, dtype);
    auto sdpa = with_backend(autob, Backend::SDPA);
    const auto vs = module_variants(autob, sdpa);
    torch::manual_seed(1);  // as bench_python_cuda.py: the same input and output gradient
    const at::Tensor x = torch::randn({p.B, p.T, p.d}).to(s.device, dtype);
    const at::Tensor g = torch::randn({p.B, p.T, p.d}).to(s.device, dtype);
    const std::string where = "main B=" + std::to_string(p.B) + " T=" + std::to_string(p.T);
    std::vector<Probe> probes = probe_and_check(vs, x, g, s.device, where);

    std::vector<std::function<void()>> fwd, fwdbwd;
    for (const Variant& v : vs) {
      fwd.push_back([&v, &x] {
        torch::NoGradGuard no_grad;
        v.forward(x);
      });
      fwdbwd.push_back([&v, &x, &g] { forward_backward(v, x, g); });
    }
    const auto tf = interleaved(s.timer, fwd, s.z.main_reps, s.z.warmup);
    const auto tb = interleaved(s.timer, fwdbwd, s.z.main_reps, s.z.warmup);
    const double flops = module_flops(p.B, p.T, p.d);
    fmt::print("\n[main] B={} T={} d={} H={} bf16, interleaved, median of {} (ms)\n", p.B, p.T, p.d, p.heads,
               s.z.main_reps);
    for (size_t i = 0; i < vs.size(); ++i) {
      fmt::print("  {:<8} fwd {:8.3f} ({:.3f}x hand)  fwd+bwd {:8.3f} ({:.3f}x hand)  peak {:7.1f} / {:7.1f} MiB\n",
                 vs[i].name, tf[i].median_ms, tf[i].median_ms / tf[1].median_ms, tb[i].median_ms,
                 tb[i].median_ms / tb[1].median_ms, probes[i].fwd_peak_mib, probes[i].fwdbwd_peak_mib);
      s.rows.push_back(Row()
                           .s("section", "main")
                           .s("variant", vs[i].name)
                           .s("dtype", dtype_name(dtype))
                           .n("B", p.B)
                           .n("T", p.T)
                           .n("d", p.d)
                           .n("H", p.heads)
                           .n("reps", s.z.main_reps)
                           .n("fwd_ms", tf[i].median_ms)
                           .n("fwd_min_ms", tf[i].min_ms)
                           .n("fwdbwd_ms", tb[i].median_ms)
                           .n("fwdbwd_min_ms", tb[i].min_ms)
                           .n("fwd_vs_hand", tf[i].median_ms / tf[1].median_ms)
                           .n("fwdbwd_vs_hand", tb[i].median_ms / tb[1].median_ms)
                           .n("fwd_tflops", flops / tf[i].median_ms / 1e9)
                           .n("fwdbwd_tflops", 3 * flops / tb[i].median_ms / 1e9)
                           .n("fwd_peak_mib", probes[i].fwd_peak_mib)
                           .n("fwdbwd_peak_mib", probes[i].fwdbwd_peak_mib)
                           .n("rel_err", i == 0 ? 0.0 : rel_err(probes[i].out, probes[0].out))
                           .n("out_norm", probes[i].out.to(at::kDouble).norm().item<double>()));
    }
  }
}

// ---- core: the causal attention kernel alone, against a GEMM ----
void section_core(Setup& s) {
  const auto dtype = at::kBFloat16;
  const int64_t n = s.z.gemm_n;
  double gemm_tflops = 0;
  {
    torch::manual_seed(4);
    const at::Tensor a = torch::randn({n, n}).to(s.device, dtype), b = torch::randn({n, n}).to(s.device, dtype);
    const auto t = interleaved(s.timer, {[&] { at::mm(a, b); }}, s.z.core_reps, s.z.warmup);
    gemm_tflops = 2.0 * n * n * n / t[0].median_ms / 1e9;
    fmt::print("\n[core] GEMM {}^3 bf16: {:.3f} ms = {:.1f} TFLOP/s\n", n, t[0].median_ms, gemm_tflops);
    s.rows.push_back(Row()
                         .s("section", "gemm")
                         .s("dtype", dtype_name(dtype))
                         .n("n", n)
                         .n("ms", t[0].median_ms)
                         .n("tflops", gemm_tflops));
  }
  using Kernel = std::function<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&)>;
  for (const CorePoint& p : s.z.core) {
    torch::manual_seed(5);
    auto make = [&] { return torch::randn({p.B, p.heads, p.T, p.head_dim}).to(s.device, dtype).requires_grad_(true); };
    const at::Tensor q = make(), k = make(), v = make();
    const at::Tensor g = torch::randn({p.B, p.heads, p.T, p.head_dim}).to(s.device, dtype);
    const std::string aten_choice = sdp_choice_name(at::_fused_sdp_choice(q, k, v, {}, 0.0, /*is_causal=*/true));
    std::vector<std::pair<std::string, Kernel>> kernels = {
        {"aten_sdpa", [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
           return at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/true);
         }}};
    if (s.device.is_cuda()) {
      // Auto's kernel where ATen would take cuDNN (src/backends/sdpa.cpp), called
      // directly: functional::attention needs a causal buffer for a causal call.
      kernels.push_back({"flash", [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
                           return std::get<0>(at::_scaled_dot_product_flash_attention(q, k, v, 0.0, true));
                         }});
    }
    at::Tensor ref;
    {
      torch::NoGradGuard no_grad;
      ref = kernels[0].second(q, k, v);
    }
    const double flops = 4.0 * p.B * p.heads * p.T * p.T * p.head_dim / 2;
    fmt::print("[core] causal attention B={} H={} T={} hd={} bf16 (ATen picks {})\n", p.B, p.heads, p.T, p.head_dim,
               aten_choice);
    for (const auto& [name, kernel] : kernels) {
      double err;
      {
        torch::NoGradGuard no_grad;
        err = rel_err(kernel(q, k, v), ref);
      }
      check_close("core " + name + " vs aten_sdpa", err, tolerance(dtype));
      auto fwd = [&, kernel = kernel] {
        torch::NoGradGuard no_grad;
        kernel(q, k, v);
      };
      auto fwdbwd = [&, kernel = kernel] {
        kernel(q, k, v).backward(g);
        for (const at::Tensor& t : {q, k, v}) t.mutable_grad() = at::Tensor();
      };
      const auto tf = interleaved(s.timer, {fwd}, s.z.core_reps, s.z.warmup);
      const auto tb = interleaved(s.timer, {fwdbwd}, s.z.core_reps, s.z.warmup);
      // A backward is 2.5 forwards of FLOPs (it recomputes the scores).
      const double ftf = flops / tf[0].median_ms / 1e9, btf = 3.5 * flops / tb[0].median_ms / 1e9;
      fmt::print("  {:<10} fwd {:7.3f} ms {:6.1f} TFLOP/s ({:.2f} of GEMM)  fwd+bwd {:7.3f} ms {:6.1f} TFLOP/s\n", name,
                 tf[0].median_ms, ftf, ftf / gemm_tflops, tb[0].median_ms, btf);
      s.rows.push_back(Row()
                           .s("section", "core")
                           .s("kernel", name)
                           .s("aten_choice", aten_choice)
                           .s("dtype", dtype_name(dtype))
                           .n("B", p.B)
                           .n("H", p.heads)
                           .n("T", p.T)
                           .n("hd", p.head_dim)
                           .n("fwd_ms", tf[0].median_ms)
                           .n("fwdbwd_ms", tb[0].median_ms)
                           .n("fwd_tflops", ftf)
                           .n("fwdbwd_tflops", btf)
                           .n("fwd_vs_gemm", ftf / gemm_tflops)
                           .n("fwdbwd_vs_gemm", btf / gemm_tflops)
                           .n("rel_err", err));
    }
  }
}

// ---- sweep: T = 128 .. max_T, B*T constant, bf16 and float32 ----
void section_sweep(Setup& s) {
  const Sizes& z = s.z;
  for (const auto dtype : {at::kBFloat16, at::kFloat}) {
    fmt::print("\n[sweep] {}, d={} H={}, B*T={}: median ms (fwd / fwd+bwd), peak MiB of fwd+bwd\n", dtype_name(dtype),
               z.sweep_d, z.sweep_heads, z.sweep_tokens);
    for (int64_t T = 128; T <= z.sweep_max_T; T *= 2) {
      const int64_t B = std::max<int64_t>(1, z.sweep_tokens / T);
      const bool mask_buffer = T <= z.mask_buffer_max_T;
      auto autob = make_mha(z.sweep_d, z.sweep_heads, T, mask_buffer, s.device, dtype);
      auto sdpa = with_backend(autob, Backend::SDPA);
      const auto vs = module_variants(autob, sdpa);
      torch::manual_seed(2);
      const at::Tensor x = torch::randn({B, T, z.sweep_d}).to(s.device, dtype);
      const at::Tensor g = torch::randn({B, T, z.sweep_d}).to(s.device, dtype);
      const std::string where = "sweep " + dtype_name(dtype) + " T=" + std::to_string(T);
      std::vector<Probe> probes = probe_and_check(vs, x, g, s.device, where);
      std::vector<std::function<void()>> fwd, fwdbwd;
      for (const Variant& v : vs) {
        fwd.push_back([&v, &x] {
          torch::NoGradGuard no_grad;
          v.forward(x);
        });
        fwdbwd.push_back([&v, &x, &g] { forward_backward(v, x, g); });
      }
      const int reps = T >= 16384 ? std::max(3, z.sweep_reps / 2) : z.sweep_reps;
      const auto tf = interleaved(s.timer, fwd, reps, 1);
      const auto tb = interleaved(s.timer, fwdbwd, reps, 1);
      const double flops = module_flops(B, T, z.sweep_d);
      for (size_t i = 0; i < vs.size(); ++i) {
        fmt::print("  T={:<6} B={:<4} {:<8} {:9.3f} / {:9.3f} ms  {:8.1f} MiB{}\n", T, B, vs[i].name, tf[i].median_ms,
                   tb[i].median_ms, probes[i].fwdbwd_peak_mib, mask_buffer ? "" : "  (no mask buffer)");
        s.rows.push_back(Row()
                             .s("section", "sweep")
                             .s("variant", vs[i].name)
                             .s("dtype", dtype_name(dtype))
                             .n("B", B)
                             .n("T", T)
                             .n("d", z.sweep_d)
                             .n("H", z.sweep_heads)
                             .n("reps", reps)
                             .n("mask_buffer", mask_buffer ? 1 : 0)
                             .n("fwd_ms", tf[i].median_ms)
                             .n("fwdbwd_ms", tb[i].median_ms)
                             .n("fwd_tflops", flops / tf[i].median_ms / 1e9)
                             .n("fwdbwd_tflops", 3 * flops / tb[i].median_ms / 1e9)
                             .n("fwd_peak_mib", probes[i].fwd_peak_mib)
                             .n("fwdbwd_peak_mib", probes[i].fwdbwd_peak_mib)
                             .n("rel_err", i == 0 ? 0.0 : rel_err(probes[i].out, probes[0].out)));
      }
    }
  }
}

// ---- stall: the first forward at a new length, the second and the third ----
// Auto takes flash at a shape's first call and ATen's choice (cuDNN on Hopper, which
// builds its plan then) from the second; the third is the steady state.
void section_stall(Setup& s) {
  const Sizes& z = s.z;
  const auto dtype = at::kBFloat16;
  const int64_t last_T = std::max(z.stall_auto_T0, z.stall_sdpa_T0) + z.stall_lengths;
  auto autob = make_mha(z.stall_d, z.stall_heads, last_T, true, s.device, dtype);
  auto sdpa = with_backend(autob, Backend::SDPA);
  torch::NoGradGuard no_grad;
  fmt::print("\n[stall] B=1 d={} H={} bf16 forward at never-seen lengths: first, second and third call (ms)\n",
             z.stall_d, z.stall_heads);
  std::vector<std::tuple<std::string, MultiHeadAttention, int64_t>> runs = {{"default", autob, z.stall_auto_T0},
                                                                            {"sdpa", sdpa, z.stall_sdpa_T0}};
  for (auto& [name, m, T0] : runs) {
    // The process-wide first calls (cuBLAS handles, the kernels' first launch) are not
    // what this measures: warm up at another length.
    torch::manual_seed(6);
    const at::Tensor w = torch::randn({1, z.stall_warmup_T, z.stall_d}).to(s.device, dtype);
    m->forward(w);
    m->forward(w);
    std::vector<at::Tensor> xs;
    for (int64_t i = 0; i < z.stall_lengths; ++i) {
      xs.push_back(torch::randn({1, T0 + i, z.stall_d}).to(s.device, dtype));
    }
    std::vector<double> first, second, third;
    at::Tensor y;
    for (const at::Tensor& x : xs) first.push_back(s.timer.ms([&] { y = m->forward(x); }));
    for (const at::Tensor& x : xs) second.push_back(s.timer.ms([&] { y = m->forward(x); }));
    for (const at::Tensor& x : xs) third.push_back(s.timer.ms([&] { y = m->forward(x); }));
    check_close("stall " + name + " vs hand", rel_err(y, hand_forward(*autob, xs.back())), tolerance(dtype));
    for (size_t i = 0; i < xs.size(); ++i) {
      fmt::print("  {:<8} T={:<5} first {:8.3f}  second {:8.3f}  third {:8.3f}\n", name, xs[i].size(1), first[i],
                 second[i], third[i]);
      s.rows.push_back(Row()
                           .s("section", "stall")
                           .s("variant", name)
                           .n("B", 1)
                           .n("T", xs[i].size(1))
                           .n("d", z.stall_d)
                           .n("H", z.stall_heads)
                           .n("first_ms", first[i])
                           .n("second_ms", second[i])
                           .n("third_ms", third[i]));
    }
  }
}

// ---- decode: one layer, one token per step ----
struct StepTimes {
  std::vector<double> us;
  double rel_err = 0;
};

void record_decode(Setup& s, const std::string& name, const StepTimes& t, double first_call_us) {
  const Timing m = summarize(t.us);
  fmt::print("  {:<12} median {:8.1f} us  min {:8.1f} us  first {:8.1f} us  ({} steps, rel err {:.1e})\n", name,
             m.median_ms, m.min_ms, first_call_us, t.us.size(), t.rel_err);
  s.rows.push_back(Row()
                       .s("section", "decode")
                       .s("variant", name)
                       .n("prompt", s.z.decode_prompt)
                       .n("context_length", s.z.decode_context)
                       .n("d", s.z.decode_d)
                       .n("H", s.z.decode_heads)
                       .n("steps", static_cast<double>(t.us.size()))
                       .n("median_us", m.median_ms)
                       .n("min_us", m.min_ms)
                       .n("first_us", first_call_us)
                       .n("rel_err", t.rel_err));
  for (size_t i = 0; i < t.us.size(); ++i) {
    s.rows.push_back(
        Row().s("section", "decode_step").s("variant", name).n("step", static_cast<double>(i)).n("us", t.us[i]));
  }
}

// `fn` run `reps` times under LibTorch's profiler (Kineto, CUPTI's activity records):
// the GPU's kernels and copies by name, each one's calls and microseconds per run of
// fn, the largest first. Empty (and says why) where the profiler is not available.
struct KernelTime {
  std::string name;
  double calls = 0, us = 0;
};

std::vector<KernelTime> kernel_profile(const c10::Device& device, const std::function<void()>& fn, int reps) {
  std::vector<KernelTime> out;
#ifdef TORCHATTN_BENCH_CUDA
  if (!device.is_cuda()) return out;
  namespace pa = torch::autograd::profiler;
  namespace pi = torch::profiler::impl;
  try {
    const pi::ProfilerConfig config(pi::ProfilerState::KINETO);
    const std::set<pi::ActivityType> activities{pi::ActivityType::CPU, pi::ActivityType::CUDA};
    pa::prepareProfiler(config, activities);
    pa::enableProfiler(config, activities);
    for (int i = 0; i < reps; ++i) fn();
    synchronize(device);
    const auto result = pa::disableProfiler();
    std::map<std::string, KernelTime> by_name;
    for (const auto& e : result->events()) {
      if (e.deviceType() != c10::DeviceType::CUDA) continue;
      KernelTime& k = by_name[e.name()];
      k.name = e.name();
      k.calls += 1.0 / reps;
      k.us += static_cast<double>(e.durationNs()) / 1e3 / reps;
    }
    for (auto& [name, k] : by_name) out.push_back(k);
    std::sort(out.begin(), out.end(), [](const KernelTime& a, const KernelTime& b) { return a.us > b.us; });
  } catch (const c10::Error& e) {
    fmt::print("  (no kernel profile: {})\n", e.what_without_backtrace());
  }
#else
  (void)device;
  (void)fn;
  (void)reps;
#endif
  return out;
}

void record_profile(Setup& s, const std::string& variant, const std::vector<KernelTime>& ks) {
  double total = 0;
  for (const KernelTime& k : ks) total += k.us;
  fmt::print("  {} kernel by kernel: {} kinds, {:.1f} us of GPU time per step\n", variant, ks.size(), total);
  for (const KernelTime& k : ks) {
    fmt::print("    {:8.2f} us  {:4.1f}x  {}\n", k.us, k.calls, k.name.substr(0, 110));
    s.rows.push_back(Row()
                         .s("section", "decode_profile")
                         .s("variant", variant)
                         .s("kernel", k.name.substr(0, 110))
                         .n("calls_per_step", k.calls)
                         .n("us_per_step", k.us));
  }
}

void section_decode(Setup& s) {
  const Sizes& z = s.z;
  const auto dtype = at::kBFloat16;
  const int64_t P = z.decode_prompt, N = z.decode_steps;
  auto m = make_mha(z.decode_d, z.decode_heads, z.decode_context, true, s.device, dtype);
  torch::NoGradGuard no_grad;
  torch::manual_seed(3);
  const at::Tensor x = torch::randn({1, P + N, z.decode_d}).to(s.device, dtype);
  const at::Tensor expected = m->forward(x).narrow(1, P, N);  // the rows a full forward gives
  fmt::print("\n[decode] one layer, B=1, d={} H={} bf16, prompt {}, context {}, {} steps (us per step)\n", z.decode_d,
             z.decode_heads, P, z.decode_context, N);

  // Prefill, then N one-token steps on `cache`, each timed; checked against the full forward.
  auto run = [&](torchattn::KVCache& cache, const std::string& name) {
    m->forward_cached(x.narrow(1, 0, P), cache);
    StepTimes t;
    std::vector<at::Tensor> outs;
    for (int64_t i = 0; i < N; ++i) {
      at::Tensor y;
      t.us.push_back(1e3 * s.timer.ms([&] { y = m->forward_cached(x.narrow(1, P + i, 1), cache); }));
      outs.push_back(y);
    }
    t.rel_err = rel_err(at::cat(outs, 1), expected);
    check_close("decode " + name + " vs the full forward", t.rel_err, tolerance(dtype));
    return t;
  };
  // (a) cold: the first pass, every step at a key length never seen before.
  auto cache = m->make_kv_cache(1);
  const StepTimes cold = run(cache, "cold");
  record_decode(s, "cold", cold, cold.us.front());
  // (b) warm: the same lengths again.
  cache.reset();
  const StepTimes warm = run(cache, "warm");
  record_decode(s, "warm", warm, warm.us.front());
  // Static shapes, eagerly: attends over the whole context (ATen's kernel may be cuDNN).
  auto scache = m->make_kv_cache(1, /*static_shapes=*/true);
  const StepTimes stat = run(scache, "static_eager");
  record_decode(s, "static_eager", stat, stat.us.front());

  // (c) replayed from a CUDA graph: captured at the first call (timed apart).
  auto gcache = m->make_kv_cache(1, /*static_shapes=*/true);
  m->forward_cached(x.narrow(1, 0, P), gcache);
  torchattn::DecodeGraph step([&](const at::Tensor& t) { return m->forward_cached(t, gcache); }, {&gcache});
  StepTimes graph;
  std::vector<at::Tensor> outs;
  double capture_us = 0;
  for (int64_t i = 0; i < N; ++i) {
    at::Tensor y;
    const double us = 1e3 * s.timer.ms([&] { y = step(x.narrow(1, P + i, 1)); });
    if (i == 0) {
      capture_us = us;
    } else {
      graph.us.push_back(us);
    }
    outs.push_back(y.clone());  // the graph's output buffer: the next replay overwrites it
  }
  graph.rel_err = rel_err(at::cat(outs, 1), expected);
  check_close("decode graph vs the full forward", graph.rel_err, tolerance(dtype));
  TORCH_CHECK(step.uses_cuda_graph() == s.device.is_cuda(), "check failed: DecodeGraph ",
              step.uses_cuda_graph() ? "captured" : "did not capture", " a CUDA graph on ", s.device);
  record_decode(s, "graph", graph, capture_us);

  // Where a step's time goes: the static step eagerly and replayed, kernel by kernel
  // (20 more steps each, past the checked ones; the caches have room to spare).
  constexpr int kProfiled = 20;
  const at::Tensor token = x.narrow(1, P + N - 1, 1);
  record_profile(s, "static_eager", kernel_profile(s.device, [&] { m->forward_cached(token, scache); }, kProfiled));
  record_profile(s, "graph", kernel_profile(s.device, [&] { step(token); }, kProfiled));
}

// ---- memory: what a long-context module adds to the device ----
void section_memory(Setup& s) {
  const Sizes& z = s.z;
  fmt::print("\n[memory] MultiHeadAttention({}, {}, context_length={}, {} heads), float32, moved to {}\n", z.memory_d,
             z.memory_d, z.memory_context, z.memory_heads, s.device.str());
  for (const bool mask_buffer : {false, true}) {
    const int64_t before = allocated_bytes(s.device);
    int64_t params = 0, buffers = 0, added = 0;
    {
      torch::manual_seed(0);
      MultiHeadAttention m(
          torchattn::MultiHeadAttentionOptions(z.memory_d, z.memory_d, z.memory_context, z.memory_heads)
              .mask_buffer(mask_buffer));
      m->to(s.device);
      added = allocated_bytes(s.device) - before;
      for (const at::Tensor& p : m->parameters()) params += p.nbytes();
      for (const at::Tensor& b : m->buffers()) buffers += b.nbytes();
    }
    fmt::print("  mask_buffer({}): adds {:9.1f} MiB (weights {:.1f} MiB, buffers {:.1f} MiB)\n",
               mask_buffer ? "true" : "false", added / kMiB, params / kMiB, buffers / kMiB);
    s.rows.push_back(Row()
                         .s("section", "module_memory")
                         .s("variant", mask_buffer ? "mask_buffer_true" : "mask_buffer_false")
                         .n("context_length", z.memory_context)
                         .n("d", z.memory_d)
                         .n("H", z.memory_heads)
                         .n("added_mib", added / kMiB)
                         .n("weights_mib", params / kMiB)
                         .n("buffers_mib", buffers / kMiB)
                         .n("added_le_weights", added <= params ? 1 : 0)
                         .n("measured", s.device.is_cuda() ? 1 : 0));
  }
}

}  // namespace

int run_device_bench(const c10::Device& device, const CudaBenchOptions& options) {
  const Sizes z = sizes_for(options.quick, options.max_T);
  std::vector<Row> rows;
  DeviceTimer timer(device);
  Setup s{device, timer, z, rows};
  try {
    fmt::print("torchattn_bench --device cuda on {}{}\n", device.str(),
               device.is_cuda() ? "" : " (the harness only: no GPU timings or memory)");
    section_main(s);
    section_core(s);
    section_sweep(s);
    section_stall(s);
    section_decode(s);
    section_memory(s);
  } catch (const c10::Error& e) {  // a failed check, or ATen refusing something
    fmt::print(stderr, "\ntorchattn_bench --device cuda: {}\n", e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "\ntorchattn_bench --device cuda: {}\n", e.what());
    return 1;
  }
  if (!options.json_path.empty()) {
    std::ostringstream meta;
    meta << "\"tool\": \"torchattn_bench\", \"mode\": \"cuda\", \"torchattn\": \"" << TORCHATTN_VERSION
         << "\", \"quick\": " << (options.quick ? "true" : "false") << ", " << device_meta(device);
    std::ofstream(options.json_path) << to_json(rows, meta.str());
    fmt::print("\nwrote {}\n", options.json_path);
  }
  return 0;
}

int run_cuda_bench([[maybe_unused]] const CudaBenchOptions& options) {
#ifndef TORCHATTN_BENCH_CUDA
  fmt::print(stderr,
             "torchattn_bench: --device cuda needs a build against a CUDA LibTorch; this one was built against a "
             "CPU LibTorch (build build-gpu/ with `make test-gpu`, see tools/test_gpu.sh)\n");
  return 2;
#else
  if (!torch::cuda::is_available()) {
    fmt::print(stderr, "torchattn_bench: --device cuda, but this LibTorch sees no CUDA device\n");
    return 2;
  }
  return run_device_bench(c10::Device(c10::kCUDA, 0), options);
#endif
}

}  // namespace bench
