#pragma once

// EXPECT that `fn` throws a c10::Error whose message contains `needle`.

#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>

inline void expect_error(const std::function<void()>& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "expected a c10::Error containing: " << needle;
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find(needle), std::string::npos) << e.what_without_backtrace();
  }
}
