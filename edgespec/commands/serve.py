"""`edgespec serve`: a local OpenAI-compatible HTTP server with speculative decoding."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from urllib.parse import urlsplit

import click

from .. import session
from ..config import MAX_PARALLEL
from ..errors import ConfigError, PlanError
from ..render import stderr_console
from .options import model_options, report, resolve, sampling_config, sampling_options, spec_config
from .root import CONTEXT, cli

# Like llama-server's -np default: four users served together get most of what batching gives on
# a CPU, and four sequences' KV fits beside a small model on most machines.
DEFAULT_PARALLEL = 4


def served_name(choice_target: str, target_path: Path) -> str:
    """The registry name when the model was given by name, else the file's stem."""
    if choice_target.endswith(".gguf") or "/" in choice_target or os.sep in choice_target:
        return target_path.stem
    return choice_target


def _open_slots(kw, spec, parallel: int | None, cache: int | None):
    """Plan --parallel slots (by default DEFAULT_PARALLEL, or as many as fit in memory) and the
    --prompt-cache prompts kept beside them, then load the slots. The cache lives in host memory,
    but each prompt in it can take a whole sequence's KV, so it is planned as that many more
    sequences: the default cache is as many prompts as slots, and only when that plan costs the
    slots nothing (the same context and the same layers on the GPU as without it). Returns
    (resolved, engine, slots, cached prompts)."""
    n = parallel or DEFAULT_PARALLEL
    while True:
        try:
            chosen = resolve({**kw, "parallel": n}, spec)
            break
        except PlanError:
            if parallel or n == 1:
                raise  # the one-line refusal names the memory, the sequences and what to try
            n -= 1
    extra = n if cache is None else cache
    kept = 0
    if extra:
        try:
            cached = resolve({**kw, "parallel": n + extra}, spec)
        except PlanError:
            if cache is not None:
                raise
        else:
            if cache is not None or _costs_nothing(cached.plan, chosen.plan):
                kept = extra
    report(chosen)
    return chosen, session.open_engine(chosen, spec, exact=kw["exact"]), n, kept


def _costs_nothing(with_cache, without) -> bool:
    def placed(p):
        return (p.n_ctx, p.target.n_gpu_layers, p.draft.n_gpu_layers if p.draft else None)
    return placed(with_cache) == placed(without)


class OriginType(click.ParamType):
    """A web page origin as browsers send it (scheme://host[:port], no path), or '*'."""

    name = "ORIGIN"

    def convert(self, value, param, ctx):
        if value == "*":
            return value
        parts = urlsplit(value.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/") \
                or parts.query or parts.fragment or parts.username:
            self.fail(f"{value!r} is not an origin: scheme://host[:port], e.g. http://localhost:3000 (or '*')", param, ctx)
        return f"{parts.scheme}://{parts.netloc}".lower()


_HOST_NAME = re.compile(r"^(\[[0-9a-f:.]+\]|[a-z0-9._:-]+)$")


class HostNameType(click.ParamType):
    """A name or address clients reach the server by (the Host header, port ignored), or '*'."""

    name = "HOST"

    def convert(self, value, param, ctx):
        name = value.strip().lower()
        if name != "*" and not _HOST_NAME.match(name):
            self.fail(f"{value!r} is not a host name or address (no scheme or path: e.g. mybox.lan)", param, ctx)
        return name


# ---- serve -------------------------------------------------------------------------------------
@cli.command(context_settings=CONTEXT)
@click.option("--host", default="127.0.0.1", show_default=True, envvar="EDGESPEC_HOST",
              help="Address to listen on. Anything but loopback exposes the models to the network.")
@click.option("--port", type=click.IntRange(1, 65535), default=8080, show_default=True, envvar="EDGESPEC_PORT")
@click.option("--api-key", envvar="EDGESPEC_API_KEY", help="Require `Authorization: Bearer KEY` (all routes but /health).")
@click.option("--alias", help="Model name served in /v1/models and responses (default: the target's name).")
@click.option("-np", "--parallel", type=click.IntRange(1, MAX_PARALLEL), default=None,
              help=f"Requests generated at once, in shared batches (default: {DEFAULT_PARALLEL}, or as many as "
                   "fit in memory with their KV cache).")
@click.option("--prompt-cache", "prompt_cache", type=click.IntRange(0, MAX_PARALLEL), default=None,
              help="Finished requests' prompts kept for reuse in host memory, planned as KV sequences beside the "
                   "slots (default: as many as --parallel when that costs the slots no context or GPU layers; 0: off).")
@click.option("--queue", "max_queue", type=click.IntRange(0, 4096), default=8, show_default=True,
              help="Requests that may wait for a free slot; beyond that: 503 with Retry-After.")
@click.option("--priority", "default_priority", type=int, default=0, show_default=True,
              help="Priority of requests that set none (lower is served first; waiting improves it).")
@click.option("--max-tokens-cap", type=click.IntRange(1), default=4096, show_default=True,
              help="Largest max_tokens a request may ask for (more: 400).")
@click.option("--max-request-bytes", type=click.IntRange(1024), default=4 << 20, show_default=True,
              help="Largest request body (more: 413).")
@click.option("--allowed-host", "allowed_hosts", multiple=True, type=HostNameType(),
              help="Also accept requests whose Host header names this (repeatable; '*' accepts any). "
                   "By default only the names of the --host address are (a guard against DNS rebinding).")
@click.option("--cors", "cors_origins", multiple=True, type=OriginType(),
              help="Let web pages from this origin call the API (repeatable; '*' for any). "
                   "By default requests from browsers (with an Origin header) are refused.")
@model_options
@sampling_options
def serve(host, port, api_key, alias, parallel, prompt_cache, max_queue, default_priority, max_tokens_cap, max_request_bytes,
          allowed_hosts, cors_origins, **kw):
    """Serve the models over an OpenAI-compatible API until Ctrl-C / SIGTERM.

    \b
    POST /v1/chat/completions  POST /v1/completions  GET /v1/models  GET /health  GET /metrics
    Sampling options (-n, --temperature, --top-p, --seed, --stop ...) are the defaults for
    requests that do not set them. Up to --parallel requests generate at once, their rows verified
    in shared target batches; others wait by priority (--queue).
    \b
    edgespec serve                      # http://127.0.0.1:8080/v1
    OPENAI_BASE_URL=http://127.0.0.1:8080/v1 OPENAI_API_KEY=none python my_client.py
    """
    # the web stack (starlette, uvicorn, pydantic, prometheus-client) loads only for serve
    from ..server.app import Settings, create_app
    from ..server.run import StopSignals, bind, is_loopback, serve as run_server
    from ..server.scheduler import Scheduler
    from ..server.schemas import PromptLimits

    spec, sampling = spec_config(kw), sampling_config(kw)
    if kw["max_tokens"] > max_tokens_cap:
        raise ConfigError(f"--max-tokens {kw['max_tokens']} is above --max-tokens-cap {max_tokens_cap}")
    if api_key is not None and not api_key.strip():
        raise ConfigError("--api-key is empty")
    err = stderr_console()
    sock = bind(host, port)  # before loading: a taken port fails in a second, not after a model load
    try:
        if not is_loopback(host):
            err.print(f"[yellow]warning:[/] serving on {host}: anyone who can reach port {port} can use these models"
                      + ("" if api_key else " (no --api-key set)"))
        resolved, engine, slots, cached = _open_slots(kw, spec, parallel, prompt_cache)
    except BaseException:
        sock.close()
        raise
    signals = StopSignals()
    try:
        limits = PromptLimits.of(engine.target)  # before the worker thread owns the engine
    except BaseException:
        engine.close()
        raise
    # From here until the models are freed a signal only asks the server to stop (StopSignals).
    with signals.installed():
        worker = Scheduler(engine, max_queue, cache=cached)
        try:
            settings = Settings(
                model_id=alias or served_name(resolved.choice.target, resolved.target_path),
                sampling=sampling, max_tokens=kw["max_tokens"], max_tokens_cap=max_tokens_cap,
                max_request_bytes=max_request_bytes, stop=tuple(kw["stop"]), api_key=api_key,
                priority=default_priority, bind_host=host, allowed_hosts=allowed_hosts, cors_origins=cors_origins,
                prompt_limits=limits,
            )
            err.print(_banner(host, port, settings, resolved, engine, spec, slots, cached))
            run_server(create_app(worker, settings), sock, worker.shutdown, signals)
        finally:
            worker.shutdown()
            if not _join(worker, signals):  # it is inside llama.cpp: never free the models under it
                _leave(err, "server stopped (a generation was still running)")
            engine.close()
        _leave(err, "server stopped")


def _banner(host, port, settings, resolved, engine, spec, slots: int, cached: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    draft = f" + {resolved.draft_path.stem}" if engine.draft is not None else ""
    return (f"edgespec serve: [bold]http://{shown}:{port}/v1[/]  model {settings.model_id}{draft}, spec {spec.mode}, "
            f"{slots} parallel, {cached} cached prompts"
            f"{', API key required' if settings.api_key else ''}  (Ctrl-C stops)")


STOP_WAIT_S = 10.0  # how long a stopped server waits for the generation thread to leave llama.cpp


def _join(worker, signals) -> bool:
    """Wait for the generation thread; a further signal stops the wait."""
    seen = len(signals.received)
    waited = 0.0
    while waited < STOP_WAIT_S and len(signals.received) == seen:
        if worker.join(timeout=0.1):
            return True
        waited += 0.1
    return worker.join(timeout=0)


def _leave(err, line: str) -> None:
    """Exit 0 now, still under StopSignals: past this point the default handlers would be back, and
    a Ctrl-C during the interpreter's exit would end the process by the signal (or a traceback).
    The models are freed, or still in use by a thread inside llama.cpp that must not see them freed:
    either way nothing is left to clean up."""
    err.print(line)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
