"""Hostile requests against both servers (issue 29 items 7-11, issue 28 item 7), over raw sockets on loopback:
every one gets an OpenAI-shaped JSON 4xx (never a 500, a text page or a held connection) and no server log line
carries a traceback."""
from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from router_r1.pool.openai_http import FD_RESERVE, ServerSettings, ThrottledLog
from router_r1.pool.server import ServerThread
from sim.backend import SimBackend
from router_r1.serve import RouterServerThread, parse_args, serving
from serve_fixture import ANSWER, SIM

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "hostile-test-token"
POOL_MODEL = "sim/llama-3.1-8b-instruct"
QUESTION = "What is the capital of Veloria?"
SETTINGS = ServerSettings(read_timeout_s=0.5, header_timeout_s=0.5, max_body_bytes=64 << 10)


@pytest.fixture(scope="module")
def servers(trained_router):
    """{'pool': port, 'router': port}: the sim pool server and the router server (in front of it), both with a
    token and short timeouts."""
    mp = pytest.MonkeyPatch()
    mp.setenv("ROUTER_SIM_API_KEY", TOKEN)
    backend = SimBackend.from_pool_yaml(SIM, seed=0, latency_scale=0.0)
    with ServerThread(backend, token=TOKEN, settings=SETTINGS) as pool:
        args = parse_args(["--checkpoint", str(trained_router), "--pool", str(SIM), "--pool-url", pool.url])
        with serving(args) as service, RouterServerThread(service, token=TOKEN, settings=SETTINGS) as router:
            yield {"pool": pool.port, "router": router.port, "service": service}
    mp.undo()


@pytest.fixture
def quiet_log(caplog):
    """Fails the test if a server logged a traceback (both servers run in this process's threads)."""
    caplog.set_level(logging.INFO)
    yield caplog
    tracebacks = [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]
    assert not tracebacks, [r.getMessage() for r in tracebacks]


def _head(method: str, path: str, length: int | None = None, extra: bytes = b"", token: bytes = TOKEN.encode()) -> bytes:
    head = (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Connection: close\r\n").encode() + b"Authorization: Bearer " + token + b"\r\n" + extra
    if length is not None:
        head += f"Content-Length: {length}\r\n".encode()
    return head + b"\r\n"


def _post(body: bytes, **kw) -> bytes:
    return _head("POST", "/v1/chat/completions", len(body), **kw) + body


def _read_response(sock: socket.socket) -> tuple[int, dict, bytes]:
    """(status, headers, body) of one response, read by its Content-Length (not by waiting for the close)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the server closed the connection without a reply (got {data!r})"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    while len(rest) < int(headers.get("content-length", 0)):
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection in the middle of its reply"
        rest += chunk
    return int(lines[0].split()[1]), headers, rest


def exchange(port: int, data: bytes) -> tuple[int, dict, dict]:
    """Send raw bytes, read one reply; (status, headers, JSON body). 10 s without a reply fails the test."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        status, headers, body = _read_response(s)
    assert headers["content-type"].startswith("application/json"), (status, headers, body)
    return status, headers, json.loads(body)


def chat_body(server: str, **fields) -> dict:
    model = POOL_MODEL if server == "pool" else "router-r1"
    return {"model": model, "messages": [{"role": "user", "content": QUESTION}], "temperature": 0, **fields}


def with_content(server: str, content) -> dict:
    body = chat_body(server)
    if content == "missing":
        body["messages"] = [{"role": "user"}]
    else:
        body["messages"] = [{"role": "user", "content": content}]
    return body


BAD_FIELDS = [  # (body maker, param the 400 names)
    *[(lambda s, c=c: with_content(s, c), "messages[0].content") for c in
      (7, None, {"text": "hi"}, [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}], [1, 2], "missing",
       "lone \ud800 surrogate", [{"type": "text", "text": "\udfff"}])],
    (lambda s: chat_body(s, seed=2 ** 70, temperature=1.0), "seed"),
    *[(lambda s, v=v: chat_body(s, max_tokens=v), "max_tokens") for v in (-1, 0, 2 ** 21, "16", True)],
    (lambda s: chat_body(s, max_completion_tokens=0), "max_completion_tokens"),
    *[(lambda s, v=v: chat_body(s, top_p=v), "top_p") for v in ("x", -1, 2, 0)],
    *[(lambda s, v=v: chat_body(s, temperature=v), "temperature") for v in ("hot", -0.5, 2.5)],
]


@pytest.mark.parametrize("server", ["pool", "router"])
@pytest.mark.parametrize("make, param", BAD_FIELDS)
def test_a_bad_field_is_a_400_naming_it(servers, quiet_log, server, make, param):
    status, _, body = exchange(servers[server], _post(json.dumps(make(server)).encode()))
    assert status == 400 and body["error"]["param"] == param and body["error"]["type"] == "invalid_request_error", body
    assert param.split("[")[0] in body["error"]["message"]


DEEP = b"[" * 30_000 + b"]" * 30_000  # far past the parser's recursion limit, under the body limit


@pytest.mark.parametrize("server", ["pool", "router"])
@pytest.mark.parametrize("raw, status, says", [
    (DEEP, 400, "nests too deeply"),
    (b'{"model": "m", "messages": [], "temperature": ' + b"9" * 5000 + b"}", 400, "integer too long"),
    (b'{"model": "m", "temperature": NaN}', 400, "NaN"),
    (b'{"model": "\xff\xfe"}', 400, "UTF-8"),
    (b'{"model": ', 400, "not valid JSON"),
])
def test_a_body_that_cannot_be_read_is_a_json_400(servers, quiet_log, server, raw, status, says):
    got, _, body = exchange(servers[server], _post(raw))
    assert got == status and says in body["error"]["message"], body


@pytest.mark.parametrize("server", ["pool", "router"])
def test_protocol_and_routing_errors_are_json(servers, quiet_log, server):
    port = servers[server]
    status, _, body = exchange(port, _head("GET", "/v1/no-such-thing"))
    assert status == 404 and "/v1/no-such-thing" in body["error"]["message"]
    status, headers, body = exchange(port, _head("GET", "/v1/chat/completions"))
    assert status == 405 and headers["allow"] == "POST" and body["error"]["type"] == "invalid_request_error"
    status, _, body = exchange(port, b"GET /v1/models HTTP/1.1\r\nHost 127.0.0.1\r\n\r\n")  # no colon
    assert status == 400 and "header" in body["error"]["message"].lower()
    status, _, body = exchange(port, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n")  # a TLS hello
    assert status == 400
    # a token that is not UTF-8 is just a wrong token
    status, _, body = exchange(port, _head("GET", "/v1/models", token=b"\xff\xfe"))
    assert status == 401 and body["error"]["code"] == "invalid_api_key"
    status, _, body = exchange(port, _head("GET", "/v1/models"))
    assert status == 200 and body["object"] == "list"


@pytest.mark.parametrize("server", ["pool", "router"])
def test_bodies_over_the_limit_or_late_get_413_and_408(servers, quiet_log, server):
    port = servers[server]
    status, _, body = exchange(port, _head("POST", "/v1/chat/completions", 10 ** 11) + b"{")  # announced
    assert status == 413 and str(SETTINGS.max_body_bytes) in body["error"]["message"]
    chunk = b"x" * (SETTINGS.max_body_bytes + 1)  # sent chunked: no length to refuse it by in advance
    chunked = _head("POST", "/v1/chat/completions", extra=b"Transfer-Encoding: chunked\r\n")
    status, _, body = exchange(port, chunked + f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n0\r\n\r\n")
    assert status == 413
    status, headers, body = exchange(port, _head("POST", "/v1/chat/completions", 60_000) + b'{"model":')
    assert status == 408 and headers["connection"] == "close"


@pytest.mark.parametrize("server", ["pool", "router"])
def test_slow_heads_are_closed_and_logged_once(servers, quiet_log, server):
    port = servers[server]
    socks = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(5)]
    for s in socks:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHo")  # a head that never ends
    for s in socks:
        assert s.recv(100) == b""  # closed by the server (a 10 s socket timeout would fail here)
        s.close()
    lines = [r.getMessage() for r in quiet_log.records if "request head did not arrive" in r.getMessage()]
    assert len(lines) <= 1  # one line per kind per interval, not one per connection
    status, _, _ = exchange(port, _post(json.dumps(chat_body(server)).encode()))
    assert status == 200


@pytest.mark.parametrize("server", ["pool", "router"])
def test_a_client_that_half_closes_is_logged_without_a_traceback(servers, quiet_log, server):
    port = servers[server]
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(_post(json.dumps(chat_body(server)).encode()))
        s.shutdown(socket.SHUT_WR)  # taken as a client that left, unless the reply was already on its way
        replied = s.recv(65536).startswith(b"HTTP/1.1 200")
    deadline = time.monotonic() + 10
    while not replied and not any("no reply sent" in r.getMessage() for r in quiet_log.records):
        assert time.monotonic() < deadline, "neither a reply nor a log line"
        time.sleep(0.05)
    status, _, _ = exchange(port, _post(json.dumps(chat_body(server)).encode()))
    assert status == 200


def test_router_model_names_and_max_tokens(servers, quiet_log):
    port, service = servers["router"], servers["service"]
    status, _, body = exchange(port, _post(json.dumps(chat_body("router", model="router-r1@")).encode()))
    assert status == 400 and body["error"]["param"] == "model", body
    # a valid max_tokens is honoured: the answer is cut to that many of the router's tokens
    n = len(service.policy.tokenizer(ANSWER, add_special_tokens=False)["input_ids"])
    status, _, body = exchange(port, _post(json.dumps(chat_body("router", max_tokens=n)).encode()))
    assert status == 200 and body["choices"][0]["message"]["content"] == ANSWER
    assert body["choices"][0]["finish_reason"] == "stop"
    if n > 1:
        status, _, body = exchange(port, _post(json.dumps(chat_body("router", max_tokens=n - 1)).encode()))
        assert status == 200 and body["choices"][0]["finish_reason"] == "length"
        assert ANSWER.startswith(body["choices"][0]["message"]["content"]) and body["choices"][0]["message"]["content"] != ANSWER
    status, _, body = exchange(port, _post(json.dumps(chat_body("router", stream="yes")).encode()))
    assert status == 400 and body["error"]["param"] == "stream"


def test_the_connection_cap_answers_503_at_once(quiet_log):
    settings = ServerSettings(max_connections=4, header_timeout_s=30)
    with ServerThread(SimBackend.from_pool_yaml(SIM, seed=0, latency_scale=0.0), settings=settings) as srv:
        held = [socket.create_connection(("127.0.0.1", srv.port), timeout=10) for _ in range(4)]
        time.sleep(0.2)  # let the server take them in
        over = []
        for _ in range(3):
            with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as s:
                over.append(_read_response(s))
        for s in held:
            s.close()
        deadline = time.monotonic() + 10
        while True:  # the held ones freed, a normal request is served again
            status, _, _ = exchange(srv.port, _post(json.dumps(chat_body("pool")).encode(), token=b""))
            if status != 503 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    assert [s for s, _, _ in over] == [503] * 3 and all(json.loads(b)["error"]["type"] == "server_error"
                                                         for _, _, b in over)
    assert status == 200
    assert sum("connection cap" in r.getMessage() for r in quiet_log.records) == 1


def test_a_flood_past_the_open_file_limit_gets_503_and_one_log_line():
    """~22,000 slow connections once filled the sim server's file table (278,143 'Too many open files' log lines,
    a normal request then timed out); here the limit is 256 files and 400 connections come: those over the cap
    get 503, the log has one line per kind, and a normal request is answered once the flood leaves."""
    import resource

    def low_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    cmd = [sys.executable, "-m", "router_r1.pool.server", "--backend", "sim", "--pool", str(SIM), "--port", "0",
           "--latency-scale", "0", "--header-timeout-s", "60"]
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=low_limit)
    socks = []
    try:
        port = int(proc.stdout.readline().strip().rsplit(":", 1)[1].split("/")[0])
        for _ in range(400):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            socks.append(s)
        cap = 256 - FD_RESERVE  # ServerSettings.connection_cap under this limit
        answered: dict[int, bytes] = {}
        deadline = time.monotonic() + 20
        while len(answered) < len(socks) - cap and time.monotonic() < deadline:  # those over the cap, at once
            for i, s in enumerate(socks):
                s.setblocking(False)
                if i not in answered:
                    try:
                        answered[i] = s.recv(12)[9:12]
                    except BlockingIOError:
                        pass
            time.sleep(0.1)
        statuses = [answered.get(i, b"held") for i in range(len(socks))]
        for s in socks:
            s.close()
        socks = []
        deadline = time.monotonic() + 20
        while True:
            try:
                status, _, _ = exchange(port, _post(json.dumps(chat_body("pool")).encode(), token=b""))
            except (AssertionError, OSError):
                status = None
            if status == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    finally:
        for s in socks:
            s.close()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert status == 200, err[-2000:]
    assert statuses.count(b"503") == 400 - cap and statuses.count(b"held") == cap
    # asyncio accepts a burst before the cap sees it, so the table may still fill for a moment: one line, no traceback
    assert err.count("Too many open files") <= 1 and "Traceback" not in err, err[-2000:]
    assert err.count("connection cap") == 1, err[-2000:]


def test_throttled_log_says_how_many_lines_it_left_out(caplog):
    caplog.set_level(logging.INFO)
    note = ThrottledLog(interval_s=0.2, logger=logging.getLogger("throttle-test"))
    for _ in range(50):
        note("kind a", "first kind")
    note("kind b", "second kind")
    time.sleep(0.25)
    note("kind a", "first kind")
    lines = [r.getMessage() for r in caplog.records if r.name == "throttle-test"]
    assert lines == ["first kind", "second kind", lines[2]] and "(49 more like it" in lines[2]


def test_the_router_cli_logs_one_line_per_request_and_stops_on_sigterm(trained_router):
    """Issue 28.8: the router server's log had an `INFO httpx2: HTTP Request: POST ...` line per pool call."""
    with ServerThread(SimBackend.from_pool_yaml(SIM, seed=0, latency_scale=0.0), token=TOKEN) as pool:
        cmd = [sys.executable, "-m", "router_r1.serve", "--checkpoint", str(trained_router), "--pool", str(SIM),
               "--pool-url", pool.url, "--port", "0"]
        proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), "ROUTER_SIM_API_KEY": TOKEN},
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            line = proc.stdout.readline()
            assert line.startswith("router server listening on "), proc.stderr.read()[-3000:]
            port = int(line.split("127.0.0.1:")[1].split("/")[0])
            status, _, body = exchange(port, _post(json.dumps(chat_body("router")).encode(), token=b""))
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert status == 200 and body["choices"][0]["message"]["content"] == ANSWER
    assert len(body["router_r1"]["calls"]) == 1  # one pool call made ...
    assert "HTTP Request:" not in err and "Traceback" not in err, err[-3000:]  # ... and not logged by httpx2
    assert err.count("router-r1 alpha=") == 1 and proc.returncode == 0


@pytest.mark.parametrize("server", ["pool", "router"])
def test_a_body_whose_content_encoding_does_not_decode_is_a_400_logged_once(servers, quiet_log, server):
    """Issue 45.12: gzip/deflate bodies that do not decode were a 500 with two tracebacks each (50 requests: 4,600
    log lines)."""
    import gzip
    port = servers[server]
    for encoding in (b"gzip", b"deflate"):
        for _ in range(25):
            status, _, body = exchange(port, _post(b"not compressed at all",
                                                   extra=b"Content-Encoding: " + encoding + b"\r\n"))
            assert status == 400 and body["error"]["type"] == "invalid_request_error", body
            assert "\n" not in body["error"]["message"] and encoding.decode() in body["error"]["message"], body
    lines = [r.getMessage() for r in quiet_log.records if r.name.startswith(("router_r1", "aiohttp"))
             and r.levelno >= logging.WARNING]
    assert len(lines) <= 2, lines  # one per kind per interval
    # a body that is gzip indeed is read as JSON
    status, _, _ = exchange(port, _post(gzip.compress(json.dumps(chat_body(server)).encode()),
                                        extra=b"Content-Encoding: gzip\r\n"))
    assert status == 200


@pytest.mark.parametrize("fields, param", [
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "tools"),
    ({"tool_choice": "auto"}, "tool_choice"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"logprobs": True}, "logprobs"), ({"top_logprobs": 2}, "top_logprobs"),
    ({"stop": ["\n"]}, "stop"), ({"stop": "."}, "stop"),
    ({"frequency_penalty": 0.5}, "frequency_penalty"), ({"logit_bias": {"5": 10}}, "logit_bias"),
    ({"n": 2}, "n"), ({"n": True}, "n"), ({"n": "1"}, "n"), ({"no_such_field": 1}, "no_such_field"),
])
def test_the_router_refuses_fields_it_does_not_honour(servers, quiet_log, fields, param):
    """Issue 45.14: tools, response_format, logprobs, stop ... got a 200 and were ignored."""
    status, _, body = exchange(servers["router"], _post(json.dumps(chat_body("router", **fields)).encode()))
    assert status == 400 and body["error"]["param"] == param, body
    assert param in body["error"]["message"]


@pytest.mark.parametrize("fields", [
    {"n": 1.0}, {"n": 1}, {"logprobs": False}, {"stop": None}, {"stop": []}, {"tools": []}, {"tool_choice": "none"},
    {"response_format": {"type": "text"}}, {"frequency_penalty": 0}, {"presence_penalty": 0.0}, {"user": "u-1"},
    {"metadata": {"k": "v"}},
])
def test_neutral_or_informational_fields_are_accepted(servers, quiet_log, fields):
    status, _, body = exchange(servers["router"], _post(json.dumps(chat_body("router", **fields)).encode()))
    assert status == 200 and body["choices"][0]["message"]["content"] == ANSWER, body


def test_a_question_over_the_bound_is_refused_before_tokenizing(servers, quiet_log, monkeypatch):
    """Issue 45.13: a 3.9 MB question was tokenized on the event loop (every request stalled, +500 MB)."""
    service = servers["service"]
    tokenized = []
    real = service.prompt_ids
    monkeypatch.setattr(service, "prompt_ids", lambda q, a: tokenized.append(len(q)) or real(q, a))
    question = "x" * (service.max_question_chars + 1)
    status, _, body = exchange(servers["router"], _post(json.dumps(chat_body("router", messages=[
        {"role": "user", "content": question}])).encode()))
    assert status == 413 and body["error"]["param"] == "messages[0].content", body
    assert str(service.max_question_chars) in body["error"]["message"] and "--max-question-chars" in body["error"]["message"]
    assert tokenized == []


def test_a_slow_tokenization_does_not_stall_other_requests(servers, quiet_log, monkeypatch):
    """A question that takes long to tokenize (here a 3 s sleep inside prompt_ids, as a long text's tokenizing
    holds the thread) must not hold up a small request sent meanwhile."""
    import threading
    service = servers["service"]
    real = service.prompt_ids

    def slow(question, alpha):
        if question.startswith("SLOW"):
            time.sleep(3.0)
        return real(question, alpha)
    monkeypatch.setattr(service, "prompt_ids", slow)
    done = {}

    def big():
        exchange(servers["router"], _post(json.dumps(chat_body("router", messages=[
            {"role": "user", "content": "SLOW " + QUESTION}])).encode()))
        done["big"] = time.monotonic()
    t = threading.Thread(target=big)
    t.start()
    time.sleep(0.3)  # the slow one is being tokenized
    status, _, _ = exchange(servers["router"], _post(json.dumps(chat_body("router")).encode()))
    done["small"] = time.monotonic()
    t.join(timeout=30)
    assert status == 200 and "big" in done and done["small"] < done["big"] - 1.0, done
