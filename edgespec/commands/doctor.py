"""`edgespec doctor`: GGUF headers and this llama.cpp build, nothing loaded."""

from __future__ import annotations

import json
import sys

import click

from .root import CONTEXT, cli


# ---- doctor ------------------------------------------------------------------------------------
@cli.command(context_settings=CONTEXT)
@click.argument("refs", nargs=-1)
@click.option("--json", "as_json", is_flag=True)
def doctor(refs, as_json):
    """Read GGUF headers only: architecture, quant, layers, vocab, template; pair compatibility and fit.

    With no MODEL, checks the default pair (if downloaded) and this llama.cpp build.
    """
    from ..doctor import diagnose
    from ..render import stdout_console
    from ..render.doctor import render_doctor

    report = diagnose(list(refs))
    if as_json:
        click.echo(json.dumps(report.to_json()))
    else:
        render_doctor(stdout_console(), report)
    if report.exit_code:
        sys.exit(report.exit_code)  # 3 missing / 4 malformed model file, else 1 for a problem found


