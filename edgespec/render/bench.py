"""Rendering for `edgespec bench`: progress lines, the results table, the verify verdict."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from ..bench.results import BenchResult
from ..bench.runner import BenchEvent
from ..bench.stats import Aggregate
from ..config import Mode
from ..timing import STALE_MESSAGE


def progress_line(p: BenchEvent) -> str | None:
    """A line for a finished run (None for 'about to start' events)."""
    if p.run is None:
        return None
    s = p.run.stats
    acc = f", accepted {s.accepted}/{s.drafted}" if s.drafted else ""
    rep = f" #{p.repeat + 1}" if p.repeat else ""
    return f"[{p.index}/{p.total}] {p.prompt_id}{rep} {p.mode}: {s.tokens} tokens, {s.tokens_per_s:.1f} tok/s{acc}"


def _pm(v: float | None, bounds: tuple[float, float] | None, spec: str, scale: float = 1.0, suffix: str = "") -> str:
    """A median with half the range of the repeats: `28.1 ±0.6`."""
    if v is None:
        return "-"
    text = f"{v * scale:{spec}}{suffix}"
    if bounds is not None:
        half = (bounds[1] - bounds[0]) / 2 * scale
        text += f" ±{half:{spec}}"
    return text


def _speed(mode: str, sp: float | None, bounds: tuple[float, float] | None) -> str:
    if sp is None:
        return "-"
    if mode == Mode.OFF:
        return f"{sp:.2f}x"
    if bounds is None:  # a single repeat: no spread to judge by
        return f"[green]{sp:.2f}x[/]" if sp >= 1.03 else f"[red]{sp:.2f}x[/]" if sp < 0.97 else f"{sp:.2f}x"
    lo, hi = bounds
    text = f"{sp:.2f}x ({lo:.2f}–{hi:.2f})"
    if lo > 1.0:
        return f"[green]{text}[/]"
    if hi < 1.0:
        return f"[red]{text}[/]"
    return f"[yellow]{text} ≈1[/]"  # the repeats disagree on which side of 1.0x it falls


def _row(label: str, mode: str, a: Aggregate, spread: dict[str, tuple[float, float]]) -> list[str]:
    g = spread.get
    return [
        label,
        mode,
        str(a.tokens),
        _pm(a.tokens_per_s, g("tokens_per_s"), ".1f"),
        _speed(mode, a.speedup, g("speedup")),
        _pm(a.acceptance_rate, g("acceptance_rate"), ".0f", 100, "%") if a.acceptance_rate is not None else "-",
        _pm(a.mean_accepted_per_pass, g("mean_accepted_per_pass"), ".2f"),
        _pm(a.ttft_ms, g("ttft_ms"), ".0f"),
        _pm(a.latency_p50_ms, g("latency_p50_ms"), ".1f"),
        _pm(a.latency_p95_ms, g("latency_p95_ms"), ".1f"),
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
    caption = ("tok/s: generation only (prompt processing excluded); speedup vs off in this run; "
               "tok/pass: tokens per target pass; TTFT includes prompt processing")
    if len(result.repeats()) > 1:
        caption += ("; ±: half the range over the repeats; speedup (min–max over repeats), "
                    "≈1: the range includes 1.00x, not a measurable difference")
    t = Table(title=title, caption=caption)
    for col, justify in (("category", "left"), ("mode", "left"), ("tokens", "right"), ("tok/s", "right"),
                         ("speedup", "right"), ("accept", "right"), ("tok/pass", "right"), ("TTFT ms", "right"),
                         ("p50 ms", "right"), ("p95 ms", "right")):
        t.add_column(col, justify=justify, no_wrap=True)
    groups = [(c, result.summary(c), result.spread(c)) for c in result.categories()]
    groups.append(("overall", result.summary(), result.spread()))
    for gi, (name, rows, spread) in enumerate(groups):
        for i, (mode, agg) in enumerate(rows.items()):
            label = f"{name} ({agg.prompts})" if i == 0 else ""
            t.add_row(*_row(label, mode, agg, spread.get(mode, {})), style="bold" if name == "overall" else None,
                      end_section=i == len(rows) - 1 and gi < len(groups) - 1)
    return t


def render_results(out: Console, err: Console, result: BenchResult) -> None:
    for s in result.skipped:
        err.print(f"[yellow]note:[/] skipped {s['mode']}: {s['reason']}")
    for note in result.notes:
        err.print(f"[yellow]note:[/] {note}")
    if result.profile_stale:
        err.print(STALE_MESSAGE, style="dim", highlight=False)
    if not out.is_terminal:  # a pipe or a README capture: do not squeeze the table into 80 columns
        out = Console(file=out.file, width=max(out.width, 140), highlight=False, color_system=None)
    out.print(results_table(result))
    if result.verified:
        render_verify(out, result)


def print_event(err: Console, e: BenchEvent) -> None:
    """The command's stderr line for a bench event (some events have none)."""
    if e.phase == "warmup":
        line = "warming up..." if e.index == 1 else None
    elif e.phase == "verify" and e.run is None:
        line = f"verify (greedy) {e.index}/{e.total}: {e.prompt_id} {e.mode}"
    elif e.phase == "margins":
        line = f"verify: plain run of {e.prompt_id} again for its logit margins ({e.index}/{e.total})"
    else:
        line = progress_line(e)
    if line:
        err.print(line, style="dim")


def _difference_line(d, result: BenchResult) -> str:
    rep = f" (repeat {d.repeat + 1})" if d.repeat else ""
    margin = "margin unknown" if d.margin is None else f"plain top-2 margin {d.margin:.3f}"
    verdict = ""
    if not result.exact:
        verdict = " — near-tie" if d.near_tie(result.near_tie_logit) else " — [red]not a near-tie[/]"
    return (f"  {d.prompt_id} {d.mode}{rep}: first difference at token {d.position} "
            f"(plain {d.plain_token}, got {d.spec_token}; {margin}){verdict}")


def render_verify(out: Console, result: BenchResult) -> None:
    n = len({(r.prompt_id, r.mode) for r in result.runs})
    if not result.differences:
        out.print(f"[green]verify: ok[/], greedy output of every mode matches plain decoding token for token ({n} prompt x mode runs)")
        return
    if result.verify_ok:
        out.print(f"[green]verify: ok[/], {len(result.differences)} run(s) diverge from plain decoding, each at a near-tie "
                  f"(plain top-2 logit margin < {result.near_tie_logit}; fast kernels: batched rows differ slightly)")
    elif result.exact:
        out.print(f"[red]verify: {len(result.differences)} run(s) differ from plain decoding[/] (exact kernels: any difference fails)")
    else:
        bad = len(result.failing_differences())
        out.print(f"[red]verify: {bad} run(s) differ from plain decoding where it was not a near-tie[/] "
                  f"(plain top-2 logit margin >= {result.near_tie_logit})")
    for d in result.differences:
        out.print(_difference_line(d, result))
