#pragma once

// A file name in the temporary directory, unique to this test process.

#include <unistd.h>

#include <filesystem>
#include <string>

inline std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("torchattn_test_" + std::to_string(::getpid()) + "_" + name))
      .string();
}
