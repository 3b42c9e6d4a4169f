"""One timed generation (`Run`) and the statistics over runs: medians per (prompt, mode) cell,
throughput and speedup per group of prompts, and their spread over repeats."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Sequence

from ..generate import GenerationStats

def median(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("median of nothing")
    return float(statistics.median(values))


def speedup(tps: float | None, base_tps: float | None) -> float | None:
    if not tps or not base_tps:
        return None
    return tps / base_tps


@dataclass(frozen=True)
class Measure:
    """One (prompt, mode) cell: medians over repeats."""

    tokens: int
    tokens_per_s: float
    gen_s: float
    ttft_ms: float
    prompt_ms: float
    latency_p50_ms: float
    latency_p95_ms: float
    drafted: int
    accepted: int
    rounds: int
    acceptance_rate: float | None
    mean_accepted_per_pass: float
    tokens_by_source: dict[str, int]
    finish_reason: str | None
    repeats: int


@dataclass(frozen=True)
class Run:
    """One timed generation."""

    prompt_id: str
    category: str
    mode: str
    repeat: int
    stats: GenerationStats
    tokens: tuple[int, ...]
    extra_prefill_ms: float = 0.0  # the draft model's prompt processing, done before the timed stream
    profile_stale: bool = False  # live timing replaced the saved profile's costs during this run
    margins: tuple[float, ...] = ()  # with record_margins: top-1 minus top-2 logit per chosen token

    @property
    def ttft_ms(self) -> float:
        return self.stats.ttft_ms + self.extra_prefill_ms

    @property
    def prompt_ms(self) -> float:
        return self.stats.prompt_ms + self.extra_prefill_ms


def measure(runs: Sequence[Run]) -> Measure:
    """Median of each metric over the repeats of one (prompt, mode)."""
    if not runs:
        raise ValueError("no runs")
    st = [r.stats for r in runs]
    tokens = int(round(median([s.tokens for s in st])))
    tps = median([s.tokens_per_s for s in st])
    drafted = int(round(median([s.drafted for s in st])))
    accepted = int(round(median([s.accepted for s in st])))
    rounds = int(round(median([s.rounds for s in st])))
    last = st[len(st) // 2]
    return Measure(
        tokens=tokens,
        tokens_per_s=tps,
        gen_s=tokens / tps if tps else 0.0,
        ttft_ms=median([r.ttft_ms for r in runs]),
        prompt_ms=median([r.prompt_ms for r in runs]),
        latency_p50_ms=median([s.latency_p50_ms for s in st]),
        latency_p95_ms=median([s.latency_p95_ms for s in st]),
        drafted=drafted,
        accepted=accepted,
        rounds=rounds,
        acceptance_rate=accepted / drafted if drafted else None,
        mean_accepted_per_pass=tokens / rounds if rounds else 0.0,
        tokens_by_source=dict(last.tokens_by_source),
        finish_reason=last.finish_reason,
        repeats=len(runs),
    )


@dataclass(frozen=True)
class Aggregate:
    """A group of prompts (a category, or all) under one mode."""

    prompts: int
    tokens: int
    gen_s: float
    tokens_per_s: float
    speedup: float | None
    acceptance_rate: float | None
    mean_accepted_per_pass: float
    ttft_ms: float
    latency_p50_ms: float
    latency_p95_ms: float

    def to_json(self) -> dict:
        return {k: rounded(v) for k, v in self.__dict__.items()}


def aggregate(cells: Sequence[Measure], base: Sequence[Measure] | None = None) -> Aggregate:
    """Throughput over a group: total tokens / total generation time (long prompts weigh more);
    acceptance pooled over all drafted tokens; TTFT and latencies: median over the prompts.
    `base` (the same prompts under plain decoding) gives the speedup."""
    if not cells:
        raise ValueError("no cells")
    tokens = sum(c.tokens for c in cells)
    gen_s = sum(c.gen_s for c in cells)
    rounds = sum(c.rounds for c in cells)
    drafted = sum(c.drafted for c in cells)
    accepted = sum(c.accepted for c in cells)
    tps = tokens / gen_s if gen_s > 0 else 0.0
    base_tps = None
    if base:
        b_tokens, b_s = sum(c.tokens for c in base), sum(c.gen_s for c in base)
        base_tps = b_tokens / b_s if b_s > 0 else None
    return Aggregate(
        prompts=len(cells),
        tokens=tokens,
        gen_s=gen_s,
        tokens_per_s=tps,
        speedup=speedup(tps, base_tps),
        acceptance_rate=accepted / drafted if drafted else None,
        mean_accepted_per_pass=tokens / rounds if rounds else 0.0,
        ttft_ms=median([c.ttft_ms for c in cells]),
        latency_p50_ms=median([c.latency_p50_ms for c in cells]),
        latency_p95_ms=median([c.latency_p95_ms for c in cells]),
    )


def median_aggregate(rows: Sequence[Aggregate]) -> Aggregate:
    """Each figure's median over several aggregates of the same group (None where any is None)."""
    out = {}
    for key, first in rows[0].__dict__.items():
        vals = [getattr(r, key) for r in rows]
        if any(v is None for v in vals):
            out[key] = None
        elif isinstance(first, int):
            out[key] = int(round(median(vals)))
        else:
            out[key] = median(vals)
    return Aggregate(**out)


def rounded(v):
    return round(v, 4) if isinstance(v, float) else v


SPREAD_METRICS = ("tokens_per_s", "speedup", "acceptance_rate", "mean_accepted_per_pass", "ttft_ms",
                  "latency_p50_ms", "latency_p95_ms")


def speedup_overlaps_one(bounds: tuple[float, float] | None) -> bool | None:
    """Whether a speedup's range over the repeats includes 1.0x (None: a single repeat, no range)."""
    if bounds is None:
        return None
    lo, hi = bounds
    return lo <= 1.0 <= hi
