#pragma once

// The benchmarks' JSON, written by hand: a few top-level fields, then flat rows of
// strings and numbers. report.py and report_cuda.py read it.

#include <cmath>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

namespace bench {

struct Row {
  std::vector<std::pair<std::string, std::string>> fields;
  Row& s(const std::string& k, const std::string& v) {
    fields.emplace_back(k, "\"" + v + "\"");
    return *this;
  }
  /// A number; NaN or infinity is written as null (JSON has neither).
  Row& n(const std::string& k, double v) {
    if (!std::isfinite(v)) {
      fields.emplace_back(k, "null");
      return *this;
    }
    std::ostringstream o;
    o.precision(6);
    o << v;
    fields.emplace_back(k, o.str());
    return *this;
  }
};

/// meta: the top-level fields, already JSON ("\"tool\": \"x\", \"threads\": 2").
inline std::string to_json(const std::vector<Row>& rows, const std::string& meta) {
  std::ostringstream o;
  o << "{" << meta << ",\n \"rows\": [\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    o << "  {";
    for (size_t j = 0; j < rows[i].fields.size(); ++j) {
      o << (j ? ", " : "") << "\"" << rows[i].fields[j].first << "\": " << rows[i].fields[j].second;
    }
    o << "}" << (i + 1 < rows.size() ? "," : "") << "\n";
  }
  o << " ]}\n";
  return o.str();
}

}  // namespace bench
