#pragma once

// Reads a JSON file of a model folder (config.json, tokenizer.json). A missing file or
// invalid JSON is a std::runtime_error that starts with `what` and names the file.

#include <nlohmann/json.hpp>

#include <fstream>
#include <stdexcept>
#include <string>

namespace generate {

inline nlohmann::json read_json_file(const std::string& path, const std::string& what) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error(what + ": cannot open '" + path + "'");
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw std::runtime_error(what + ": '" + path + "' is not valid JSON (" + e.what() + ")");
  }
}

} // namespace generate
