#!/usr/bin/env python3
"""Seeds for fuzz_front_door (make fuzz): requests whose header values, field names,
request lines and bodies are just under, at, just over and far over each limit of the
front door (apps/serve/front_door.h: a line of 8 KiB, headers of 64 KiB, a field of
65533 bytes as Beast holds it, a body of 1 MiB), and a few of the usual shapes (chunked,
pipelined, 100-continue, a Content-Length past 64 bits).

Each seed is written in fuzz_front_door's input form: 0xFF N2 N1 N0 C stands for the
byte C repeated N times.

Usage: door_seeds.py OUT_DIR
"""

import hashlib
import os
import sys

LINE = 8 << 10
HEADERS = 64 << 10
FIELD = 65533
BODY = 1 << 20


def run(n, c=b"v"):
    """C repeated n times, in the fuzzer's form."""
    return b"\xff" + n.to_bytes(3, "big") + c


def around(limit):
    return [limit - 1, limit, limit + 1, limit * 4]


def seeds():
    out = []
    host = b"Host: a\r\n"
    for n in around(HEADERS - 20) + around(FIELD) + [HEADERS, HEADERS + LINE]:
        out.append(b"GET /x HTTP/1.1\r\n" + host + b"X-Big: " + run(n) + b"\r\n\r\n")
    for n in around(FIELD):
        out.append(b"GET /x HTTP/1.1\r\n" + host + b"X" + run(n - 1, b"n") + b": v\r\n\r\n")
    for n in around(LINE - 14):
        out.append(b"GET /" + run(n - 1, b"t") + b" HTTP/1.1\r\n" + host + b"\r\n")
    for n in around(BODY):
        out.append(b"POST /x HTTP/1.1\r\n" + host + b"Content-Length: " + str(n).encode() + b"\r\n\r\n" + run(n, b"b"))
    out += [
        b"POST /x HTTP/1.1\r\n" + host + b"Content-Length: 12345678901234567890123\r\n\r\n",
        b"POST /x HTTP/1.1\r\n" + host + b"Transfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n0\r\n\r\n",
        b"POST /x HTTP/1.1\r\n" + host + b"Transfer-Encoding: gzip\r\n\r\nabcd",
        b"POST /x HTTP/1.1\r\n" + host + b"Expect: 100-continue\r\nContent-Length: 4\r\n\r\nabcd",
        b"GET /a HTTP/1.1\r\n" + host + b"\r\nGET /b HTTP/1.1\r\n" + host + b"\r\n",
        b"GET /x HTTP/1.1\r\n" + host + b"X-Fold: a\r\n " + run(FIELD, b"f") + b"\r\n\r\n",
    ]
    return out


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    made = seeds()
    for s in made:
        with open(os.path.join(out, hashlib.sha1(s).hexdigest()[:16]), "wb") as f:
            f.write(s)
    print(f"door_seeds: {len(made)} requests around the front door's limits in {out}")


if __name__ == "__main__":
    main()
