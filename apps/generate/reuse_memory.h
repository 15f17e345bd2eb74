#pragma once

// Keeps the C library's allocator from handing large buffers back to the kernel after
// every operation (a fresh mapping, page faults and zeroing each time a forward
// allocates an activation): large blocks come from the heap and stay reused. First
// returns what is free now (the weights the model was built with, replaced by the
// checkpoint's), so call it once the model is loaded. For the programs' own process
// (torchattn_generate and its benchmark); the library never calls it. About 10% of a
// 512-token prefill on the benchmark machine.

#include <malloc.h>

inline void keep_freed_memory_for_reuse() {
  malloc_trim(0);
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 512 << 20);
}
