"""`edgespec serve` as users run it: a subprocess on a free loopback port with the real models,
spoken to with the official `openai` package (raw HTTP only where a client cannot send the request).

Each promise of README's "Serving" section has a test here. Waits are on conditions (the server's
/health, a stream's end) with generous limits: the machine may be busy. smollm2 with one thread
keeps the load down; long prompts and generations are long only where the point needs it.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from .conftest import DRAFT, SMALL, TARGET

KEY = "edgespec-test-key"
COUNT = [{"role": "user", "content": "Count from 1 to 300, separated by commas."}]
PATIENCE = 300.0  # the most any one condition is waited for (a busy machine is slow, not broken)
# ~1800 tokens: its prefill takes seconds on one thread (many chunks of a llama.cpp batch)
LONG = [{"role": "user", "content": "Summarise this log:\n" + "".join(
    f"{i:04d} worker {i % 7} finished job {i * 37 % 1000} in {i % 13}.{i % 10}s\n" for i in range(150))}]


def wait_until(condition, message: str = "timed out", seconds: float = PATIENCE) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, message
        time.sleep(0.05)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, *args: str, port: int | None = None):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.TemporaryFile()
        env = {k: v for k, v in os.environ.items() if k != "EDGESPEC_API_KEY"}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from edgespec.commands import main; main()", "serve",
             "--host", "127.0.0.1", "--port", str(self.port), *args],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
        )

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def wait_ready(self, timeout: float = 300) -> "Server":
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"serve exited with {self.proc.returncode}:\n{self.output()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.proc.kill()
        pytest.fail(f"serve did not become ready:\n{self.output()}")

    def health(self) -> dict:
        return httpx.get(f"{self.url}/health", timeout=PATIENCE).json()

    def headers(self, key: str | None = None) -> dict:
        return {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}

    def open_stream(self, body: dict, key: str | None = None) -> socket.socket:
        """A streaming request on a plain socket, read up to the end of its headers: the client stays
        until the test closes it (it reads nothing more, as a client that is gone does not)."""
        data = json.dumps({**body, "stream": True}).encode()
        head = {"Host": f"127.0.0.1:{self.port}", "Content-Length": str(len(data)), **self.headers(key)}
        conn = socket.create_connection(("127.0.0.1", self.port), timeout=PATIENCE)
        conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\n"
                     + b"".join(f"{k}: {v}\r\n".encode() for k, v in head.items()) + b"\r\n" + data)
        return conn

    def client(self, key: str = KEY) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=key, max_retries=0, timeout=300)

    def stop(self, sig=signal.SIGINT, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.wait_exit(timeout, f"{signal.Signals(sig).name}")

    def wait_exit(self, timeout: float = PATIENCE, after: str = "the signal") -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail(f"serve did not stop within {timeout}s of {after}:\n{self.output()}")


@pytest.fixture(scope="module", autouse=True)
def models_present(model_path):
    for name in (TARGET, DRAFT, SMALL):
        model_path(name)


@pytest.fixture(scope="module")
def small():
    server = Server("-m", SMALL, "-t", "1", "-n", "24", "--api-key", KEY).wait_ready()
    yield server
    assert server.stop() == 0, server.output()  # SIGINT with nothing in flight: a clean exit
    out = server.output()
    assert "Traceback" not in out and "Exception in ASGI" not in out, out  # whatever the tests sent


def test_lists_models(small):
    assert [m.id for m in small.client().models.list()] == [SMALL]


def test_streams_a_chat_completion(small):
    chunks = list(small.client().chat.completions.create(
        model=SMALL, messages=[{"role": "user", "content": "Say hello in five words."}], max_tokens=16, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip()
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) >= 2  # streamed, not one blob
    last = chunks[-1]
    assert last.choices[0].finish_reason in ("stop", "length")
    assert 0 < last.usage.completion_tokens <= 16
    stats = last.model_extra["edgespec"]
    assert stats["mode"] == "auto" and stats["accepted"] <= stats["drafted"]
    assert stats["tokens_per_s"] > 0


def test_three_concurrent_requests_all_complete(small):
    before = small.health()["served"]
    client = small.client()

    def ask(topic):
        return client.chat.completions.create(model=SMALL, messages=[{"role": "user", "content": f"Name a {topic}."}],
                                              max_tokens=12)

    with ThreadPoolExecutor(3) as pool:
        answers = list(pool.map(ask, ["colour", "fruit", "city"]))
    assert all(a.choices[0].message.content.strip() for a in answers)
    assert all(a.choices[0].finish_reason in ("stop", "length") for a in answers)
    after = small.health()
    assert after["served"]["completed"] == before["completed"] + 3
    assert after["waiting"] == 0
    # "generating" clears when the worker has settled the caches, just after the last answer went out
    wait_until(lambda: small.health()["generating"] is False, "still generating after every answer was returned")


def test_continued_chat_reports_cached_prompt_tokens(small):
    client = small.client()
    messages = [{"role": "user", "content": "Write one sentence about the sea."}]
    first = client.chat.completions.create(model=SMALL, messages=messages, max_tokens=16)
    messages += [{"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "Now one about mountains."}]
    second = client.chat.completions.create(model=SMALL, messages=messages, max_tokens=16)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= first.usage.prompt_tokens - 1  # the whole first turn came from the KV cache
    assert second.usage.prompt_tokens > cached
    assert second.model_extra["edgespec"]["prompt_cached"] == cached


def test_bad_requests_get_openai_shaped_errors(small):
    r = httpx.post(f"{small.url}/v1/chat/completions", content=b'{"messages": [',
                   headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
    assert r.status_code == 400
    assert r.json()["error"]["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as err:
        small.client().chat.completions.create(model=SMALL, messages=[{"role": "user", "content": "hi"}], max_tokens=-1)
    assert err.value.status_code == 400 and err.value.param == "max_tokens"
    with pytest.raises(openai.AuthenticationError) as err:
        small.client(key="not-the-key").chat.completions.create(model=SMALL, messages=[{"role": "user", "content": "hi"}])
    assert err.value.status_code == 401 and err.value.code == "invalid_api_key"


def test_cancelled_stream_stops_and_the_next_request_is_answered(small):
    client = small.client()
    control = client.chat.completions.create(model=SMALL, messages=COUNT, max_tokens=200)
    assert control.choices[0].finish_reason == "length"  # uncancelled, this prompt runs all 200 tokens
    before = small.health()["served"]
    stream = client.chat.completions.create(model=SMALL, messages=COUNT, max_tokens=200, stream=True)
    pieces = 0
    for chunk in stream:
        pieces += bool(chunk.choices and chunk.choices[0].delta.content)
        if pieces == 2:
            break
    stream.close()
    wait_until(lambda: small.health()["served"]["cancelled"] == before["cancelled"] + 1, "the stream was not cancelled")
    after = small.health()["served"]
    cancelled_tokens = after["tokens"] - before["tokens"]
    assert 2 <= cancelled_tokens < 200  # it stopped early: the client left after 2 pieces
    answer = client.chat.completions.create(model=SMALL, messages=[{"role": "user", "content": "Say hi."}], max_tokens=8)
    assert answer.choices[0].message.content.strip()


def test_sigint_during_a_stream_ends_it_with_an_error_and_exits_0():
    server = Server("-m", SMALL, "-t", "1").wait_ready()
    try:
        stream = server.client().chat.completions.create(model=SMALL, messages=COUNT, max_tokens=400, stream=True)
        it = iter(stream)
        for _ in range(3):
            next(it)
        server.proc.send_signal(signal.SIGINT)
        with pytest.raises(openai.APIError, match="shutting down"):
            for _ in it:
                pass
    finally:
        rc = server.stop()
    assert rc == 0, server.output()
    assert "Traceback" not in server.output()


def test_default_pair_serves_an_edit_with_speculation_and_stops_on_sigterm():
    # --spec combined drafts every round (auto decides from this machine's measured costs whether
    # drafting pays, which a test must not depend on); the draft model is loaded as in auto
    server = Server("-t", "2", "-n", "48", "--spec", "combined").wait_ready()
    try:
        assert DRAFT.rsplit("-q", 1)[0] in server.output()  # the startup line names the draft model
        code = "def area(width, height):\n    result = width * height\n    return result\n\n\nprint(area(3, 4))\n"
        ask = [{"role": "user", "content": f"Rename the variable result to product and return the whole code:\n\n{code}"}]
        answer = server.client().chat.completions.create(model="anything", messages=ask)
        assert answer.model == TARGET
        assert "product" in answer.choices[0].message.content
        stats = answer.model_extra["edgespec"]
        assert stats["mode"] == "combined"
        assert stats["drafted"] > 0 and 0 < stats["accepted"] <= stats["drafted"]
        assert stats["tokens_per_pass"] > 1.0
    finally:
        rc = server.stop(signal.SIGTERM)
    assert rc == 0, server.output()


def test_startup_errors_are_one_line():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        server = Server("-m", SMALL, port=holder.getsockname()[1])
        assert server.proc.wait(60) == 2
    out = server.output().strip()
    assert "already in use" in out and len(out.splitlines()) == 1, out
    server = Server("-m", "/nonexistent/model.gguf")
    assert server.proc.wait(60) == 3
    out = server.output().strip()
    assert out.startswith("error:") and len(out.splitlines()) == 1, out


# ---- README "Serving", promise by promise ------------------------------------------------------
def test_routes_also_answer_without_v1(small):
    auth = {"Authorization": f"Bearer {KEY}"}
    assert [m["id"] for m in httpx.get(f"{small.url}/models", headers=auth, timeout=PATIENCE).json()["data"]] == [SMALL]
    chat = httpx.post(f"{small.url}/chat/completions", headers=auth, timeout=PATIENCE,
                      json={"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4}).json()
    assert chat["object"] == "chat.completion" and chat["usage"]["completion_tokens"] >= 1
    text = httpx.post(f"{small.url}/completions", headers=auth, timeout=PATIENCE,
                      json={"prompt": "def add(a, b):", "max_tokens": 4}).json()
    assert text["object"] == "text_completion" and text["usage"]["completion_tokens"] >= 1


def test_only_its_own_host_names_no_browser_origins_and_json_posts(small):
    url, body = f"{small.url}/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    before = small.health()["served"]["requests"]
    auth = {"Authorization": f"Bearer {KEY}"}
    r = httpx.post(url, json=body, headers={**auth, "Host": f"rebound.example:{small.port}"}, timeout=PATIENCE)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_host"
    r = httpx.post(url, json=body, headers={**auth, "Origin": "https://any-page.example"}, timeout=PATIENCE)
    assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed"
    r = httpx.post(url, content=json.dumps(body), headers={**auth, "Content-Type": "text/plain"}, timeout=PATIENCE)
    assert r.status_code == 415 and r.json()["error"]["code"] == "unsupported_media_type"
    r = httpx.get(f"{small.url}/v1/models/", headers={**auth, "Host": "localhost"}, timeout=PATIENCE)
    assert r.status_code == 404 and "location" not in r.headers
    assert small.health()["served"]["requests"] == before  # none reached the models


def test_cors_lets_the_named_origin_in():
    server = Server("-m", SMALL, "-t", "1", "--cors", "http://localhost:5173").wait_ready()
    try:
        pre = httpx.options(f"{server.url}/v1/chat/completions", timeout=PATIENCE, headers={
            "Origin": "http://localhost:5173", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type, authorization"})
        assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == "http://localhost:5173"
        r = httpx.post(f"{server.url}/v1/chat/completions", headers={"Origin": "http://localhost:5173"}, timeout=PATIENCE,
                       json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://localhost:5173"
        assert httpx.post(f"{server.url}/v1/chat/completions", headers={"Origin": "http://localhost:6666"},
                          json={"messages": [{"role": "user", "content": "hi"}]}, timeout=PATIENCE).status_code == 403
    finally:
        assert server.stop() == 0, server.output()


@pytest.mark.parametrize("body", [
    b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": ' + b"7" * 5000 + b"}",
    b'{"messages": [{"role": "user", "content": "hi"}], "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    b'{"messages": [{"role": "user", "content": "\\ud800"}]}',
    b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": "5"}',
    b'{"messages": [{"role": "user", "content": "hi"}], "stream": "yes"}',
])
def test_bad_input_is_a_400_not_a_crash(small, body):
    r = httpx.post(f"{small.url}/v1/chat/completions", content=body, timeout=PATIENCE, headers=small.headers(KEY))
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error"  # the fixture asserts no traceback at the end


def test_unsupported_features_are_refused_by_name(small):
    client = small.client()
    hi = [{"role": "user", "content": "What is the weather in Paris?"}]
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {}}}}]
    for extra, param in (({"tools": tools, "tool_choice": "required"}, "tools"),
                         ({"response_format": {"type": "json_object"}}, "response_format"),
                         ({"logprobs": True, "top_logprobs": 2}, "logprobs"),
                         ({"logit_bias": {"1": 5}}, "logit_bias")):
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model=SMALL, messages=hi, max_tokens=4, **extra)
        assert err.value.param == param and err.value.code == "unsupported_parameter"
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=SMALL, prompt="x", best_of=2, max_tokens=4)
    assert err.value.param == "best_of"


def test_caps_max_tokens_and_the_body_size(small):
    with pytest.raises(openai.BadRequestError) as err:
        small.client().chat.completions.create(model=SMALL, messages=[{"role": "user", "content": "hi"}], max_tokens=5000)
    assert err.value.param == "max_tokens"  # above --max-tokens-cap (4096)
    big = json.dumps({"messages": [{"role": "user", "content": "x" * (5 << 20)}]})
    r = httpx.post(f"{small.url}/v1/chat/completions", content=big, headers=small.headers(KEY), timeout=PATIENCE)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"


def test_a_prompt_that_cannot_fit_is_refused_before_it_is_tokenized(small):
    """3.9 MiB of text is at least ~50k tokens for smollm2 (no token is longer than 81 bytes): refused from
    its size ("at least"), not after tokenizing a million tokens ("the prompt is N tokens")."""
    text = "lorem ipsum dolor sit amet " * 150_000
    r = httpx.post(f"{small.url}/v1/completions", headers=small.headers(KEY), timeout=PATIENCE,
                   content=json.dumps({"prompt": text, "max_tokens": 1}))
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
    assert "at least" in r.json()["error"]["message"], r.json()


def test_a_denormal_temperature_samples_as_greedy(small):
    client = small.client()
    greedy = client.chat.completions.create(model=SMALL, messages=COUNT, max_tokens=12, temperature=0)
    tiny = client.chat.completions.create(model=SMALL, messages=COUNT, max_tokens=12, temperature=1e-310)
    assert tiny.choices[0].message.content == greedy.choices[0].message.content  # was garbage ("ectableectable")


def test_alias_and_the_cli_sampling_options_are_the_server_defaults():
    server = Server("-m", SMALL, "-t", "1", "-n", "9", "--stop", "5", "--alias", "tiny").wait_ready()
    try:
        client = server.client()
        assert [m.id for m in client.models.list()] == ["tiny"]
        stopped = client.chat.completions.create(model="x", messages=COUNT)
        assert stopped.model == "tiny"
        text = stopped.choices[0].message.content
        assert stopped.choices[0].finish_reason == "stop" and "4" in text and "5" not in text, text  # --stop 5
        # a request's own stop replaces the server's; its max_tokens is the server's -n
        longer = client.chat.completions.create(model="x", messages=COUNT, stop=["300"])
        assert longer.choices[0].finish_reason == "length" and longer.usage.completion_tokens == 9
        assert "5" in longer.choices[0].message.content
    finally:
        assert server.stop() == 0, server.output()


def test_a_non_loopback_host_prints_a_warning():
    # The model does not exist: the server binds, warns, and stops at the model (exit 3) before serving anything.
    server = Server("-m", "/nonexistent/model.gguf", "--host", "0.0.0.0")
    assert server.proc.wait(PATIENCE) == 3
    out = server.output()
    assert "warning: serving on 0.0.0.0" in out and "no --api-key set" in out, out


def test_the_port_is_bound_before_the_models_are_looked_at():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        # a model that does not exist would be exit 3: exit 2 says the port came first
        server = Server("-m", "/nonexistent/model.gguf", port=holder.getsockname()[1])
        assert server.proc.wait(PATIENCE) == 2, server.output()
    assert "already in use" in server.output()


# ---- stopping ----------------------------------------------------------------------------------
def test_repeated_signals_never_crash_the_server():
    """Issue 21: `kill -INT; sleep 0.3; kill -INT` during a stream ended in a segfault (-11) 2 runs
    in 11, and in -2 or 130 in others. The pauses vary so the later signals land in each phase of
    the shutdown (uvicorn's grace, the generation thread's join, the models' release)."""
    pauses = [0.0, 0.05, 0.1, 0.2, 0.3, 0.3, 0.4, 0.5, 0.7, 1.0, 1.5]
    outcomes = []
    for i, pause in enumerate(pauses):
        server = Server("-m", SMALL, "-t", "1").wait_ready()
        stream = httpx.stream("POST", f"{server.url}/v1/chat/completions", timeout=PATIENCE,
                              json={"messages": COUNT, "max_tokens": 400, "stream": True})
        with stream as r:
            lines = r.iter_lines()
            next(lines)  # the role chunk: generating now
            second = signal.SIGTERM if i % 3 == 2 else signal.SIGINT
            server.proc.send_signal(signal.SIGINT)
            time.sleep(pause)  # the gap between the signals is what is varied, nothing is asserted on time
            if server.proc.poll() is None:
                server.proc.send_signal(second)
            if i % 4 == 3 and server.proc.poll() is None:
                server.proc.send_signal(signal.SIGINT)  # and a third
            rc = server.stop(timeout=PATIENCE)
        out = server.output()
        outcomes.append((pause, rc))
        assert "Traceback" not in out and "Segmentation" not in out, out
    assert all(rc == 0 for _, rc in outcomes), outcomes


def test_waiting_requests_get_503_shutting_down_and_the_stream_an_error_chunk():
    server = Server("-m", SMALL, "-t", "1", "-np", "1").wait_ready()  # one slot: the others wait
    results = []
    try:
        client = server.client()
        stream = iter(client.chat.completions.create(model=SMALL, messages=COUNT, max_tokens=400, stream=True))
        next(stream)

        def ask():
            try:
                client.chat.completions.create(model=SMALL, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
                results.append("answered")
            except openai.APIStatusError as err:
                results.append((err.status_code, err.code))

        askers = [threading.Thread(target=ask) for _ in range(2)]
        for t in askers:
            t.start()
        wait_until(lambda: server.health()["waiting"] >= 1, "no request waited")
        server.proc.send_signal(signal.SIGINT)
        with pytest.raises(openai.APIError, match="shutting down"):
            for _ in stream:
                pass
        for t in askers:
            t.join(PATIENCE)
        rc = server.wait_exit()
    finally:
        server.stop()
    assert rc == 0, server.output()
    waited = [r for r in results if r != "answered"]
    assert waited and all(r == (503, "shutting_down") for r in waited), results
    assert "Traceback" not in server.output()


def test_shutdown_during_a_long_prefill_keeps_the_contract():
    """SIGINT while a long prompt is being evaluated, 3 requests waiting: each waiting one gets a 503
    `shutting_down` in JSON, the stream its error chunk, no traceback, and the prefill stops within a
    chunk, so the generation thread is joined and the models freed ("server stopped") before the
    exit. (The one-generation worker evaluates the whole prompt first: "a generation was still running".)"""
    # one slot: the others wait in the queue whatever the machine's speed (with more slots they
    # would be admitted between prompt chunks)
    server = Server("-m", SMALL, "-t", "1", "-c", "4096", "-np", "1").wait_ready()
    results = []
    try:
        client = server.client()
        stream = iter(client.chat.completions.create(model=SMALL, messages=LONG, max_tokens=20, stream=True))
        next(stream)  # the role chunk: the prompt is being evaluated

        def ask():
            try:
                client.chat.completions.create(model=SMALL, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
                results.append("answered")
            except openai.APIStatusError as err:
                results.append((err.status_code, err.code, err.response.headers.get("content-type")))

        askers = [threading.Thread(target=ask) for _ in range(3)]
        for t in askers:
            t.start()
        wait_until(lambda: server.health()["waiting"] == 3, "the three did not wait")
        server.proc.send_signal(signal.SIGINT)
        with pytest.raises(openai.APIError, match="shutting down"):
            for _ in stream:
                pass
        for t in askers:
            t.join(PATIENCE)
        rc = server.wait_exit()  # no second signal: that would stop the wait for the generation thread
    finally:
        server.stop()
    out = server.output()
    assert rc == 0, out
    assert results == [(503, "shutting_down", "application/json")] * 3, results
    assert "Traceback" not in out and "CancelledError" not in out, out
    assert out.rstrip().endswith("server stopped"), out


def test_a_client_leaving_during_a_long_prefill_stops_it():
    """The prompt is abandoned within a chunk: no token is generated for it (the one-generation
    worker evaluated the whole prompt and generated a token before it looked)."""
    server = Server("-m", SMALL, "-t", "1", "-c", "4096").wait_ready()
    try:
        before = server.health()["served"]
        conn = server.open_stream({"messages": LONG, "max_tokens": 20})
        reply = conn.makefile("rb")
        assert reply.readline().startswith(b"HTTP/1.1 200")
        while reply.readline() not in (b"\r\n", b""):  # headers
            pass
        assert b"data: " in reply.readline() + reply.readline()  # the role chunk (a chunked-encoding size line first)
        reply.close()  # the socket stays open while a file made from it is
        conn.close()
        wait_until(lambda: server.health()["served"]["cancelled"] == before["cancelled"] + 1, "the request was not cancelled")
        assert server.health()["served"]["tokens"] == before["tokens"]
        answer = server.client().chat.completions.create(model=SMALL, messages=[{"role": "user", "content": "hi"}],
                                                         max_tokens=4)
        assert answer.choices[0].message.content
    finally:
        assert server.stop() == 0, server.output()


def test_queued_clients_that_leave_free_their_place():
    """Issue 21: with a generation running and the queue full, queued clients that close their
    sockets kept their places (`waiting` unchanged, new requests 503 queue_full) until it ended."""
    server = Server("-m", SMALL, "-t", "1", "-np", "1", "--queue", "2").wait_ready()
    try:
        long_done = threading.Event()

        def long_generation():
            with httpx.stream("POST", f"{server.url}/v1/chat/completions", timeout=PATIENCE,
                              json={"messages": COUNT, "max_tokens": 600, "stream": True}) as r:
                for _ in r.iter_lines():
                    pass
            long_done.set()

        runner = threading.Thread(target=long_generation)
        runner.start()
        wait_until(lambda: server.health()["generating"], "the long generation did not start")
        queued = []
        for _ in range(16):  # fill the queue (a server that runs several at once takes more)
            waiting = server.health()["waiting"]
            if waiting == 2:
                break
            conn = server.open_stream({"messages": COUNT, "max_tokens": 600})
            queued.append(conn)
            # counted as waiting, or answered (a server that runs several at once started it)
            wait_until(lambda: server.health()["waiting"] > waiting or select.select([conn], [], [], 0)[0])
        assert server.health()["waiting"] == 2, "the queue did not fill"
        full = httpx.post(f"{server.url}/v1/chat/completions", timeout=PATIENCE,
                          json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        assert full.status_code == 503 and full.json()["error"]["code"] == "queue_full"
        for conn in queued:
            conn.close()
        wait_until(lambda: server.health()["waiting"] == 0 or long_done.is_set())
        assert not long_done.is_set(), "the queue emptied only when the running generation ended"
        admitted = httpx.post(f"{server.url}/v1/chat/completions", timeout=PATIENCE,
                              json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        assert admitted.status_code == 200, admitted.text
        runner.join(PATIENCE)
    finally:
        assert server.stop() == 0, server.output()
