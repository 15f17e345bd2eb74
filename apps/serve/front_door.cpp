#include "front_door.h"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/chunk_encode.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/serializer.hpp>
#include <boost/beast/http/write.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <stdexcept>
#include <tuple>

namespace serve {

namespace beast = boost::beast;
using tcp = net::ip::tcp;
using beast::error_code;

namespace {

constexpr auto tuple_awaitable = net::as_tuple(net::use_awaitable);

// Why `host`:`port` cannot be listened on, in words.
std::string why_not_listen(const std::string& host, int port, const error_code& ec, bool resolving) {
  std::string why = "cannot listen on " + host + ":" + std::to_string(port);
  if (resolving) return why + ": '" + host + "' is not an address or a name that resolves (" + ec.message() + ")";
  if (ec == net::error::address_in_use) return why + ": the port is in use (another program listens there)";
  if (ec.value() == EADDRNOTAVAIL) return why + ": '" + host + "' is not an address of this machine";
  if (ec == net::error::access_denied) return why + ": permission denied (ports below 1024 need privileges)";
  return why + ": " + ec.message();
}

// A connection's end closed by the client, the timeout, or the door: nothing to answer.
bool is_gone(const error_code& ec) {
  return ec == net::error::eof || ec == http::error::end_of_stream || ec == http::error::partial_message ||
         ec == beast::error::timeout || ec == net::error::operation_aborted || ec == net::error::connection_reset ||
         ec == net::error::broken_pipe || ec == net::error::bad_descriptor;
}

// Beast's request parser with each field's name and value bounded before they are
// stored. Beast's fields hold at most kMaxFieldBytes each and throw std::length_error
// past it from inside the read, on the io_context's thread where no coroutine's try
// reaches (the process would end): here such a field is the parse error header_limit,
// answered 431 as any head past the limits.
class RequestParser final : public http::request_parser<http::string_body> {
 public:
  static constexpr size_t kMaxFieldBytes = 65533;

 private:
  void on_field_impl(http::field name, beast::string_view name_string, beast::string_view value,
                     error_code& ec) override {
    if (name_string.size() > kMaxFieldBytes || value.size() > kMaxFieldBytes) {
      ec = http::error::header_limit;
      return;
    }
    try {
      get().insert(name, name_string, value);
    } catch (const std::exception&) {  // out of memory: refused as too large, never thrown into the io_context
      ec = http::error::header_limit;
    }
  }
};

// The value of the first Content-Length field in `data` (what is left of the raw head:
// the parser may have taken its first lines), trimmed, or empty.
std::string_view raw_content_length(std::string_view data) {
  static constexpr std::string_view name = "content-length:";
  for (size_t at = 0; at < data.size();) {
    const size_t end = std::min(data.find("\r\n", at), data.size());
    const std::string_view line = data.substr(at, end - at);
    at = end + 2;
    if (line.empty()) break;  // the head's end
    if (line.size() < name.size() || !beast::iequals(line.substr(0, name.size()), name)) continue;
    std::string_view value = line.substr(name.size());
    while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
    while (!value.empty() && (value.back() == ' ' || value.back() == '\t')) value.remove_suffix(1);
    return value;
  }
  return {};
}

bool all_digits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
}

bool expects_continue(const Request& head) {
  const auto expect = head[http::field::expect];
  return expect.size() == 12 && beast::iequals(expect, "100-continue");
}

}  // namespace

bool may_have_body(const Request& head) {
  if (head.find(http::field::transfer_encoding) != head.end()) return true;
  const auto length = head.find(http::field::content_length);
  return length != head.end() && length->value() != "0";
}

// ---- Exchange ----

bool Exchange::write_done(bool ok) {
  stream_.expires_never();
  if (!ok) ok_ = false;
  return ok;
}

net::awaitable<bool> Exchange::reply(const Reply& reply) {
  http::response<http::string_body> res{static_cast<http::status>(reply.status), 11};
  res.set(http::field::content_type, reply.content_type);
  res.body() = reply.body;
  res.keep_alive(keep_alive());
  res.prepare_payload();
  status_ = reply.status;
  http::response_serializer<http::string_body> writer{res};
  stream_.expires_after(write_timeout_);
  error_code ec;
  if (request_.method() == http::verb::head) {
    std::tie(ec, std::ignore) = co_await http::async_write_header(stream_, writer, tuple_awaitable);
  } else {
    std::tie(ec, std::ignore) = co_await http::async_write(stream_, writer, tuple_awaitable);
  }
  co_return write_done(!ec);
}

net::awaitable<bool> Exchange::begin_stream(const std::string& content_type,
                                            const std::vector<std::pair<std::string, std::string>>& headers) {
  http::response<http::empty_body> res{http::status::ok, 11};
  res.set(http::field::content_type, content_type);
  for (const auto& [name, value] : headers) res.set(name, value);
  res.chunked(true);
  res.keep_alive(keep_alive());
  status_ = 200;
  http::response_serializer<http::empty_body> writer{res};
  stream_.expires_after(write_timeout_);
  const auto [ec, n] = co_await http::async_write_header(stream_, writer, tuple_awaitable);
  co_return write_done(!ec);
}

net::awaitable<bool> Exchange::send(std::string_view data) {
  if (!ok_) co_return false;
  stream_.expires_after(write_timeout_);
  const auto chunk = http::make_chunk(net::buffer(data.data(), data.size()));
  const auto [ec, n] = co_await net::async_write(stream_, chunk, tuple_awaitable);
  co_return write_done(!ec);
}

net::awaitable<bool> Exchange::end_stream() {
  if (!ok_) co_return false;
  stream_.expires_after(write_timeout_);
  const auto last = http::make_chunk_last();
  const auto [ec, n] = co_await net::async_write(stream_, last, tuple_awaitable);
  co_return write_done(!ec);
}

// ---- the door ----

namespace {

struct Connection {
  explicit Connection(tcp::socket socket) : stream(std::move(socket)) {}
  beast::tcp_stream stream;
  bool waiting = true;  // for a request (idle, or its head still coming): may be closed for a new one
  bool spare = false;   // let in past the cap, for the light routes
  bool evicted = false;
  bool answered = false;  // the current request's answer (or refusal) begun
  std::list<std::shared_ptr<Connection>>::iterator at;
};

}  // namespace

struct FrontDoor::Impl {
  Impl(Service& s, DoorOptions o) : service(s), options(o) {}

  Service& service;
  DoorOptions options;
  net::io_context io;
  tcp::acceptor acceptor{io};
  std::list<std::shared_ptr<Connection>> connections;  // oldest first
  int spares = 0;
  bool stopping = false;  // on the door's thread
  std::atomic<bool> serving{false};

  net::awaitable<void> accept_loop();
  net::awaitable<void> session(std::shared_ptr<Connection> c);
  // One request on `c`: its head and body read, then answered (or refused). Whether
  // the connection serves another.
  net::awaitable<bool> exchange_one(Connection& c, const std::string& remote, beast::flat_buffer& buffer, bool first);
  // The refusal of a request, written, then the connection closed (its unread rest
  // read and dropped for at most 2 s, so that the client reads the answer, not a reset).
  net::awaitable<void> refuse(Connection& c, const std::string& remote, const Request& request, const Reply& reply);
  // Whether a connection over the cap may come in: the oldest waiting one closed for
  // it, else a spare (`spare` set), else none.
  bool make_room(bool& spare);
  // The refusals of a head past the limits: 414 and 431.
  Reply line_too_long() const {
    return service.refusal(414, "the request line is longer than " + std::to_string(options.max_line_bytes) + " bytes",
                           "request_line_too_long");
  }
  Reply headers_too_large() const {
    return service.refusal(431,
                           "the request's headers are larger than " + std::to_string(options.max_header_bytes) +
                               " bytes",
                           "headers_too_large");
  }

  // What escaped a connection's coroutine or a handler, to the service's log.
  void report(const std::exception_ptr& failure) {
    std::string what;
    try {
      std::rethrow_exception(failure);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
      what = "an exception that is not a std::exception";
    }
    const Request none;
    service.internal_error(none, what);
  }

  static void close(Connection& c) {
    error_code ignored;
    c.stream.socket().shutdown(tcp::socket::shutdown_both, ignored);
    c.stream.close();
  }
};

bool FrontDoor::Impl::make_room(bool& spare) {
  spare = false;
  if (static_cast<int>(connections.size()) - spares < options.max_connections) return true;
  for (auto it = connections.begin(); it != connections.end(); ++it) {
    Connection& c = **it;
    if (!c.waiting) continue;
    c.evicted = true;
    if (c.spare) --spares;
    close(c);
    connections.erase(it);
    return true;
  }
  if (spares >= options.spare_connections) return false;
  spare = true;
  return true;
}

net::awaitable<void> FrontDoor::Impl::accept_loop() {
  net::steady_timer pause(io);
  while (!stopping) {
    auto [ec, socket] = co_await acceptor.async_accept(tuple_awaitable);
    if (stopping) break;
    if (ec) {
      if (ec == net::error::no_descriptors || ec == net::error::no_buffer_space) {
        pause.expires_after(std::chrono::milliseconds(50));  // out of descriptors: let some close
        co_await pause.async_wait(tuple_awaitable);
      }
      continue;
    }
    bool spare = false;
    if (!make_room(spare)) continue;  // the socket closes here
    error_code ignored;
    socket.set_option(tcp::no_delay(true), ignored);
    auto c = std::make_shared<Connection>(std::move(socket));
    c->spare = spare;
    if (spare) ++spares;
    connections.push_back(c);
    c->at = std::prev(connections.end());
    // Whatever escapes a connection's coroutine ends it, logged, never the door.
    net::co_spawn(io, session(std::move(c)), [this](const std::exception_ptr& failure) {
      if (failure) report(failure);
    });
  }
}

net::awaitable<void> FrontDoor::Impl::refuse(Connection& c, const std::string& remote, const Request& request,
                                             const Reply& reply) {
  c.answered = true;
  Exchange exchange(c.stream, request, remote, /*closing=*/true, options.write_timeout);
  co_await exchange.reply(reply);
  service.answered(remote, request, reply.status, true);
  error_code ignored;
  c.stream.socket().shutdown(tcp::socket::shutdown_send, ignored);
  std::array<char, 1 << 16> sink;
  c.stream.expires_after(std::chrono::seconds(2));
  for (;;) {
    const auto [ec, n] = co_await c.stream.async_read_some(net::buffer(sink), tuple_awaitable);
    if (ec) break;
  }
}

net::awaitable<void> FrontDoor::Impl::session(std::shared_ptr<Connection> c) {
  struct Leave {
    Impl& door;
    Connection& c;
    ~Leave() {
      if (c.evicted) return;
      if (c.spare) --door.spares;
      door.connections.erase(c.at);
      close(c);
    }
  } leave{*this, *c};
  auto& stream = c->stream;
  std::string remote;
  {
    error_code ec;
    const auto peer = stream.socket().remote_endpoint(ec);
    if (ec) co_return;
    remote = peer.address().to_string() + ":" + std::to_string(peer.port());
  }
  beast::flat_buffer buffer(options.max_line_bytes + options.max_header_bytes + (64 << 10));
  for (bool first = true; !stopping; first = false) {
    c->answered = false;
    bool more = false;
    std::string failure;  // what the door itself threw (the service's throws are caught in exchange_one)
    try {
      more = co_await exchange_one(*c, remote, buffer, first);
    } catch (const std::exception& e) {
      failure = e.what();
    } catch (...) {
      failure = "unknown error";
    }
    if (!failure.empty()) {
      // The connection's edge: logged, a 500 where nothing was written, and the
      // connection's end; the server serves on.
      const Request none;
      service.internal_error(none, failure);
      if (!c->answered) {
        const Reply reply = service.refusal(500, "internal error: " + failure, "");
        co_await refuse(*c, remote, none, reply);
      }
      break;
    }
    if (!more) break;
  }
  error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_send, ignored);
}

net::awaitable<bool> FrontDoor::Impl::exchange_one(Connection& c, const std::string& remote, beast::flat_buffer& buffer,
                                                   bool first) {
  auto& stream = c.stream;
  const size_t head_limit = options.max_line_bytes + options.max_header_bytes;
  const Request none;
  c.waiting = true;
  if (buffer.size() == 0) {  // the idle time before a request
    stream.expires_after(first || c.spare ? options.header_timeout : options.idle_timeout);
    const auto [ec, n] = co_await stream.async_read_some(buffer.prepare(4096), tuple_awaitable);
    if (ec) co_return false;
    buffer.commit(n);
  }
  RequestParser parser;
  parser.header_limit(static_cast<std::uint32_t>(head_limit));
  parser.body_limit(boost::none);  // a Content-Length is for early() to judge, after the key
  stream.expires_after(options.header_timeout);
  if (const auto [ec, n] = co_await http::async_read_header(stream, buffer, parser, tuple_awaitable); ec) {
    if (ec == beast::error::timeout) service.answered(remote, none, 408, true);  // logged; the socket is closed
    if (is_gone(ec)) co_return false;
    const std::string_view data(static_cast<const char*>(buffer.data().data()), buffer.size());
    Reply refusal;
    if (ec == http::error::header_limit || ec == http::error::buffer_overflow) {
      // The parser may have taken the request line from the buffer already.
      const bool long_line = parser.get().target().empty() &&
                             data.substr(0, options.max_line_bytes + 2).find("\r\n") == std::string_view::npos;
      refusal = long_line ? line_too_long() : headers_too_large();
    } else if (ec == http::error::bad_content_length && all_digits(raw_content_length(data))) {
      // A number past 64 bits: a body too large for any limit.
      refusal = service.refusal(413,
                                "the request body is larger than " + std::to_string(options.max_body_bytes) +
                                    " bytes (Content-Length " + std::string(raw_content_length(data).substr(0, 40)) +
                                    " is too large)",
                                "request_too_large");
    } else if (ec == http::error::bad_content_length) {
      refusal = service.refusal(400, "the Content-Length header is not a number", "invalid_request");
    } else {
      refusal = service.refusal(400, "the request could not be read: " + ec.message(), "invalid_request");
    }
    co_await refuse(c, remote, none, refusal);
    co_return false;
  }
  c.waiting = false;
  const Request& head = parser.get();
  // A head under the parser's limit (line and headers together) may still pass one of them.
  size_t header_bytes = 2;
  for (const auto& field : head) header_bytes += field.name_string().size() + field.value().size() + 4;
  const bool long_line = head.method_string().size() + head.target().size() + 11 > options.max_line_bytes;
  if (long_line || header_bytes > options.max_header_bytes) {
    const Reply refusal = long_line ? line_too_long() : headers_too_large();
    co_await refuse(c, remote, head, refusal);
    co_return false;
  }
  if (c.spare && !service.light(head)) {
    const Reply refusal = service.refusal(503,
                                          "the server holds its most connections (" +
                                              std::to_string(options.max_connections) + "), each busy; try again",
                                          "too_many_connections");
    co_await refuse(c, remote, head, refusal);
    co_return false;
  }
  if (auto early = service.early(head)) {
    if (may_have_body(head)) {
      co_await refuse(c, remote, head, *early);
      co_return false;
    }
    Exchange exchange(stream, head, remote, c.spare, options.write_timeout);
    c.answered = true;
    co_await exchange.reply(*early);
    service.answered(remote, head, early->status, !exchange.keep_alive());
    co_return exchange.keep_alive();
  }
  if (!parser.is_done()) {
    if (expects_continue(head)) {
      static constexpr std::string_view go_on = "HTTP/1.1 100 Continue\r\n\r\n";
      stream.expires_after(options.write_timeout);
      if (const auto [ec, n] = co_await net::async_write(stream, net::buffer(go_on), tuple_awaitable); ec) {
        co_return false;
      }
    }
    parser.body_limit(options.max_body_bytes);
    stream.expires_after(options.body_timeout);
    if (const auto [ec, n] = co_await http::async_read(stream, buffer, parser, tuple_awaitable); ec) {
      Reply refusal;
      if (ec == http::error::body_limit) {
        refusal = service.refusal(413,
                                  "the request body is larger than " + std::to_string(options.max_body_bytes) +
                                      " bytes",
                                  "request_too_large");
      } else if (ec != beast::error::timeout && ec != net::error::operation_aborted) {
        refusal = service.refusal(400,
                                  "the request body could not be read (malformed chunked encoding, or the client "
                                  "left): " +
                                      ec.message(),
                                  "invalid_request");
      }
      if (refusal.status != 200) co_await refuse(c, remote, head, refusal);
      if (ec == beast::error::timeout) service.answered(remote, head, 408, true);
      co_return false;
    }
  }
  stream.expires_never();
  const Request request = parser.release();
  Exchange exchange(stream, request, remote, c.spare, options.write_timeout);
  std::string failure;  // what the service threw: a 500 if nothing was written yet, and the end
  try {
    co_await service.serve(exchange);
  } catch (const std::exception& e) {
    failure = e.what();
  } catch (...) {
    failure = "unknown error";
  }
  c.answered = exchange.status() != 0;
  if (!failure.empty()) {
    service.internal_error(request, failure);
    if (!c.answered) {
      const Reply reply = service.refusal(500, "internal error: " + failure, "");
      co_await refuse(c, remote, request, reply);
    }
    co_return false;
  }
  service.answered(remote, request, exchange.status(), !exchange.keep_alive() || stopping);
  co_return exchange.keep_alive();
}

FrontDoor::FrontDoor(Service& service, DoorOptions options) : impl_(std::make_unique<Impl>(service, options)) {}

FrontDoor::~FrontDoor() = default;

int FrontDoor::bind(const std::string& host, int port) {
  tcp::resolver resolver(impl_->io);
  error_code ec;
  const auto found = resolver.resolve(host, std::to_string(port), tcp::resolver::passive, ec);
  if (ec || found.empty()) throw std::runtime_error(why_not_listen(host, port, ec, true));
  const tcp::endpoint at = found.begin()->endpoint();
  auto& acceptor = impl_->acceptor;
  acceptor.open(at.protocol(), ec);
  if (!ec) acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) acceptor.bind(at, ec);
  if (!ec) acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec) {
    acceptor.close();
    throw std::runtime_error(why_not_listen(host, port, ec, false));
  }
  return acceptor.local_endpoint().port();
}

void FrontDoor::run() {
  net::co_spawn(impl_->io, impl_->accept_loop(), [impl = impl_.get()](const std::exception_ptr& failure) {
    if (failure) impl->report(failure);
  });
  impl_->serving = true;
  // A handler that throws (inside a library's composed operation, where no coroutine's
  // try reaches) is logged and the door serves on: Asio's run() resumes after one.
  for (;;) {
    try {
      impl_->io.run();
      break;
    } catch (...) {
      impl_->report(std::current_exception());
    }
  }
  impl_->serving = false;
}

void FrontDoor::stop() {
  net::post(impl_->io, [impl = impl_.get()] {
    impl->stopping = true;
    error_code ignored;
    impl->acceptor.close(ignored);
    for (auto& c : impl->connections) {
      if (c->waiting) Impl::close(*c);
    }
  });
}

bool FrontDoor::running() const { return impl_->serving; }

net::any_io_executor FrontDoor::executor() { return impl_->io.get_executor(); }

}  // namespace serve
