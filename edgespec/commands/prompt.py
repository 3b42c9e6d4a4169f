"""`edgespec prompt`: one-shot generation, streamed."""

from __future__ import annotations

import json
import sys

import click

from ..errors import InputError
from ..generate import Chunk, Final, interrupt
from ..render import stderr_console, stdout_console
from ..render.common import footer, print_stale_notice, styled
from ..template import Message
from .options import model_options, open_engine, sampling_config, sampling_options, spec_config
from .root import CONTEXT, cli


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
    text = read_prompt(text)
    spec, sampling = spec_config(kw), sampling_config(kw)
    _, engine = open_engine(kw, spec, quiet=quiet or as_json)
    out, err = stdout_console(), stderr_console()
    with engine:
        if raw:
            tokens = engine.raw_tokens(text)
        else:
            messages = ([Message("system", system)] if system else []) + [Message("user", text)]
            tokens = engine.chat_tokens(messages)
        final = None
        chunks = engine.stream(tokens, sampling, max_tokens=kw["max_tokens"], stop=kw["stop"])
        item = next(chunks, None)
        while item is not None:
            try:
                if isinstance(item, Chunk) and not as_json:
                    out.print(styled(item.text, item.sources, show_drafts), end="")
                    out.file.flush()
                elif isinstance(item, Final):
                    final = item
                item = next(chunks, None)
            except KeyboardInterrupt:
                # Ctrl-C while a chunk was being printed: the same end as one during decoding
                item = interrupt(chunks)
                if item is None:
                    raise
    if as_json:
        click.echo(json.dumps({"text": final.text, "finish_reason": final.finish_reason, "stats": final.stats.to_json()}))
        if final.finish_reason == "interrupted":
            sys.exit(130)  # what was generated is printed, but the run did not finish
        return
    out.print()
    out.file.flush()  # the footer goes to stderr: keep it after the answer on a terminal
    if not quiet:
        err.print(footer(final.stats), style="dim")
        print_stale_notice(err, getattr(engine, "last_controller", None))
    if final.finish_reason == "interrupted":
        sys.exit(130)


