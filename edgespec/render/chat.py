"""Rich output for the chat REPL: answers on stdout, everything else (banner, stats, notices) on stderr."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..chat import SessionTotals
from ..generate import Chunk, Final, GenerationStats
from .common import stats_table, styled


def banner(target: str, draft: str | None, spec_mode: str, n_ctx: int) -> str:
    models = f"{escape(target)} + draft {escape(draft)}" if draft else escape(target)
    return f"[bold]edgespec chat[/] · {models} · spec {spec_mode} · context {n_ctx} · [bold]/help[/] for commands, Ctrl-D to leave"


def answer_line(s: GenerationStats) -> str:
    """The short line under each answer."""
    acc = f" · accepted {s.accepted}/{s.drafted}" if s.drafted else ""
    return (
        f"{s.tokens} tokens · {s.tokens_per_s:.1f} tok/s · spec {s.mode}{acc} · "
        f"prompt {s.prompt_tokens} ({s.prompt_cached} cached) · {s.finish_reason}"
    )


def totals_table(t: SessionTotals) -> Table:
    table = Table(title="session totals", show_header=False, box=None)
    table.add_column(style="bold")
    table.add_column()
    n = t.sums
    acc = f"{n['accepted']}/{n['drafted']} ({t.acceptance_rate:.0%})" if n["drafted"] else "-"
    rows = [
        ("answers", f"{t.answers} ({t.interrupted} interrupted)"),
        ("tokens generated", str(n["tokens"])),
        ("mean speed", f"{t.tokens_per_s:.2f} tok/s"),
        ("prompt tokens", f"{n['prompt_tokens']}, {n['prompt_cached']} reused from cache"),
        ("drafted / accepted", acc),
    ]
    for k, v in rows:
        table.add_row(k, v)
    return table


class RichChatView:
    def __init__(self, out: Console, err: Console, *, show_drafts: bool = False, quiet: bool = False):
        self.out, self.err = out, err
        self.show_drafts = show_drafts
        self.quiet = quiet
        self._streamed = False  # whether the current answer printed anything (it then needs a newline)

    def chunk(self, chunk: Chunk) -> None:
        self.out.print(styled(chunk.text, chunk.sources, self.show_drafts), end="")
        self.out.file.flush()
        self._streamed = True

    def answer_end(self, final: Final | None) -> None:
        if self._streamed:
            self.out.print()
            self.out.file.flush()
        self._streamed = False
        if final is None:
            return
        if final.finish_reason == "interrupted":
            self.err.print("[yellow]\\[interrupted][/]")
        if not self.quiet:
            self.err.print(answer_line(final.stats), style="dim", markup=False)

    def notice(self, text: str) -> None:
        self.err.print(text, style="yellow", markup=False)

    def info(self, text: str) -> None:
        self.err.print(text, markup=False)

    def error(self, text: str) -> None:
        self.err.print(f"error: {text}", style="red", markup=False)

    def help(self, text: str) -> None:
        self.err.print(text, markup=False)

    def stats(self, last: GenerationStats, totals: SessionTotals) -> None:
        self.err.print(stats_table(last, title="last answer"))
        self.err.print(totals_table(totals))
