#include <torchattn/detail/kernels/cpu/parallel.h>

#include <ATen/Parallel.h>

namespace torchattn::kernels::cpu {

void parallel_for(int64_t begin, int64_t end, int64_t grain, const std::function<void(int64_t, int64_t)>& f) {
  at::parallel_for(begin, end, grain, f);
}

}  // namespace torchattn::kernels::cpu
