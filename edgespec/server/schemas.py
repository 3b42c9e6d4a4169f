"""What the OpenAI API accepts and returns: request validation, response and error shapes.

Unknown request fields are ignored (clients send many); a field we read but cannot honour is a
400 naming it, in OpenAI's error shape so the official clients raise their usual exceptions.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..generate import Final, GenerationStats


class APIError(Exception):
    """An HTTP error with OpenAI's body: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return error_body(self.message, type=self.type, param=self.param, code=self.code)


def error_body(message: str, *, type: str = "invalid_request_error", param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


# ---- requests ----------------------------------------------------------------------------------
# Strict types, as OpenAI's API has them: "5" is not an integer, "yes" not a boolean (an integer
# is a number, though). The JSON is parsed by pydantic's own parser (jiter), which refuses what
# Python's json module would turn into a 500 later: numbers of thousands of digits, nesting
# deeper than 200 levels (RecursionError), lone UTF-16 surrogates ("\ud800", which no tokenizer
# can encode) and invalid UTF-8.
_STRICT = ConfigDict(extra="ignore", strict=True)


class StreamOptions(BaseModel):
    model_config = _STRICT
    include_usage: bool = False


class _Request(BaseModel):
    model_config = _STRICT

    model: str | None = None  # any name is accepted: one model pair is loaded
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)  # the newer name of max_tokens
    temperature: float | None = Field(None, ge=0, le=2)  # below sampling.GREEDY_BELOW: greedy
    top_p: float | None = Field(None, gt=0, le=1)
    seed: int | None = Field(None, ge=-1, lt=2**63)  # -1: random, as in llama.cpp
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    n: int | None = Field(None, ge=1, le=1)  # one choice per request
    priority: int | None = Field(None, ge=-(2**31), lt=2**31)  # lower is served first (as vLLM)
    # Read only to refuse them: a client that asks for these must not get an answer without them.
    logit_bias: dict[str, float] | None = None
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    response_format: dict | None = None

    def stops(self) -> list[str] | None:
        if self.stop is None:
            return None
        stops = [self.stop] if isinstance(self.stop, str) else self.stop
        if len(stops) > 16:
            raise APIError(400, f"stop: at most 16 stop strings (got {len(stops)})", param="stop")
        return [s for s in stops if s]

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens if self.max_tokens is not None else self.max_completion_tokens

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def unsupported(self) -> list[tuple[str, str]]:
        """(field, why) for each feature asked for that this server does not implement."""
        out = []
        if self.logit_bias:
            out.append(("logit_bias", "token biases are not supported"))
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name):
                out.append((name, "not supported; the server's --repeat-penalty applies to every request"))
        kind = (self.response_format or {}).get("type", "text")
        if kind != "text":
            out.append(("response_format", f"{kind!r} is not supported: no constrained (JSON) output, text only"))
        return out

    def prompt_bytes(self) -> int:
        """The UTF-8 size of the text that will be tokenized (the template adds to it)."""
        raise NotImplementedError


class ContentPart(BaseModel):
    model_config = _STRICT
    type: str
    text: str | None = None


class ChatMessageIn(BaseModel):
    model_config = _STRICT
    role: str
    content: str | list[ContentPart] | None = None
    tool_calls: list | None = None  # read only to refuse them

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for part in self.content:
            if part.type != "text" or part.text is None:
                raise APIError(400, f"messages: content parts of type {part.type!r} are not supported (text only)",
                               param="messages")
            parts.append(part.text)
        return "".join(parts)


NO_TOOLS = "this server does not call tools (no function calling)"


class ChatRequest(_Request):
    messages: list[ChatMessageIn] = Field(min_length=1)
    tools: list | None = None
    tool_choice: str | dict | None = None
    functions: list | None = None  # the older names of tools and tool_choice
    function_call: str | dict | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    audio: dict | None = None
    modalities: list[str] | None = None

    def unsupported(self) -> list[tuple[str, str]]:
        out = super().unsupported()
        # Tools offered with "none" cannot be called: that request is served as plain chat.
        if self.tools and self.tool_choice != "none":
            out.append(("tools", f"{NO_TOOLS}; send tool_choice \"none\" or no tools"))
        elif self.tool_choice not in (None, "none", "auto"):
            out.append(("tool_choice", NO_TOOLS))
        if self.functions and self.function_call != "none":
            out.append(("functions", NO_TOOLS))
        elif self.function_call not in (None, "none", "auto"):
            out.append(("function_call", NO_TOOLS))
        for i, m in enumerate(self.messages):
            if m.tool_calls:
                out.append((f"messages.{i}.tool_calls", NO_TOOLS))
        if self.logprobs:
            out.append(("logprobs", "log probabilities are not returned by this server"))
        if self.top_logprobs:
            out.append(("top_logprobs", "log probabilities are not returned by this server"))
        if self.audio is not None or any(m != "text" for m in self.modalities or ()):
            out.append(("modalities" if self.audio is None else "audio", "text output only"))
        return out

    def prompt_bytes(self) -> int:
        return sum(len(m.text().encode()) for m in self.messages)


class CompletionRequest(_Request):
    prompt: str | list[str]
    logprobs: int | None = Field(None, ge=0, le=5)
    echo: bool | None = None
    best_of: int | None = Field(None, ge=1)
    suffix: str | None = None

    def prompt_text(self) -> str:
        if isinstance(self.prompt, str):
            return self.prompt
        if len(self.prompt) != 1:
            raise APIError(400, f"prompt: one prompt per request (got a list of {len(self.prompt)})", param="prompt")
        return self.prompt[0]

    def unsupported(self) -> list[tuple[str, str]]:
        out = super().unsupported()
        if self.logprobs is not None:
            out.append(("logprobs", "log probabilities are not returned by this server"))
        if self.echo:
            out.append(("echo", "the prompt is not echoed"))
        if self.best_of is not None and self.best_of > 1:
            out.append(("best_of", "one completion per request"))
        if self.suffix:
            out.append(("suffix", "no insertion (fill-in-the-middle) completions"))
        return out

    def prompt_bytes(self) -> int:
        return len(self.prompt_text().encode())


ROLE_ALIASES = {"developer": "system"}  # OpenAI's newer name for the system role


@dataclass(frozen=True)
class PromptLimits:
    """What a prompt must fit in, known before it is tokenized: no token is longer than
    `max_token_bytes`, so a text of B bytes is at least ceil(B / max_token_bytes) tokens."""

    n_ctx: int
    max_token_bytes: int

    @classmethod
    def of(cls, model) -> "PromptLimits":
        """From a loaded model (its context size, and its vocabulary's longest token)."""
        longest = getattr(model, "max_token_bytes", None)
        if longest is None:  # until the backend reports it: measured over the vocabulary
            longest = max(len(model.token_bytes(t)) for t in range(model.n_vocab))
        return cls(model.n_ctx, max(longest, 1))

    def check(self, req: _Request, param: str) -> None:
        at_least = -(-req.prompt_bytes() // self.max_token_bytes)
        if at_least >= self.n_ctx:  # the Engine's own rule: the prompt plus one generated token must fit
            raise APIError(400, f"{param}: the prompt is at least {at_least} tokens but the context holds "
                                f"{self.n_ctx}", param=param, code="context_length_exceeded")


def _shown(value) -> str:
    try:
        return json.dumps(value)[:80]
    except (TypeError, ValueError):  # bytes, or an integer too long to print
        return type(value).__name__


def parse(model: type[_Request], body: bytes, limits: PromptLimits | None = None):
    """JSON bytes to a validated request, or a 400 that says which field is wrong and why.

    With `limits`, a prompt that cannot fit the context is refused before anything tokenizes it."""
    try:
        req = model.model_validate_json(body)
    except ValidationError as err:
        first = err.errors(include_url=False)[0]
        if first["type"] == "json_invalid":
            raise APIError(400, f"the request body is not valid JSON: {first['msg']}", code="invalid_json") from None
        if not first["loc"]:
            raise APIError(400, "the request body must be a JSON object") from None
        where = ".".join(str(p) for p in first["loc"])
        got = f" (got {_shown(first['input'])})" if first["type"] != "missing" else ""
        raise APIError(400, f"{where}: {first['msg']}{got}", param=where) from None
    refused = req.unsupported()
    if refused:
        field, why = refused[0]
        raise APIError(400, f"{field}: {why}", param=field, code="unsupported_parameter")
    if limits is not None:
        limits.check(req, "messages" if isinstance(req, ChatRequest) else "prompt")
    return req


# ---- responses ---------------------------------------------------------------------------------
def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def finish_reason(final: Final) -> Literal["stop", "length"]:
    return "length" if final.finish_reason == "length" else "stop"


def usage(stats: GenerationStats) -> dict:
    return {
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.tokens,
        "total_tokens": stats.prompt_tokens + stats.tokens,
        "prompt_tokens_details": {"cached_tokens": stats.prompt_cached},
    }


def edgespec_stats(stats: GenerationStats) -> dict:
    """What speculation did for this response (llama-server reports the like as `timings`)."""
    return {
        "mode": stats.mode,
        "drafted": stats.drafted,
        "accepted": stats.accepted,
        "acceptance_rate": round(stats.acceptance_rate, 4),
        "tokens_per_pass": round(stats.mean_accepted_per_pass, 4),
        "tokens_per_s": round(stats.tokens_per_s, 2),
        "ttft_ms": round(stats.ttft_ms, 1),
        "prompt_ms": round(stats.prompt_ms, 1),
        "prompt_tokens": stats.prompt_tokens,
        "prompt_cached": stats.prompt_cached,
        "tokens_by_source": stats.tokens_by_source,
    }


class Shape:
    """One response kind (chat or text completion): whole objects and stream chunks."""

    def __init__(self, kind: Literal["chat", "text"], model: str):
        self.kind, self.model = kind, model
        self.id = new_id("chatcmpl" if kind == "chat" else "cmpl")
        self.created = int(time.time())

    def _envelope(self, obj: str, choices: list[dict]) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model, "choices": choices}

    def whole(self, final: Final) -> dict:
        if self.kind == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": final.text},
                      "logprobs": None, "finish_reason": finish_reason(final)}
            out = self._envelope("chat.completion", [choice])
        else:
            choice = {"index": 0, "text": final.text, "logprobs": None, "finish_reason": finish_reason(final)}
            out = self._envelope("text_completion", [choice])
        out["usage"] = usage(final.stats)
        out["edgespec"] = edgespec_stats(final.stats)
        return out

    def _chunk(self, content: str | None, finish: str | None, *, role: bool = False) -> dict:
        if self.kind == "chat":
            delta = {"role": "assistant", "content": ""} if role else ({"content": content} if content is not None else {})
            return self._envelope("chat.completion.chunk", [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}])
        return self._envelope("text_completion", [{"index": 0, "text": content or "", "logprobs": None, "finish_reason": finish}])

    def opening(self) -> dict | None:
        return self._chunk(None, None, role=True) if self.kind == "chat" else None

    def delta(self, text: str) -> dict:
        return self._chunk(text, None)

    def closing(self, final: Final) -> dict:
        """The last chunk: finish_reason, and (as llama-server does) usage and the speculation stats."""
        out = self._chunk(None, finish_reason(final))
        out["usage"] = usage(final.stats)
        out["edgespec"] = edgespec_stats(final.stats)
        return out

    def usage_chunk(self, final: Final) -> dict:
        """OpenAI's stream_options.include_usage chunk: no choices, just usage."""
        obj = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        out = self._envelope(obj, [])
        out["usage"] = usage(final.stats)
        return out


def sse(data: dict | str) -> str:
    payload = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
    return f"data: {payload}\n\n"
