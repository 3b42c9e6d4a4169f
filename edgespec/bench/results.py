"""A bench's results: the runs, per-category summaries, the JSON report, and verification
against plain decoding (`--verify`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from ..config import Mode
from .prompts import BenchPrompt
from .stats import (SPREAD_METRICS, Aggregate, Measure, Run, aggregate, measure, median, median_aggregate, rounded, speedup,
                    speedup_overlaps_one)

# The largest top-1 minus top-2 logit gap at which a divergence from plain decoding counts as a
# near-tie under fast kernels. A greedy flip needs the gap between plain's choice and another token
# to move by more than it was. 1.0 is above every drift measured across verify batch sizes (README,
# "Exactness"; tests/real/test_logits_real.py checks the drift stays below it) with room for other
# CPUs' kernels, and far below a real disagreement.
NEAR_TIE_LOGIT = 1.0


@dataclass(frozen=True)
class Difference:
    prompt_id: str
    mode: str
    repeat: int
    position: int  # index into the generated tokens
    plain_token: int | None
    spec_token: int | None
    margin: float | None = None  # the plain run's top-1 minus top-2 logit at `position` (None: unknown)

    def near_tie(self, limit: float = NEAR_TIE_LOGIT) -> bool:
        return self.margin is not None and self.margin < limit


@dataclass
class BenchResult:
    modes: list[str]
    prompts: list[BenchPrompt]
    runs: list[Run] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    verified: bool = False
    differences: list[Difference] = field(default_factory=list)
    config: dict = field(default_factory=dict)
    exact: bool = False  # exact kernels: any divergence fails verification
    near_tie_logit: float = NEAR_TIE_LOGIT

    # -- cells
    def cell(self, prompt_id: str, mode: str) -> Measure | None:
        runs = [r for r in self.runs if r.prompt_id == prompt_id and r.mode == mode]
        return measure(runs) if runs else None

    def categories(self) -> list[str]:
        return list(dict.fromkeys(p.category for p in self.prompts))

    def summary(self, category: str | None = None) -> dict[str, Aggregate]:
        """mode -> aggregate over the prompts of `category` (None: all) that ran in every mode.

        With several repeats each figure is the median of the repeats' own aggregates (a speedup
        is then always taken within one repeat, off and the mode measured minutes apart at most)."""
        if len(self.repeats()) > 1:
            per = self.summary_by_repeat(category)
            modes = [m for m in self.modes if all(m in p for p in per)]
            return {m: median_aggregate([p[m] for p in per]) for m in modes} if per else {}
        chosen = [p for p in self.prompts if category is None or p.category == category]
        cells = {m: {p.id: self.cell(p.id, m) for p in chosen} for m in self.modes}
        complete = [p.id for p in chosen if all(cells[m][p.id] is not None for m in self.modes)]
        if not complete:
            return {}
        base = [cells[Mode.OFF][i] for i in complete] if Mode.OFF in self.modes else None
        return {m: aggregate([cells[m][i] for i in complete], base) for m in self.modes}

    def repeats(self) -> list[int]:
        return sorted({r.repeat for r in self.runs})

    def summary_by_repeat(self, category: str | None = None) -> list[dict[str, Aggregate]]:
        """summary() computed on each repeat's runs alone: the spread of every figure."""
        out = []
        for rep in self.repeats():
            part = BenchResult(self.modes, self.prompts, [r for r in self.runs if r.repeat == rep])
            rows = part.summary(category)  # one repeat: the plain aggregate
            if rows:
                out.append(rows)
        return out

    def spread(self, category: str | None = None) -> dict[str, dict[str, tuple[float, float]]]:
        """mode -> metric -> (min, max) over the repeats (empty with a single repeat)."""
        per = self.summary_by_repeat(category)
        if len(per) < 2:
            return {}
        out: dict[str, dict[str, tuple[float, float]]] = {}
        for m in self.modes:
            rows = [p[m] for p in per if m in p]
            metrics = {}
            for key in SPREAD_METRICS:
                vals = [getattr(a, key) for a in rows if getattr(a, key) is not None]
                if vals:
                    metrics[key] = (min(vals), max(vals))
            out[m] = metrics
        return out

    @property
    def profile_stale(self) -> bool:
        return any(r.profile_stale for r in self.runs)

    def failing_differences(self) -> list[Difference]:
        """Divergences verification does not accept: all of them under exact kernels, else those
        that are not near-ties."""
        if self.exact:
            return list(self.differences)
        return [d for d in self.differences if not d.near_tie(self.near_tie_logit)]

    @property
    def verify_ok(self) -> bool:
        return not self.failing_differences()

    def to_json(self) -> dict:
        per_prompt = []
        for p in self.prompts:
            base = self.cell(p.id, Mode.OFF)
            runs = {}
            for m in self.modes:
                c = self.cell(p.id, m)
                if c is None:
                    continue
                d = {k: rounded(v) for k, v in c.__dict__.items()}
                d["runs"] = [self._run_json(r) for r in self.runs if r.prompt_id == p.id and r.mode == m]
                # as for groups, a speedup is taken within one repeat: over repeats minutes apart the
                # machine's speed moves under both modes alike, and a ratio of the two medians (runs of
                # different repeats) carries that drift
                paired = [r["speedup"] for r in d["runs"] if r["speedup"] is not None]
                d["speedup"] = rounded(median(paired) if paired else
                                       speedup(c.tokens_per_s, base.tokens_per_s if base else None))
                runs[m] = d
            prompt_tokens = next((r.stats.prompt_tokens for r in self.runs if r.prompt_id == p.id), None)
            per_prompt.append({"id": p.id, "category": p.category, "prompt_tokens": prompt_tokens, "modes": runs})
        return {
            "config": self.config,
            "modes": self.modes,
            "skipped": self.skipped,
            "notes": self.notes,
            "overall": self._group_json(None),
            "categories": {c: self._group_json(c) for c in self.categories()},
            "prompts": per_prompt,
            "profile_stale": self.profile_stale,
            "verify": {
                "checked": self.verified,
                "ok": self.verify_ok if self.verified else None,
                "exact": self.exact,
                "near_tie_logit": None if self.exact else self.near_tie_logit,
                "differences": [{**d.__dict__, "margin": rounded(d.margin),
                                 "near_tie": None if self.exact else d.near_tie(self.near_tie_logit)}
                                for d in self.differences],
            },
        }

    def _group_json(self, category: str | None) -> dict:
        """mode -> the group's figures (medians), their (min, max) over repeats, and each repeat's."""
        spread = self.spread(category)
        per = self.summary_by_repeat(category)
        out = {}
        for m, a in self.summary(category).items():
            d = a.to_json()
            d["spread"] = {k: [rounded(lo), rounded(hi)] for k, (lo, hi) in spread.get(m, {}).items()}
            d["speedup_overlaps_1"] = speedup_overlaps_one(spread.get(m, {}).get("speedup")) if m != Mode.OFF else None
            d["repeats"] = [p[m].to_json() for p in per if m in p]
            out[m] = d
        return out

    def _run_json(self, r: Run) -> dict:
        base = next((b for b in self.runs if b.prompt_id == r.prompt_id and b.mode == Mode.OFF and b.repeat == r.repeat), None)
        s = r.stats
        return {
            "repeat": r.repeat, "tokens": s.tokens, "tokens_per_s": rounded(s.tokens_per_s),
            # against plain decoding of the same prompt in the same repeat
            "speedup": rounded(speedup(s.tokens_per_s, base.stats.tokens_per_s if base else None)),
            "ttft_ms": rounded(r.ttft_ms), "latency_p50_ms": rounded(s.latency_p50_ms),
            "latency_p95_ms": rounded(s.latency_p95_ms), "drafted": s.drafted, "accepted": s.accepted,
            "rounds": s.rounds, "profile_stale": r.profile_stale,
            "loop_ms_per_token": rounded(s.loop_ms / s.tokens) if s.tokens else None,  # GenerationStats.loop_ms
        }


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first position where two token sequences differ (a length mismatch counts); None if equal."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return None if len(a) == len(b) else n


def compare_runs(plain: Sequence[int], other: Sequence[int]) -> tuple[int, int | None, int | None] | None:
    """(position, plain token, other token) at the first difference, or None."""
    pos = first_difference(plain, other)
    if pos is None:
        return None
    return pos, (plain[pos] if pos < len(plain) else None), (other[pos] if pos < len(other) else None)


def verify_runs(runs: Sequence[Run]) -> list[Difference]:
    """Every greedy run of a prompt must match that prompt's first plain run, token for token."""
    diffs = []
    by_prompt: dict[str, list[Run]] = {}
    for r in runs:
        by_prompt.setdefault(r.prompt_id, []).append(r)
    for pid, group in by_prompt.items():
        ref = next((r for r in group if r.mode == Mode.OFF), None)
        if ref is None:
            continue
        for r in group:
            if r is ref:
                continue
            hit = compare_runs(ref.tokens, r.tokens)
            if hit is not None:
                diffs.append(Difference(pid, r.mode, r.repeat, *hit))
    return diffs
