#pragma once

// Reads a JSON file of a model folder (config.json, tokenizer.json). A missing file or
// invalid JSON is a c10::Error that starts with `what` and names the file.

#include <nlohmann/json.hpp>

#include <fstream>
#include <c10/util/Exception.h>
#include <string>

namespace torchattn::models::files {

inline nlohmann::json read_json_file(const std::string& path, const std::string& what) {
  std::ifstream in(path);
  if (!in) TORCH_CHECK(false, what + ": cannot open '" + path + "'");
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    TORCH_CHECK(false, what + ": '" + path + "' is not valid JSON (" + e.what() + ")");
  }
}

}  // namespace torchattn::models::files
