#pragma once

// EXPECT that `fn` throws a c10::Error whose message contains `needle`; or take the
// message (error_of) and check a part of it (EXPECT_HAS).

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

// The message of the c10::Error `fn` throws, or "(no error)".
inline std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return "(no error)";
}

#define EXPECT_HAS(text, part) EXPECT_NE(std::string(text).find(part), std::string::npos) << (text)
