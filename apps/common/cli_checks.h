#pragma once

// CLI11 validators with plain messages ("--max-new-tokens: expected at least 1, got 0"),
// and the parsing of a list of token ids, shared by the apps.

#include <CLI/CLI.hpp>
#include "fmt.h"

#include <cmath>
#include <cstdint>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace apps {

// "1,2,3" -> ids, each a non-negative integer below the vocabulary's size.
inline std::vector<int64_t> parse_ids(const std::string& text, int64_t vocab_size) {
  std::vector<int64_t> ids;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size() || v < 0) {
      throw std::runtime_error("--prompt-ids: '" + item +
                               "' is not a token id (expected comma-separated integers >= 0, "
                               "e.g. 1,2,3)");
    }
    if (v >= vocab_size) {
      throw std::runtime_error("--prompt-ids: id " + std::to_string(v) + " is past the model's vocabulary of " +
                               std::to_string(vocab_size) + " tokens (ids 0 to " + std::to_string(vocab_size - 1) +
                               ")");
    }
    ids.push_back(v);
  }
  if (ids.empty()) throw std::runtime_error("--prompt-ids: no ids");
  return ids;
}

// CLI11 validators with plain messages ("--max-new-tokens: expected at least 1, got 0").
inline CLI::Validator at_least(int64_t low) {
  return CLI::Validator(
      [low](std::string& s) -> std::string {
        size_t used = 0;
        long long v = 0;
        try {
          v = std::stoll(s, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (s.empty() || used != s.size()) return "expected an integer, got '" + s + "'";
        if (v < low) return "expected at least " + std::to_string(low) + ", got " + s;
        return {};
      },
      ">=" + std::to_string(low));
}

// `s` as a finite number (the whole of it), or nothing.
inline std::optional<double> parse_real(const std::string& s) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (s.empty() || used != s.size() || !std::isfinite(v)) return std::nullopt;
  return v;
}

// A number in (0, high]; without `high`, any number > 0.
inline CLI::Validator positive_real(std::optional<double> high = std::nullopt) {
  const std::string range = high ? "(0, " + fmt::format("{:g}", *high) + "]" : "> 0";
  return CLI::Validator(
      [high, range](std::string& s) -> std::string {
        const auto v = parse_real(s);
        if (!v) return "expected a finite number, got '" + s + "'";
        if (!(*v > 0 && (!high || *v <= *high)))
          return std::string("expected a number ") + (high ? "in " : "") + range + ", got " + s;
        return {};
      },
      range);
}

// A number in [low, high) (high_open) or [low, high]; high may be infinity.
inline CLI::Validator real_in(double low, double high, bool high_open = false) {
  const std::string range = "[" + fmt::format("{:g}", low) + ", " +
                            (std::isinf(high) ? std::string("inf") : fmt::format("{:g}", high)) +
                            (high_open ? ")" : "]");
  return CLI::Validator(
      [low, high, high_open, range](std::string& s) -> std::string {
        const auto v = parse_real(s);
        if (!v) return "expected a finite number, got '" + s + "'";
        if (!(*v >= low && (high_open ? *v < high : *v <= high))) return "expected a number in " + range + ", got " + s;
        return {};
      },
      range);
}

}  // namespace apps
