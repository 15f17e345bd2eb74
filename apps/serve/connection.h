#pragma once

// What cpp-httplib (0.11, Debian's) leaves out at the server's front door: binding a
// port that no other socket shares, saying why a bind failed, and closing a connection
// whose request body was not read (a body over the limit, a method that takes none),
// so that its remaining bytes are never parsed as the next request.

#include <httplib.h>

#include <string>

namespace serve {

/// The listening socket's options in place of httplib's default (which sets
/// SO_REUSEPORT on POSIX, so that a second server could bind the same port and take
/// part of its connections): SO_REUSEADDR only on POSIX (a restart may bind a port
/// whose old connections linger in TIME_WAIT, but not one a live socket listens on),
/// SO_EXCLUSIVEADDRUSE on Windows.
void exclusive_bind_options(socket_t sock);

/// Why `host`:`port` cannot be listened on, in words, found by trying it once more:
/// the name does not resolve, the port is in use, the address is not this machine's,
/// or the system's own message.
std::string why_not_listen(const std::string& host, int port);

/// Ends the connection of `req` once its response is written (httplib's logger runs
/// then), so that the rest of an unread body is never parsed as a new request: the
/// response is followed by the end of the stream; what the client still sends is read
/// and dropped for at most `linger_ms` (a client that sends its whole body before it
/// reads, as most do, then reads the response instead of a reset; nothing is kept);
/// then the socket is closed under httplib, whose loop sees the end of its input.
/// POSIX only (a no-op elsewhere); false when the connection was not found.
bool end_connection(const httplib::Request& req, int linger_ms = 2000);

}  // namespace serve
