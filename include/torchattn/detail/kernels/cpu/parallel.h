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

/// f over n items of `work` multiply-adds each: f(0, n) on the calling thread when all of
/// them are below what pays for a parallel region (2^20: a region costs tens of
/// microseconds to start and join, and far more when a core is busy), else in chunks of
/// about 2^18 on ATen's intra-op threads, unless recent regions stalled on a busy core
/// (src/kernels/cpu/stall_aware.h). Each item is computed by one thread either way.
void parallel_for_work(int64_t n, int64_t work, const std::function<void(int64_t, int64_t)>& f);

}  // namespace torchattn::kernels::cpu
