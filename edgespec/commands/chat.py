"""`edgespec chat`: the terminal side of the REPL (input, Ctrl-C, the command). No Rich here:
the session is chat.py, the drawing render/chat.py."""

from __future__ import annotations

import signal
import sys
import threading
from contextlib import contextmanager
from typing import Callable, Iterator, Protocol

import click

from ..chat import BLOCK, ChatSession, Notice, SessionTotals
from .root import CONTEXT, cli, terminations_reach_the_main_thread
from .options import model_options, open_engine, sampling_config, sampling_options, spec_config
from ..errors import ContextError, EdgespecError
from ..generate import Chunk, Final, GenerationStats
from ..render import stderr_console, stdout_console
from ..render.chat import RichChatView, banner
from ..timing import STALE_MESSAGE

PROMPT = "you> "
CONTINUATION = "...> "


@cli.command(context_settings=CONTEXT)
@model_options
@sampling_options
@click.option("--system", help="System message (change it later with /system).")
@click.option("--load", "load_file", type=click.Path(dir_okay=False), help="Start from a history saved with /save.")
@click.option("--show-drafts", is_flag=True, help="Colour accepted draft (green) and n-gram (cyan) tokens.")
@click.option("--no-trim", is_flag=True, help="Do not drop the oldest turns when the history outgrows the context.")
@click.option("-q", "--quiet", is_flag=True, help="No stats line under each answer.")
def chat(system, load_file, show_drafts, no_trim, quiet, **kw):
    """Interactive chat with streaming answers; each turn reuses the models' caches.

    Type /help inside for commands (/stats, /reset, /system, /save, /load, /exit) and multi-line
    input. Ctrl-C stops an answer, Ctrl-D leaves.
    """
    spec = spec_config(kw)
    resolved, engine = open_engine(kw, spec)
    err = stderr_console()
    with engine:
        session = ChatSession(
            engine, sampling_config(kw), max_tokens=kw["max_tokens"], stop=kw["stop"], system=system,
            auto_trim=not no_trim,
        )
        if load_file:
            session.load(load_file)
        draft = resolved.draft_path.name if engine.draft is not None else None
        err.print(banner(resolved.target_path.name, draft, spec.mode, engine.target.n_ctx))
        _line_editing()
        _ctrl_c_on_a_terminal()
        with terminations_reach_the_main_thread():
            status = run_repl(session, RichChatView(stdout_console(), err, show_drafts=show_drafts, quiet=quiet))
    sys.exit(status)


def _line_editing() -> None:
    """Arrow keys and history for input(), where the platform has readline."""
    if sys.stdin.isatty():
        try:
            import readline  # noqa: F401 - importing it is what turns line editing on
        except ImportError:
            pass


# ---- input -------------------------------------------------------------------------------------
class LineAssembler:
    """Joins physical lines into one message: a trailing backslash continues, triple quotes fence a block."""

    def __init__(self):
        self.lines: list[str] = []
        self.in_block = False

    @property
    def pending(self) -> bool:
        return bool(self.lines) or self.in_block

    def reset(self) -> None:
        self.lines, self.in_block = [], False

    def feed(self, line: str) -> str | None:
        """The complete message, or None while more lines are needed."""
        if self.in_block:
            if line.rstrip().endswith(BLOCK):
                self.lines.append(line.rstrip()[: -len(BLOCK)])
                return self._take()
            self.lines.append(line)
            return None
        if not self.lines and line.lstrip().startswith(BLOCK):
            rest = line.lstrip()[len(BLOCK) :]
            if rest.rstrip().endswith(BLOCK):  # """one line"""
                return rest.rstrip()[: -len(BLOCK)]
            self.in_block = True
            if rest.strip():
                self.lines.append(rest)
            return None
        if line.endswith("\\"):
            self.lines.append(line[:-1])
            return None
        self.lines.append(line)
        return self._take()

    def _take(self) -> str:
        text = "\n".join(self.lines)
        self.reset()
        return text


class ChatView(Protocol):
    def chunk(self, chunk: Chunk) -> None: ...
    def answer_end(self, final: Final | None) -> None: ...
    def notice(self, text: str) -> None: ...
    def info(self, text: str) -> None: ...
    def error(self, text: str) -> None: ...
    def help(self, text: str) -> None: ...
    def stats(self, last: GenerationStats, totals: SessionTotals) -> None: ...


class _Sigint:
    hits = 0


@contextmanager
def soft_sigint() -> Iterator[_Sigint]:
    """While an answer streams, the first Ctrl-C only raises a flag, read between tokens.

    A KeyboardInterrupt raised right after llama_decode returns would leave a model's KV cache
    holding tokens its Python mirror does not list; stopping at a token boundary avoids that.
    A second Ctrl-C raises KeyboardInterrupt at once (the caller then drops the caches).
    """
    flag = _Sigint()
    if threading.current_thread() is not threading.main_thread():
        yield flag
        return

    def handler(signum, frame):
        flag.hits += 1
        if flag.hits > 1:
            raise KeyboardInterrupt

    old = signal.signal(signal.SIGINT, handler)
    try:
        yield flag
    finally:
        signal.signal(signal.SIGINT, old)


def _ctrl_c_on_a_terminal() -> None:
    """A shell starts background jobs with SIGINT ignored, which Python then keeps; in an
    interactive session on a terminal Ctrl-C must work, so take it back."""
    if sys.stdin.isatty() and signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def is_command(text: str) -> bool:
    return text.startswith("/") and not text.startswith("//") and "\n" not in text


def run_repl(session: ChatSession, view: ChatView, read: Callable[[str], str] = input) -> int:
    """Read, answer, repeat. Returns the exit status (0 on /exit or Ctrl-D)."""
    lines = LineAssembler()
    while True:
        try:
            line = read(CONTINUATION if lines.pending else PROMPT)
            text = lines.feed(line)
            if text is None or not text.strip():
                continue
            if is_command(text):
                if _command(session, view, text):
                    return 0
                continue
            _turn(session, view, text[1:] if text.startswith("//") else text)
        except KeyboardInterrupt:
            lines.reset()  # Ctrl-C at the prompt clears what was typed
            view.info("")
        except EOFError:
            view.info("")
            return 0


def _command(session: ChatSession, view: ChatView, text: str) -> bool:
    """Run one command; True when it asks to leave."""
    result = session.handle_command(text)
    if result.action == "exit":
        return True
    if result.action == "help":
        view.help(result.message)
    elif result.action == "stats":
        view.stats(session.last_stats, session.totals)
    elif result.action == "error":
        view.error(result.message)
    else:
        view.info(result.message)
    return False


def _turn(session: ChatSession, view: ChatView, text: str) -> None:
    final = None
    with soft_sigint() as sigint:
        answer = session.send(text, stop_requested=lambda: sigint.hits > 0)
        try:
            for item in answer:
                if isinstance(item, Notice):
                    view.notice(item.text)
                elif isinstance(item, Chunk):
                    view.chunk(item)
                else:
                    final = item
        except KeyboardInterrupt:
            answer.close()
        except EdgespecError as err:
            view.answer_end(None)
            hint = "; /reset clears the history" if isinstance(err, ContextError) and not session.auto_trim else ""
            view.error(err.message + hint)
            return
    view.answer_end(final)
    timing = getattr(getattr(getattr(session, "engine", None), "last_controller", None), "timing", None)
    if timing is not None and timing.take_notice():
        view.notice(STALE_MESSAGE)
    if sigint.hits > 1:
        # The second Ctrl-C may have landed anywhere, even between a decode and its bookkeeping.
        session.drop_cache()
        view.notice("stopped at once: the model caches were cleared (the next turn reads the history again)")
