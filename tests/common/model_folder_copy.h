#pragma once

// A copy of a model folder in the temporary directory, for a test that swaps one of its
// files (another model's tokenizer.json): the weights are linked, the other files copied.

#include "temp_path.h"

#include <filesystem>
#include <fstream>
#include <string>

inline std::filesystem::path copy_model_folder(const std::filesystem::path& from, const std::string& name) {
  namespace fs = std::filesystem;
  const fs::path to = temp_path(name);
  fs::remove_all(to);
  fs::create_directories(to);
  for (const auto& e : fs::directory_iterator(from)) {
    if (e.path().extension() == ".safetensors") {
      fs::create_symlink(fs::absolute(e.path()), to / e.path().filename());
    } else {
      fs::copy(e.path(), to / e.path().filename(), fs::copy_options::recursive);
    }
  }
  return to;
}

inline void write_file(const std::filesystem::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}
