"""`edgespec models list|scan|pull`."""

from __future__ import annotations

import dataclasses
import json

import click

from .root import CONTEXT, cli
from .. import models as registry
from ..render import stdout_console
from ..render.common import models_table, pairs_table
from ..render import stderr_console
from ..render.common import RichProgress
from ..models.local import local_models
from ..render.models import local_table


# ---- models ------------------------------------------------------------------------------------
@cli.group(context_settings=CONTEXT)
def models():
    """List and download registry models (models.toml), and find the GGUF files you already have."""


@models.command("list", context_settings=CONTEXT)
@click.option("--json", "as_json", is_flag=True)
@click.option("--local", is_flag=True, help="The GGUF files already on this machine (same as `models scan`).")
def models_list(as_json, local):
    """Registry models and pairs, where each comes from, their size, and whether they are cached.

    The built-in registry is merged with your own, $EDGESPEC_HOME/models.toml (same format): an
    entry there adds a model or pair, or replaces the built-in one of the same name.
    """
    if local:
        _print_local(as_json)
        return

    reg = registry.load_registry()
    rows = registry.list_models(reg)
    if as_json:
        click.echo(json.dumps([dataclasses.asdict(r) for r in rows]))
        return
    out = stdout_console()
    out.print(models_table(rows))
    out.print(pairs_table(reg))


@models.command("pull", context_settings=CONTEXT)
@click.argument("names", nargs=-1, required=True)
def models_pull(names):
    """Download and verify NAMES (or a pair name, for both its models). Instant when cached."""

    reg = registry.load_registry()
    wanted = []
    for name in names:
        wanted += list(reg.pairs[name]) if name in reg.pairs else [name]
    for name in wanted:
        path = registry.pull(name, RichProgress(stderr_console()), registry=reg)
        click.echo(f"{name}: {path}")




@models.command("scan", context_settings=CONTEXT)
@click.option("--json", "as_json", is_flag=True)
def models_scan(as_json):
    """The GGUF files already on this machine, read in place (headers only, nothing loaded or copied).

    Stores: the edgespec cache ($EDGESPEC_HOME/models), the Hugging Face cache (HF_HUB_CACHE /
    HF_HOME), LM Studio (~/.lmstudio/models, ~/.cache/lm-studio/models; EDGESPEC_LMSTUDIO_MODELS)
    and Ollama (~/.ollama/models; OLLAMA_MODELS). The first column is the reference to pass to
    -m/-md, e.g. ollama:qwen2.5-coder:1.5b. Models with equal vocab fingerprints share a tokenizer.
    """
    _print_local(as_json)


def _print_local(as_json: bool) -> None:

    rows = local_models()
    if as_json:
        click.echo(json.dumps([{**dataclasses.asdict(r), "path": str(r.path)} for r in rows]))
        return
    stdout_console().print(local_table(rows))
