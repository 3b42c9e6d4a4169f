"""Rendering for `edgespec bench`: progress lines, the results table, the verify verdict."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from ..bench import Aggregate, BenchResult, Progress


def progress_line(p: Progress) -> str | None:
    """A line for a finished run (None for 'about to start' events)."""
    if p.run is None:
        return None
    s = p.run.stats
    acc = f", accepted {s.accepted}/{s.drafted}" if s.drafted else ""
    rep = f" #{p.repeat + 1}" if p.repeat else ""
    return f"[{p.index}/{p.total}] {p.prompt_id}{rep} {p.mode}: {s.tokens} tokens, {s.tokens_per_s:.1f} tok/s{acc}"


def _fmt(v: float | None, spec: str, suffix: str = "") -> str:
    return "-" if v is None else f"{v:{spec}}{suffix}"


def _row(label: str, mode: str, a: Aggregate) -> list[str]:
    sp = a.speedup
    speed = "-" if sp is None else (f"[green]{sp:.2f}x[/]" if sp >= 1.03 else f"[red]{sp:.2f}x[/]" if sp < 0.97 else f"{sp:.2f}x")
    return [
        label,
        mode,
        str(a.tokens),
        f"{a.tokens_per_s:.1f}",
        speed,
        _fmt(a.acceptance_rate, ".0%"),
        f"{a.mean_accepted_per_pass:.2f}",
        f"{a.ttft_ms:.0f}",
        f"{a.latency_p50_ms:.1f}",
        f"{a.latency_p95_ms:.1f}",
    ]


def results_table(result: BenchResult) -> Table:
    cfg = result.config
    title = "edgespec bench"
    if cfg:
        bits = [cfg.get("target", "")]
        if cfg.get("draft"):
            bits.append(f"draft {cfg['draft']}")
        if cfg.get("threads"):
            bits.append(f"{cfg['threads']} threads")
        bits.append("greedy" if not cfg.get("temperature") else f"temperature {cfg['temperature']}")
        if cfg.get("repeats", 1) > 1:
            bits.append(f"median of {cfg['repeats']}")
        title += " (" + ", ".join(b for b in bits if b) + ")"
    t = Table(title=title, caption="tok/s: generation only (prompt processing excluded); speedup vs off in this run; "
              "tok/pass: tokens per target pass; TTFT includes prompt processing")
    for col, justify in (("category", "left"), ("mode", "left"), ("tokens", "right"), ("tok/s", "right"),
                         ("speedup", "right"), ("accept", "right"), ("tok/pass", "right"), ("TTFT ms", "right"),
                         ("p50 ms", "right"), ("p95 ms", "right")):
        t.add_column(col, justify=justify, no_wrap=True)
    groups = [(c, result.summary(c)) for c in result.categories()]
    groups.append(("overall", result.summary()))
    for gi, (name, rows) in enumerate(groups):
        for i, (mode, agg) in enumerate(rows.items()):
            label = f"{name} ({agg.prompts})" if i == 0 else ""
            t.add_row(*_row(label, mode, agg), style="bold" if name == "overall" else None,
                      end_section=i == len(rows) - 1 and gi < len(groups) - 1)
    return t


def render_results(out: Console, err: Console, result: BenchResult) -> None:
    for s in result.skipped:
        err.print(f"[yellow]note:[/] skipped {s['mode']}: {s['reason']}")
    for note in result.notes:
        err.print(f"[yellow]note:[/] {note}")
    if not out.is_terminal:  # a pipe or a README capture: do not squeeze the table into 80 columns
        out = Console(file=out.file, width=max(out.width, 120), highlight=False, color_system=None)
    out.print(results_table(result))
    if result.verified:
        render_verify(out, result)


def render_verify(out: Console, result: BenchResult) -> None:
    if result.verify_ok:
        n = len({(r.prompt_id, r.mode) for r in result.runs})
        out.print(f"[green]verify: ok[/], greedy output of every mode matches plain decoding token for token ({n} prompt x mode runs)")
        return
    out.print(f"[red]verify: {len(result.differences)} run(s) differ from plain decoding[/]")
    for d in result.differences:
        rep = f" (repeat {d.repeat + 1})" if d.repeat else ""
        out.print(f"  {d.prompt_id} {d.mode}{rep}: first difference at token {d.position} (plain {d.plain_token}, got {d.spec_token})")
