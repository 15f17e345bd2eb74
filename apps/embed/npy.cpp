#include "npy.h"

#include <c10/util/Exception.h>

#include <string>

void write_npy(std::ostream& out, const at::Tensor& rows_in) {
  TORCH_CHECK(rows_in.dim() == 2 && rows_in.scalar_type() == at::kFloat, "write_npy: expected float32 [N, D], got ",
              rows_in.sizes(), " of ", rows_in.scalar_type());
  const at::Tensor rows = rows_in.cpu().contiguous();
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + std::to_string(rows.size(0)) + ", " +
                       std::to_string(rows.size(1)) + "), }";
  // Magic (6) + version (2) + header length (2) + header, padded with spaces and
  // ended by a newline to a multiple of 64 bytes.
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header.push_back('\n');
  out.write("\x93NUMPY\x01\x00", 8);
  const uint16_t n = static_cast<uint16_t>(header.size());
  const char len[2] = {static_cast<char>(n & 0xff), static_cast<char>(n >> 8)};
  out.write(len, 2);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(static_cast<const char*>(rows.const_data_ptr()), static_cast<std::streamsize>(rows.numel() * 4));
}
