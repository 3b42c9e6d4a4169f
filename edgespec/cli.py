"""Click commands: parse, build configs, call the library, render. Errors map to one line here."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from dataclasses import dataclass

import click

from . import __version__
from .config import KV_TYPES, SPEC_MODES, LoadConfig, SpecConfig, parse_rpc
from .errors import ConfigError, EdgespecError, InputError
from .sampling import SamplingConfig

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@dataclass
class State:
    debug: bool = False
    verbose: bool = False


# ---- shared options ----------------------------------------------------------------------------
def model_options(fn):
    opts = [
        click.option("-m", "--model", envvar="EDGESPEC_MODEL", help="Target model: registry name, path to .gguf, or hf:OWNER/REPO/FILE."),
        click.option("-md", "--model-draft", envvar="EDGESPEC_MODEL_DRAFT", help="Draft model (same tokenizer as the target)."),
        click.option("--pair", envvar="EDGESPEC_PAIR", help="A named target+draft pair from models.toml."),
        click.option("--spec", "spec_mode", type=click.Choice(SPEC_MODES), default="auto", show_default=True, envvar="EDGESPEC_SPEC",
                     help="Speculation: auto picks and switches drafters by measured cost; off is plain decoding."),
        click.option("--draft-max", type=int, default=16, show_default=True, envvar="EDGESPEC_DRAFT_MAX", help="Most tokens drafted per round."),
        click.option("--draft-min", type=int, default=1, show_default=True, envvar="EDGESPEC_DRAFT_MIN", help="Fewest tokens worth drafting."),
        click.option("--draft-p-min", type=float, default=0.5, show_default=True, envvar="EDGESPEC_DRAFT_P_MIN",
                     help="Stop drafting when the draft model's top probability falls below this."),
        click.option("-c", "--ctx-size", type=int, envvar="EDGESPEC_CTX_SIZE", help="Context size in tokens (default: from the plan)."),
        click.option("-t", "--threads", type=int, envvar="EDGESPEC_THREADS", help="CPU threads for the target (default: physical cores)."),
        click.option("-td", "--threads-draft", type=int, envvar="EDGESPEC_THREADS_DRAFT", help="CPU threads for the draft."),
        click.option("-ngl", "--n-gpu-layers", type=int, envvar="EDGESPEC_NGL", help="Target layers on the GPU (default: from the plan)."),
        click.option("-ngld", "--n-gpu-layers-draft", type=int, envvar="EDGESPEC_NGLD", help="Draft layers on the GPU."),
        click.option("-ctk", "--cache-type-k", type=click.Choice(KV_TYPES), default="f16", show_default=True, envvar="EDGESPEC_CTK"),
        click.option("-ctv", "--cache-type-v", type=click.Choice(KV_TYPES), default="f16", show_default=True, envvar="EDGESPEC_CTV"),
        click.option("--rpc", envvar="EDGESPEC_RPC", metavar="HOST:PORT,...",
                     help="llama.cpp RPC servers (`edgespec rpc-server` there) whose devices take target layers."),
        click.option("--fast-kernels", is_flag=True, envvar="EDGESPEC_FAST_KERNELS",
                     help="Faster CPU kernels whose logits depend on the batch size: greedy speculative output may "
                          "then differ from plain decoding at near-ties (as in llama.cpp). Off: exact."),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def sampling_options(fn):
    opts = [
        click.option("-n", "--max-tokens", type=int, default=512, show_default=True, envvar="EDGESPEC_MAX_TOKENS"),
        click.option("--temperature", "--temp", type=float, default=0.0, show_default=True, envvar="EDGESPEC_TEMPERATURE",
                     help="0 is greedy (output identical to plain decoding)."),
        click.option("--top-k", type=int, default=40, show_default=True),
        click.option("--top-p", type=float, default=0.95, show_default=True),
        click.option("--min-p", type=float, default=0.05, show_default=True),
        click.option("--repeat-penalty", type=float, default=1.0, show_default=True),
        click.option("--seed", type=int, envvar="EDGESPEC_SEED", help="Seed for sampling (reproducible runs)."),
        click.option("--stop", multiple=True, help="Stop string (repeatable)."),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def spec_config(kw) -> SpecConfig:
    return SpecConfig(mode=kw["spec_mode"], draft_min=kw["draft_min"], draft_max=kw["draft_max"], draft_p_min=kw["draft_p_min"])


def sampling_config(kw) -> SamplingConfig:
    return SamplingConfig(
        temperature=kw["temperature"], top_k=kw["top_k"], top_p=kw["top_p"], min_p=kw["min_p"],
        repeat_penalty=kw["repeat_penalty"], seed=kw["seed"],
    )


def load_config(kw, spec: SpecConfig) -> LoadConfig:
    from .session import choose_models

    choice = choose_models(kw["model"], kw["model_draft"], kw["pair"], spec)
    return LoadConfig(
        target=choice.target, draft=choice.draft, n_ctx=kw["ctx_size"], threads=kw["threads"],
        threads_draft=kw["threads_draft"], n_gpu_layers=kw["n_gpu_layers"], n_gpu_layers_draft=kw["n_gpu_layers_draft"],
        type_k=kw["cache_type_k"], type_v=kw["cache_type_v"], rpc=parse_rpc(kw["rpc"]),
    )


def open_engine(kw, spec: SpecConfig, *, quiet: bool = False):
    """Resolve (downloading if needed), plan and load; warnings go to stderr."""
    from .render import stderr_console
    from .render.common import RichProgress
    from .session import open_engine as _open, resolve

    err = stderr_console()
    resolved = resolve(load_config(kw, spec), spec, progress=RichProgress(err),
                       kernels="fast" if kw["fast_kernels"] else "exact")
    if not quiet:
        for w in resolved.plan.warnings + resolved.warnings:
            err.print(f"[yellow]warning:[/] {w}")
    return resolved, _open(resolved, spec, exact=not kw["fast_kernels"])


# ---- the error boundary ------------------------------------------------------------------------
def main(argv=None) -> None:
    debug = "--debug" in (argv if argv is not None else sys.argv[1:])
    try:
        cli.main(args=argv, prog_name="edgespec", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as err:
        err.show()
        sys.exit(err.exit_code)
    except click.exceptions.Exit as err:
        sys.exit(err.exit_code)
    except EdgespecError as err:
        if debug:
            raise
        click.echo(f"error: {err.message}", err=True)
        sys.exit(err.exit_code)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(0)
    except Exception as err:  # the last line of defence: never a traceback without --debug
        if debug:
            raise
        click.echo(f"internal error: {type(err).__name__}: {err} (run with --debug for the traceback)", err=True)
        sys.exit(1)


@click.group(context_settings=CONTEXT)
@click.version_option(__version__, "--version", prog_name="edgespec")
@click.option("--debug", is_flag=True, help="Show tracebacks on errors.")
@click.option("--verbose", is_flag=True, help="Show llama.cpp's own log.")
@click.pass_context
def cli(ctx, debug, verbose):
    """edgespec: faster local LLM inference with speculative decoding (llama.cpp, GGUF)."""
    ctx.obj = State(debug=debug, verbose=verbose)
    if verbose or debug:
        from .backend.model import set_native_backtraces, set_verbose

        set_verbose(verbose)
        set_native_backtraces(debug)


# ---- prompt ------------------------------------------------------------------------------------
def read_prompt(text: str | None) -> str:
    if text is None or text == "-":
        if sys.stdin is None or sys.stdin.isatty():
            raise InputError("no prompt: pass TEXT or pipe it on stdin")
        data = sys.stdin.buffer.read()
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as err:
            raise InputError(f"stdin is not valid UTF-8 (byte {err.start}); convert it first, e.g. iconv -t utf-8") from None
    if not text.strip():
        raise InputError("empty prompt")
    return text


@cli.command(context_settings=CONTEXT)
@click.argument("text", required=False)
@model_options
@sampling_options
@click.option("--system", help="System message.")
@click.option("--raw", is_flag=True, help="Send TEXT as-is, without the chat template.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (text, finish_reason, stats).")
@click.option("-q", "--quiet", is_flag=True, help="No stats footer.")
@click.option("--show-drafts", is_flag=True, help="Colour accepted draft (green) and n-gram (cyan) tokens.")
def prompt(text, system, raw, as_json, quiet, show_drafts, **kw):
    """One-shot generation: TEXT or stdin. Streams tokens as they are accepted.

    \b
    edgespec prompt "Write a haiku about caches"
    echo "def add(a, b):" | edgespec prompt --raw -n 64
    """
    from .generate import Chunk, Final
    from .render import stderr_console, stdout_console
    from .render.common import footer, styled
    from .template import Message

    text = read_prompt(text)
    spec, sampling = spec_config(kw), sampling_config(kw)
    if kw["max_tokens"] < 1:
        raise InputError(f"--max-tokens must be >= 1 (got {kw['max_tokens']})")
    _, engine = open_engine(kw, spec, quiet=quiet or as_json)
    out, err = stdout_console(), stderr_console()
    with engine:
        if raw:
            tokens = engine.raw_tokens(text)
        else:
            messages = ([Message("system", system)] if system else []) + [Message("user", text)]
            tokens = engine.chat_tokens(messages)
        final = None
        for item in engine.stream(tokens, sampling, max_tokens=kw["max_tokens"], stop=kw["stop"]):
            if isinstance(item, Chunk) and not as_json:
                out.print(styled(item.text, item.sources, show_drafts), end="")
                out.file.flush()
            elif isinstance(item, Final):
                final = item
    if as_json:
        click.echo(json.dumps({"text": final.text, "finish_reason": final.finish_reason, "stats": final.stats.to_json()}))
        return
    out.print()
    out.file.flush()  # the footer goes to stderr: keep it after the answer on a terminal
    if not quiet:
        err.print(footer(final.stats), style="dim")
    if final.finish_reason == "interrupted":
        sys.exit(130)


# ---- models ------------------------------------------------------------------------------------
@cli.group(context_settings=CONTEXT)
def models():
    """List and download registry models (models.toml)."""


@models.command("list", context_settings=CONTEXT)
@click.option("--json", "as_json", is_flag=True)
def models_list(as_json):
    """Registry models, their size, and whether they are cached."""
    from . import models as registry
    from .render import stdout_console
    from .render.common import models_table

    rows = registry.list_models(registry.load_registry())
    if as_json:
        click.echo(json.dumps([dataclasses.asdict(r) for r in rows]))
        return
    stdout_console().print(models_table(rows))


@models.command("pull", context_settings=CONTEXT)
@click.argument("names", nargs=-1, required=True)
def models_pull(names):
    """Download and verify NAMES (or a pair name, for both its models). Instant when cached."""
    from . import models as registry
    from .render import stderr_console
    from .render.common import RichProgress

    reg = registry.load_registry()
    wanted = []
    for name in names:
        wanted += list(reg.pairs[name]) if name in reg.pairs else [name]
    for name in wanted:
        path = registry.pull(name, RichProgress(stderr_console()), registry=reg)
        click.echo(f"{name}: {path}")


# ---- doctor ------------------------------------------------------------------------------------
@cli.command(context_settings=CONTEXT)
@click.argument("refs", nargs=-1)
@click.option("--json", "as_json", is_flag=True)
def doctor(refs, as_json):
    """Read GGUF headers only: architecture, quant, layers, vocab, template; pair compatibility and fit.

    With no MODEL, checks the default pair (if downloaded) and this llama.cpp build.
    """
    from .doctor import diagnose
    from .render import stdout_console
    from .render.doctor import render_doctor

    report = diagnose(list(refs))
    if as_json:
        click.echo(json.dumps(report.to_json()))
    else:
        render_doctor(stdout_console(), report)
    if not report.ok:
        sys.exit(1)


# ---- profile -----------------------------------------------------------------------------------
@cli.command(context_settings=CONTEXT)
@model_options
@click.option("--measure/--no-measure", default=True, show_default=True, help="Time the models (a few seconds each).")
@click.option("--show", is_flag=True, help="Print the saved profile and exit.")
@click.option("--json", "as_json", is_flag=True)
def profile(measure, show, as_json, **kw):
    """Detect the hardware, plan the offload of target + draft, measure costs, save the profile.

    prompt/chat/bench then use it automatically.
    """
    from .profile_cmd import run_profile

    run_profile(kw, measure=measure, show=show, as_json=as_json, spec=spec_config(kw))


# ---- rpc-server --------------------------------------------------------------------------------
@cli.command("rpc-server", context_settings=CONTEXT)
@click.option("--host", default="127.0.0.1", show_default=True, envvar="EDGESPEC_RPC_HOST",
              help="Address to listen on; 0.0.0.0 for other machines (trusted networks only).")
@click.option("-p", "--port", type=click.IntRange(1, 65535), default=50052, show_default=True, envvar="EDGESPEC_RPC_PORT")
@click.option("-t", "--threads", type=click.IntRange(1, 1024), help="CPU threads (default: physical cores).")
@click.option("--cache", is_flag=True, help="Keep received tensors on disk under the user dir: reloads skip the network.")
@click.option("--cpu", "use_cpu", is_flag=True, help="Serve the CPU even when this machine has GPUs.")
def rpc_server(host, port, threads, cache, use_cpu):
    """Lend this machine's GPU (or CPU) to another machine's edgespec (`--rpc HOST:PORT` there).

    Runs until Ctrl-C. The protocol has no authentication or encryption: do not expose it.
    """
    from . import paths
    from .backend import rpc
    from .render import stderr_console

    err = stderr_console()
    if ":" in host:
        raise ConfigError(f"--host {host}: llama.cpp's RPC takes IPv4 addresses or host names, not IPv6")
    if host not in ("127.0.0.1", "localhost"):
        err.print(f"[yellow]warning:[/] serving on {host}: anyone who can reach port {port} can use this machine's memory and compute")
    cache_dir = None
    if cache:
        cache_dir = paths.home() / "rpc-cache"
        cache_dir.mkdir(parents=True, exist_ok=True)
    err.print(f"edgespec rpc-server on {host}:{port}; on the other machine: [bold]edgespec prompt --rpc {host}:{port} ...[/]  (Ctrl-C stops)")
    try:
        rpc.serve(host, port, threads, str(cache_dir) if cache_dir else None, use_cpu)
    except KeyboardInterrupt:
        err.print("rpc-server stopped")
        # The serving thread is inside a C call that never returns: leave without finalizing.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def _register_optional_commands() -> None:
    """chat and bench live in their own modules; they register themselves on the group."""
    import importlib

    for name in ("chat_cmd", "bench_cmd"):
        importlib.import_module(f"edgespec.{name}")


_register_optional_commands()
