// Flash-decoding over a static-shape cache: kernels/cuda/static_decode_attention.h.
//
// Two kernels on the current stream. The first has a block per (query row, chunk of
// kChunk keys): it reads the position from the device, returns at once where the
// chunk holds no visible key, else computes the chunk's scores (a warp per key, its
// lanes along the head dimension), their maximum m, the sum l of exp(score - m) and
// the weighted sum of the values, all in float32, into a workspace. The second has a
// block per query row and combines the chunks: out = sum_c acc_c e^(m_c - M) /
// sum_c l_c e^(m_c - M), M the largest m_c.

#include "kernels/cuda/static_decode_attention.h"

#include <ATen/Dispatch.h>
#include <ATen/ops/empty.h>
#include <c10/core/GradMode.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include <cuda_runtime.h>

#include <cstdint>

namespace torchattn::kernels::cuda {

namespace {

constexpr int kChunk = 64;     // keys per block of the first kernel
constexpr int kThreads = 256;  // threads per block of the first kernel (>= the largest head dimension)
constexpr int kWarps = kThreads / 32;
constexpr int kKeysPerWarp = kChunk / kWarps;
constexpr int kKeyBatch = 4;  // keys whose loads a warp issues before reducing any
constexpr int kPerLane = kStaticDecodeMaxHeadDim / 32;
constexpr int kCombineThreads = 128;
constexpr int kCombineWarps = kCombineThreads / 32;
constexpr int64_t kMaxGridY = 65535;

static_assert(kStaticDecodeMaxHeadDim <= kThreads, "a value dimension per thread in the weighted sum");
static_assert(kKeysPerWarp % kKeyBatch == 0, "whole batches of keys per warp");

struct Params {
  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const void* buffer = nullptr;  // null: positions alone
  const int64_t* positions = nullptr;
  float* part_m = nullptr;    // [rows, chunks]
  float* part_l = nullptr;    // [rows, chunks]
  float* part_acc = nullptr;  // [rows, chunks, Dv]
  void* out = nullptr;        // [rows, Dv]
  int64_t q_sb = 0, q_sh = 0, q_si = 0;
  int64_t k_sb = 0, k_sh = 0, k_sj = 0;
  int64_t v_sb = 0, v_sh = 0, v_sj = 0;
  int64_t buf_rows = 0, buf_stride = 0;
  int64_t H = 0, G = 1, Tq = 0, Tk = 0, chunks = 0, window = 0;
  int D = 0, Dv = 0;
  float scale = 1.0f;
  bool causal = false;
};

__device__ float warp_sum(float x) {
  for (int o = 16; o > 0; o >>= 1) {
    x += __shfl_xor_sync(0xffffffffu, x, o);
  }
  return x;
}

__device__ float warp_max(float x) {
  for (int o = 16; o > 0; o >>= 1) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  }
  return x;
}

// The maximum (kMax) or sum of x over a block of kBlockWarps warps, on every thread.
// scratch: kBlockWarps + 1 floats.
template <bool kMax, int kBlockWarps = kWarps>
__device__ float block_reduce(float x, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  x = kMax ? warp_max(x) : warp_sum(x);
  if (lane == 0) {
    scratch[warp] = x;
  }
  __syncthreads();
  if (warp == 0) {
    float y = lane < kBlockWarps ? scratch[lane] : (kMax ? -INFINITY : 0.0f);
    y = kMax ? warp_max(y) : warp_sum(y);
    if (lane == 0) {
      scratch[kBlockWarps] = y;
    }
  }
  __syncthreads();
  const float r = scratch[kBlockWarps];
  __syncthreads();  // scratch is reused by the next reduction
  return r;
}

template <typename T>
__global__ void __launch_bounds__(kThreads) static_decode_partial(Params p) {
  const int64_t chunk = blockIdx.x, row = blockIdx.y;
  const int64_t i = row % p.Tq, h = (row / p.Tq) % p.H, b = row / (p.Tq * p.H);
  const int64_t hk = h / p.G;
  const int64_t p0 = *p.positions, pos = p0 + i;
  // The visible keys lie in [lo, hi]; a buffer may hide some of them.
  int64_t lo = 0, hi = p.Tk - 1;
  const T* brow = nullptr;
  if (!p.causal) {
    hi = min(hi, p0 + p.Tq - 1);
  } else {
    if (p.buffer != nullptr) {
      if (pos < 0 || pos >= p.buf_rows) {
        hi = -1;
      } else {
        brow = static_cast<const T*>(p.buffer) + pos * p.buf_stride;
      }
    } else {
      hi = min(hi, pos);
    }
    if (p.window > 0) {
      lo = max(lo, pos - p.window + 1);
    }
  }
  const int64_t j0 = chunk * kChunk;
  const int64_t first = max(j0, lo), last = min(min(j0 + kChunk, p.Tk) - 1, hi);
  const int64_t slot = row * p.chunks + chunk;
  if (first > last) {
    if (threadIdx.x == 0) {
      p.part_m[slot] = -INFINITY;
      p.part_l[slot] = 0.0f;
    }
    return;
  }

  __shared__ float qs[kStaticDecodeMaxHeadDim];
  __shared__ float s[kChunk];
  __shared__ float scratch[kWarps + 1];
  __shared__ float red[kThreads];
  const T* qrow = static_cast<const T*>(p.q) + b * p.q_sb + h * p.q_sh + i * p.q_si;
  for (int d = threadIdx.x; d < p.D; d += kThreads) {
    qs[d] = static_cast<float>(qrow[d]);
  }
  __syncthreads();

  // Scores: warp w takes the chunk's keys w * kKeysPerWarp onwards, kKeyBatch at a
  // time; a lane loads its elements (d = lane, lane + 32, ...) of every key of the
  // batch before any is reduced, so the loads are in flight together.
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const T* kbase = static_cast<const T*>(p.k) + b * p.k_sb + hk * p.k_sh;
  for (int base = warp * kKeysPerWarp; base < (warp + 1) * kKeysPerWarp; base += kKeyBatch) {
    float dot[kKeyBatch];
    bool seen[kKeyBatch];
#pragma unroll
    for (int u = 0; u < kKeyBatch; ++u) {
      const int64_t j = j0 + base + u;
      bool visible = j >= first && j <= last;
      if (visible && brow != nullptr) {
        visible = static_cast<float>(brow[j]) == 0.0f;
      }
      seen[u] = visible;
      dot[u] = 0.0f;
      if (visible) {  // the same on the warp's lanes
        const T* krow = kbase + j * p.k_sj;
#pragma unroll
        for (int e = 0; e < kPerLane; ++e) {
          const int d = lane + 32 * e;
          if (d < p.D) {
            dot[u] += qs[d] * static_cast<float>(krow[d]);
          }
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kKeyBatch; ++u) {
      const float total = warp_sum(dot[u]);
      if (lane == 0) {
        s[base + u] = seen[u] ? total * p.scale : -INFINITY;
      }
    }
  }
  __syncthreads();

  float mx = -INFINITY;
  for (int t = threadIdx.x; t < kChunk; t += kThreads) {
    mx = fmaxf(mx, s[t]);
  }
  mx = block_reduce<true>(mx, scratch);
  if (mx == -INFINITY) {  // the buffer hid every key of the chunk
    if (threadIdx.x == 0) {
      p.part_m[slot] = -INFINITY;
      p.part_l[slot] = 0.0f;
    }
    return;
  }
  float sum = 0.0f;
  for (int t = threadIdx.x; t < kChunk; t += kThreads) {
    const float e = s[t] == -INFINITY ? 0.0f : expf(s[t] - mx);
    s[t] = e;
    sum += e;
  }
  sum = block_reduce<false>(sum, scratch);  // its barriers publish s

  // Weighted values: thread t sums value dimension t % Dv over keys g, g + ng, ...
  // of the chunk (g = t / Dv, ng = kThreads / Dv groups), then the groups add up.
  const int ng = kThreads / p.Dv, dv = threadIdx.x % p.Dv, g = threadIdx.x / p.Dv;
  float acc = 0.0f;
  if (g < ng) {
    const T* vbase = static_cast<const T*>(p.v) + b * p.v_sb + hk * p.v_sh;
#pragma unroll 4
    for (int64_t jj = first - j0 + g; jj <= last - j0; jj += ng) {
      const float w = s[jj];
      if (w != 0.0f) {  // hidden keys are not read
        acc += w * static_cast<float>(vbase[(j0 + jj) * p.v_sj + dv]);
      }
    }
  }
  red[threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.x < p.Dv) {
    float a = 0.0f;
    for (int gg = 0; gg < ng; ++gg) {
      a += red[gg * p.Dv + threadIdx.x];
    }
    p.part_acc[slot * p.Dv + threadIdx.x] = a;
  }
  if (threadIdx.x == 0) {
    p.part_m[slot] = mx;
    p.part_l[slot] = sum;
  }
}

// One block a query row. The chunks' maxima and sums are read once, a chunk a thread,
// and reduced across the block (M, then L); then thread d sums value dimension d over
// the chunks with loads that do not wait on each other (no branch in the loop: a chunk
// with no visible key, whose acc was never written, is selected out, not skipped).
template <typename T>
__global__ void __launch_bounds__(kCombineThreads) static_decode_combine(Params p) {
  __shared__ float scratch[kCombineWarps + 1];
  const int64_t row = blockIdx.x;
  const float* m = p.part_m + row * p.chunks;
  const float* l = p.part_l + row * p.chunks;
  const float* acc = p.part_acc + row * p.chunks * p.Dv;
  float M = -INFINITY;
  for (int64_t c = threadIdx.x; c < p.chunks; c += kCombineThreads) {
    if (l[c] > 0.0f) {
      M = fmaxf(M, m[c]);
    }
  }
  M = block_reduce<true, kCombineWarps>(M, scratch);
  float L = 0.0f;
  if (M != -INFINITY) {
    for (int64_t c = threadIdx.x; c < p.chunks; c += kCombineThreads) {
      const float lc = l[c];
      L += lc > 0.0f ? lc * expf(m[c] - M) : 0.0f;
    }
  }
  L = block_reduce<false, kCombineWarps>(L, scratch);
  T* out = static_cast<T*>(p.out) + row * p.Dv;
  for (int d = threadIdx.x; d < p.Dv; d += kCombineThreads) {
    float o = 0.0f;
    if (L > 0.0f) {
#pragma unroll 8
      for (int64_t c = 0; c < p.chunks; ++c) {
        const float lc = l[c], mc = m[c], a = acc[c * p.Dv + d];
        o += lc > 0.0f ? a * expf(mc - M) : 0.0f;
      }
    }
    out[d] = static_cast<T>(L > 0.0f ? o / L : 0.0f);
  }
}

bool unit_last_stride(const at::Tensor& t) { return t.size(-1) == 1 || t.stride(-1) == 1; }

}  // namespace

bool static_decode_applies(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const StaticDecodeMask& mask) {
  if (!q.is_cuda() || q.dim() != 4 || k.dim() != 4 || v.dim() != 4) {
    return false;
  }
  const auto dtype = q.scalar_type();
  if (dtype != at::kFloat && dtype != at::kHalf && dtype != at::kBFloat16) {
    return false;
  }
  if (k.scalar_type() != dtype || v.scalar_type() != dtype || k.device() != q.device() || v.device() != q.device()) {
    return false;
  }
  const int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), D = q.size(3);
  const int64_t Hkv = k.size(1), Tk = k.size(2), Dv = v.size(3);
  if (k.size(0) != B || v.size(0) != B || v.size(1) != Hkv || v.size(2) != Tk || k.size(3) != D) {
    return false;
  }
  if (B < 1 || Hkv < 1 || H % Hkv != 0 || Tq < 1 || Tq > kStaticDecodeRows || Tk < 1 || D < 1 ||
      D > kStaticDecodeMaxHeadDim || Dv < 1 || Dv > kStaticDecodeMaxHeadDim || B * H * Tq > kMaxGridY) {
    return false;
  }
  if (!unit_last_stride(q) || !unit_last_stride(k) || !unit_last_stride(v)) {
    return false;
  }
  if (c10::GradMode::is_enabled() && (q.requires_grad() || k.requires_grad() || v.requires_grad())) {
    return false;
  }
  const at::Tensor& pos = mask.positions;
  if (!pos.defined() || pos.numel() != 1 || pos.scalar_type() != at::kLong || pos.device() != q.device()) {
    return false;
  }
  if (mask.buffer.defined()) {
    const at::Tensor& buf = mask.buffer;
    if (!mask.causal || buf.dim() != 2 || buf.scalar_type() != dtype || buf.device() != q.device() ||
        buf.size(1) < Tk || !unit_last_stride(buf)) {
      return false;
    }
  }
  return mask.window >= 0;
}

at::Tensor static_decode_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const StaticDecodeMask& mask, double scale) {
  TORCH_CHECK(static_decode_applies(q, k, v, mask),
              "static_decode_attention: expected CUDA q [B, H, Tq <= ", kStaticDecodeRows,
              ", d], k and v [B, Hkv, Tk, d] of one floating dtype and a [1] int64 position on q's device, got q ",
              q.sizes(), " ", q.scalar_type(), ", k ", k.sizes(), ", v ", v.sizes());
  const c10::cuda::CUDAGuard guard(q.device());
  const int64_t B = q.size(0), H = q.size(1), Tq = q.size(2);
  const int64_t Tk = k.size(2), Dv = v.size(3);
  const int64_t rows = B * H * Tq, chunks = (Tk + kChunk - 1) / kChunk;
  const auto f32 = q.options().dtype(at::kFloat);
  at::Tensor part_m = at::empty({rows, chunks}, f32);
  at::Tensor part_l = at::empty({rows, chunks}, f32);
  at::Tensor part_acc = at::empty({rows, chunks, Dv}, f32);
  at::Tensor out = at::empty({B, H, Tq, Dv}, q.options());

  Params p;
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  p.positions = mask.positions.data_ptr<int64_t>();
  p.part_m = part_m.data_ptr<float>();
  p.part_l = part_l.data_ptr<float>();
  p.part_acc = part_acc.data_ptr<float>();
  p.out = out.data_ptr();
  p.q_sb = q.stride(0);
  p.q_sh = q.stride(1);
  p.q_si = q.stride(2);
  p.k_sb = k.stride(0);
  p.k_sh = k.stride(1);
  p.k_sj = k.stride(2);
  p.v_sb = v.stride(0);
  p.v_sh = v.stride(1);
  p.v_sj = v.stride(2);
  if (mask.buffer.defined()) {
    p.buffer = mask.buffer.data_ptr();
    p.buf_rows = mask.buffer.size(0);
    p.buf_stride = mask.buffer.stride(0);
  }
  p.H = H;
  p.G = H / k.size(1);
  p.Tq = Tq;
  p.Tk = Tk;
  p.chunks = chunks;
  p.window = mask.window;
  p.D = static_cast<int>(q.size(3));
  p.Dv = static_cast<int>(Dv);
  p.scale = static_cast<float>(scale);
  p.causal = mask.causal;

  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, q.scalar_type(), "static_decode_attention", [&] {
    static_decode_partial<scalar_t>
        <<<dim3(static_cast<unsigned>(chunks), static_cast<unsigned>(rows)), kThreads, 0, stream>>>(p);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    static_decode_combine<scalar_t><<<static_cast<unsigned>(rows), kCombineThreads, 0, stream>>>(p);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

}  // namespace torchattn::kernels::cuda
