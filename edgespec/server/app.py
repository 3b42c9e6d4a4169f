"""The HTTP routes (Starlette): OpenAI's chat and text completions, model list, health, metrics.

Handlers validate a request, turn it into a `Job` for the scheduler's engine thread and relay its
events: one JSON object, or Server-Sent Events as OpenAI streams them (`data: {chunk}` ...
`data: [DONE]`).
"""

from __future__ import annotations

import asyncio
import hmac
import time
from dataclasses import dataclass, replace

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..errors import EdgespecError
from ..generate import Chunk, Final
from ..sampling import SamplingConfig
from ..template import Message
from .guard import Guard
from .scheduler import Failed, Job, QueueFull, Scheduler, Stopping
from .schemas import ROLE_ALIASES, APIError, ChatRequest, CompletionRequest, PromptLimits, Shape, error_body, parse, sse


@dataclass(frozen=True)
class Settings:
    model_id: str
    sampling: SamplingConfig = SamplingConfig()  # the server's defaults; a request overrides temperature, top_p, seed
    max_tokens: int = 512  # when a request sets none
    max_tokens_cap: int = 4096
    max_request_bytes: int = 1 << 20
    stop: tuple[str, ...] = ()
    api_key: str | None = None
    retry_after_s: int = 2
    priority: int = 0  # when a request sets none (lower is served first)
    bind_host: str = "127.0.0.1"  # with allowed_hosts: the Host names accepted (server/guard.py)
    allowed_hosts: tuple[str, ...] = ()
    cors_origins: tuple[str, ...] = ()  # web page origins allowed to call (none by default)
    prompt_limits: PromptLimits | None = None  # refuses a prompt that cannot fit before it is tokenized


def _api_error(failed: Failed) -> APIError:
    return APIError(failed.status, failed.message, type=failed.type, code=failed.code)


class EventStream(StreamingResponse):
    """SSE that cancels its job however the response ends (done, client gone, server stopping)."""

    media_type = "text/event-stream"

    def __init__(self, job: Job, body):
        super().__init__(body, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.job = job

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.job.cancel()  # a no-op when the generation already finished


async def _events(job: Job, shape: Shape, include_usage: bool):
    opening = shape.opening()
    if opening is not None:
        yield sse(opening)
    while True:
        item = await job.next()
        if isinstance(item, Chunk):
            yield sse(shape.delta(item.text))
        elif isinstance(item, Final):
            yield sse(shape.closing(item))
            if include_usage:
                yield sse(shape.usage_chunk(item))
            yield sse("[DONE]")
            return
        elif isinstance(item, Failed):
            # Headers are long sent: OpenAI's clients raise on a data event carrying "error".
            yield sse(error_body(item.message, type=item.type, code=item.code))
            return


async def _watch_disconnect(request: Request, job: Job) -> None:
    """Cancel the job when the client hangs up (the request body has been read by now)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            job.cancel()
            return


class API:
    """The request handlers, over one scheduler and the server's settings."""

    def __init__(self, worker: Scheduler, settings: Settings):
        self.worker, self.settings = worker, settings
        self.started = int(time.time())

    def check_auth(self, request: Request) -> None:
        key = self.settings.api_key
        if key is None:
            return
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
            raise APIError(401, "invalid or missing API key: send the header Authorization: Bearer <key>",
                           code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})

    async def read_body(self, request: Request) -> bytes:
        limit = self.settings.max_request_bytes
        too_large = APIError(413, f"the request body is larger than this server's limit of {limit} bytes "
                                  "(edgespec serve --max-request-bytes)", code="request_too_large")
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            raise too_large
        body = bytearray()
        try:
            async for part in request.stream():
                body += part
                if len(body) > limit:
                    raise too_large
        except ClientDisconnect:
            raise APIError(499, "the client closed the request", code="cancelled") from None  # nobody reads it
        return bytes(body)

    def make_job(self, req, prepare) -> Job:
        settings = self.settings
        max_tokens = req.requested_max_tokens()
        if max_tokens is None:
            max_tokens = min(settings.max_tokens, settings.max_tokens_cap)
        elif max_tokens > settings.max_tokens_cap:
            raise APIError(400, f"max_tokens: at most {settings.max_tokens_cap} on this server (got {max_tokens}; "
                                "edgespec serve --max-tokens-cap raises it)", param="max_tokens")
        base = settings.sampling
        sampling = replace(
            base,
            temperature=base.temperature if req.temperature is None else req.temperature,
            top_p=base.top_p if req.top_p is None else req.top_p,
            seed=base.seed if req.seed is None else (None if req.seed == -1 else req.seed),
        )
        stops = req.stops()
        priority = settings.priority if req.priority is None else req.priority
        return Job(prepare, sampling, max_tokens, tuple(settings.stop if stops is None else stops), priority)

    async def respond(self, request: Request, job: Job, stream: bool, shape: Shape, include_usage: bool):
        try:
            self.worker.submit(job)
        except QueueFull:
            raise APIError(503, f"the server is busy: {self.worker.max_queue} requests are already waiting; "
                                "retry shortly", type="server_error", code="queue_full",
                           headers={"Retry-After": str(self.settings.retry_after_s)})
        except Stopping:
            raise APIError(503, "the server is shutting down", type="server_error", code="shutting_down")
        watcher = asyncio.create_task(_watch_disconnect(request, job))
        handed_over = False
        try:
            first = await job.next()
            if isinstance(first, Failed):
                raise _api_error(first)
            if stream:
                handed_over = True  # from here the response owns the job (and listens for disconnects)
                return EventStream(job, _events(job, shape, include_usage))
            while True:
                item = await job.next()
                if isinstance(item, Final):
                    return JSONResponse(shape.whole(item))
                if isinstance(item, Failed):
                    raise _api_error(item)
        finally:
            watcher.cancel()
            if not handed_over:
                job.cancel()

    # ---- routes ------------------------------------------------------------------------------
    async def chat_completions(self, request: Request):
        self.check_auth(request)
        req = parse(ChatRequest, await self.read_body(request), self.settings.prompt_limits)
        try:
            messages = [Message(ROLE_ALIASES.get(m.role, m.role), m.text()) for m in req.messages]
        except EdgespecError as err:
            raise APIError(400, f"messages: {err.message}", param="messages") from None
        job = self.make_job(req, lambda engine: engine.chat_tokens(messages))
        return await self.respond(request, job, req.stream, Shape("chat", self.settings.model_id), req.include_usage())

    async def completions(self, request: Request):
        self.check_auth(request)
        req = parse(CompletionRequest, await self.read_body(request), self.settings.prompt_limits)
        text = req.prompt_text()
        if not text:
            raise APIError(400, "prompt: empty prompt", param="prompt")
        job = self.make_job(req, lambda engine: engine.raw_tokens(text))
        return await self.respond(request, job, req.stream, Shape("text", self.settings.model_id), req.include_usage())

    async def models(self, request: Request):
        self.check_auth(request)
        return JSONResponse({"object": "list", "data": [
            {"id": self.settings.model_id, "object": "model", "created": self.started, "owned_by": "edgespec"},
        ]})

    async def health(self, request: Request):
        w = self.worker
        if w.stopping:
            return JSONResponse({"status": "stopping"}, status_code=503)
        return JSONResponse({"status": "ok", "generating": w.busy > 0, "waiting": w.waiting,
                             "busy_slots": w.busy, "slots": w.n_slots, "served": dict(w.counts)})

    async def metrics(self, request: Request):
        self.check_auth(request)
        return Response(self.worker.metrics.render(), media_type=self.worker.metrics.content_type)

    def routes(self) -> list[Route]:
        routes = [Route("/health", self.health, methods=["GET"]), Route("/metrics", self.metrics, methods=["GET"])]
        for prefix in ("/v1", ""):  # some clients are configured with the base URL without /v1
            routes += [
                Route(f"{prefix}/models", self.models, methods=["GET"]),
                Route(f"{prefix}/chat/completions", self.chat_completions, methods=["POST"]),
                Route(f"{prefix}/completions", self.completions, methods=["POST"]),
            ]
        return routes


async def _on_api_error(request: Request, err: APIError):
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


async def _on_http_error(request: Request, err: HTTPException):
    return JSONResponse(error_body(f"{request.method} {request.url.path}: {err.detail}"),
                        status_code=err.status_code, headers=err.headers)


async def _on_internal_error(request: Request, err: Exception):
    body = error_body(f"internal error: {type(err).__name__}: {err}", type="server_error")
    return JSONResponse(body, status_code=500)


def create_app(worker: Scheduler, settings: Settings) -> Starlette:
    middleware = [Middleware(Guard, bind_host=settings.bind_host, allowed_hosts=settings.allowed_hosts,
                             cors_origins=settings.cors_origins)]
    if settings.cors_origins:
        middleware.append(Middleware(CORSMiddleware, allow_origins=list(settings.cors_origins),
                                     allow_methods=["GET", "POST"], allow_headers=["*"],
                                     expose_headers=["Retry-After"], max_age=600))
    app = Starlette(routes=API(worker, settings).routes(), middleware=middleware, exception_handlers={
        APIError: _on_api_error, HTTPException: _on_http_error, Exception: _on_internal_error,
    })
    # A trailing-slash redirect would copy the request's Host header into its Location: a 404 instead.
    app.router.redirect_slashes = False
    return app
