#pragma once

// at::parallel_for as the library runs it, for kernels instantiated in a user's
// translation unit (flex_attention's). ATen's parallel_for is inline and, where ATen's
// backend is OpenMP (LibTorch's CPU wheel), splits the work only in a translation unit
// compiled with OpenMP: a program built without -fopenmp would run it on one thread.
// This one is compiled into the library, with OpenMP.

#include <cstdint>
#include <functional>

namespace torchattn::kernels::cpu {

/// f(chunk_begin, chunk_end) over [begin, end) in chunks of at least `grain`, on ATen's
/// intra-op threads (at::get_num_threads()), as at::parallel_for.
void parallel_for(int64_t begin, int64_t end, int64_t grain, const std::function<void(int64_t, int64_t)>& f);

}  // namespace torchattn::kernels::cpu
