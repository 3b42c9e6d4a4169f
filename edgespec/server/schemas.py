"""What the OpenAI API accepts and returns: request validation, response and error shapes.

Unknown request fields are ignored (clients send many); a field we read but cannot honour is a
400 naming it, in OpenAI's error shape so the official clients raise their usual exceptions.
"""

from __future__ import annotations

import json
import time
import uuid
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
class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class _Request(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None  # any name is accepted: one model pair is loaded
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)  # the newer name of max_tokens
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    seed: int | None = Field(None, ge=-1, lt=2**63)  # -1: random, as in llama.cpp
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    n: int | None = Field(None, ge=1, le=1)  # one choice per request
    priority: int | None = Field(None, ge=-(2**31), lt=2**31)  # lower is served first (as vLLM)

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


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: str
    text: str | None = None


class ChatMessageIn(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: str
    content: str | list[ContentPart] | None = None

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


class ChatRequest(_Request):
    messages: list[ChatMessageIn] = Field(min_length=1)


class CompletionRequest(_Request):
    prompt: str | list[str]

    def prompt_text(self) -> str:
        if isinstance(self.prompt, str):
            return self.prompt
        if len(self.prompt) != 1:
            raise APIError(400, f"prompt: one prompt per request (got a list of {len(self.prompt)})", param="prompt")
        return self.prompt[0]


ROLE_ALIASES = {"developer": "system"}  # OpenAI's newer name for the system role


def parse(model: type[_Request], body: bytes):
    """JSON bytes to a validated request, or a 400 that says which field is wrong and why."""
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise APIError(400, f"the request body is not valid JSON: {err}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise APIError(400, "the request body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        got = f" (got {json.dumps(first['input'])[:80]})" if first["type"] != "missing" else ""
        raise APIError(400, f"{where}: {first['msg']}{got}", param=where or None) from None


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
