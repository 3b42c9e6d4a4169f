"""Benchmark logic: prompt sets, timed baseline-vs-speculative runs, statistics, greedy verification.

No Rich, no click: the command lives in bench_cmd.py, the tables in render/bench.py.

Fairness rules for the timings:
- every run starts from empty KV caches (target and draft), so no mode reuses another's prompt;
- generation tok/s excludes prompt processing: the target's prefill is outside `gen_s` already,
  and the draft model's prefill is done before the timed stream (it is added to TTFT instead);
- each run gets a fresh controller (no learning carried over between prompts or modes);
- repeats are the outer loop and the order of modes rotates per repeat, so a noisy minute hits one
  repeat of several cells (which the median drops) rather than every repeat of one mode;
- every figure comes with its spread over the repeats, and a speedup whose range includes 1.0x is
  flagged: that difference is not measurable on this machine at this noise.

Verification (`--verify`) compares every greedy run with plain decoding. With exact kernels any
divergence fails. With fast kernels a batched row's logits may differ from a single row's by a
little, which flips a greedy choice only where the plain run's top two logits were nearly tied: a
divergence passes when the plain run's top-2 margin at that position is below NEAR_TIE_LOGIT.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Callable, Iterable, Sequence

from .config import SPEC_MODES, Mode
from .errors import InputError
from .generate import Final, GenerationStats
from .sampling import SamplingConfig

DEFAULT_MODES = (Mode.OFF, Mode.DRAFT, Mode.NGRAM, Mode.COMBINED, Mode.AUTO)  # the baseline first
DEFAULT_MAX_TOKENS = 128  # for a prompt without its own max_tokens
WARMUP_TOKENS = 8
# The largest top-1 minus top-2 logit gap at which a divergence from plain decoding counts as a
# near-tie under fast kernels. A greedy flip needs the gap between plain's choice and another token
# to move by more than it was; measured (tests/real/test_logits_real.py, 1.5B target, batches of
# 2..64 rows, 3 prompts) that gap moved by at most 0.66 (single logits by up to 0.77). 1.0 is above
# every measured drift with room for other CPUs' kernels, and far below a real disagreement.
NEAR_TIE_LOGIT = 1.0
PROMPT_FIELDS = {"id": str, "category": str, "prompt": str, "system": str, "max_tokens": int}
REQUIRED_FIELDS = ("id", "category", "prompt")


# ---- prompt sets ------------------------------------------------------------------------------
@dataclass(frozen=True)
class BenchPrompt:
    id: str
    category: str
    prompt: str
    system: str | None = None
    max_tokens: int | None = None


def parse_prompts(text: str, source: str = "<prompts>") -> list[BenchPrompt]:
    """One JSON object per line; blank lines and lines starting with # are skipped.

    Errors are one line naming the file and line number.
    """
    prompts: list[BenchPrompt] = []
    seen: dict[str, int] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        where = f"{source}:{lineno}"
        try:
            obj = json.loads(stripped)
        except json.JSONDecodeError as err:
            raise InputError(f"{where}: not valid JSON ({err.msg} at column {err.colno})") from None
        if not isinstance(obj, dict):
            raise InputError(f"{where}: expected a JSON object, got {type(obj).__name__}")
        missing = [k for k in REQUIRED_FIELDS if k not in obj]
        if missing:
            raise InputError(f"{where}: missing field{'s' if len(missing) > 1 else ''} {', '.join(repr(k) for k in missing)}")
        for key, kind in PROMPT_FIELDS.items():
            value = obj.get(key)
            if value is None and key not in REQUIRED_FIELDS:
                continue
            if kind is int:
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise InputError(f"{where}: {key!r} must be a positive integer (got {value!r})")
            elif not isinstance(value, str) or (key in REQUIRED_FIELDS and not value.strip()):
                raise InputError(f"{where}: {key!r} must be a non-empty string (got {value!r})")
        if obj["id"] in seen:
            raise InputError(f"{where}: duplicate id {obj['id']!r} (first on line {seen[obj['id']]})")
        seen[obj["id"]] = lineno
        prompts.append(BenchPrompt(obj["id"], obj["category"], obj["prompt"], obj.get("system"), obj.get("max_tokens")))
    if not prompts:
        raise InputError(f"{source}: no prompts (expected one JSON object per line)")
    return prompts


BUILTIN = "built-in"


def load_prompts(path: str | Path | None = None) -> list[BenchPrompt]:
    """The built-in set (path None) or a JSONL file."""
    if path is None:
        text = resources.files("edgespec").joinpath("prompts/bench.jsonl").read_text(encoding="utf-8")
        return parse_prompts(text, BUILTIN)
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as err:
        raise InputError(f"cannot read {p}: {err.strerror or err}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise InputError(f"{p}:{line}: not valid UTF-8") from None
    return parse_prompts(text, str(p))


def split_list(values: Iterable[str]) -> list[str]:
    """`--x a,b --x c` -> [a, b, c]."""
    out: list[str] = []
    for v in values:
        out += [s.strip() for s in v.split(",") if s.strip()]
    return out


def filter_categories(prompts: Sequence[BenchPrompt], categories: Sequence[str]) -> list[BenchPrompt]:
    if not categories:
        return list(prompts)
    known = sorted({p.category for p in prompts})
    unknown = [c for c in categories if c not in known]
    if unknown:
        raise InputError(f"--category: unknown {', '.join(unknown)} (this set has: {', '.join(known)})")
    return [p for p in prompts if p.category in categories]


def parse_modes(text: str) -> list[Mode]:
    modes = split_list([text])
    bad = [m for m in modes if m not in SPEC_MODES]
    if bad:
        raise InputError(f"--modes: unknown mode {', '.join(map(repr, bad))} (choose from {', '.join(DEFAULT_MODES)})")
    if not modes:
        raise InputError("--modes: no modes given")
    ordered = [Mode(m) for m in dict.fromkeys(modes) if m != Mode.OFF]
    return [Mode.OFF, *ordered]  # the baseline every speedup is measured against, first


def runnable_modes(modes: Sequence[str], has_draft: bool) -> tuple[list[Mode], list[dict]]:
    """Drop modes that need a draft model when none is loaded; return (modes, skipped notes)."""
    keep, skipped = [], []
    for m in map(Mode, modes):
        if m.needs_draft_model and not has_draft:
            skipped.append({"mode": m, "reason": "no draft model loaded (pass -md/--model-draft or --pair)"})
        else:
            keep.append(m)
    return keep, skipped


# ---- statistics -------------------------------------------------------------------------------
def median(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("median of nothing")
    return float(statistics.median(values))


def speedup(tps: float | None, base_tps: float | None) -> float | None:
    if not tps or not base_tps:
        return None
    return tps / base_tps


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first position where two token sequences differ (a length mismatch counts); None if equal."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return None if len(a) == len(b) else n


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
        return {k: _round(v) for k, v in self.__dict__.items()}


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


def _round(v):
    return round(v, 4) if isinstance(v, float) else v


# ---- results ----------------------------------------------------------------------------------
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
        base = [cells["off"][i] for i in complete] if "off" in self.modes else None
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
            base = self.cell(p.id, "off")
            runs = {}
            for m in self.modes:
                c = self.cell(p.id, m)
                if c is None:
                    continue
                d = {k: _round(v) for k, v in c.__dict__.items()}
                d["speedup"] = _round(speedup(c.tokens_per_s, base.tokens_per_s if base else None))
                d["runs"] = [self._run_json(r) for r in self.runs if r.prompt_id == p.id and r.mode == m]
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
                "differences": [{**d.__dict__, "margin": _round(d.margin),
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
            d["spread"] = {k: [_round(lo), _round(hi)] for k, (lo, hi) in spread.get(m, {}).items()}
            d["speedup_overlaps_1"] = speedup_overlaps_one(spread.get(m, {}).get("speedup")) if m != "off" else None
            d["repeats"] = [p[m].to_json() for p in per if m in p]
            out[m] = d
        return out

    def _run_json(self, r: Run) -> dict:
        base = next((b for b in self.runs if b.prompt_id == r.prompt_id and b.mode == "off" and b.repeat == r.repeat), None)
        s = r.stats
        return {
            "repeat": r.repeat, "tokens": s.tokens, "tokens_per_s": _round(s.tokens_per_s),
            "speedup": _round(speedup(s.tokens_per_s, base.stats.tokens_per_s if base else None)),
            "ttft_ms": _round(r.ttft_ms), "latency_p50_ms": _round(s.latency_p50_ms),
            "latency_p95_ms": _round(s.latency_p95_ms), "drafted": s.drafted, "accepted": s.accepted,
            "rounds": s.rounds, "profile_stale": r.profile_stale,
        }


SPREAD_METRICS = ("tokens_per_s", "speedup", "acceptance_rate", "mean_accepted_per_pass", "ttft_ms",
                  "latency_p50_ms", "latency_p95_ms")


def speedup_overlaps_one(bounds: tuple[float, float] | None) -> bool | None:
    """Whether a speedup's range over the repeats includes 1.0x (None: a single repeat, no range)."""
    if bounds is None:
        return None
    lo, hi = bounds
    return lo <= 1.0 <= hi


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
        ref = next((r for r in group if r.mode == "off"), None)
        if ref is None:
            continue
        for r in group:
            if r is ref:
                continue
            hit = compare_runs(ref.tokens, r.tokens)
            if hit is not None:
                diffs.append(Difference(pid, r.mode, r.repeat, *hit))
    return diffs


# ---- running ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Progress:
    index: int  # 1-based number of this run
    total: int
    run: Run | None  # None: the run is about to start
    prompt_id: str
    mode: str
    repeat: int
    phase: str = "timed"  # "warmup" | "timed" | "verify" | "margins"


class Runner:
    """Runs one generation on an Engine from clean caches with a fresh controller."""

    def __init__(self, engine):
        self.engine = engine
        self._tokens: dict[str, list[int]] = {}

    def tokens(self, p: BenchPrompt) -> list[int]:
        if p.id not in self._tokens:
            from .template import Message

            messages = ([Message("system", p.system)] if p.system else []) + [Message("user", p.prompt)]
            self._tokens[p.id] = self.engine.chat_tokens(messages)
        return self._tokens[p.id]

    def reset(self) -> None:
        self.engine.reset()

    def run(self, p: BenchPrompt, mode: str, sampling: SamplingConfig, max_tokens: int, repeat: int = 0,
            *, record_margins: bool = False) -> Run:
        engine = self.engine
        tokens = self.tokens(p)
        # Empty caches and a fresh controller per run: nothing carries into the next prompt or mode.
        engine.reset(forget_learning=True)
        decoder = engine.decoder(sampling, mode, record_margins=True) if record_margins else engine.decoder(sampling, mode)
        extra_ms = 0.0
        if decoder.drafter is not None and not Mode(mode).adaptive and len(tokens) > 1:
            # The draft model's prompt processing, done up front so generation tok/s excludes it.
            # Not in auto: there the draft model is read lazily, only if the controller uses it.
            t0 = time.perf_counter()
            decoder.drafter.model.decode(tokens[:-1])
            extra_ms = (time.perf_counter() - t0) * 1000
        final: Final | None = None
        for item in engine.stream(tokens, sampling, max_tokens=max_tokens, decoder=decoder):
            if isinstance(item, Final):
                final = item
        assert final is not None
        self.reset()
        stale = bool(getattr(decoder.controller, "profile_stale", False))
        margins = tuple(decoder.stats.margins) if record_margins else ()
        return Run(p.id, p.category, mode, repeat, final.stats, tuple(final.tokens), extra_ms, stale, margins)


def budget(p: BenchPrompt, cap: int | None) -> int:
    own = p.max_tokens or DEFAULT_MAX_TOKENS
    return min(own, cap) if cap else own


def run_bench(
    engine,
    prompts: Sequence[BenchPrompt],
    modes: Sequence[str],
    sampling: SamplingConfig,
    *,
    repeats: int = 1,
    max_tokens: int | None = None,
    verify: bool = False,
    exact: bool = False,
    warmup: bool = True,
    on_progress: Callable[[Progress], None] | None = None,
) -> BenchResult:
    if repeats < 1:
        raise InputError(f"--repeats must be >= 1 (got {repeats})")
    if max_tokens is not None and max_tokens < 1:
        raise InputError(f"--max-tokens must be >= 1 (got {max_tokens})")
    if not prompts:
        raise InputError("no prompts to run")
    modes, skipped = runnable_modes(list(modes), engine.draft is not None)
    result = BenchResult(modes=list(modes), prompts=list(prompts), skipped=skipped, exact=exact)
    if Mode.AUTO in modes and engine.draft is None:
        result.notes.append("auto ran without a draft model (n-gram drafting only)")
    runner = Runner(engine)
    report = on_progress or (lambda _p: None)

    if warmup:  # the first decodes (graph allocation, page faults) are slower than the rest
        for i, m in enumerate(modes, 1):
            report(Progress(i, len(modes), None, prompts[0].id, m, 0, "warmup"))
            runner.run(prompts[0], m, sampling, min(WARMUP_TOKENS, budget(prompts[0], max_tokens)))

    total = len(prompts) * repeats * len(modes)
    n = 0
    for rep in range(repeats):
        # Rotate the order of modes each repeat: none always runs first (coldest) or last.
        order = list(modes[rep % len(modes):]) + list(modes[: rep % len(modes)])
        for p in prompts:
            for m in order:
                n += 1
                report(Progress(n, total, None, p.id, m, rep))
                run = runner.run(p, m, sampling, budget(p, max_tokens), rep)
                result.runs.append(run)
                report(Progress(n, total, run, p.id, m, rep))

    if verify:
        result.verified = True
        if sampling.greedy:
            checked = result.runs
        else:  # timed runs sampled: verify on separate greedy runs
            greedy = SamplingConfig()
            checked = []
            total, n = len(prompts) * len(modes), 0
            for p in prompts:
                for m in modes:
                    n += 1
                    report(Progress(n, total, None, p.id, m, 0, "verify"))
                    checked.append(runner.run(p, m, greedy, budget(p, max_tokens)))
        result.differences = verify_runs(checked)
        if result.differences and not exact:
            greedy = SamplingConfig()
            result.differences = attach_margins(
                result.differences,
                lambda p: runner.run(p, "off", greedy, budget(p, max_tokens), record_margins=True),
                {p.id: p for p in prompts}, checked, report)
    return result


def attach_margins(diffs: Sequence[Difference], plain_with_margins: Callable[[BenchPrompt], Run],
                   prompts: dict[str, BenchPrompt], checked: Sequence[Run], report=lambda _p: None,
                   ) -> list[Difference]:
    """Each divergence with the plain run's top-2 logit margin at its position.

    Only prompts that diverged are decoded again (plain, untimed, recording margins), so timed
    runs never pay for the margins. Plain decoding is deterministic; should the re-run disagree
    with the run that was compared, its margin is not trusted (None, so the divergence fails)."""
    out = []
    ids = list(dict.fromkeys(d.prompt_id for d in diffs))
    margins: dict[str, list[float] | None] = {}
    for i, pid in enumerate(ids, 1):
        report(Progress(i, len(ids), None, pid, "off", 0, "margins"))
        run = plain_with_margins(prompts[pid])
        ref = next(r for r in checked if r.prompt_id == pid and r.mode == "off")
        margins[pid] = run.margins if run.tokens == ref.tokens else None
    for d in diffs:
        m = margins.get(d.prompt_id)
        margin = m[d.position] if m is not None and d.position < len(m) else None
        out.append(replace(d, margin=margin))
    return out
