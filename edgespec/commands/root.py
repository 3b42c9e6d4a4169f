"""The root group and the one error boundary: every EdgespecError becomes one line and its exit code."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass

import click

from .. import __version__
from ..errors import EdgespecError
from ..backend.model import set_native_backtraces, set_verbose

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


@dataclass
class State:
    debug: bool = False
    verbose: bool = False


# ---- signals -----------------------------------------------------------------------------------
class Terminated(BaseException):
    """SIGTERM or SIGHUP arrived. A BaseException, like KeyboardInterrupt, so that it unwinds
    through every `finally` (temp files removed, KV caches settled, progress bars stopped) and
    no `except Exception` swallows it."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


_TERMINATING = tuple(s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None)) if s is not None)


# Python functions llama.cpp calls from C (its log callback). An exception raised in one is printed
# by ctypes and dropped ("Exception ignored on calling ctypes callback function"), and the run would
# go on; a signal handled there is sent again a moment later instead, until it lands in our code.
_C_CALLBACKS = {("edgespec/backend/model.py", "_log"), ("edgespec/backend/model.py", "_on_abort")}
_REDELIVER_S = 0.02


def _in_c_callback(frame) -> bool:
    while frame is not None:
        code = frame.f_code
        name = code.co_filename.replace("\\", "/")
        if any(code.co_name == fn and name.endswith(where) for where, fn in _C_CALLBACKS):
            return True
        frame = frame.f_back
    return False


def _send_again_soon(signum: int) -> None:
    timer = threading.Timer(_REDELIVER_S, os.kill, (os.getpid(), signum))
    timer.daemon = True
    timer.start()


def _on_terminate(signum, frame):
    if _in_c_callback(frame):
        _send_again_soon(signum)
        return
    # A second signal while unwinding must not cut the clean-up short: ignore the rest.
    for sig in _TERMINATING:
        signal.signal(sig, signal.SIG_IGN)
    raise Terminated(signum)


def _on_interrupt(signum, frame):
    # Python's own Ctrl-C handler, except that it does not raise where ctypes would drop it.
    if _in_c_callback(frame):
        _send_again_soon(signum)
        return
    raise KeyboardInterrupt


@contextmanager
def _terminate_by_exception():
    """SIGTERM/SIGHUP raise Terminated, SIGINT KeyboardInterrupt, in the main thread while a
    command runs (restored after); commands may install their own SIGINT handler meanwhile."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {}
    for sig in _TERMINATING:
        if signal.getsignal(sig) is signal.SIG_IGN:
            continue  # started under nohup (or told to ignore it): keep ignoring
        old[sig] = signal.signal(sig, _on_terminate)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        old[signal.SIGINT] = signal.signal(signal.SIGINT, _on_interrupt)
    try:
        yield
    except Terminated:
        raise  # the handlers stay on "ignore" until the process has said its line and exited
    except BaseException:
        _restore(old)
        raise
    _restore(old)


@contextmanager
def terminations_reach_the_main_thread():
    """While the main thread waits in C for something that only a signal interrupts (readline's
    input() at the chat prompt), SIGTERM or SIGHUP the kernel hands to another thread (llama.cpp's
    OpenMP workers take them as readily) only marks Python's handler as due: nothing wakes the main
    thread to run it, and the process waits at the prompt for ever. Python reports every signal on
    its wakeup fd, whichever thread took it: a watcher thread sends each terminating one on to the
    main thread itself, once. The second delivery is harmless: before the handler runs it merges
    with the first, after it the signal is ignored (_on_terminate)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    r, w = os.pipe()
    os.set_blocking(w, False)
    try:
        old = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    except ValueError:  # not allowed here: leave things as they are
        os.close(r)
        os.close(w)
        yield
        return
    main = threading.main_thread().ident

    def forward():
        sent = set()  # once each: the one forwarded is reported here too
        while data := os.read(r, 64):
            for signum in data:
                if signum in _TERMINATING and signum not in sent:
                    sent.add(signum)
                    signal.pthread_kill(main, signum)

    watcher = threading.Thread(target=forward, name="edgespec-signals", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        signal.set_wakeup_fd(old)
        os.close(w)  # the watcher reads the end and stops
        watcher.join(5)
        os.close(r)


def _restore(old: dict) -> None:
    for sig, handler in old.items():
        signal.signal(sig, handler)


# ---- warnings ----------------------------------------------------------------------------------
class _WarningLine(logging.Handler):
    """Library warnings (logger "edgespec") as one line each on stderr: `warning: ...`."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            click.echo(f"warning: {record.getMessage()}", err=True)
        except Exception:  # a closed stderr must not turn a warning into a failure
            pass


@contextmanager
def _warning_lines():
    log = logging.getLogger("edgespec")
    handler = _WarningLine(logging.WARNING)
    old_propagate = log.propagate
    log.addHandler(handler)
    log.propagate = False
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.propagate = old_propagate


def _say(line: str) -> None:
    try:
        click.echo(line, err=True)
    except Exception:  # after SIGHUP the terminal may be gone: the exit status still tells
        pass


# ---- the error boundary ------------------------------------------------------------------------
def main(argv=None) -> None:
    debug = "--debug" in (argv if argv is not None else sys.argv[1:])
    try:
        with _terminate_by_exception(), _warning_lines():
            cli.main(args=argv, prog_name="edgespec", standalone_mode=False)
    except Terminated as sig:
        _say(f"terminated ({signal.Signals(sig.signum).name})")
        sys.exit(128 + sig.signum)
    except click.exceptions.Abort:
        click.echo("interrupted", err=True)
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
        set_verbose(verbose)
        set_native_backtraces(debug)


