#pragma once

// Writing a float32 matrix as a NumPy .npy file (format version 1.0), which
// numpy.load reads.

#include <ATen/core/Tensor.h>

#include <ostream>

/// rows: [N, D] float32 (any device) -> the .npy bytes on `out`.
void write_npy(std::ostream& out, const at::Tensor& rows);
