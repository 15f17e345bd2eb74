#pragma once

// torchattn_serve's front door: HTTP/1.1 on Boost.Beast, every connection a coroutine
// on one thread, bounding what a client can make the server hold:
// - a request line of at most max_line_bytes (else 414) and a head of at most
//   max_header_bytes more (else 431; also a single field's name or value past the
//   65533 bytes Beast's fields hold), read within header_timeout of its first byte;
// - a body of at most max_body_bytes in any transfer encoding (else 413, the connection
//   closed), read within body_timeout; a Content-Length past it refused before any
//   body is read (and before 100 Continue invites one);
// - a connection idle between requests for idle_timeout is closed; one whose client
//   stops reading an answer for write_timeout is closed;
// - at most max_connections connections: past it a new one closes the oldest that is
//   waiting for a request (idle, or a head still coming), so that idle and half-open
//   clients can never lock the door; when every one is busy with a request, up to
//   spare_connections more are let in for the light routes (/health, /stats), the
//   others answered 503.
// A Service answers the requests; the door calls it on its thread and never blocks.

#include <boost/asio/awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace serve {

namespace net = boost::asio;
namespace http = boost::beast::http;

using Request = http::request<http::string_body>;

struct DoorOptions {
  size_t max_line_bytes = 8 << 10;
  size_t max_header_bytes = 64 << 10;
  size_t max_body_bytes = 1 << 20;
  std::chrono::milliseconds header_timeout{10'000};
  std::chrono::milliseconds body_timeout{30'000};
  std::chrono::milliseconds idle_timeout{30'000};
  std::chrono::milliseconds write_timeout{30'000};
  int max_connections = 256;
  int spare_connections = 16;
};

/// A whole answer.
struct Reply {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
};

/// Whether a body may follow the head (HTTP/1.1: a request with neither
/// Transfer-Encoding nor a Content-Length other than 0 has none).
bool may_have_body(const Request& head);

/// One request on a connection and the means to answer it: one whole reply, or a
/// stream of chunks. Lives on the door's thread; the awaitables run there.
class Exchange {
 public:
  Exchange(boost::beast::tcp_stream& stream, const Request& request, std::string remote, bool closing,
           std::chrono::milliseconds write_timeout)
      : stream_(stream), request_(request), remote_(std::move(remote)), closing_(closing),
        write_timeout_(write_timeout) {}

  const Request& request() const { return request_; }
  /// "ADDR:PORT" of the client.
  const std::string& remote() const { return remote_; }

  /// Writes `reply` (its head only for HEAD); false when the client is gone.
  net::awaitable<bool> reply(const Reply& reply);
  /// Writes the head of a chunked answer; false when the client is gone.
  net::awaitable<bool> begin_stream(const std::string& content_type,
                                    const std::vector<std::pair<std::string, std::string>>& headers);
  /// Writes one chunk of the stream; false when the client is gone.
  net::awaitable<bool> send(std::string_view data);
  /// Ends the stream; false when the client is gone.
  net::awaitable<bool> end_stream();

  /// The status written (0: none yet).
  int status() const { return status_; }
  /// Whether the connection may serve another request after this one.
  bool keep_alive() const { return ok_ && !closing_ && request_.keep_alive(); }

 private:
  bool write_done(bool ok);

  boost::beast::tcp_stream& stream_;
  const Request& request_;
  std::string remote_;
  bool closing_;
  std::chrono::milliseconds write_timeout_;
  int status_ = 0;
  bool ok_ = true;
};

/// What the door serves.
class Service {
 public:
  virtual ~Service() = default;
  /// The answer to a request that can be given from its head alone (before its body is
  /// read, and before 100 Continue invites one), or nothing.
  virtual std::optional<Reply> early(const Request& head) = 0;
  /// Whether `head` may be answered past the connection cap.
  virtual bool light(const Request& head) const = 0;
  /// Answers a whole request (its body read).
  virtual net::awaitable<void> serve(Exchange& exchange) = 0;
  /// The reply to a request the door refuses: `status`, the message, OpenAI's error code.
  virtual Reply refusal(int status, const std::string& message, const std::string& code) const = 0;
  /// What serve() threw for `request`, or the door itself while reading or answering
  /// one (`request` then empty): the door answers 500 if nothing was written, closes
  /// that connection and serves on. No exception ends the door.
  virtual void internal_error(const Request& request, const std::string& what) = 0;
  /// After each answer the door or the service wrote: `request` (empty when the head
  /// could not be read), its status, and whether the connection was then closed. A
  /// head or body that did not come in time comes as 408, closed (nothing is written:
  /// the socket is closed at the deadline).
  virtual void answered(const std::string& remote, const Request& request, int status, bool closed) = 0;
};

class FrontDoor {
 public:
  FrontDoor(Service& service, DoorOptions options);
  ~FrontDoor();

  /// Binds and listens; returns the port (a free one when `port` is 0). Throws
  /// std::runtime_error saying why when it cannot (the name does not resolve, the port
  /// is in use, the address is not this machine's). The socket takes SO_REUSEADDR only,
  /// never SO_REUSEPORT: a second server cannot share the port.
  int bind(const std::string& host, int port);

  /// Serves on the calling thread until stop() and every connection's end.
  void run();

  /// From any thread: no new connection is taken, idle ones close, and a busy one
  /// closes after its answer.
  void stop();

  /// Whether run() is serving.
  bool running() const;

  /// The executor the door runs on (for a service's timers).
  net::any_io_executor executor();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace serve
