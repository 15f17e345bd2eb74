#pragma once

// Dicts of tensors in the pickle format of Python's torch.save / torch.load, the way
// state dicts travel between Python and C++.

#include <torchattn/safetensors.h>

#include <string>
#include <vector>

namespace torchattn::serialize {

// The bytes of the file at `path`; a c10::Error naming `fn` when it cannot be opened.
std::vector<char> read_file(const std::string& path, const char* fn);

// The tensors of a file written in Python by `torch.save(plain_dict, path)`, in the
// dict's order. Anything else (an OrderedDict, which LibTorch's unpickler cannot read,
// a value that is not a tensor) is a c10::Error naming `fn` and `path` that says how
// to save the file.
NamedTensors unpickle_tensors(const std::vector<char>& bytes, const std::string& path, const char* fn);

// Writes `tensors` as a plain dict, as Python's torch.save writes one, that Python's
// torch.load reads with its default weights_only=True; errors name `fn`.
void pickle_tensors(const NamedTensors& tensors, const std::string& path, const char* fn);

}  // namespace torchattn::serialize
