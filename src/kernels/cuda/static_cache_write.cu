// A static-shape cache's write: kernels/cuda/static_cache_write.h. A block per (batch,
// head, new token), its threads along the head dimension, keys and values together.

#include "kernels/cuda/static_cache_write.h"

#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace torchattn::kernels::cuda {

namespace {

constexpr int kMaxThreads = 128;

struct WriteParams {
  void* keys = nullptr;
  void* values = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  const int64_t* position = nullptr;
  int64_t H = 1, t = 1, C = 0, D = 0;
  int64_t k_sb = 0, k_sh = 0, k_si = 0, k_sd = 1;
  int64_t v_sb = 0, v_sh = 0, v_si = 0, v_sd = 1;
};

template <typename T>
__global__ void __launch_bounds__(kMaxThreads) write_slots(WriteParams p) {
  const int64_t row = blockIdx.x;
  const int64_t i = row % p.t, h = (row / p.t) % p.H, b = row / (p.t * p.H);
  const int64_t slot = *p.position + i;
  if (slot < 0 || slot >= p.C) {
    return;
  }
  const int64_t dst = ((b * p.H + h) * p.C + slot) * p.D;
  const T* ks = static_cast<const T*>(p.k) + b * p.k_sb + h * p.k_sh + i * p.k_si;
  const T* vs = static_cast<const T*>(p.v) + b * p.v_sb + h * p.v_sh + i * p.v_si;
  T* kd = static_cast<T*>(p.keys) + dst;
  T* vd = static_cast<T*>(p.values) + dst;
  for (int64_t d = threadIdx.x; d < p.D; d += blockDim.x) {
    kd[d] = ks[d * p.k_sd];
    vd[d] = vs[d * p.v_sd];
  }
}

// t as [B, H, T, D]: a rank-3 [B, T, D] gets a head dimension of 1.
at::Tensor as_4d(const at::Tensor& t) { return t.dim() == 3 ? t.unsqueeze(1) : t; }

}  // namespace

bool static_cache_write_applies(const at::Tensor& keys, const at::Tensor& values, const at::Tensor& k,
                                const at::Tensor& v, const at::Tensor& position) {
  if (!keys.is_cuda() || (keys.dim() != 3 && keys.dim() != 4) || !keys.is_contiguous() || !values.is_contiguous() ||
      values.sizes() != keys.sizes()) {
    return false;
  }
  const auto dtype = keys.scalar_type();
  for (const at::Tensor* t : {&values, &k, &v}) {
    if (t->scalar_type() != dtype || t->device() != keys.device() || t->dim() != keys.dim()) {
      return false;
    }
  }
  if (dtype != at::kFloat && dtype != at::kHalf && dtype != at::kBFloat16 && dtype != at::kDouble) {
    return false;
  }
  for (int64_t d = 0; d < keys.dim(); ++d) {
    if (d != keys.dim() - 2 && (k.size(d) != keys.size(d) || v.size(d) != keys.size(d))) {
      return false;
    }
  }
  if (k.size(-2) != v.size(-2) || k.size(-2) < 1 || keys.numel() == 0) {
    return false;
  }
  return position.defined() && position.numel() == 1 && position.scalar_type() == at::kLong &&
         position.device() == keys.device();
}

void static_cache_write(at::Tensor& keys, at::Tensor& values, const at::Tensor& k, const at::Tensor& v,
                        const at::Tensor& position) {
  TORCH_CHECK(static_cache_write_applies(keys, values, k, v, position),
              "static_cache_write: expected contiguous CUDA caches [..., C, d] and new keys and values [..., t, d] "
              "of their dtype and device, with a [1] int64 position there; got caches ",
              keys.sizes(), ", keys ", k.sizes(), ", values ", v.sizes());
  const c10::cuda::CUDAGuard guard(keys.device());
  const at::Tensor k4 = as_4d(k), v4 = as_4d(v), keys4 = as_4d(keys);
  WriteParams p;
  p.keys = keys.data_ptr();
  p.values = values.data_ptr();
  p.k = k4.data_ptr();
  p.v = v4.data_ptr();
  p.position = position.data_ptr<int64_t>();
  p.H = keys4.size(1);
  p.t = k4.size(2);
  p.C = keys4.size(2);
  p.D = keys4.size(3);
  p.k_sb = k4.stride(0);
  p.k_sh = k4.stride(1);
  p.k_si = k4.stride(2);
  p.k_sd = k4.stride(3);
  p.v_sb = v4.stride(0);
  p.v_sh = v4.stride(1);
  p.v_si = v4.stride(2);
  p.v_sd = v4.stride(3);
  const int64_t rows = keys4.size(0) * p.H * p.t;
  const int threads = static_cast<int>(std::min<int64_t>(kMaxThreads, (p.D + 31) / 32 * 32));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, keys.scalar_type(), "static_cache_write", [&] {
    write_slots<scalar_t><<<static_cast<unsigned>(rows), threads, 0, stream>>>(p);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

}  // namespace torchattn::kernels::cuda
