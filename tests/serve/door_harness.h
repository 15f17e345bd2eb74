#pragma once

// torchattn_serve's front door (apps/serve/front_door.h) alone, for its tests and its
// fuzzer: a Service that answers every request with its body's size (and throws on
// /throw, as a failing handler would), the door running on a thread of its own on a
// free loopback port, and a client that sends raw bytes and reads the answer.

#include "front_door.h"

#include <boost/asio/awaitable.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>

namespace door_harness {

class StubService final : public serve::Service {
 public:
  std::optional<serve::Reply> early(const serve::Request& /*head*/) override { return std::nullopt; }
  bool light(const serve::Request& /*head*/) const override { return true; }
  serve::net::awaitable<void> serve(serve::Exchange& exchange) override {
    if (exchange.request().target() == "/throw") throw std::runtime_error("the handler failed");
    const serve::Reply reply{200, "text/plain", std::to_string(exchange.request().body().size())};
    co_await exchange.reply(reply);
  }
  serve::Reply refusal(int status, const std::string& message, const std::string& code) const override {
    return serve::Reply{status, "text/plain", code + ": " + message};
  }
  void internal_error(const serve::Request& /*request*/, const std::string& what) override {
    const std::lock_guard<std::mutex> lock(mutex_);
    ++internal_errors_;
    last_error_ = what;
  }
  void answered(const std::string& /*remote*/, const serve::Request& /*request*/, int /*status*/,
                bool /*closed*/) override {}

  int internal_errors() const {
    const std::lock_guard<std::mutex> lock(mutex_);
    return internal_errors_;
  }
  std::string last_error() const {
    const std::lock_guard<std::mutex> lock(mutex_);
    return last_error_;
  }

 private:
  mutable std::mutex mutex_;
  int internal_errors_ = 0;
  std::string last_error_;
};

/// A door serving `service` on 127.0.0.1 (a free port) until destroyed.
class RunningDoor {
 public:
  RunningDoor(serve::Service& service, serve::DoorOptions options) : door_(service, options) {
    port_ = door_.bind("127.0.0.1", 0);
    thread_ = std::thread([this] { door_.run(); });
  }
  ~RunningDoor() {
    door_.stop();
    thread_.join();
  }
  RunningDoor(const RunningDoor&) = delete;
  RunningDoor& operator=(const RunningDoor&) = delete;

  int port() const { return port_; }

 private:
  serve::FrontDoor door_;
  int port_ = 0;
  std::thread thread_;
};

/// What came back for a request: its status (0: none, the connection closed or the
/// time ran out first), the whole reply, and whether the reply came within the time.
struct Answer {
  int status = 0;
  std::string reply;
  bool in_time = true;
};

/// Sends `bytes` on a new connection to 127.0.0.1:`port`, ends the sending side, and
/// reads until the server closes (or `seconds` pass). A server that closes before
/// taking every byte is not an error: its answer is read all the same.
inline Answer send_request(int port, const std::string& bytes, int seconds = 10) {
  Answer answer;
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("socket() failed");
  timeval tv{seconds, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in at{};
  at.sin_family = AF_INET;
  at.sin_port = htons(static_cast<uint16_t>(port));
  at.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&at), sizeof(at)) != 0) {
    ::close(fd);
    throw std::runtime_error("connect() to the door failed: the door is not serving");
  }
  // Sending and reading at once: a large request whose head is refused is answered
  // (and then drained by the door) before its last byte is sent.
  std::thread sender([&] {
    size_t sent = 0;
    while (sent < bytes.size()) {
      const ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) break;
      sent += static_cast<size_t>(n);
    }
    ::shutdown(fd, SHUT_WR);
  });
  char buffer[65536];
  for (;;) {
    const ssize_t n = ::recv(fd, buffer, sizeof(buffer), 0);
    if (n == 0) break;
    if (n < 0) {
      answer.in_time = errno != EAGAIN && errno != EWOULDBLOCK;
      break;
    }
    answer.reply.append(buffer, static_cast<size_t>(n));
  }
  ::shutdown(fd, SHUT_RDWR);
  sender.join();
  ::close(fd);
  if (answer.reply.rfind("HTTP/1.1 ", 0) == 0 && answer.reply.size() >= 12) {
    answer.status = std::atoi(answer.reply.substr(9, 3).c_str());
  }
  return answer;
}

}  // namespace door_harness
