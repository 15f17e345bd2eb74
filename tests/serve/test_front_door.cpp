// torchattn_serve's front door (apps/serve/front_door.h) without a model: heads, fields
// and bodies around every limit (just under, at, just over, far over) get their answer
// (200, 413, 414, 431), and after each the door still serves; a handler that throws gets
// a 500 and the door serves on; nothing a request does reaches internal_error otherwise.

#include "door_harness.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <string>
#include <vector>

namespace {

using door_harness::send_request;

// A GET whose head holds `fields` ("Name: value" lines) after the Host line.
std::string get(const std::string& target, const std::vector<std::string>& fields = {}) {
  std::string head = "GET " + target + " HTTP/1.1\r\nHost: a\r\n";
  for (const auto& f : fields) head += f + "\r\n";
  return head + "\r\n";
}

// What the door counts of a head's fields: 2, and each field's name and value with 4.
size_t header_bytes(const std::vector<std::pair<std::string, size_t>>& fields) {
  size_t n = 2 + (4 + 1 + 4);  // "Host: a"
  for (const auto& [name, value] : fields) n += name.size() + value + 4;
  return n;
}

void expect_serving(const door_harness::StubService& service, int port, const std::string& after) {
  const auto answer = send_request(port, get("/after"));
  EXPECT_EQ(answer.status, 200) << "the door stopped serving after " << after;
  EXPECT_EQ(service.internal_errors(), 0) << after << ": " << service.last_error();
}

class FrontDoorLimits : public ::testing::TestWithParam<size_t> {};

// One field's value around the header limit (64 KiB) and around what Beast's fields
// hold (65533 bytes each): 200 up to the limit, 431 past it; never the process's end.
TEST_P(FrontDoorLimits, HeaderValuesAroundTheLimits) {
  door_harness::StubService service;
  const serve::DoorOptions options;
  door_harness::RunningDoor door(service, options);
  const size_t value = GetParam();
  const size_t bytes = header_bytes({{"X-Big", value}});
  const auto answer = send_request(door.port(), get("/x", {"X-Big: " + std::string(value, 'v')}));
  EXPECT_EQ(answer.status, bytes <= options.max_header_bytes ? 200 : 431)
      << "a value of " << value << " bytes (" << bytes << " header bytes)";
  if (answer.status == 431) {
    EXPECT_NE(answer.reply.find("headers_too_large"), std::string::npos) << answer.reply;
  }
  expect_serving(service, door.port(), "a value of " + std::to_string(value) + " bytes");
}

// Under a header limit past what Beast's fields hold, a single value past 65533 bytes is
// a 431 still (Beast would throw from inside the read), and one of 65533 is served.
TEST_P(FrontDoorLimits, HeaderValuesPastWhatAFieldHolds) {
  door_harness::StubService service;
  serve::DoorOptions options;
  options.max_header_bytes = 1 << 20;
  door_harness::RunningDoor door(service, options);
  const size_t value = GetParam();
  const auto answer = send_request(door.port(), get("/x", {"X-Big: " + std::string(value, 'v')}));
  EXPECT_EQ(answer.status, value <= 65533 ? 200 : 431) << "a value of " << value << " bytes";
  expect_serving(service, door.port(), "a value of " + std::to_string(value) + " bytes");
}

// 65536 - 20 is the largest value under the default limit (header_bytes adds 20).
INSTANTIATE_TEST_SUITE_P(Sizes, FrontDoorLimits,
                         ::testing::Values(size_t{1000}, size_t{65515}, size_t{65516}, size_t{65517}, size_t{65532},
                                           size_t{65533}, size_t{65534}, size_t{65535}, size_t{65536}, size_t{70000},
                                           size_t{73728}, size_t{200000}, size_t{2} << 20));

TEST(FrontDoor, FieldNamesPastWhatAFieldHolds) {
  door_harness::StubService service;
  serve::DoorOptions options;
  options.max_header_bytes = 1 << 20;
  door_harness::RunningDoor door(service, options);
  for (const size_t n : {size_t{65531}, size_t{65534}, size_t{100000}}) {
    const auto answer = send_request(door.port(), get("/x", {"X" + std::string(n - 1, 'n') + ": v"}));
    EXPECT_EQ(answer.status, n <= 65533 ? 200 : 431) << "a name of " << n << " bytes";
    expect_serving(service, door.port(), "a name of " + std::to_string(n) + " bytes");
  }
}

// Many fields together past the limit: 431; at the limit exactly: 200.
TEST(FrontDoor, ManyFieldsAroundTheLimit) {
  door_harness::StubService service;
  const serve::DoorOptions options;
  door_harness::RunningDoor door(service, options);
  for (const long extra : {-1L, 0L, 1L, 9000L}) {
    std::vector<std::string> fields;
    std::vector<std::pair<std::string, size_t>> sizes;
    for (int i = 0; i < 64; ++i) {
      fields.push_back("X-" + std::to_string(1000 + i) + ": " + std::string(1000, 'v'));
      sizes.emplace_back("X-" + std::to_string(1000 + i), 1000);
    }
    const size_t base = header_bytes(sizes) + 5 + 4;  // with a last field "X-End: ..."
    const size_t last = options.max_header_bytes - base + static_cast<size_t>(extra);
    fields.push_back("X-End: " + std::string(last, 'w'));
    const auto answer = send_request(door.port(), get("/x", fields));
    EXPECT_EQ(answer.status, extra <= 0 ? 200 : 431) << extra << " bytes past the limit";
    expect_serving(service, door.port(), std::to_string(extra) + " header bytes past the limit");
  }
}

// The request line: method, target and " HTTP/1.1\r\n" at most 8 KiB.
TEST(FrontDoor, RequestLinesAroundTheLimit) {
  door_harness::StubService service;
  const serve::DoorOptions options;
  door_harness::RunningDoor door(service, options);
  const size_t most = options.max_line_bytes - 3 - 11;  // "GET" and " HTTP/1.1\r\n" + " " counted as 11
  for (const long extra : {-1L, 0L, 1L, 70000L, 1L << 20}) {
    const std::string target = "/" + std::string(most + static_cast<size_t>(extra) - 1, 't');
    const auto answer = send_request(door.port(), get(target));
    EXPECT_EQ(answer.status, extra <= 0 ? 200 : 414) << extra << " bytes past the limit";
    expect_serving(service, door.port(), "a request line " + std::to_string(extra) + " bytes past the limit");
  }
}

// Bodies the door counts as they come (chunked: a Content-Length is the service's to
// judge, after the key; serve_checks.py has the server's): up to max_body_bytes served,
// past it 413. A Content-Length past 64 bits is "too large", not "not a number".
TEST(FrontDoor, BodiesAroundTheLimit) {
  door_harness::StubService service;
  serve::DoorOptions options;
  options.max_body_bytes = 4096;
  door_harness::RunningDoor door(service, options);
  for (const long extra : {-1L, 0L, 1L, 100000L}) {
    const size_t n = options.max_body_bytes + static_cast<size_t>(extra);
    std::string request = "POST /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n";
    for (size_t sent = 0; sent < n; sent += 1000) {
      const size_t piece = std::min<size_t>(1000, n - sent);
      char size[16];
      std::snprintf(size, sizeof(size), "%zx\r\n", piece);
      request += size + std::string(piece, 'b') + "\r\n";
    }
    request += "0\r\n\r\n";
    const auto answer = send_request(door.port(), request);
    EXPECT_EQ(answer.status, extra <= 0 ? 200 : 413) << n << " body bytes";
    if (answer.status == 200) {
      EXPECT_NE(answer.reply.find("\r\n\r\n" + std::to_string(n)), std::string::npos);
    }
    expect_serving(service, door.port(), std::to_string(n) + " body bytes");
  }
  const auto huge = send_request(door.port(),
                                 "POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 12345678901234567890123\r\n\r\n");
  EXPECT_EQ(huge.status, 413) << huge.reply;
  EXPECT_NE(huge.reply.find("too large"), std::string::npos) << huge.reply;
  EXPECT_EQ(huge.reply.find("not a number"), std::string::npos) << huge.reply;
  const auto words = send_request(door.port(), "POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: twelve\r\n\r\n");
  EXPECT_EQ(words.status, 400) << words.reply;
  EXPECT_NE(words.reply.find("not a number"), std::string::npos) << words.reply;
  expect_serving(service, door.port(), "Content-Lengths past 64 bits and of words");
}

// A handler that throws: a 500 naming it, logged once, and the door serves on.
TEST(FrontDoor, AHandlerThatThrowsGets500AndTheDoorServesOn) {
  door_harness::StubService service;
  door_harness::RunningDoor door(service, serve::DoorOptions{});
  const auto answer = send_request(door.port(), get("/throw"));
  EXPECT_EQ(answer.status, 500);
  EXPECT_NE(answer.reply.find("the handler failed"), std::string::npos) << answer.reply;
  EXPECT_EQ(service.internal_errors(), 1);
  EXPECT_EQ(send_request(door.port(), get("/after")).status, 200);
}

}  // namespace
