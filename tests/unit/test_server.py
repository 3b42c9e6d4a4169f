"""The HTTP server over the real Engine on a fake model: real uvicorn on a loopback port, real HTTP
clients, the real scheduler, decoders and KV bookkeeping.

The fake model speaks bytes as tokens and answers a fixed reply (a gate holds its next decode
when a test needs a request in flight), and records which threads touched it — so the
engine-thread rule, queueing, cache reuse, cancellation and shutdown are checked without llama.cpp.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest

from edgespec.backend.model import LoadParams
from edgespec.engine import Engine, EngineConfig
from edgespec.sampling import SamplingConfig
from edgespec.server.app import Settings, create_app
from edgespec.server.run import bind, is_loopback, make_server
from edgespec.server.scheduler import Scheduler
from edgespec.template import Message

from .fake_llama import FakeLlama

REPLY = "Hello from the fake model, one token at a time."


def wait_until(condition, message: str = "timed out", seconds: float = 5.0) -> None:
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


class FakeEngine(Engine):
    """The real Engine (decoders, batcher, controller) over a fake multi-sequence model."""

    def __init__(self, reply: str = REPLY, *, n_seq: int = 1, n_ctx: int = 2048):
        target = FakeLlama(reply, n_seq=n_seq, n_ctx=n_ctx)
        super().__init__(EngineConfig(Path("fake.gguf"), LoadParams(), n_seq=n_seq), models=(target, None))
        self.gate, self.waiting, self.threads = target.gate, target.held, target.threads
        self.generations: list[dict] = []  # per admitted request: sampling, max_tokens, emitted, closed

    def decoder(self, sampling, mode=None, **kw):
        dec = super().decoder(sampling, mode, **kw)
        record = {"emitted": 0, "sampling": sampling, "closed": False}
        self.generations.append(record)
        apply, close = dec.apply, dec.close

        def counted_apply(*args):
            events = apply(*args)
            record["emitted"] += len(events)
            return events

        def recorded_close():
            record["closed"] = True
            close()

        dec.apply, dec.close = counted_apply, recorded_close
        return dec


@contextlib.contextmanager
def served(engine=None, *, max_queue: int = 8, grace_s: float = 5.0, **settings):
    engine = engine or FakeEngine()
    worker = Scheduler(engine, max_queue)
    app = create_app(worker, Settings(model_id="fake-model", **settings))
    sock = bind("127.0.0.1", free_port())
    server = make_server(app, worker.shutdown, grace_s=grace_s)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "server did not start"
        time.sleep(0.01)
    handle = type("Served", (), {})()
    handle.url, handle.engine, handle.worker, handle.server, handle.thread = url, engine, worker, server, thread
    try:
        yield handle
    finally:
        engine.gate.set()
        server.handle_exit(2, None)
        thread.join(15)
        worker.join(5)


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
        assert whole.usage.prompt_tokens_details.cached_tokens >= 0
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


# ---- one generation at a time ------------------------------------------------------------------
def test_concurrent_requests_queue_and_all_complete():
    engine = FakeEngine()
    engine.gate.clear()
    with served(engine) as s:
        results = [None] * 3

        def ask(i):
            results[i] = httpx.post(f"{s.url}/v1/chat/completions", json=chat_body(f"question {i}"), timeout=30)

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        assert engine.waiting.wait(5)
        time.sleep(0.2)  # let the other two reach the queue while the first is held
        engine.gate.set()
        for t in threads:
            t.join(30)
        assert [r.status_code for r in results] == [200, 200, 200]
        assert all(r.json()["choices"][0]["message"]["content"] == REPLY for r in results)
        assert len(engine.generations) == 3 and all(g["closed"] for g in engine.generations)
        assert engine.threads == {"edgespec-generate"}


def test_full_queue_is_503_with_retry_after():
    engine = FakeEngine()
    engine.gate.clear()
    with served(engine, max_queue=1) as s:
        threads = [threading.Thread(target=httpx.post, args=(f"{s.url}/v1/chat/completions",),
                                    kwargs={"json": chat_body(), "timeout": 30}) for _ in range(2)]
        threads[0].start()
        assert engine.waiting.wait(5)  # one generating
        threads[1].start()
        deadline = time.monotonic() + 5
        while s.worker.waiting < 1:  # one waiting
            assert time.monotonic() < deadline
            time.sleep(0.01)
        r = httpx.post(f"{s.url}/v1/chat/completions", json=chat_body())
        assert r.status_code == 503
        assert r.headers["retry-after"].isdigit()
        assert r.json()["error"]["code"] == "queue_full"
        engine.gate.set()
        for t in threads:
            t.join(30)


def test_client_leaving_mid_stream_stops_generation_and_frees_the_models():
    engine = FakeEngine()
    with served(engine) as s:
        engine.gate.clear()
        with httpx.stream("POST", f"{s.url}/v1/chat/completions", json=chat_body(stream=True)) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")  # the role chunk
            assert engine.waiting.wait(5)
            job = s.worker.running[0]
        # closed mid-answer; once the server notices, let the held token through: generation must stop after it
        wait_until(lambda: job.cancelled.is_set(), "the server did not notice the client leaving")
        engine.gate.set()
        wait_until(lambda: engine.generations[0]["closed"], "generation kept running after the client left")
        assert engine.generations[0]["emitted"] == 0  # the held decode was the prompt's: nothing after it
        r = httpx.post(f"{s.url}/v1/chat/completions", json=chat_body())
        assert r.json()["choices"][0]["message"]["content"] == REPLY
        counts = httpx.get(f"{s.url}/health").json()["served"]
        assert counts == {"requests": 2, "completed": 1, "cancelled": 1, "failed": 0, "tokens": len(REPLY)}


def test_client_leaving_while_waiting_for_a_whole_answer_stops_it():
    engine = FakeEngine()
    with served(engine) as s:
        engine.gate.clear()
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{s.url}/v1/chat/completions", json=chat_body(), timeout=0.5)
        assert engine.waiting.is_set()
        job = s.worker.running[0]
        wait_until(lambda: job.cancelled.is_set(), "the server did not notice the client leaving")
        engine.gate.set()
        wait_until(lambda: engine.generations[0]["closed"])
        assert engine.generations[0]["emitted"] == 0


# ---- shutdown ----------------------------------------------------------------------------------
def test_shutdown_ends_a_stream_with_an_error_chunk():
    engine = FakeEngine()
    with served(engine) as s:
        engine.gate.clear()
        with httpx.stream("POST", f"{s.url}/v1/chat/completions", json=chat_body(stream=True), timeout=10) as r:
            lines = r.iter_lines()
            next(lines)
            assert engine.waiting.wait(5)
            s.server.handle_exit(2, None)  # what SIGINT does
            engine.gate.set()
            rest = sse_events(lines)
        assert rest[-1]["error"]["code"] == "shutting_down"
        assert "[DONE]" not in rest
        s.thread.join(10)
        assert not s.thread.is_alive()
        assert s.worker.join(5)


def test_official_client_raises_on_the_error_chunk():
    engine = FakeEngine()
    with served(engine) as s:
        client = openai.OpenAI(base_url=f"{s.url}/v1", api_key="x", max_retries=0)
        engine.gate.clear()
        chunks = client.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}], stream=True)
        it = iter(chunks)
        next(it)
        assert engine.waiting.wait(5)
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

    code = ("import sys, edgespec.server.app, edgespec.server.run, edgespec.server.scheduler, edgespec.server.schemas; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('llama_cpp', 'rich')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
