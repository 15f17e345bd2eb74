// libFuzzer target: torchattn_serve's front door (apps/serve/front_door.cpp) over a real
// loopback socket, every input one connection's bytes. Heads, fields and bodies near the
// limits are hundreds of KiB, so the input is a small program of bytes: 0xFF N2 N1 N0 C
// stands for the byte C repeated N (24 bits, at most 2 MiB) times; every other byte is
// itself. The door must answer each input with a status below 500 (or close without a
// word where the request never ended), within the time, never report an internal error,
// and keep serving: any of these otherwise aborts.
//
// Seeds: tests/fuzz/door_seeds.py writes requests with header values, field names,
// request lines and bodies just under, at, just over and far over every limit.

#include "door_harness.h"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>

namespace {

[[noreturn]] void fail(const std::string& what) {
  std::fprintf(stderr, "fuzz_front_door: %s\n", what.c_str());
  std::abort();
}

std::string expand(const uint8_t* data, size_t size) {
  std::string out;
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == 0xFF && i + 4 < size) {
      const size_t n = (size_t{data[i + 1]} << 16) | (size_t{data[i + 2]} << 8) | data[i + 3];
      out.append(std::min<size_t>(n, 2 << 20), static_cast<char>(data[i + 4]));
      i += 4;
    } else {
      out.push_back(static_cast<char>(data[i]));
    }
  }
  return out;
}

struct Door {
  door_harness::StubService service;
  std::unique_ptr<door_harness::RunningDoor> running;
  Door() {
    serve::DoorOptions options;
    options.header_timeout = std::chrono::milliseconds(2000);
    options.body_timeout = options.idle_timeout = options.write_timeout = std::chrono::milliseconds(4000);
    running = std::make_unique<door_harness::RunningDoor>(service, options);
  }
};

Door& door() {
  static Door* d = new Door();  // never destroyed: the door serves every input
  return *d;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Door& d = door();
  const std::string bytes = expand(data, size);
  const int errors_before = d.service.internal_errors();
  door_harness::Answer answer;
  try {
    answer = door_harness::send_request(d.running->port(), bytes, 15);
  } catch (const std::exception& e) {
    fail(e.what());
  }
  if (!answer.in_time) fail("no answer and no close within 15 s");
  if (!answer.reply.empty() && answer.status == 0) fail("a reply that is not HTTP/1.1: " + answer.reply.substr(0, 80));
  // The stub answers /throw with a 500 by design; any other 5xx is the door's.
  const bool throws = bytes.find("/throw") != std::string::npos;
  if (answer.status >= 500 && !throws)
    fail("status " + std::to_string(answer.status) + ": " + answer.reply.substr(0, 200));
  if (d.service.internal_errors() > errors_before && !throws) fail("an internal error: " + d.service.last_error());
  return 0;
}
