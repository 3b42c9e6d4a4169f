"""The root group and the one error boundary: every EdgespecError becomes one line and its exit code."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import click

from .. import __version__
from ..errors import EdgespecError

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@dataclass
class State:
    debug: bool = False
    verbose: bool = False


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
        from ..backend.model import set_native_backtraces, set_verbose

        set_verbose(verbose)
        set_native_backtraces(debug)


