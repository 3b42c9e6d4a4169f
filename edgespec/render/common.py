"""Rendering for prompt, models, doctor and profile output."""

from __future__ import annotations

from typing import Any, Iterable

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn
from rich.table import Table
from rich.text import Text

from ..generate import GenerationStats
from . import SOURCE_STYLES, human_bytes
from ..timing import STALE_MESSAGE


def footer(stats: GenerationStats) -> str:
    """One line: speed, acceptance, mean accepted length, who drafted."""
    used = ", ".join(f"{k} {v}" for k, v in sorted(stats.tokens_by_source.items()) if k != "target") or "none"
    acc = f"{stats.acceptance_rate:.0%}" if stats.drafted else "-"
    return (
        f"{stats.tokens} tokens, {stats.tokens_per_s:.1f} tok/s | spec {stats.mode} | accepted {stats.accepted}/{stats.drafted} ({acc}) | "
        f"{stats.mean_accepted_per_pass:.2f} tokens/pass | drafted tokens used: {used} | "
        f"prompt {stats.prompt_tokens} ({stats.prompt_cached} cached) in {stats.prompt_ms:.0f} ms | {stats.finish_reason}"
    )


def stats_table(stats: GenerationStats, title: str = "generation stats") -> Table:
    t = Table(title=title, show_header=False, box=None)
    t.add_column(style="bold")
    t.add_column()
    rows = [
        ("mode", stats.mode),
        ("tokens", str(stats.tokens)),
        ("speed", f"{stats.tokens_per_s:.2f} tok/s"),
        ("time to first token", f"{stats.ttft_ms:.0f} ms"),
        ("latency p50 / p95", f"{stats.latency_p50_ms:.1f} / {stats.latency_p95_ms:.1f} ms"),
        ("prompt", f"{stats.prompt_tokens} tokens, {stats.prompt_cached} reused from cache, {stats.prompt_ms:.0f} ms"),
        ("target passes", str(stats.rounds)),
        ("tokens per pass", f"{stats.mean_accepted_per_pass:.2f}"),
        ("drafted / accepted", f"{stats.drafted} / {stats.accepted} ({stats.acceptance_rate:.0%})"),
        ("accepted-length histogram", " ".join(f"{k}:{v}" for k, v in sorted(stats.accepted_hist.items())) or "-"),
        ("draft / verify time", f"{stats.draft_ms:.0f} / {stats.verify_ms:.0f} ms"),
        ("tokens by source", ", ".join(f"{k} {v}" for k, v in sorted(stats.tokens_by_source.items())) or "-"),
        ("finish", str(stats.finish_reason)),
    ]
    for k, v in rows:
        t.add_row(k, v)
    return t


def styled(text: str, sources: Iterable[str], show_drafts: bool) -> Text:
    """Colour text by who produced it: accepted draft tokens green, n-gram cyan, target plain."""
    if not show_drafts:
        return Text(text)
    srcs = set(sources)
    style = ""
    for name in ("draft", "ngram"):
        if name in srcs:
            style = SOURCE_STYLES[name]
    return Text(text, style=style)


def _origin_label(origin: str) -> str:
    return origin if origin == "built-in" else "user"


def _user_caption(origins) -> str | None:
    users = sorted({o for o in origins if o != "built-in"})
    return "user: " + ", ".join(escape(u) for u in users) if users else None


def models_table(rows) -> Table:
    t = Table(title="models", caption=_user_caption(r.origin for r in rows))
    t.add_column("name", overflow="fold")
    for col in ("family", "params", "quant", "size", "cached", "sources", "from"):
        t.add_column(col)
    for r in rows:
        t.add_row(escape(r.name), escape(r.family), escape(r.params), escape(r.quant), human_bytes(r.size),
                  "[green]yes[/]" if r.cached else "no", r.sources, _origin_label(r.origin))
    return t


def pairs_table(registry) -> Table:
    origins = [registry.origin.get(name, "built-in") for name in registry.pairs]
    t = Table(title="pairs (target + draft)", caption=_user_caption(origins))
    for col in ("name", "target", "draft"):
        t.add_column(col, overflow="fold")
    t.add_column("from")
    for (name, (target, draft)), origin in zip(registry.pairs.items(), origins):
        label = f"{escape(name)} [bold](default)[/]" if name == registry.default_pair else escape(name)
        t.add_row(label, escape(target), escape(draft), _origin_label(origin))
    return t


def plan_table(plan) -> Table:
    t = Table(title=f"offload plan (context {plan.n_ctx}, KV {plan.type_k}/{plan.type_v})")
    for col in ("model", "GPU layers", "GPU bytes", "CPU bytes", "KV bytes", "threads"):
        t.add_column(col)
    for place in (plan.target, plan.draft):
        if place is None:
            continue
        gpu = ", ".join(f"{k}: {human_bytes(v)}" for k, v in place.gpu_bytes.items()) or "-"
        t.add_row(place.model, str(place.n_gpu_layers), gpu, human_bytes(place.cpu_bytes), human_bytes(place.kv_bytes), str(place.threads))
    return t


def devices_table(plan) -> Table:
    t = Table(title="devices")
    for col in ("device", "total", "used by plan", "headroom"):
        t.add_column(col)
    for d in plan.devices:
        t.add_row(d.label, human_bytes(d.total), human_bytes(d.used), human_bytes(d.headroom))
    return t


def hardware_table(hw) -> Table:
    t = Table(title="hardware", show_header=False, box=None)
    t.add_column(style="bold")
    t.add_column()
    t.add_row("os", hw.os)
    t.add_row("cpu", f"{hw.cpu_model} ({hw.physical_cores} cores / {hw.logical_cores} threads)")
    t.add_row("cpu features", " ".join(hw.cpu_features) or "-")
    t.add_row("ram", f"{human_bytes(hw.ram_total)} total, {human_bytes(hw.ram_available)} available, swap {human_bytes(hw.swap_total)}")
    gpus = "; ".join(
        f"{g.label} {'(remote)' if g.remote else g.name} {human_bytes(g.free_bytes)} free / {human_bytes(g.total_bytes)}"
        for g in hw.gpus
    )
    t.add_row("gpus", gpus or "none")
    t.add_row("gpu offload in this build", "yes" if hw.gpu_offload_supported else "no")
    t.add_row("rpc in this build", "yes" if hw.rpc_supported else "no")
    t.add_row("llama-cpp-python", hw.llama_cpp_version or "-")
    return t


def measurement_tables(m: dict[str, Any]) -> list[Table]:
    kind = m.get("kernels")
    repeats = m.get("repeats")
    notes = [f"{kind} kernels"] if kind else []
    if "target_spread" in m:
        notes.append((f"ms: fastest of {repeats} interleaved repeats; " if repeats else "")
                     + "spread: how much slower the median repeat was")
    title, caption = "measured target batch cost t(k)", "; ".join(notes) or None
    timing = Table(title=title, caption=caption)
    timing.add_column("k", justify="right")
    timing.add_column("ms", justify="right")
    spreads = m.get("target_spread") or {}
    if spreads:
        timing.add_column("spread", justify="right")
    timing.add_column("v(k) = t(k)/t(1)", justify="right")
    t1 = m["target_ms"]["1"]
    for k, ms in sorted(m["target_ms"].items(), key=lambda kv: int(kv[0])):  # stored JSON sorts keys as text
        spread = [_spread(spreads.get(k))] if spreads else []
        timing.add_row(k, f"{ms:.1f}", *spread, f"{ms / t1:.2f}")
    tables = [timing]
    summary = Table(show_header=False, box=None, title="drafters")
    summary.add_column(style="bold")
    summary.add_column()
    if m.get("draft_ms") is not None:
        spread = f", spread {_spread(m['draft_spread'])}" if m.get("draft_spread") is not None else ""
        summary.add_row("draft t(1)", f"{m['draft_ms']:.1f} ms{spread} (cost ratio c = {m['cost']['draft_cost']:.2f})")
    if m.get("draft_alpha") is not None:
        summary.add_row("draft acceptance (sample)", f"{m['draft_alpha']:.2f}")
    summary.add_row("n-gram lookup", f"{m['ngram_us']:.0f} µs per proposal")
    v = m.get("verdicts", {})
    if "draft_model_pays" in v:
        verdict = (
            f"[green]pays[/]: K={v['draft_model_best_k']}, expected {v['draft_model_expected_speedup']:.2f}x"
            if v["draft_model_pays"]
            else "[yellow]does not pay on this machine[/] at the measured acceptance: auto mode keeps it off and uses n-gram drafting"
        )
        summary.add_row("draft model verdict", verdict)
    if "stable" in m:
        loads = ", ".join(f"{x['other_cores']:.1f} cores {x['when']}" for x in m.get("load", []))
        load = f" (other processes: {loads} of {m['load'][0]['cores']})" if loads else ""
        if m["stable"]:
            summary.add_row("measurement", f"[green]stable[/]{load}")
        else:
            why = "; ".join(m.get("unstable_reasons", []))
            forced = " — saved anyway (--force)" if m.get("forced") else ""
            summary.add_row("measurement", f"[yellow]unstable[/]: {why}{forced}")
    tables.append(summary)
    exp = Table(title=f"expected speedup (best K <= {m.get('k_limit', 16)}) by acceptance rate")
    exp.add_column("drafter")
    alphas = sorted({a for rows in (v.get("ngram", {}), v.get("draft", {})) for a in rows}, key=float)
    for a in alphas:
        exp.add_column(f"α={a}", justify="right")
    for name in ("ngram", "draft"):
        rows = v.get(name)
        if rows:
            exp.add_row(name, *[f"{rows[a]['speedup']:.2f}x (K={rows[a]['k']})" if a in rows else "-" for a in alphas])
    tables.append(exp)
    return tables


def print_stale_notice(console: Console, *controllers) -> None:
    """One dim line, once, when live timing replaced a saved profile that no longer fits (timing.py)."""

    for c in controllers:
        timing = getattr(c, "timing", None)
        if timing is not None and timing.take_notice():
            console.print(STALE_MESSAGE, style="dim", highlight=False)
            return


def _spread(x: float | None) -> str:
    return "-" if x is None else f"+{x:.1%}"


def doctor_model_table(path, info) -> Table:
    t = Table(title=str(path), show_header=False, box=None)
    t.add_column(style="bold")
    t.add_column()
    t.add_row("architecture", info.architecture)
    t.add_row("name", info.name or "-")
    t.add_row("quantization", info.quant)
    t.add_row("size", f"{human_bytes(info.file_size)} ({info.n_params / 1e9:.2f} B params)")
    t.add_row("layers", str(info.n_layers))
    t.add_row("context (trained)", str(info.n_ctx_train))
    vocab = info.vocab
    t.add_row("vocabulary", f"{vocab.model}, {vocab.n_tokens} tokens, bos {vocab.bos_id}, eos {vocab.eos_id}" if vocab else "-")
    t.add_row("chat template", "yes" if info.chat_template else "no (ChatML is used)")
    return t


class RichProgress:
    """The progress.Progress protocol on a Rich progress bar (stderr)."""

    def __init__(self, console: Console | None = None):
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TransferSpeedColumn(),
            TimeRemainingColumn(),
            console=console,
            transient=True,
        )
        self._task = None

    def start(self, task: str, total: int | None) -> None:
        if self._task is None:
            self._progress.start()
        else:
            self._progress.remove_task(self._task)
        self._task = self._progress.add_task(task, total=total)

    def advance(self, n: int) -> None:
        if self._task is not None:
            self._progress.advance(self._task, n)

    def done(self) -> None:
        if self._task is not None:
            self._progress.remove_task(self._task)
            self._task = None
        self._progress.stop()


class StepProgress(RichProgress):
    """Same protocol for counted steps (profile measurement) rather than bytes."""

    def __init__(self, console: Console | None = None):
        self._progress = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"), console=console, transient=True)
        self._task = None
