#include "paged_attention.h"

#include "needs_grad.h"
#include "stall_aware.h"
#include "vec.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace torchattn::kernels::cpu {

namespace {

// Multiply-adds below which the whole step runs on the calling thread (see
// decode_attention: a parallel region costs more than small work).
constexpr int64_t kPagedSerialWork = 1 << 20;

bool plain_float(const at::Tensor& t, int64_t dim) {
  return t.is_cpu() && t.scalar_type() == at::kFloat && t.layout() == at::kStrided && !t.is_nested() &&
         t.dim() == dim && t.stride(dim - 1) == 1 && !needs_grad(t);
}

} // namespace

bool paged_attention_applies(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values) {
  if (!plain_float(q, 3) || !plain_float(keys, 3) || !plain_float(values, 3)) return false;
  if (!keys.is_contiguous() || !values.is_contiguous() || keys.sizes() != values.sizes()) return false;
  const int64_t H = q.size(1), Hkv = keys.size(1);
  return Hkv >= 1 && H % Hkv == 0 && q.size(2) == keys.size(2) && q.size(2) >= 1;
}

void paged_attention(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values, const PagedRows& r,
                     const std::vector<int64_t>& which, double scale, at::Tensor& out) {
  TORCH_CHECK(paged_attention_applies(q, keys, values), "paged_attention: expected float32 CPU q [N, H, d] and "
              "contiguous keys and values [slots, Hkv, d], H a multiple of Hkv, and no gradient");
  TORCH_CHECK(out.is_contiguous() && out.sizes() == q.sizes() && out.scalar_type() == at::kFloat,
              "paged_attention: expected a contiguous float32 out of q's shape ", q.sizes(), ", got ", out.sizes());
  const int64_t H = q.size(1), d = q.size(2), Hkv = keys.size(1), G = H / Hkv;
  const auto& qs = *r.query_start;
  const auto& ks = *r.key_start;
  for (const int64_t s : which) {
    TORCH_CHECK(qs[s + 1] - qs[s] >= 1 && qs[s + 1] - qs[s] <= kPagedKernelRows, "paged_attention: sequence ", s,
                " brings ", qs[s + 1] - qs[s], " rows; the kernel takes 1 to ", kPagedKernelRows);
    TORCH_CHECK(ks[s + 1] - ks[s] >= qs[s + 1] - qs[s], "paged_attention: sequence ", s, " has fewer keys (",
                ks[s + 1] - ks[s], ") than new rows (", qs[s + 1] - qs[s], ")");
  }
  const float* qp = q.const_data_ptr<float>();
  const float* kp = keys.const_data_ptr<float>();
  const float* vp = values.const_data_ptr<float>();
  float* op = out.mutable_data_ptr<float>();
  const int64_t q_row = q.stride(0), q_head = q.stride(1);
  const int64_t slot_stride = Hkv * d;  // keys and values: [slots, Hkv, d]
  const float fscale = static_cast<float>(scale);
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();

  // One task: a sequence and one of its key heads, for each new row and each of the G
  // query heads that share it. Keys are read once per task; each (row, head) keeps its
  // own scores and sums in key order, as decode_attention does.
  auto tasks = [&](int64_t begin, int64_t end) {
    std::vector<float> scores;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t s = which[static_cast<size_t>(task / Hkv)], hk = task % Hkv;
      const int64_t n = qs[s + 1] - qs[s], L = ks[s + 1] - ks[s];
      const int64_t* slots = r.key_slots + ks[s];
      scores.assign(static_cast<size_t>(n * G * L), kNegInf);
      auto first_key = [&](int64_t i) {
        const int64_t position = L - n + i;
        return r.window ? std::max<int64_t>(0, position - *r.window + 1) : int64_t{0};
      };
      const int64_t lo = first_key(0);
      for (int64_t j = lo; j < L; ++j) {
        const float* k = kp + slots[j] * slot_stride + hk * d;
        for (int64_t i = std::max<int64_t>(0, j - (L - n)); i < n; ++i) {
          if (j < first_key(i)) continue;  // left of the row's window
          const float* qr = qp + (qs[s] + i) * q_row + (hk * G) * q_head;
          for (int64_t g = 0; g < G; ++g) scores[static_cast<size_t>((i * G + g) * L + j)] = dot(qr + g * q_head, k, d) * fscale;
        }
      }
      for (int64_t i = 0; i < n; ++i) {
        for (int64_t g = 0; g < G; ++g) {
          float* row = scores.data() + (i * G + g) * L;
          float* o = op + ((qs[s] + i) * H + hk * G + g) * d;
          std::fill(o, o + d, 0.0f);
          float top = kNegInf;
          for (int64_t j = 0; j < L; ++j) top = std::max(top, row[j]);
          float total = 0.0f;
          for (int64_t j = 0; j < L; ++j) {
            if (row[j] == kNegInf) continue;
            const float p = std::exp(row[j] - top);
            total += p;
            axpy(p, vp + slots[j] * slot_stride + hk * d, o, d);
          }
          const float inv = 1.0f / total;
          for (int64_t c = 0; c < d; ++c) o[c] *= inv;
        }
      }
    }
  };
  const int64_t n_tasks = static_cast<int64_t>(which.size()) * Hkv;
  int64_t work = 0;
  for (const int64_t s : which) work += (qs[s + 1] - qs[s]) * G * (ks[s + 1] - ks[s]) * 2 * d * Hkv;
  if (work <= kPagedSerialWork || n_tasks == 1) {
    tasks(0, n_tasks);
  } else {
    parallel_for_unless_stalled(n_tasks, 1, tasks);
  }
}

} // namespace torchattn::kernels::cpu
