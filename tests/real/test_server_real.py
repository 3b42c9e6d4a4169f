"""`edgespec serve` as users run it: a subprocess on a free loopback port with the real models,
spoken to with the official `openai` package (raw HTTP only where a client cannot send the request)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from .conftest import DRAFT, SMALL, TARGET

KEY = "edgespec-test-key"
COUNT = [{"role": "user", "content": "Count from 1 to 300, separated by commas."}]


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
        return httpx.get(f"{self.url}/health", timeout=10).json()

    def client(self, key: str = KEY) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=key, max_retries=0, timeout=300)

    def stop(self, sig=signal.SIGINT, timeout: float = 20) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            pytest.fail(f"serve did not stop within {timeout}s of {signal.Signals(sig).name}:\n{self.output()}")


@pytest.fixture(scope="module", autouse=True)
def models_present(model_path):
    for name in (TARGET, DRAFT, SMALL):
        model_path(name)


@pytest.fixture(scope="module")
def small():
    server = Server("-m", SMALL, "-t", "2", "-n", "24", "--api-key", KEY).wait_ready()
    yield server
    assert server.stop() == 0, server.output()  # SIGINT with nothing in flight: a clean exit


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
    assert after["waiting"] == 0 and after["generating"] is False


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
    control = client.chat.completions.create(model=SMALL, messages=COUNT, max_tokens=60)
    assert control.choices[0].finish_reason == "length"  # uncancelled, this prompt runs all 60 tokens
    before = small.health()["served"]
    stream = client.chat.completions.create(model=SMALL, messages=COUNT, max_tokens=60, stream=True)
    pieces = 0
    for chunk in stream:
        pieces += bool(chunk.choices and chunk.choices[0].delta.content)
        if pieces == 2:
            break
    stream.close()
    answer = client.chat.completions.create(model=SMALL, messages=[{"role": "user", "content": "Say hi."}], max_tokens=8)
    assert answer.choices[0].message.content.strip()
    after = small.health()["served"]
    assert after["cancelled"] == before["cancelled"] + 1
    cancelled_tokens = after["tokens"] - before["tokens"] - answer.usage.completion_tokens
    assert 2 <= cancelled_tokens < 60


def test_sigint_during_a_stream_ends_it_with_an_error_and_exits_0():
    server = Server("-m", SMALL, "-t", "2").wait_ready()
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
    server = Server("-t", "2", "-n", "48").wait_ready()
    try:
        assert DRAFT.rsplit("-q", 1)[0] in server.output()  # the startup line names the draft model
        code = "def area(width, height):\n    result = width * height\n    return result\n\n\nprint(area(3, 4))\n"
        ask = [{"role": "user", "content": f"Rename the variable result to product and return the whole code:\n\n{code}"}]
        answer = server.client().chat.completions.create(model="anything", messages=ask)
        assert answer.model == TARGET
        assert "product" in answer.choices[0].message.content
        stats = answer.model_extra["edgespec"]
        assert stats["mode"] == "auto"
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
