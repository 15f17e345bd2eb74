#pragma once

// at::parallel_for for the many small parallel regions of decoding, made robust to a
// machine shared with other processes.
//
// Every parallel region ends in a join that waits for each intra-op thread. When
// another process holds a core, a worker thread may not be scheduled for a whole
// time slice (milliseconds), and a decoding step of a few hundred regions of tens of
// microseconds each collapses (measured: 2 threads at a third of 1 thread's speed).
// So the region's time is compared with the calling thread's own share of the work:
// when joins wait far longer than the work took (twice within a few regions: one
// alone is the system's own noise), the workers are not getting the cores, and the
// next regions run on the calling thread alone for a while (0.1 s, doubling while the
// stalls go on, up to 6.4 s; back to 0.1 s after 256 clean regions), then parallel
// again to see. So a machine that becomes idle again regains its threads within
// seconds. Measured on 2 cores with one kept busy: 2 threads decode as fast as 1.
//
// The split of the work does not change any result (each output is computed by one
// thread either way), so this only moves time. The state is this library's own (a
// few atomics): no thread count or other process-wide setting is changed.

#include <torchattn/detail/kernels/cpu/parallel.h>

#include <cstdint>
#include <functional>

namespace torchattn::kernels::cpu {

/// Runs f over [0, n) in chunks like at::parallel_for(0, n, grain, f), or as f(0, n)
/// on the calling thread while recent regions stalled (see above).
void parallel_for_unless_stalled(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& f);

// parallel_for_work (detail/kernels/cpu/parallel.h, for the kernels a user's translation
// unit instantiates too) runs its regions through parallel_for_unless_stalled.

/// Whether regions currently run on the calling thread alone (for tests and benchmarks).
bool stalled_recently();

}  // namespace torchattn::kernels::cpu
