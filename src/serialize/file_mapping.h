#pragma once

// A weights file mapped into memory, as the readers of safetensors and GGUF files hand
// its bytes to tensors without copying them: read-only on disk, copy-on-write in
// memory, unmapped when the last tensor over it goes.

#include <cstddef>
#include <cstdint>
#include <string>

namespace torchattn::serialize {

class FileMapping {
 public:
  /// Maps `path`; `reader` names the caller in errors ("safetensors", "gguf"). Asks the
  /// kernel for 2 MiB pages where it can (a hint): decoding reads every weight once a
  /// token as one stream per thread, and 4 KiB pages stop the prefetchers at every page.
  FileMapping(const std::string& path, const char* reader);
  ~FileMapping();
  FileMapping(const FileMapping&) = delete;
  FileMapping& operator=(const FileMapping&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

  /// Gives back the whole pages of [p, p + n) (a tensor of a mapping that nothing uses
  /// any more: its storage's deleter calls this), so that a model quantized layer by
  /// layer after loading does not keep the float32 file resident until the last
  /// tensor goes. The pages are the mapping's own (private): nothing else reads them.
  static void release(const uint8_t* p, size_t n);

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace torchattn::serialize
