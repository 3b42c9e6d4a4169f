"""The HTTP server over the real Engine on a fake model: real uvicorn on a loopback port, real HTTP
clients, the real scheduler, decoders and KV bookkeeping.

The fake model speaks bytes as tokens and answers a fixed reply (a gate holds its next decode
when a test needs a request in flight), and records which threads touched it — so the
engine-thread rule, queueing, cache reuse, cancellation and shutdown are checked without llama.cpp.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import os
import signal
import socket
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from edgespec.sampling import SamplingConfig
from edgespec.server.app import Settings, create_app
from edgespec.server.guard import HostRule
from edgespec.server.run import StopSignals, bind, is_loopback, make_server
from edgespec.server.scheduler import Scheduler
from edgespec.server.schemas import APIError, ChatRequest, CompletionRequest, PromptLimits, parse
from edgespec.template import Message

from .fake_llama import REPLY, FakeEngine

# Every wait is on a condition; this only bounds how long a broken server can hang a test. It is
# generous on purpose: the machine running the tests may be busy.
PATIENCE = 60.0


def wait_until(condition, message: str = "timed out", seconds: float = PATIENCE) -> None:
    """Poll `condition` until it holds; fail with `message` after `seconds`."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, message
        time.sleep(0.01)


def common_prefix(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@contextlib.contextmanager
def served(engine=None, *, max_queue: int = 8, grace_s: float = 5.0, head_timeout_s: float = 10.0,
           keep_alive_s: float = 5, **settings):
    engine = engine or FakeEngine()
    worker = Scheduler(engine, max_queue)
    app = create_app(worker, Settings(model_id="fake-model", **settings))
    sock = bind("127.0.0.1", free_port())
    server = make_server(app, worker.shutdown, grace_s=grace_s, head_timeout_s=head_timeout_s, keep_alive_s=keep_alive_s)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    handle = type("Served", (), {})()
    handle.port = sock.getsockname()[1]
    handle.url = f"http://127.0.0.1:{handle.port}"
    wait_until(lambda: server.started, "server did not start")
    handle.engine, handle.worker, handle.server, handle.thread = engine, worker, server, thread
    try:
        yield handle
    finally:
        engine.gate.set()
        server.handle_exit(2, None)
        thread.join(PATIENCE)
        worker.join(PATIENCE)


@pytest.fixture(scope="module")
def shared():
    """One server for the tests that leave no state behind."""
    with served() as s:
        yield s


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def chat_body(text="Hi", **extra):
    return {"model": "anything", "messages": [{"role": "user", "content": text}], **extra}


def sse_events(lines) -> list:
    out = []
    for line in lines:
        if line.startswith("data: "):
            payload = line[len("data: "):]
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


# ---- the happy paths ---------------------------------------------------------------------------
def test_models_and_health():
    with served() as s:
        models = httpx.get(f"{s.url}/v1/models").json()
        assert models["object"] == "list"
        assert [m["id"] for m in models["data"]] == ["fake-model"]
        health = httpx.get(f"{s.url}/health").json()
        assert health["status"] == "ok" and health["generating"] is False and health["waiting"] == 0
        assert health["served"]["requests"] == 0


def test_chat_completion_whole_with_usage_and_speculation_stats():
    with served() as s:
        r = httpx.post(f"{s.url}/v1/chat/completions", json=chat_body(unknown_field={"ignored": True}))
        assert r.status_code == 200, r.text
        data = r.json()
        assert data["object"] == "chat.completion" and data["model"] == "fake-model"
        choice = data["choices"][0]
        assert choice["message"] == {"role": "assistant", "content": REPLY}
        assert choice["finish_reason"] == "stop"
        usage = data["usage"]
        assert usage["completion_tokens"] == len(REPLY)
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
        assert usage["prompt_tokens_details"]["cached_tokens"] == 0
        spec = data["edgespec"]
        assert spec["drafted"] >= spec["accepted"] == spec["tokens_by_source"].get("ngram", 0)
        assert spec["mode"] == "auto" and sum(spec["tokens_by_source"].values()) == len(REPLY)
        for key in ("acceptance_rate", "tokens_per_pass", "tokens_per_s", "ttft_ms"):
            assert key in spec
        assert s.engine.threads == {"edgespec-generate"}  # never touched from the event loop


def test_max_tokens_stop_and_sampling_reach_the_engine():
    with served(sampling=SamplingConfig(top_k=7)) as s:
        data = httpx.post(f"{s.url}/v1/chat/completions",
                          json=chat_body(max_tokens=5, temperature=0.7, top_p=0.5, seed=3)).json()
        assert data["choices"][0]["message"]["content"] == REPLY[:5]
        assert data["choices"][0]["finish_reason"] == "length"
        sampling = s.engine.generations[-1]["sampling"]
        assert (sampling.temperature, sampling.top_p, sampling.seed, sampling.top_k) == (0.7, 0.5, 3, 7)
        data = httpx.post(f"{s.url}/v1/chat/completions", json=chat_body(stop=[" one"], seed=-1)).json()
        assert data["choices"][0]["message"]["content"] == REPLY[: REPLY.index(" one")]
        assert data["choices"][0]["finish_reason"] == "stop"
        assert s.engine.generations[-1]["sampling"].seed is None  # -1 is llama.cpp's "random"
        data = httpx.post(f"{s.url}/v1/chat/completions", json=chat_body(max_completion_tokens=3)).json()
        assert data["choices"][0]["message"]["content"] == REPLY[:3]


def test_default_max_tokens_comes_from_the_server():
    with served(max_tokens=4) as s:
        data = httpx.post(f"{s.url}/v1/chat/completions", json=chat_body()).json()
        assert data["usage"]["completion_tokens"] == 4


def test_stream_is_openai_sse():
    with served() as s:
        with httpx.stream("POST", f"{s.url}/v1/chat/completions", json=chat_body(stream=True)) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            events = sse_events(r.iter_lines())
        assert events[-1] == "[DONE]"
        chunks = events[:-1]
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
        assert text == REPLY
        last = chunks[-1]
        assert last["choices"][0]["finish_reason"] == "stop"
        assert last["usage"]["completion_tokens"] == len(REPLY)
        assert sum(last["edgespec"]["tokens_by_source"].values()) == len(REPLY)


def test_stream_include_usage_adds_a_usage_only_chunk():
    with served() as s:
        with httpx.stream("POST", f"{s.url}/v1/chat/completions",
                          json=chat_body(stream=True, stream_options={"include_usage": True})) as r:
            events = sse_events(r.iter_lines())
        assert events[-2]["choices"] == [] and events[-2]["usage"]["completion_tokens"] == len(REPLY)


def test_text_completions_whole_and_streamed():
    with served() as s:
        data = httpx.post(f"{s.url}/v1/completions", json={"prompt": "def add(a, b):", "max_tokens": 6}).json()
        assert data["object"] == "text_completion"
        assert data["choices"][0]["text"] == REPLY[:6]
        assert data["usage"]["prompt_tokens"] == len("def add(a, b):")
        with httpx.stream("POST", f"{s.url}/v1/completions", json={"prompt": ["x"], "stream": True}) as r:
            events = sse_events(r.iter_lines())
        assert "".join(e["choices"][0]["text"] for e in events[:-1]) == REPLY


def test_continued_chat_reports_cached_prompt_tokens():
    with served() as s:
        first = [{"role": "user", "content": "Write a haiku"}]
        a = httpx.post(f"{s.url}/v1/chat/completions", json={"messages": first}).json()
        history = first + [{"role": "assistant", "content": a["choices"][0]["message"]["content"]},
                           {"role": "user", "content": "Another"}]
        b = httpx.post(f"{s.url}/v1/chat/completions", json={"messages": history}).json()
        cached = b["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached >= a["usage"]["prompt_tokens"] - 1
        assert b["edgespec"]["prompt_cached"] == cached < b["usage"]["prompt_tokens"]


def test_official_openai_client_reads_it():
    with served() as s:
        client = openai.OpenAI(base_url=f"{s.url}/v1", api_key="unused", max_retries=0)
        assert [m.id for m in client.models.list()] == ["fake-model"]
        whole = client.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}])
        assert whole.choices[0].message.content == REPLY
        assert whole.usage.prompt_tokens_details.cached_tokens == 0  # a fresh server holds nothing
        again = client.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}])
        assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1  # all but the last
        assert whole.model_extra["edgespec"]["prompt_tokens"] == whole.usage.prompt_tokens
        parts = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model="x", messages=[{"role": "user", "content": "hi"}], stream=True) if c.choices]
        assert "".join(parts) == REPLY
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}], max_tokens=-1)
        assert err.value.param == "max_tokens"


# ---- bad requests: OpenAI-shaped 4xx -----------------------------------------------------------
@pytest.mark.parametrize("body,param,status", [
    (b"{not json", None, 400),
    (b"[1, 2]", None, 400),
    (json.dumps(chat_body(max_tokens=-5)).encode(), "max_tokens", 400),
    (json.dumps(chat_body(max_tokens=0)).encode(), "max_tokens", 400),
    (json.dumps(chat_body(max_tokens=10**6)).encode(), "max_tokens", 400),
    (json.dumps(chat_body(temperature=-1)).encode(), "temperature", 400),
    (json.dumps(chat_body(top_p=0)).encode(), "top_p", 400),
    (json.dumps(chat_body(n=2)).encode(), "n", 400),
    (json.dumps(chat_body(stop=["a"] * 17)).encode(), "stop", 400),
    (json.dumps({"model": "x"}).encode(), "messages", 400),
    (json.dumps({"messages": []}).encode(), "messages", 400),
    (json.dumps({"messages": [{"role": "tool", "content": "x"}]}).encode(), "messages", 400),
    (json.dumps({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}).encode(), "messages", 400),
])
def test_bad_requests_are_openai_shaped_400s(shared, body, param, status):
    before = len(shared.engine.generations)
    r = httpx.post(f"{shared.url}/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["message"]
    if param is not None:
        assert err["param"] == param or err["param"].startswith(param), err
    assert len(shared.engine.generations) == before  # nothing reached the models


NESTED = b'{"messages": [{"role": "user", "content": "hi"}], "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"


@pytest.mark.parametrize("body,param,message", [
    # each of these was a 500 with a traceback (issue 21): Python's int limit, its recursion limit, and
    # a string no tokenizer can encode
    (b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": ' + b"9" * 5000 + b"}", None, "not valid JSON"),
    (b'{"messages": [{"role": "user", "content": "hi"}], "seed": ' + b"9" * 4000 + b"}", "seed", "less than"),
    (NESTED, None, "not valid JSON"),
    (b'{"messages": [{"role": "user", "content": "\\ud800"}]}', None, "not valid JSON"),
    (b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}', None, "not valid JSON"),
    # strings are not numbers or booleans (OpenAI's API refuses them too)
    (json.dumps(chat_body(max_tokens="5")).encode(), "max_tokens", "integer"),
    (json.dumps(chat_body(max_tokens=5.0)).encode(), "max_tokens", "integer"),
    (json.dumps(chat_body(stream="yes")).encode(), "stream", "boolean"),
    (json.dumps(chat_body(temperature="0.5")).encode(), "temperature", "number"),
    (json.dumps(chat_body(seed=True)).encode(), "seed", "integer"),
    (json.dumps(chat_body(stream_options={"include_usage": 1})).encode(), "stream_options.include_usage", "boolean"),
])
def test_malformed_bodies_are_400s_not_500s(shared, body, param, message):
    r = httpx.post(f"{shared.url}/v1/chat/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and message in err["message"], err
    assert err["param"] == param or (param is not None and err["param"].startswith(param)), err


TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


@pytest.mark.parametrize("route,extra,param", [
    ("chat", {"tools": TOOLS}, "tools"),
    ("chat", {"tools": TOOLS, "tool_choice": "required"}, "tools"),
    ("chat", {"tools": TOOLS, "tool_choice": "auto"}, "tools"),
    ("chat", {"tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice"),
    ("chat", {"functions": [{"name": "f"}]}, "functions"),
    ("chat", {"function_call": {"name": "f"}}, "function_call"),
    ("chat", {"response_format": {"type": "json_object"}}, "response_format"),
    ("chat", {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}}, "response_format"),
    ("chat", {"logprobs": True}, "logprobs"),
    ("chat", {"logprobs": True, "top_logprobs": 3}, "logprobs"),
    ("chat", {"top_logprobs": 2}, "top_logprobs"),
    ("chat", {"logit_bias": {"50256": -100}}, "logit_bias"),
    ("chat", {"presence_penalty": 0.5}, "presence_penalty"),
    ("chat", {"frequency_penalty": -1}, "frequency_penalty"),
    ("chat", {"modalities": ["text", "audio"]}, "modalities"),
    ("chat", {"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
    ("text", {"best_of": 3}, "best_of"),
    ("text", {"echo": True}, "echo"),
    ("text", {"logprobs": 2}, "logprobs"),
    ("text", {"suffix": "return x"}, "suffix"),
])
def test_unsupported_features_are_400s_naming_the_field(shared, route, extra, param):
    before = len(shared.engine.generations)
    if route == "chat":
        r = httpx.post(f"{shared.url}/v1/chat/completions", json=chat_body(**extra))
    else:
        r = httpx.post(f"{shared.url}/v1/completions", json={"prompt": "def f(x):", **extra})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["code"] == "unsupported_parameter", err
    assert len(shared.engine.generations) == before


def test_tool_calls_in_the_history_are_refused(shared):
    messages = [{"role": "user", "content": "weather?"},
                {"role": "assistant", "content": None, "tool_calls": [{"id": "1", "type": "function",
                                                                      "function": {"name": "f", "arguments": "{}"}}]}]
    r = httpx.post(f"{shared.url}/v1/chat/completions", json={"messages": messages})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages.1.tool_calls", r.text


@pytest.mark.parametrize("extra", [
    {"tools": TOOLS, "tool_choice": "none"},  # offered but never to be called: plain chat
    {"tool_choice": "auto"}, {"response_format": {"type": "text"}}, {"logprobs": False, "top_logprobs": 0},
    {"logit_bias": {}}, {"presence_penalty": 0, "frequency_penalty": 0.0}, {"modalities": ["text"]},
    {"temperature": 1, "top_p": 1},  # an integer is a number
])
def test_what_asks_for_nothing_unsupported_is_served(shared, extra):
    r = httpx.post(f"{shared.url}/v1/chat/completions", json=chat_body(max_tokens=3, **extra))
    assert r.status_code == 200, r.text


def test_text_completion_neutral_values_are_served(shared):
    r = httpx.post(f"{shared.url}/v1/completions",
                   json={"prompt": "x", "max_tokens": 2, "best_of": 1, "echo": False, "suffix": None, "logprobs": None})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("temperature", [1e-310, 5e-324, 1e-6])
def test_tiny_temperatures_are_served_greedy(shared, temperature):
    r = httpx.post(f"{shared.url}/v1/chat/completions", json=chat_body(temperature=temperature, max_tokens=3))
    assert r.status_code == 200, r.text
    assert shared.engine.generations[-1]["sampling"].greedy


def test_a_prompt_that_cannot_fit_is_refused_before_tokenizing():
    limits = PromptLimits(n_ctx=100, max_token_bytes=4)
    fits = json.dumps({"prompt": "x" * 396}).encode()  # at least 99 tokens: might fit
    assert parse(CompletionRequest, fits, limits).prompt_text() == "x" * 396
    for body, param in ((json.dumps({"prompt": "x" * 397}).encode(), "prompt"),  # at least 100
                        (json.dumps({"messages": [{"role": "user", "content": "é" * 150},  # 2 bytes each
                                                  {"role": "user", "content": "x" * 100}]}).encode(), "messages")):
        with pytest.raises(APIError) as err:
            parse(CompletionRequest if param == "prompt" else ChatRequest, body, limits)
        assert err.value.status == 400 and err.value.code == "context_length_exceeded" and err.value.param == param
        assert "at least 100 tokens" in err.value.message


def test_prompt_limits_come_from_the_model_s_vocabulary():
    class Vocab:
        n_ctx, n_vocab = 64, 3

        def token_bytes(self, t):
            return [b"a", b"abcde", b""][t]

    assert PromptLimits.of(Vocab()) == PromptLimits(64, 5)
    reported = Vocab()
    reported.max_token_bytes = 9
    assert PromptLimits.of(reported) == PromptLimits(64, 9)


def test_content_parts_and_developer_role_are_accepted():
    with served() as s:
        body = {"messages": [{"role": "developer", "content": "Be brief."},
                             {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]}]}
        r = httpx.post(f"{s.url}/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        expected = s.engine.chat_tokens([Message("system", "Be brief."), Message("user", "Hi there")])
        assert r.json()["usage"]["prompt_tokens"] == len(expected)


def test_prompt_longer_than_the_context_is_a_400():
    with served() as s:
        r = httpx.post(f"{s.url}/v1/completions", json={"prompt": "x" * 3000})
        assert r.status_code == 400
        assert r.json()["error"]["code"] == "context_length_exceeded"


def test_body_size_is_capped():
    with served(max_request_bytes=2048) as s:
        r = httpx.post(f"{s.url}/v1/chat/completions", json=chat_body("x" * 4096))
        assert r.status_code == 413
        assert "2048" in r.json()["error"]["message"]


def test_unknown_route_is_openai_shaped_404():
    with served() as s:
        r = httpx.get(f"{s.url}/v1/nothing")
        assert r.status_code == 404 and "error" in r.json()


def test_api_key():
    with served(api_key="sekrit") as s:
        assert httpx.get(f"{s.url}/health").status_code == 200  # health stays open for probes
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "sekrit"}):
            r = httpx.post(f"{s.url}/v1/chat/completions", json=chat_body(), headers=headers)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
            assert httpx.get(f"{s.url}/v1/models", headers=headers).status_code == 401
        r = httpx.post(f"{s.url}/v1/chat/completions", json=chat_body(), headers={"Authorization": "Bearer sekrit"})
        assert r.status_code == 200
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{s.url}/v1", api_key="wrong", max_retries=0).models.list()


# ---- who may call: Host, Origin, Content-Type --------------------------------------------------
def test_a_foreign_host_header_is_refused(shared):
    """DNS rebinding: a page on evil.example resolving to 127.0.0.1 still sends its own Host."""
    for host in ("evil.example", f"evil.example:{shared.port}", "127.0.0.1.evil.example", "192.168.1.5"):
        r = httpx.post(f"{shared.url}/v1/chat/completions", json=chat_body(), headers={"Host": host})
        assert r.status_code == 400, (host, r.text)
        assert r.json()["error"]["code"] == "invalid_host" and "--allowed-host" in r.json()["error"]["message"]
    for host in (f"127.0.0.1:{shared.port}", f"localhost:{shared.port}", "LOCALHOST", "127.0.0.2", "[::1]:8080"):
        assert httpx.get(f"{shared.url}/v1/models", headers={"Host": host}).status_code == 200, host


def test_allowed_host_adds_a_name():
    with served(allowed_hosts=("mybox.lan",)) as s:
        assert httpx.get(f"{s.url}/v1/models", headers={"Host": "mybox.lan:8080"}).status_code == 200
        assert httpx.get(f"{s.url}/v1/models", headers={"Host": "other.lan"}).status_code == 400
        assert httpx.get(f"{s.url}/v1/models").status_code == 200


def test_host_rule_by_bind_address():
    wildcard = HostRule("0.0.0.0")
    assert wildcard.allows("192.168.1.5:8080") and wildcard.allows("[fe80::1]") and wildcard.allows("localhost")
    assert wildcard.allows(socket.gethostname()) and not wildcard.allows("evil.example")
    lan = HostRule("192.168.1.5")
    assert lan.allows("192.168.1.5:8080") and not lan.allows("127.0.0.1") and not lan.allows("10.0.0.1")
    named = HostRule("mybox.lan", ["alias.lan"])
    assert named.allows("MyBox.lan.") and named.allows("alias.lan") and not named.allows("evil.example")
    assert HostRule("127.0.0.1", ["*"]).allows("anything.example")
    assert HostRule("::1").allows("[::1]:9000") and not HostRule("::1").allows("evil.example")


def test_browser_origins_are_refused_without_cors(shared):
    before = len(shared.engine.generations)
    for origin in ("https://evil.example", "http://localhost:3000", "null"):
        r = httpx.post(f"{shared.url}/v1/chat/completions", json=chat_body(), headers={"Origin": origin})
        assert r.status_code == 403, r.text
        assert r.json()["error"]["code"] == "origin_not_allowed" and "access-control-allow-origin" not in r.headers
    r = httpx.options(f"{shared.url}/v1/chat/completions",
                      headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
    assert r.status_code == 403 and "access-control-allow-origin" not in r.headers
    assert len(shared.engine.generations) == before


def test_cors_allows_the_named_origin_with_preflight():
    with served(cors_origins=("http://localhost:3000",)) as s:
        pre = httpx.options(f"{s.url}/v1/chat/completions", headers={
            "Origin": "http://localhost:3000", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os"})
        assert pre.status_code == 200, pre.text
        assert pre.headers["access-control-allow-origin"] == "http://localhost:3000"
        assert "POST" in pre.headers["access-control-allow-methods"]
        assert "x-stainless-os" in pre.headers["access-control-allow-headers"].lower()
        r = httpx.post(f"{s.url}/v1/chat/completions", json=chat_body(max_tokens=2), headers={"Origin": "http://localhost:3000"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://localhost:3000"
        other = httpx.post(f"{s.url}/v1/chat/completions", json=chat_body(), headers={"Origin": "https://evil.example"})
        assert other.status_code == 403
    with served(cors_origins=("*",)) as s:
        r = httpx.post(f"{s.url}/v1/chat/completions", json=chat_body(max_tokens=2), headers={"Origin": "https://a.example"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "*"


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded",
                                          "multipart/form-data; boundary=x", "application/jsonx"])
def test_posts_must_be_json(shared, content_type):
    """A browser sends these "simple" requests without a CORS preflight, Origin or not."""
    before = len(shared.engine.generations)
    conn = http.client.HTTPConnection("127.0.0.1", shared.port, timeout=PATIENCE)  # sends no Content-Type of its own
    conn.request("POST", "/v1/chat/completions", body=json.dumps(chat_body()),
                 headers={} if content_type is None else {"Content-Type": content_type})
    reply = conn.getresponse()
    assert reply.status == 415
    assert json.loads(reply.read())["error"]["code"] == "unsupported_media_type"
    conn.close()
    assert len(shared.engine.generations) == before
    ok = httpx.post(f"{shared.url}/v1/chat/completions", content=json.dumps(chat_body(max_tokens=2)),
                    headers={"Content-Type": "Application/JSON; charset=utf-8"})
    assert ok.status_code == 200, ok.text


def test_a_trailing_slash_is_a_404_not_a_redirect_to_the_host_header(shared):
    r = httpx.get(f"{shared.url}/v1/models/", headers={"Host": f"localhost:{shared.port}"})
    assert r.status_code == 404 and "location" not in r.headers and "error" in r.json()


# ---- connections are bounded in time -----------------------------------------------------------
def closed_by_server(conn: socket.socket, send_slowly: bytes = b"") -> bool:
    """Read (sending `send_slowly` a byte at a time meanwhile) until the server closes the connection."""
    conn.settimeout(0.05)
    deadline = time.monotonic() + PATIENCE
    for i in range(10**9):
        assert time.monotonic() < deadline, "the server kept the connection open"
        try:
            if conn.recv(65536) == b"":
                return True
        except socket.timeout:
            pass
        except ConnectionResetError:
            return True
        if i < len(send_slowly):
            try:
                conn.send(send_slowly[i:i + 1])
            except (BrokenPipeError, ConnectionResetError):
                return True
    return False


def test_connections_that_send_no_request_head_are_closed():
    with served(head_timeout_s=0.3) as s:
        with socket.create_connection(("127.0.0.1", s.port)) as silent:
            assert closed_by_server(silent)
        slow_head = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"X-Slow: " + b"a" * 100_000
        with socket.create_connection(("127.0.0.1", s.port)) as slow:
            assert closed_by_server(slow, send_slowly=slow_head)
        # a request in progress is not cut by the deadline, and the connection stays usable for the next
        with httpx.Client() as client:
            s.engine.gate.clear()
            answer = threading.Thread(target=lambda: results.append(client.post(
                f"{s.url}/v1/chat/completions", json=chat_body(), timeout=PATIENCE)))
            results: list = []
            answer.start()
            assert s.engine.waiting.wait(PATIENCE)
            wait_until(lambda: s.worker.counts["requests"] == 1)
            with socket.create_connection(("127.0.0.1", s.port)) as later:  # its deadline ends after the request's
                assert closed_by_server(later)
            s.engine.gate.set()
            answer.join(PATIENCE)
            assert results[0].status_code == 200
            assert client.get(f"{s.url}/v1/models").status_code == 200


def test_idle_keep_alive_connections_are_closed_and_heads_are_bounded():
    with served(keep_alive_s=0.3) as s:
        with socket.create_connection(("127.0.0.1", s.port)) as conn:
            conn.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert closed_by_server(conn)  # after its response, idle
        with socket.create_connection(("127.0.0.1", s.port), timeout=PATIENCE) as conn:
            conn.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"a" * (20 << 10))  # 20 KiB, no end
            assert conn.recv(4096).startswith(b"HTTP/1.1 400")


# ---- shutdown: what uvicorn cancels still ends as documented ------------------------------------
@contextlib.contextmanager
def uvicorn_errors():
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    log = logging.getLogger("uvicorn.error")
    log.addHandler(handler)
    try:
        yield records
    finally:
        log.removeHandler(handler)


def test_responses_cancelled_at_shutdown_end_with_shutting_down():
    """The prompt of the running request is still being evaluated (held) when the grace period ends:
    the stream gets its error chunk, the waiting request a 503 in JSON, and nothing is logged as a crash."""
    engine = FakeEngine()
    with uvicorn_errors() as errors, served(engine, grace_s=0.5) as s:
        engine.gate.clear()
        waiting: list = []
        with httpx.stream("POST", f"{s.url}/v1/chat/completions", json=chat_body(stream=True), timeout=PATIENCE) as r:
            lines = r.iter_lines()
            next(lines)
            assert engine.waiting.wait(PATIENCE)
            queued = threading.Thread(target=lambda: waiting.append(
                httpx.post(f"{s.url}/v1/chat/completions", json=chat_body(), timeout=PATIENCE)))
            queued.start()
            wait_until(lambda: s.worker.waiting == 1)
            s.server.handle_exit(signal.SIGINT, None)
            rest = sse_events(lines)  # the held generation never reaches its next token
        queued.join(PATIENCE)
        with pytest.raises(httpx.ConnectError):  # the port closed at the stop
            httpx.get(f"{s.url}/health")
        assert rest[-1]["error"]["code"] == "shutting_down"
        assert waiting[0].status_code == 503 and waiting[0].json()["error"]["code"] == "shutting_down"
        s.thread.join(PATIENCE)
        assert not s.thread.is_alive()
    crashes = [r for r in errors if r.exc_info or "Exception in ASGI" in r.getMessage()]
    assert not crashes, [r.getMessage() for r in crashes]


def test_a_signal_stops_the_wait_for_the_generation_thread():
    from edgespec.commands.serve import STOP_WAIT_S, _join

    class Stuck:  # a generation thread inside one long llama.cpp call
        def join(self, timeout=None):
            time.sleep(timeout or 0)
            return False

    signals = StopSignals()
    threading.Timer(0.2, signals.received.append, (signal.SIGINT,)).start()
    started = time.monotonic()
    assert _join(Stuck(), signals) is False
    assert len(signals.received) == 1 and time.monotonic() - started < STOP_WAIT_S  # it did not wait it out

    class Done:
        def join(self, timeout=None):
            return True

    assert _join(Done(), StopSignals()) is True


def test_stop_signals_never_raise_and_reach_every_listener():
    heard: list[int] = []
    signals = StopSignals()
    before = signal.getsignal(signal.SIGINT)
    with signals.installed():
        os.kill(os.getpid(), signal.SIGINT)  # before anyone listens: replayed to the listener
        wait_until(lambda: len(signals.received) == 1)
        signals.listen(heard.append)
        # One at a time: the kernel keeps one pending signal of a kind, so a second SIGINT sent
        # before the handler ran for the first merges with it (on a busy machine it often does).
        for n, sig in enumerate((signal.SIGINT, signal.SIGTERM, signal.SIGINT), start=2):
            os.kill(os.getpid(), sig)
            wait_until(lambda: len(signals.received) == n, f"signal {n} was lost")
    assert heard == [signal.SIGINT, signal.SIGINT, signal.SIGTERM, signal.SIGINT]
    assert signal.getsignal(signal.SIGINT) is before


# ---- one generation at a time ------------------------------------------------------------------
def test_concurrent_requests_queue_and_all_complete():
    engine = FakeEngine()
    engine.gate.clear()
    with served(engine) as s:
        results = [None] * 3

        def ask(i):
            results[i] = httpx.post(f"{s.url}/v1/chat/completions", json=chat_body(f"question {i}"), timeout=PATIENCE)

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        assert engine.waiting.wait(PATIENCE)
        wait_until(lambda: s.worker.waiting == 2, "the other two did not queue behind the first")
        engine.gate.set()
        for t in threads:
            t.join(PATIENCE)
        assert [r.status_code for r in results] == [200, 200, 200]
        assert all(r.json()["choices"][0]["message"]["content"] == REPLY for r in results)
        assert len(engine.generations) == 3 and all(g["closed"] for g in engine.generations)
        assert engine.threads == {"edgespec-generate"}


def test_full_queue_is_503_with_retry_after():
    engine = FakeEngine()
    engine.gate.clear()
    with served(engine, max_queue=1) as s:
        threads = [threading.Thread(target=httpx.post, args=(f"{s.url}/v1/chat/completions",),
                                    kwargs={"json": chat_body(), "timeout": PATIENCE}) for _ in range(2)]
        threads[0].start()
        assert engine.waiting.wait(PATIENCE)  # one generating
        threads[1].start()
        wait_until(lambda: s.worker.waiting == 1, "the second request did not queue")
        r = httpx.post(f"{s.url}/v1/chat/completions", json=chat_body())
        assert r.status_code == 503
        assert r.headers["retry-after"].isdigit()
        assert r.json()["error"]["code"] == "queue_full"
        engine.gate.set()
        for t in threads:
            t.join(PATIENCE)


def test_client_leaving_mid_stream_stops_generation_and_frees_the_models():
    engine = FakeEngine()
    with served(engine) as s:
        engine.gate.clear()
        with httpx.stream("POST", f"{s.url}/v1/chat/completions", json=chat_body(stream=True)) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")  # the role chunk
            assert engine.waiting.wait(PATIENCE)
            job = s.worker.running[0]
        # closed mid-answer; once the server notices, let the held token through: generation must stop after it
        wait_until(lambda: job.cancelled.is_set(), "the server did not notice the client leaving")
        engine.gate.set()
        wait_until(lambda: engine.generations[0]["closed"], "generation kept running after the client left")
        # the held decode read the prompt and its first round: nothing after it
        assert engine.generations[0]["emitted"] == 1
        r = httpx.post(f"{s.url}/v1/chat/completions", json=chat_body())
        assert r.json()["choices"][0]["message"]["content"] == REPLY
        counts = httpx.get(f"{s.url}/health").json()["served"]
        # the cancelled request's one token, then the whole reply
        assert counts == {"requests": 2, "completed": 1, "cancelled": 1, "failed": 0, "tokens": 1 + len(REPLY)}


def raw_post(port: int, path: str, body: dict | bytes, headers: dict | None = None) -> socket.socket:
    """A request on a plain socket, left open: the test decides when the client leaves."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    head = {"Host": f"127.0.0.1:{port}", "Content-Type": "application/json", "Content-Length": str(len(data)),
            **(headers or {})}
    conn = socket.create_connection(("127.0.0.1", port), timeout=PATIENCE)
    conn.sendall(f"POST {path} HTTP/1.1\r\n".encode() + b"".join(f"{k}: {v}\r\n".encode() for k, v in head.items())
                 + b"\r\n" + data)
    return conn


def test_client_leaving_while_waiting_for_a_whole_answer_stops_it():
    engine = FakeEngine()
    with served(engine) as s:
        engine.gate.clear()
        conn = raw_post(s.port, "/v1/chat/completions", chat_body())
        assert engine.waiting.wait(PATIENCE)  # generating, held at its first decode
        job = s.worker.running[0]
        conn.close()
        wait_until(lambda: job.cancelled.is_set(), "the server did not notice the client leaving")
        engine.gate.set()
        wait_until(lambda: engine.generations[0]["closed"])
        assert engine.generations[0]["emitted"] == 1  # the held decode's round, nothing after it


# ---- shutdown ----------------------------------------------------------------------------------
def test_shutdown_ends_a_stream_with_an_error_chunk():
    engine = FakeEngine()
    with served(engine) as s:
        engine.gate.clear()
        with httpx.stream("POST", f"{s.url}/v1/chat/completions", json=chat_body(stream=True), timeout=PATIENCE) as r:
            lines = r.iter_lines()
            next(lines)
            assert engine.waiting.wait(PATIENCE)
            s.server.handle_exit(2, None)  # what SIGINT does
            engine.gate.set()
            rest = sse_events(lines)
        assert rest[-1]["error"]["code"] == "shutting_down"
        assert "[DONE]" not in rest
        s.thread.join(PATIENCE)
        assert not s.thread.is_alive()
        assert s.worker.join(PATIENCE)


def test_official_client_raises_on_the_error_chunk():
    engine = FakeEngine()
    with served(engine) as s:
        client = openai.OpenAI(base_url=f"{s.url}/v1", api_key="x", max_retries=0)
        engine.gate.clear()
        chunks = client.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}], stream=True)
        it = iter(chunks)
        next(it)
        assert engine.waiting.wait(PATIENCE)
        s.server.handle_exit(15, None)
        engine.gate.set()
        with pytest.raises(openai.APIError, match="shutting down"):
            for _ in it:
                pass


# ---- listening ---------------------------------------------------------------------------------
def test_port_in_use_is_a_one_line_config_error():
    from edgespec.errors import ConfigError

    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(ConfigError, match="already in use"):
            bind("127.0.0.1", port)


def test_loopback_detection():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost") and is_loopback("127.3.2.1")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.5") and not is_loopback("example.org")


# ---- the command -------------------------------------------------------------------------------
@pytest.mark.parametrize("args,message", [
    (["-n", "100", "--max-tokens-cap", "50"], "above --max-tokens-cap"),
    (["--api-key", " "], "--api-key is empty"),
    (["--temperature", "-1"], "--temperature"),
])
def test_serve_refuses_bad_options_in_one_line_before_loading(args, message, capsys):
    from edgespec.commands import main

    with pytest.raises(SystemExit) as exit_:
        main(["serve", "-m", "/nonexistent/never-loaded.gguf", "--port", str(free_port()), *args])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err


@pytest.mark.parametrize("args,message", [
    (["--cors", "localhost:3000"], "is not an origin"),
    (["--cors", "http://localhost:3000/app"], "is not an origin"),
    (["--allowed-host", "http://mybox.lan"], "is not a host name"),
])
def test_serve_refuses_bad_cors_and_host_options(args, message, capsys):
    from edgespec.commands import main

    with pytest.raises(SystemExit) as exit_:
        main(["serve", "-m", "/nonexistent/never-loaded.gguf", "--port", str(free_port()), *args])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_origin_and_host_options_normalise():
    from edgespec.commands.serve import HostNameType, OriginType

    assert OriginType().convert("HTTP://LocalHost:3000/", None, None) == "http://localhost:3000"
    assert OriginType().convert("*", None, None) == "*"
    assert HostNameType().convert("MyBox.LAN", None, None) == "mybox.lan"
    assert HostNameType().convert("[::1]", None, None) == "[::1]"


def test_served_name():
    from pathlib import Path

    from edgespec.commands.serve import served_name

    path = Path("/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf")
    assert served_name("qwen2.5-coder-1.5b-instruct-q4_k_m", path) == "qwen2.5-coder-1.5b-instruct-q4_k_m"
    assert served_name("/models/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", path) == "qwen2.5-coder-1.5b-instruct-q4_k_m"
    assert served_name("hf:Qwen/Repo/file.gguf", Path("/cache/file.gguf")) == "file"


def test_server_package_reaches_the_models_only_through_the_engine():
    import subprocess
    import sys

    code = ("import sys, edgespec.server.app, edgespec.server.run, edgespec.server.scheduler, edgespec.server.schemas, "
            "edgespec.server.guard; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('llama_cpp', 'rich')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
