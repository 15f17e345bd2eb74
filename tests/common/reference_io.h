#pragma once

// Reading what the reference scripts (tests/reference/make_*_reference.py) write: torch.save'd
// dicts of tensors, token ids, and the error of a result relative to the reference.

#include <ATen/ATen.h>
#include <ATen/core/Dict.h>
#include <torch/serialize.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>
#include <vector>

namespace torchattn::testing {

/// The dict torch.save wrote at `path`; `made_by` names what makes it, for the error.
inline c10::impl::GenericDict read_pickle(const std::filesystem::path& path, const std::string& made_by) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path.string() + " (" + made_by + " writes it)");
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return torch::pickle_load(bytes).toGenericDict();
}

/// Token ids [N] (any integer dtype, CPU) -> a vector.
inline std::vector<int64_t> to_ids(const at::Tensor& t) {
  const auto c = t.to(at::kLong).contiguous();
  return {c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()};
}

/// max |a - e| / max |e|, in float64 on the CPU.
inline double relative_error(const at::Tensor& a, const at::Tensor& e) {
  return (a.to(at::kDouble).cpu() - e.to(at::kDouble).cpu()).abs().max().item<double>() / e.abs().max().item<double>();
}

}  // namespace torchattn::testing
