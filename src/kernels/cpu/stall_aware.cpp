#include "kernels/cpu/stall_aware.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <chrono>

namespace torchattn::kernels::cpu {

namespace {

using Clock = std::chrono::steady_clock;

constexpr int64_t kFirstBackoffNs = 100'000'000;   // 0.1 s
constexpr int64_t kLastBackoffNs = 6'400'000'000;  // 6.4 s
// A join that waits this much longer than the calling thread's own work (and at least
// this many times longer) means a worker was not scheduled.
constexpr int64_t kStallSlackNs = 200'000;  // 0.2 ms
constexpr int64_t kStallFactor = 4;

std::atomic<int64_t> serial_until_ns{0};
std::atomic<int64_t> backoff_ns{kFirstBackoffNs};
// Evidence of stalls: +4 for a stalled region, -1 for a clean one; at kStrikes the
// regions go serial. One stall alone (the system's own noise) does not.
constexpr int64_t kStrikes = 8;
std::atomic<int64_t> strikes{0};
// Clean regions in a row; after kCleanRun of them the back-off starts again from the first.
constexpr int64_t kCleanRun = 256;
std::atomic<int64_t> clean_run{0};

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

}  // namespace

bool stalled_recently() { return now_ns() < serial_until_ns.load(std::memory_order_relaxed); }

void parallel_for_unless_stalled(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& f) {
  if (n <= 0) return;
  const int64_t start = now_ns();
  if (n <= grain || at::get_num_threads() < 2 || at::in_parallel_region() ||
      start < serial_until_ns.load(std::memory_order_relaxed)) {
    f(0, n);
    return;
  }
  std::atomic<int64_t> own_ns{-1};
  at::parallel_for(0, n, grain, [&](int64_t begin, int64_t end) {
    const int64_t t0 = now_ns();
    f(begin, end);
    if (at::get_thread_num() == 0) own_ns.store(now_ns() - t0, std::memory_order_relaxed);
  });
  const int64_t total = now_ns() - start, own = own_ns.load(std::memory_order_relaxed);
  if (own < 0) return;  // the calling thread had no chunk: nothing to compare with
  if (total > kStallFactor * own + kStallSlackNs) {
    clean_run.store(0, std::memory_order_relaxed);
    if (strikes.fetch_add(4, std::memory_order_relaxed) + 4 < kStrikes) return;
    strikes.store(0, std::memory_order_relaxed);
    const int64_t wait = backoff_ns.load(std::memory_order_relaxed);
    serial_until_ns.store(now_ns() + wait, std::memory_order_relaxed);
    backoff_ns.store(std::min(wait * 2, kLastBackoffNs), std::memory_order_relaxed);
  } else {
    if (strikes.load(std::memory_order_relaxed) > 0) strikes.fetch_sub(1, std::memory_order_relaxed);
    if (clean_run.fetch_add(1, std::memory_order_relaxed) + 1 >= kCleanRun) {
      backoff_ns.store(kFirstBackoffNs, std::memory_order_relaxed);
    }
  }
}

void parallel_for_work(int64_t n, int64_t work, const std::function<void(int64_t, int64_t)>& f) {
  constexpr int64_t kSerialWork = int64_t{1} << 20, kChunkWork = int64_t{1} << 18;
  work = std::max<int64_t>(1, work);
  if (n * work <= kSerialWork) {
    f(0, n);
  } else {
    parallel_for_unless_stalled(n, std::max<int64_t>(1, kChunkWork / work), f);
  }
}

}  // namespace torchattn::kernels::cpu
