#pragma once

// Reads the golden fixtures that tests/reference/make_golden.py writes from the notebooks' code.

#include <torch/torch.h>

#include "common/golden_dir.h"

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace golden {

struct Case {
  std::string name;
  std::map<std::string, std::string> params;
  std::map<std::string, torch::Tensor> tensors;

  const std::string& param(const std::string& key) const {
    auto it = params.find(key);
    if (it == params.end()) throw std::runtime_error("golden case " + name + " has no param " + key);
    return it->second;
  }
  int64_t integer(const std::string& key) const { return std::stoll(param(key)); }
  double real(const std::string& key) const { return std::stod(param(key)); }
  const torch::Tensor& tensor(const std::string& key) const {
    auto it = tensors.find(key);
    if (it == tensors.end()) throw std::runtime_error("golden case " + name + " has no tensor " + key);
    return it->second;
  }
};

struct File {
  std::string torch_version;
  std::vector<Case> cases;

  const Case& get(const std::string& name) const {
    for (const auto& c : cases) {
      if (c.name == name) return c;
    }
    throw std::runtime_error("no golden case " + name);
  }
};

// make_golden.py's base64 values: little-endian float64 bytes (x86 and ARM alike).
inline std::vector<double> float64_of_base64(const std::string& text, const std::string& path, const std::string& key) {
  std::vector<uint8_t> bytes;
  bytes.reserve(text.size() / 4 * 3);
  uint32_t bits = 0;
  int count = 0;
  for (const char c : text) {
    int v = -1;
    if (c >= 'A' && c <= 'Z') v = c - 'A';
    if (c >= 'a' && c <= 'z') v = c - 'a' + 26;
    if (c >= '0' && c <= '9') v = c - '0' + 52;
    if (c == '+') v = 62;
    if (c == '/') v = 63;
    if (c == '=') break;
    if (v < 0) throw std::runtime_error("golden: " + path + ": tensor " + key + " is not base64");
    bits = (bits << 6) | static_cast<uint32_t>(v);
    if ((count += 6) >= 8) {
      count -= 8;
      bytes.push_back(static_cast<uint8_t>(bits >> count));
    }
  }
  if (bytes.size() % sizeof(double) != 0) {
    throw std::runtime_error("golden: " + path + ": tensor " + key + " is not whole float64 values");
  }
  std::vector<double> values(bytes.size() / sizeof(double));
  std::memcpy(values.data(), bytes.data(), bytes.size());
  return values;
}

inline torch::Dtype dtype_from_name(const std::string& name) {
  if (name == "float32") return torch::kFloat32;
  if (name == "float64") return torch::kFloat64;
  if (name == "float16") return torch::kFloat16;
  if (name == "bfloat16") return torch::kBFloat16;
  if (name == "int64") return torch::kInt64;
  if (name == "int32") return torch::kInt32;
  if (name == "int8") return torch::kInt8;
  if (name == "uint8") return torch::kUInt8;
  if (name == "bool") return torch::kBool;
  throw std::runtime_error("golden: unknown dtype " + name);
}

inline File load(const std::string& file_name) {
  const std::string path = std::string(directory()) + "/" + file_name;
  std::ifstream in(path);
  if (!in) throw std::runtime_error("golden: cannot open " + path + " (run `make golden`)");
  File file;
  std::string line;
  Case* current = nullptr;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream words(line);
    std::string kind;
    words >> kind;
    if (kind == "torch_version") {
      words >> file.torch_version;
    } else if (kind == "case") {
      file.cases.emplace_back();
      current = &file.cases.back();
      words >> current->name;
    } else if (kind == "param") {
      std::string key, value;
      words >> key >> value;
      current->params[key] = value;
    } else if (kind == "tensor") {
      std::string key, dtype, shape_text, encoding;
      words >> key >> dtype >> shape_text >> encoding;
      std::vector<int64_t> shape;
      if (shape_text != "-") {
        std::stringstream dims(shape_text);
        for (std::string d; std::getline(dims, d, ',');) shape.push_back(std::stoll(d));
      }
      std::string values_line;
      std::getline(in, values_line);
      std::vector<double> values;
      if (encoding == "base64") {
        values = float64_of_base64(values_line, path, key);
      } else {
        const char* p = values_line.c_str();
        char* end = nullptr;
        for (double v = std::strtod(p, &end); p != end; v = std::strtod(p, &end)) {
          values.push_back(v);
          p = end;
        }
      }
      auto t = torch::tensor(values, torch::kFloat64).reshape(shape).to(dtype_from_name(dtype));
      current->tensors[key] = t;
    } else if (kind == "end") {
      current = nullptr;
    } else {
      throw std::runtime_error("golden: unexpected line in " + path + ": " + line);
    }
  }
  return file;
}

}  // namespace golden
