#include "connection.h"

#include <cerrno>
#include <cstring>

#ifndef _WIN32
#include <dirent.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#endif

namespace serve {

void exclusive_bind_options(socket_t sock) {
  int yes = 1;
#ifdef _WIN32
  setsockopt(sock, SOL_SOCKET, SO_EXCLUSIVEADDRUSE, reinterpret_cast<const char*>(&yes), sizeof(yes));
#else
  setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
#endif
}

std::string why_not_listen(const std::string& host, int port) {
#ifdef _WIN32
  return "cannot listen on " + host + ":" + std::to_string(port);
#else
  const std::string where = host + ":" + std::to_string(port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0) {
    return "cannot listen on " + where + ": '" + host + "' is not an address or a name that resolves (" +
           gai_strerror(rc) + ")";
  }
  std::string why = "cannot listen on " + where;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int sock = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (sock < 0) continue;
    exclusive_bind_options(sock);
    int err = 0;
    if (bind(sock, a->ai_addr, a->ai_addrlen) != 0 || listen(sock, 1) != 0) err = errno;
    close(sock);
    if (err == EADDRINUSE) {
      why += ": the port is in use (another program listens there)";
    } else if (err == EADDRNOTAVAIL) {
      why += ": '" + host + "' is not an address of this machine";
    } else if (err == EACCES) {
      why += ": permission denied (ports below 1024 need privileges)";
    } else if (err != 0) {
      why += std::string(": ") + std::strerror(err);
    } else {
      why += " (it was free when tried again)";
    }
    break;
  }
  freeaddrinfo(found);
  return why;
#endif
}

#ifndef _WIN32
namespace {

// The numeric address and port of a socket's end, as httplib writes them.
bool endpoint(int fd, bool peer, std::string& addr, int& port) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  auto* sa = reinterpret_cast<sockaddr*>(&ss);
  if ((peer ? getpeername(fd, sa, &len) : getsockname(fd, sa, &len)) != 0) return false;
  char host[NI_MAXHOST], serv[NI_MAXSERV];
  if (getnameinfo(sa, len, host, sizeof(host), serv, sizeof(serv), NI_NUMERICHOST | NI_NUMERICSERV) != 0) return false;
  addr = host;
  port = std::atoi(serv);
  return true;
}

bool is_connection_of(int fd, const httplib::Request& req) {
  std::string local, remote;
  int local_port = 0, remote_port = 0;
  return endpoint(fd, false, local, local_port) && local_port == req.local_port && local == req.local_addr &&
         endpoint(fd, true, remote, remote_port) && remote_port == req.remote_port && remote == req.remote_addr;
}

// The socket whose two ends are the request's, or -1: the process's open descriptors
// from /proc, or every number up to the limit where there is no /proc.
int socket_of(const httplib::Request& req) {
  if (DIR* dir = opendir("/proc/self/fd")) {
    int found = -1;
    while (dirent* e = readdir(dir)) {
      char* end = nullptr;
      const long fd = std::strtol(e->d_name, &end, 10);
      if (end != e->d_name && *end == '\0' && is_connection_of(static_cast<int>(fd), req)) {
        found = static_cast<int>(fd);
        break;
      }
    }
    closedir(dir);
    return found;
  }
  const long limit = std::min<long>(sysconf(_SC_OPEN_MAX), 1 << 16);
  for (int fd = 0; fd < limit; ++fd) {
    if (is_connection_of(fd, req)) return fd;
  }
  return -1;
}

}  // namespace
#endif

bool end_connection(const httplib::Request& req, int linger_ms) {
#ifdef _WIN32
  return false;
#else
  const int fd = socket_of(req);
  if (fd < 0) return false;
  shutdown(fd, SHUT_WR);  // the response, then the end of the stream
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + std::chrono::milliseconds(linger_ms);
  char sink[1 << 16];
  for (auto now = Clock::now(); now < deadline; now = Clock::now()) {
    pollfd p{fd, POLLIN, 0};
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count();
    if (poll(&p, 1, static_cast<int>(left) + 1) <= 0) break;
    const ssize_t n = recv(fd, sink, sizeof(sink), 0);
    if (n <= 0) break;  // the client is done
  }
  // Closes the socket (the number now names /dev/null, which httplib closes in turn):
  // its next read fails and its loop over the connection's requests ends.
  const int null = open("/dev/null", O_RDWR | O_CLOEXEC);
  if (null < 0) return shutdown(fd, SHUT_RDWR) == 0;
  const bool done = dup2(null, fd) == fd;
  close(null);
  return done;
#endif
}

}  // namespace serve
