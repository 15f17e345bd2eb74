#!/usr/bin/env python3
"""Seeds for fuzz_serve_request (make fuzz): the requests the official `openai` client
sends, captured on a loopback server of this script's own, each written as
"METHOD PATH\\n" + body; then a few made by hand that reach the checks' edges
(numbers past their types, fields of the schema the server refuses, other routes).

Usage: serve_seeds.py OUT_DIR
"""

import hashlib
import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import openai

CAPTURED = []


class Capture(BaseHTTPRequestHandler):
    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        CAPTURED.append(f"POST {self.path}\n".encode() + self.rfile.read(n))
        self.send_response(400)
        self.send_header("Content-Type", "application/json")
        body = b'{"error": {"message": "captured", "type": "invalid_request_error", "param": null, "code": null}}'
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def client_requests(base):
    c = openai.OpenAI(base_url=base + "/v1", api_key="k", max_retries=0, timeout=10)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi! \u00e9\u4e2d\U0001F600"}]
    calls = [
        lambda: c.chat.completions.create(model="m", messages=msgs),
        lambda: c.chat.completions.create(model="m", messages=msgs, max_tokens=16, temperature=0.7, top_p=0.9, seed=3,
                                          stop=["\n", "END"], n=1, user="u1"),
        lambda: c.chat.completions.create(model="m", messages=msgs, stream=True, stream_options={"include_usage": True}),
        lambda: c.chat.completions.create(model="m", messages=msgs, logprobs=True, top_logprobs=5,
                                          max_completion_tokens=8),
        lambda: c.chat.completions.create(model="m", messages=msgs, logit_bias={"42": -100, "7": 5.5},
                                          presence_penalty=0.5, frequency_penalty=-1.25),
        lambda: c.chat.completions.create(model="m", messages=msgs, response_format={"type": "json_object"}),
        lambda: c.chat.completions.create(model="m", messages=msgs, tools=[{"type": "function", "function": {
            "name": "f", "parameters": {"type": "object", "properties": {}}}}], tool_choice="auto"),
        lambda: c.chat.completions.create(model="m", messages=[{"role": "user", "content": [
            {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}], store=False, service_tier="auto",
            extra_body={"top_k": 20, "return_token_ids": True, "ignore_eos": True}),
        lambda: c.completions.create(model="m", prompt="Once upon a time"),
        lambda: c.completions.create(model="m", prompt=["one"], max_tokens=4, logprobs=5, echo=False, best_of=1,
                                     temperature=0, stream=True),
        lambda: c.completions.create(model="m", prompt="x", suffix="y", logit_bias={"0": 100}),
    ]
    for call in calls:
        try:
            r = call()
            for _ in r if hasattr(r, "__iter__") else []:
                pass
        except openai.APIError:
            pass


def by_hand():
    chat = "POST /v1/chat/completions\n"
    text = "POST /v1/completions\n"
    base = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    out = [text + '{"model": "m", "prompt": "x", "max_tokens": 9223372036854775808}',
           chat + '{"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": 1e309}',
           chat + '{"model": "m", "messages": [{"role": "user", "content": "x"}], "seed": -9223372036854775809}',
           chat + '{"model": "m", "messages": [{"role": "user", "content": "x"}], "logit_bias": {"99999999999": 1}}',
           "GET /v1/models\n", "PUT /v1/chat/completions\n{}", "POST /v1/nothing\n{}", "GET /health\n"]
    for field in ["audio", "functions", "prediction", "reasoning_effort", "verbosity", "web_search_options"]:
        out.append(chat + json.dumps({**base, field: {"x": 1}}))
    return [s.encode() for s in out]


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Capture)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    client_requests(f"http://127.0.0.1:{server.server_address[1]}")
    server.shutdown()
    seeds = CAPTURED + by_hand()
    for s in seeds:
        with open(os.path.join(out, hashlib.sha1(s).hexdigest()[:16]), "wb") as f:
            f.write(s)
    print(f"serve_seeds: {len(CAPTURED)} requests of the openai client and {len(seeds) - len(CAPTURED)} by hand "
          f"in {out}")


if __name__ == "__main__":
    main()
