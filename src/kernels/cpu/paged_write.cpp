#include "kernels/cpu/paged_write.h"

#include <ATen/Dispatch.h>

#include <algorithm>

namespace torchattn::kernels::cpu {

bool paged_write_applies(const at::Tensor& k, const at::Tensor& v, const at::Tensor& keys, const at::Tensor& values) {
  for (const at::Tensor* t : {&k, &v, &keys, &values}) {
    if (!t->device().is_cpu() || t->scalar_type() != k.scalar_type() || !at::isFloatingType(t->scalar_type())) {
      return false;
    }
  }
  return keys.is_contiguous() && values.is_contiguous() && k.dim() == 3 && v.dim() == 3 && k.stride(2) == 1 &&
         v.stride(2) == 1;
}

namespace {

template <typename scalar_t>
void write(const at::Tensor& k, const at::Tensor& v, const int64_t* blocks, const int64_t* offsets, at::Tensor& keys,
           at::Tensor& values) {
  const int64_t N = k.size(0), Hkv = k.size(1), d = k.size(2), block_size = keys.size(3);
  const scalar_t* kp = k.const_data_ptr<scalar_t>();
  const scalar_t* vp = v.const_data_ptr<scalar_t>();
  scalar_t* key_pool = keys.mutable_data_ptr<scalar_t>();
  scalar_t* value_pool = values.mutable_data_ptr<scalar_t>();
  for (int64_t i = 0; i < N; ++i) {
    for (int64_t h = 0; h < Hkv; ++h) {
      const scalar_t* ki = kp + i * k.stride(0) + h * k.stride(1);
      const scalar_t* vi = vp + i * v.stride(0) + h * v.stride(1);
      const int64_t head = blocks[i] * Hkv + h;  // [block, head] of the pool
      scalar_t* kd = key_pool + head * d * block_size + offsets[i];
      for (int64_t e = 0; e < d; ++e) kd[e * block_size] = ki[e];
      std::copy(vi, vi + d, value_pool + (head * block_size + offsets[i]) * d);
    }
  }
}

}  // namespace

void paged_write(const at::Tensor& k, const at::Tensor& v, const int64_t* blocks, const int64_t* offsets,
                 at::Tensor& keys, at::Tensor& values) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, k.scalar_type(), "torchattn_paged_write",
                                  [&] { write<scalar_t>(k, v, blocks, offsets, keys, values); });
}

}  // namespace torchattn::kernels::cpu
