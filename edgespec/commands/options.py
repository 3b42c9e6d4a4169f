"""Options shared by the commands, and how they become configs and a loaded engine."""

from __future__ import annotations

import click

from .. import session
from ..config import DEFAULT_DRAFT_MAX, KV_TYPES, MAX_DRAFT, SPEC_MODES, LoadConfig, SpecConfig, parse_rpc
from ..errors import ConfigError
from ..hardware import parse_size_option
from ..render import stderr_console
from ..render.common import RichProgress
from ..sampling import SamplingConfig


# ---- option types ------------------------------------------------------------------------------
class AtLeast(click.types.IntParamType):
    """An integer option with a lower bound, checked as click parses it (flag or EDGESPEC_* variable).

    Below the bound it is the one-line `error: --max-tokens must be >= 1 (got 0)` of the error
    boundary (exit 2), as the commands said before the check moved here; a non-integer is click's
    own usage error."""

    def __init__(self, minimum: int):
        self.minimum = minimum

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if number < self.minimum:
            flag = max(param.opts, key=len) if param is not None else "value"
            raise ConfigError(f"{flag} must be >= {self.minimum} (got {number})")
        return number

    def __repr__(self) -> str:
        return f"AtLeast({self.minimum})"


POSITIVE = AtLeast(1)

# ---- shared options ----------------------------------------------------------------------------
def model_options(fn):
    opts = [
        click.option("-m", "--model", envvar="EDGESPEC_MODEL",
                     help="Target model: registry name, path to .gguf, hf:OWNER/REPO/FILE, ollama:NAME[:TAG] or "
                          "lmstudio:PUBLISHER/REPO[/FILE] (edgespec models scan lists what is here)."),
        click.option("-md", "--model-draft", "--draft", "model_draft", envvar="EDGESPEC_MODEL_DRAFT",
                     help="Draft model (same vocabulary as the target, or one differing only in special tokens); "
                          "`auto` picks the best one on this machine."),
        click.option("--pair", envvar="EDGESPEC_PAIR", help="A named target+draft pair from models.toml."),
        click.option("--spec", "spec_mode", type=click.Choice(SPEC_MODES), default="auto", show_default=True, envvar="EDGESPEC_SPEC",
                     help="Speculation: auto picks and switches drafters by measured cost; off is plain decoding."),
        click.option("--draft-max", type=int, envvar="EDGESPEC_DRAFT_MAX",
                     help=f"Most tokens drafted per round (default: the longest verify batch the profile measured, "
                          f"up to {MAX_DRAFT}; {DEFAULT_DRAFT_MAX} without a profile)."),
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
        click.option("--gpu-memory", envvar="EDGESPEC_GPU_MEMORY", metavar="SIZE",
                     help="Most GPU memory the plan may use on each GPU of this machine, e.g. 1.5G or 800M "
                          "(default: what is free, less a margin); layers that do not fit stay on the CPU."),
        click.option("--exact", is_flag=True, envvar="EDGESPEC_EXACT",
                     help="Batch-invariant kernels: greedy output identical to plain decoding token for token "
                          "(slower: no weight repacking or flash attention, verify batches of at most 7 rows). "
                          "Default: llama.cpp's fast kernels, where speculative output can differ from plain "
                          "decoding only at near-ties."),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


def sampling_options(fn):
    opts = [
        click.option("-n", "--max-tokens", type=POSITIVE, default=512, show_default=True, envvar="EDGESPEC_MAX_TOKENS"),
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


def spec_config(kw, *, mode: str | None = None) -> SpecConfig:
    """From the flags; `mode` in place of --spec where a command decides it (bench)."""
    return SpecConfig(mode=mode or kw["spec_mode"], draft_min=kw["draft_min"], draft_max=kw["draft_max"], draft_p_min=kw["draft_p_min"])


def sampling_config(kw) -> SamplingConfig:
    return SamplingConfig(
        temperature=kw["temperature"], top_k=kw["top_k"], top_p=kw["top_p"], min_p=kw["min_p"],
        repeat_penalty=kw["repeat_penalty"], seed=kw["seed"],
    )


def load_config(kw, spec: SpecConfig) -> LoadConfig:
    choice = session.choose_models(kw["model"], kw["model_draft"], kw["pair"], spec)
    return LoadConfig(
        target=choice.target, draft=choice.draft, n_ctx=kw["ctx_size"], threads=kw["threads"],
        threads_draft=kw["threads_draft"], n_gpu_layers=kw["n_gpu_layers"], n_gpu_layers_draft=kw["n_gpu_layers_draft"],
        type_k=kw["cache_type_k"], type_v=kw["cache_type_v"], rpc=parse_rpc(kw["rpc"]),
        gpu_memory=parse_size_option(kw.get("gpu_memory"), "--gpu-memory"),
        n_seq=kw.get("parallel") or 1,
    )


def kernel_kind(kw) -> str:
    """"exact" with --exact, else "fast" (llama.cpp's default kernels)."""
    return "exact" if kw.get("exact") else "fast"


def resolve(kw, spec: SpecConfig) -> session.Resolved:
    """Resolve the models (downloading if needed) and plan them; nothing is loaded or said yet."""
    return session.resolve(load_config(kw, spec), spec, progress=RichProgress(stderr_console()),
                           kernels=kernel_kind(kw))


def report(resolved: session.Resolved) -> None:
    """The plan's warnings and the resolution's notes, on stderr."""
    err = stderr_console()
    for w in resolved.plan.warnings + resolved.warnings:
        err.print(f"[yellow]warning:[/] {w}")
    for note in resolved.notes:
        err.print(note, markup=False, highlight=False)


def open_engine(kw, spec: SpecConfig, *, quiet: bool = False):
    """Resolve (downloading if needed), plan and load; warnings go to stderr."""
    resolved = resolve(kw, spec)
    if not quiet:
        report(resolved)
    return resolved, session.open_engine(resolved, spec, exact=kw["exact"])


