#include "serialize/pickled_dict.h"

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>
#include <caffe2/serialize/inline_container.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>
#include <torch/serialize.h>

#include <fstream>
#include <iterator>

namespace torchattn::serialize {

std::vector<char> read_file(const std::string& path, const char* fn) {
  std::ifstream in(path, std::ios::binary);
  TORCH_CHECK(in, fn, ": cannot open '", path, "'");
  return std::vector<char>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

NamedTensors unpickle_tensors(const std::vector<char>& bytes, const std::string& path, const char* fn) {
  c10::IValue value;
  try {
    value = torch::pickle_load(bytes);
  } catch (const std::exception& e) {
    // LibTorch's unpickler cannot read the OrderedDict (with its _metadata) that
    // module.state_dict() returns; a plain dict of the same tensors reads fine.
    const std::string what = e.what();
    TORCH_CHECK(false, fn, ": cannot read '", path, "' as a torch.save file of a plain dict; save it in ",
                "Python with torch.save(dict(module.state_dict()), path) (", what.substr(0, what.find('\n')), ")");
  }
  TORCH_CHECK(value.isGenericDict(), fn, ": expected '", path,
              "' to hold a state dict (a dict of name -> tensor), got ", value.tagKind());
  NamedTensors out;
  for (const auto& item : value.toGenericDict()) {
    TORCH_CHECK(item.key().isString() && item.value().isTensor(), fn, ": expected '", path,
                "' to map names to tensors, got ", item.key().tagKind(), " -> ", item.value().tagKind());
    out.emplace_back(item.key().toStringRef(), item.value().toTensor());
  }
  return out;
}

void pickle_tensors(const NamedTensors& tensors, const std::string& path, const char* fn) {
  c10::impl::GenericDict dict(c10::StringType::get(), c10::TensorType::get());
  for (const auto& [key, tensor] : tensors) {
    dict.insert(key, tensor);
  }
  // torch::pickle_save, less the type tag (torch.jit._pickle.restore_type_tag) that
  // its Pickler wraps every dict in and that Python's torch.load refuses with
  // weights_only=True, its default: a plain dict, as Python's torch.save writes.
  std::vector<char> pickled;
  torch::jit::Pickler pickler([&](const char* data, size_t size) { pickled.insert(pickled.end(), data, data + size); },
                              /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
                              /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(c10::IValue(dict));
  pickler.stop();
  std::vector<char> bytes;
  caffe2::serialize::PyTorchStreamWriter writer([&](const void* data, size_t size) {
    const char* begin = static_cast<const char*>(data);
    bytes.insert(bytes.end(), begin, begin + size);
    return size;
  });
  torch::jit::writeArchiveAndTensors("data", pickled.data(), pickled.size(), pickler.tensorData(), writer);
  writer.writeEndOfFile();

  std::ofstream out(path, std::ios::binary);
  TORCH_CHECK(out, fn, ": cannot write '", path, "'");
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  TORCH_CHECK(out.good(), fn, ": writing '", path, "' failed");
}

}  // namespace torchattn::serialize
