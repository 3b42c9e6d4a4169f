"""`edgespec serve`: a local OpenAI-compatible HTTP server with speculative decoding."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from ..config import MAX_PARALLEL
from ..errors import ConfigError, PlanError
from .options import model_options, open_engine, sampling_config, sampling_options, spec_config
from .root import CONTEXT, cli

# Like llama-server's -np default: four users served together get most of what batching gives on
# a CPU, and four sequences' KV fits beside a small model on most machines.
DEFAULT_PARALLEL = 4


def served_name(choice_target: str, target_path: Path) -> str:
    """The registry name when the model was given by name, else the file's stem."""
    if choice_target.endswith(".gguf") or "/" in choice_target or os.sep in choice_target:
        return target_path.stem
    return choice_target


def _open_slots(kw, spec, parallel: int | None):
    """Load with --parallel sequences; by default DEFAULT_PARALLEL, or as many as fit in memory."""
    n = parallel or DEFAULT_PARALLEL
    while True:
        try:
            return open_engine({**kw, "parallel": n}, spec)
        except PlanError:
            if parallel or n == 1:
                raise  # the one-line refusal names the memory, the sequences and what to try
            n -= 1


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
@click.option("--queue", "max_queue", type=click.IntRange(0, 4096), default=8, show_default=True,
              help="Requests that may wait for a free slot; beyond that: 503 with Retry-After.")
@click.option("--priority", "default_priority", type=int, default=0, show_default=True,
              help="Priority of requests that set none (lower is served first; waiting improves it).")
@click.option("--max-tokens-cap", type=click.IntRange(1), default=4096, show_default=True,
              help="Largest max_tokens a request may ask for (more: 400).")
@click.option("--max-request-bytes", type=click.IntRange(1024), default=4 << 20, show_default=True,
              help="Largest request body (more: 413).")
@model_options
@sampling_options
def serve(host, port, api_key, alias, parallel, max_queue, default_priority, max_tokens_cap, max_request_bytes, **kw):
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
    from ..render import stderr_console
    from ..server.app import Settings, create_app
    from ..server.run import bind, is_loopback, serve as run_server
    from ..server.scheduler import Scheduler

    spec, sampling = spec_config(kw), sampling_config(kw)
    if kw["max_tokens"] < 1:
        raise ConfigError(f"--max-tokens must be >= 1 (got {kw['max_tokens']})")
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
        resolved, engine = _open_slots(kw, spec, parallel)
    except BaseException:
        sock.close()
        raise
    worker = Scheduler(engine, max_queue)
    settings = Settings(
        model_id=alias or served_name(resolved.choice.target, resolved.target_path),
        sampling=sampling, max_tokens=kw["max_tokens"], max_tokens_cap=max_tokens_cap,
        max_request_bytes=max_request_bytes, stop=tuple(kw["stop"]), api_key=api_key, priority=default_priority,
    )
    shown = f"[{host}]" if ":" in host else host
    draft = f" + {resolved.draft_path.stem}" if engine.draft is not None else ""
    err.print(f"edgespec serve: [bold]http://{shown}:{port}/v1[/]  model {settings.model_id}{draft}, spec {spec.mode}, "
              f"{engine.n_seq} parallel"
              f"{', API key required' if api_key else ''}  (Ctrl-C stops)")
    run_server(create_app(worker, settings), sock, worker.shutdown)
    worker.shutdown()
    if not worker.join(timeout=3):
        # Still inside one long llama.cpp call (a big prompt's prefill): freeing the models under
        # it would crash, and the process is leaving anyway.
        err.print("server stopped (a generation was still running)")
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    engine.close()
    err.print("server stopped")
