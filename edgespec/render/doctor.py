"""Rendering for `edgespec doctor`."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape

from .common import doctor_model_table


def _mark(ok: bool) -> str:
    return "[green]ok[/]" if ok else "[red]problem[/]"


def problem_line(ref: str, error: str) -> str:
    """`REF: what is wrong`, naming REF once: most errors already start with the path."""
    if error.startswith(f"{ref}:") or ref in error:
        return f"[red]problem[/] {escape(error)}"
    return f"[red]{escape(ref)}[/]: {escape(error)}"


def render_doctor(console: Console, report) -> None:
    for m in report.models:
        if m.info is None:
            console.print(problem_line(m.ref, m.error))
        else:
            console.print(doctor_model_table(m.path, m.info))
    if report.pair is not None:
        console.print(f"pair: {_mark(report.pair[0])} {report.pair[1]}")
    if report.fit is not None:
        console.print(f"fit on this machine: {_mark(report.fit[0])} {report.fit[1]}")
    for ok, detail in report.build:
        console.print(f"build: {_mark(ok)} {detail}")
    if report.drafts is not None:
        render_drafts(console, report.drafts)


def render_drafts(console: Console, drafts) -> None:
    if not drafts:
        console.print("drafts: none on this machine shares the target's vocabulary (edgespec models scan)")
        return
    console.print(f"drafts on this machine for this target, best first ({sum(c.usable for c in drafts)} fit beside it):")
    for i, c in enumerate(drafts):
        mark = "[green]best[/]" if i == 0 and c.usable else ("[green]fits[/]" if c.usable else "[yellow]no[/]")
        why = "" if c.fits else f" (does not fit: {escape(c.fit_detail)})"
        console.print(f"  {mark} {escape(c.line())}{why}")
