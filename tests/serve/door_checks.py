#!/usr/bin/env python3
"""torchattn_serve's front door against clients that try to hold it (ctest -R serve_door).

A server with --max-connections 64 and --timeout 2 (heads within 2 s, bodies within 6 s,
idle connections closed after 6 s), then:

- 500 half-open connections held: /health and /v1/models answer within 1 s, and the
  oldest of the 500 are the ones closed;
- a request line of 1 GB sent as fast as the server takes it: 414 or a closed
  connection, the peak resident memory grown by at most 16 MiB;
- a request line of 9 KiB: 414; a header of 2 MiB and 70 KiB of small headers: 431;
- one header value just under, at and past the 64 KiB of headers and the 65533 bytes a
  field holds, and far past: 200 or 431, the server serving after each; a POST with no
  length (411), Transfer-Encoding: gzip (415), a Content-Length past 64 bits (413);
- a head that stops coming, and one that comes a byte at a time: closed once the head's
  time is up (2 s), not later;
- a body that stops coming: closed after the body's time (6 s); a connection idle after
  an answer: closed after 6 s;
- 64 connections each busy with a request (a body still coming): /health still answers
  on a spare connection, a completion there gets 503 naming the cap, and idle spare
  connections are closed by newer ones.

Usage: door_checks.py --server build/apps/serve/torchattn_serve --model .cache/smollm2
"""

import argparse
import os
import select
import socket
import sys
import threading
import time

from serve_process import Checks, ServerProcess

KEY = "door-key"
CAP = 64
TIMEOUT = 2
check = Checks("door")


class Server(ServerProcess):
    def __init__(self, exe, model, log_dir):
        super().__init__([exe, model, "--port", "0", "--api-key", KEY, "--max-connections", str(CAP), "--timeout",
                          str(TIMEOUT), "--kv-tokens", "4096"],
                         open(os.path.join(log_dir, f"door-{os.getpid()}.log"), "w"), "door")

    def connect(self, timeout=30):
        return socket.create_connection(("127.0.0.1", self.port), timeout=timeout)


    def reset_peak(self):
        try:
            with open(f"/proc/{self.proc.pid}/clear_refs", "w") as f:
                f.write("5")  # resets VmHWM
            return "VmHWM"
        except OSError:
            return "VmRSS"



def status_of(reply):
    return int(reply.split(b" ", 2)[1]) if reply.startswith(b"HTTP/1.1 ") else None


def exchange(sock, request, timeout=30):
    """Sends `request` and reads until the server closes or a whole small reply came."""
    sock.settimeout(timeout)
    sock.sendall(request)
    reply = b""
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                break
            reply += data
            head, _, body = reply.partition(b"\r\n\r\n")
            if _ and b"content-length: " in head.lower():
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                if len(body) >= length:
                    break
    except OSError:
        pass
    return reply


def timed_get(srv, path, key=True):
    start = time.time()
    sock = srv.connect()
    auth = f"Authorization: Bearer {KEY}\r\n" if key else ""
    reply = exchange(sock, f"GET {path} HTTP/1.1\r\nHost: x\r\n{auth}\r\n".encode())
    sock.close()
    return status_of(reply), time.time() - start


def closed_after(sock, limit):
    """Seconds until the server closes `sock` (reading and dropping what it sends), or None."""
    start = time.time()
    sock.settimeout(limit)
    try:
        while sock.recv(65536):
            pass
    except socket.timeout:
        return None
    except OSError:
        pass
    return time.time() - start


def half_open(srv, count=500):
    socks = []
    for i in range(count):
        s = srv.connect()
        if i % 2:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")  # a head that never ends
        socks.append(s)
    time.sleep(0.2)
    status, took = timed_get(srv, "/health", key=False)
    check(status == 200 and took < 1, f"{count} half-open connections held: /health {status} in {took:.3f} s")
    status, took = timed_get(srv, "/v1/models")
    check(status == 200 and took < 1, f"{count} half-open connections held: /v1/models {status} in {took:.3f} s")

    readable, _, _ = select.select(socks, [], [], 0.2)  # closed ones read as the end (or a reset)
    closed = [s in readable for s in socks]
    oldest, newest = sum(closed[:count - CAP]), sum(closed[count - CAP + 2:])
    check(oldest == count - CAP and newest == 0,
          f"the oldest are closed: {oldest} of the first {count - CAP}, {newest} of the last {CAP - 2}")
    for s in socks:
        s.close()


def long_line(srv, total=1 << 30):
    field = srv.reset_peak()
    before = srv.status_mib(field)
    sock = srv.connect()
    piece = b"a" * (1 << 20)
    sent = 0
    reply = b""
    try:
        sock.sendall(b"GET /" + piece)
        sent += len(piece)
        while sent < total:
            sock.sendall(piece)
            sent += len(piece)
            sock.setblocking(False)
            try:
                data = sock.recv(65536)
                reply += data
                break
            except BlockingIOError:
                pass
            finally:
                sock.setblocking(True)
    except OSError:
        pass
    sock.settimeout(10)
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                break
            reply += data
    except OSError:
        pass
    sock.close()
    grew = srv.status_mib(field) - before
    status = status_of(reply)
    check(status in (414, None) and grew <= 16,
          f"a 1 GB request line: {status or 'closed'} after {sent >> 20} MiB sent, peak resident memory "
          f"+{grew:.1f} MiB")


def big_heads(srv):
    reply = exchange(srv.connect(), b"GET /health?" + b"a" * (9 << 10) + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    check(status_of(reply) == 414 and b"8192" in reply, f"a 9 KiB request line: {status_of(reply)}")
    sock = srv.connect()
    reply = exchange(sock, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * (2 << 20) + b"\r\n\r\n")
    sock.close()
    check(status_of(reply) == 431, f"a 2 MiB header: {status_of(reply)}")
    many = b"".join(b"X-H%d: %s\r\n" % (i, b"c" * 90) for i in range(700))  # 70 KiB
    reply = exchange(srv.connect(), b"GET /health HTTP/1.1\r\nHost: x\r\n" + many + b"\r\n")
    check(status_of(reply) == 431 and b"65536" in reply, f"70 KiB of headers: {status_of(reply)}")
    status, _ = timed_get(srv, "/health", key=False)
    check(status == 200, f"/health after them: {status}")


def field_limits(srv):
    """One header value around every size that matters (the 64 KiB of headers, the 65533
    bytes Beast's fields hold, far past both): 431 past the limit, and the server serving
    after each (a value of about 64 KiB once ended the process); then the refusals of a
    POST's body that need no body: 411, 415, and a Content-Length past 64 bits."""
    host = b"Host: x\r\n"
    # header_bytes = 2 + (4 + 1 + 4) "Host: x" + (5 + n + 4) "X-Big: ..." = 20 + n
    for n in [65515, 65516, 65517, 65533, 65534, 65535, 65536, 70000, 73728, 1 << 20]:
        reply = exchange(srv.connect(), b"GET /health HTTP/1.1\r\n" + host + b"X-Big: " + b"v" * n + b"\r\n\r\n")
        want = 200 if 20 + n <= 65536 else 431
        status, _ = timed_get(srv, "/health", key=False)
        check(status_of(reply) == want and status == 200,
              f"a header value of {n} bytes: {status_of(reply)} (expected {want}), then /health {status}")
    post = f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
    reply = exchange(srv.connect(), (post + "\r\n").encode())
    check(status_of(reply) == 411 and b"length_required" in reply and b"Content-Length" in reply,
          f"a POST without Content-Length or a chunked body: {status_of(reply)}")
    reply = exchange(srv.connect(), (post + "Transfer-Encoding: gzip\r\n\r\nabcd").encode())
    check(status_of(reply) == 415 and b"Transfer-Encoding 'gzip'" in reply,
          f"Transfer-Encoding: gzip: {status_of(reply)} {reply[-200:]!r}")
    reply = exchange(srv.connect(), (post + "Content-Length: 12345678901234567890123\r\n\r\n").encode())
    check(status_of(reply) == 413 and b"too large" in reply and b"not a number" not in reply,
          f"a 23-digit Content-Length: {status_of(reply)} {reply[-200:]!r}")
    status, _ = timed_get(srv, "/v1/models")
    check(status == 200, f"/v1/models after them: {status}")


def timeouts(srv):
    sock = srv.connect()
    sock.sendall(b"GET /health HTTP/1.1\r\n")
    took = closed_after(sock, 10)
    sock.close()
    check(took is not None and TIMEOUT - 0.5 < took < TIMEOUT + 1.5,
          f"a head that stops coming: closed after {took if took is None else round(took, 2)} s")

    sock = srv.connect()
    start = time.time()
    result = {}

    def drip():
        try:
            for byte in b"GET /health HTTP/1.1\r\nX-Slow: " + b"z" * 100:
                sock.sendall(bytes([byte]))
                time.sleep(0.2)
        except OSError:
            result["closed"] = time.time() - start

    t = threading.Thread(target=drip)
    t.start()
    t.join()
    took = result.get("closed")
    check(took is not None and took < TIMEOUT + 1.5,
          f"a head a byte each 0.2 s: closed after {took if took is None else round(took, 2)} s")
    sock.close()

    sock = srv.connect()
    sock.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
                  "Content-Length: 100\r\n\r\n{\"model\"").encode())
    took = closed_after(sock, 20)
    sock.close()
    check(took is not None and 3 * TIMEOUT - 0.5 < took < 3 * TIMEOUT + 1.5,
          f"a body that stops coming: closed after {took if took is None else round(took, 2)} s")

    sock = srv.connect()
    reply = exchange(sock, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    took = closed_after(sock, 20)
    sock.close()
    check(status_of(reply) == 200 and took is not None and 3 * TIMEOUT - 0.5 < took < 3 * TIMEOUT + 1.5,
          f"a connection idle after its answer: closed after {took if took is None else round(took, 2)} s")


def busy_cap(srv):
    busy = []
    for _ in range(CAP):
        s = srv.connect()
        s.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
                   "Content-Length: 1000\r\n\r\n{").encode())
        busy.append(s)
    time.sleep(0.3)
    status, took = timed_get(srv, "/health", key=False)
    check(status == 200 and took < 1, f"{CAP} connections busy with a request: /health {status} in {took:.3f} s")
    body = '{"model": "smollm2", "prompt": "Hi", "max_tokens": 2}'
    reply = exchange(srv.connect(), (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
                                     f"Content-Length: {len(body)}\r\n\r\n{body}").encode())
    check(status_of(reply) == 503 and b"too_many_connections" in reply and b"64" in reply,
          f"{CAP} busy: a completion gets {status_of(reply)}")
    spares = [srv.connect() for _ in range(16)]
    time.sleep(0.3)
    extra = srv.connect()
    time.sleep(0.3)
    readable, _, _ = select.select(spares + [extra], [], [], 0.2)
    check(readable == spares, f"{CAP} busy, then 17 idle connections: each closed by the next, the last held "
          f"(closed: {[i for i, s in enumerate(spares + [extra]) if s in readable]})")
    status, took = timed_get(srv, "/health", key=False)
    check(status == 200 and took < 1, f"then /health: {status} in {took:.3f} s")
    for s in busy + spares + [extra]:
        s.close()
    time.sleep(0.5)
    status, _ = timed_get(srv, "/v1/models")
    check(status == 200, f"once they leave: /v1/models {status}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--log-dir", default=".")
    a = ap.parse_args()
    srv = Server(a.server, a.model, a.log_dir)
    try:
        half_open(srv)
        long_line(srv)
        big_heads(srv)
        field_limits(srv)
        timeouts(srv)
        busy_cap(srv)
    finally:
        code = srv.stop()
    check(code == 0, f"SIGTERM: exit {code}")
    return check.finish()


if __name__ == "__main__":
    sys.exit(main())
