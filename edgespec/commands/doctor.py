"""`edgespec doctor`: GGUF headers and this llama.cpp build, nothing loaded."""

from __future__ import annotations

import json
import sys

import click

from .root import CONTEXT, cli
from ..doctor import diagnose
from ..errors import InputError
from ..render import stdout_console
from ..render.doctor import render_doctor


# ---- doctor ------------------------------------------------------------------------------------
@cli.command(context_settings=CONTEXT)
@click.argument("refs", nargs=-1)
@click.option("-md", "--model-draft", "--draft", "model_draft", help="The draft to check against the target (same as a second MODEL).")
@click.option("--drafts", is_flag=True, help="Rank every compatible draft on this machine for the target (what --draft auto picks).")
@click.option("--json", "as_json", is_flag=True)
def doctor(refs, model_draft, drafts, as_json):
    """Read GGUF headers only: architecture, quant, layers, vocab, template; pair compatibility and fit.

    With no MODEL, checks the default pair (if downloaded) and this llama.cpp build. A pair is one
    of: identical vocabularies; compatible through a map of special tokens; incompatible (the first
    mismatch named).
    """

    refs = list(refs) + ([model_draft] if model_draft else [])
    if drafts and not refs:
        raise InputError("--drafts needs a target: edgespec doctor TARGET --drafts")
    report = diagnose(refs, drafts=drafts)
    if as_json:
        click.echo(json.dumps(report.to_json()))
    else:
        render_doctor(stdout_console(), report)
    if report.exit_code:
        sys.exit(report.exit_code)  # 3 missing / 4 malformed model file, else 1 for a problem found


