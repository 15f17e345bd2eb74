#pragma once

// A module's parameters and buffers copied by name, and the check that a failed call
// left them as they were.

#include <gtest/gtest.h>
#include <torch/nn/module.h>

#include <map>
#include <string>

inline std::map<std::string, torch::Tensor> snapshot(torch::nn::Module& m) {
  std::map<std::string, torch::Tensor> out;
  for (auto& p : m.named_parameters()) out[p.key()] = p.value().detach().clone();
  for (auto& b : m.named_buffers()) out[b.key()] = b.value().clone();
  return out;
}

inline void expect_unchanged(torch::nn::Module& m, const std::map<std::string, torch::Tensor>& before) {
  auto now = snapshot(m);
  ASSERT_EQ(now.size(), before.size());
  for (auto& [k, v] : before) EXPECT_TRUE(torch::equal(now.at(k), v)) << k << " changed by a failed load";
}
