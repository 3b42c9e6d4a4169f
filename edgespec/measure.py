"""`edgespec profile --measure`: time the target's verify batches, the draft, the n-gram lookup,
and the draft's acceptance on a short sample; derive the cost model and a starting verdict.

The target's batches are timed at a few context depths (tokens already in the KV cache): costs
grow with the context, and single passes grow faster than batches (costs.py), so a table measured
at one depth misjudges drafts at another. The depths share one prefill: each deeper one extends
the filler context of the one before.

A profile measured on a busy machine lies, and every later decision is built on it. So each timing
is repeated, interleaved across batch sizes (a noisy second then hits one repeat of every size, not
every repeat of one size); the cost is the fastest repeat (noise on a CPU only ever adds time) and
the spread of the repeats is its uncertainty; the machine's load is checked before and during
(psutil: other processes' CPU, load average vs cores). `check_stability` turns all of that into a
verdict; it is pure, so scripted timings test it.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence

from .controller import Acceptance, speedup
from .costs import CostModel
from .drafters import common_prefix_len
from .progress import NullProgress
import random
from .drafters import NgramDrafter
from .config import SpecConfig
from .engine import Engine, EngineConfig
from .generate import complete
from .sampling import SamplingConfig
from .session import load_params
from .template import Message
from .backend.model import LlamaModel
import psutil

# Batch sizes timed. Fast kernels: small batches one by one (where v(k) bends), then the large
# batches long copy drafts need. Exact kernels verify at most 7 rows, so nothing above 8 is used.
KS_FAST = (1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32, 48, 64)
KS_EXACT = (1, 2, 3, 4, 5, 6, 7, 8)
REPEATS = 5
# Context depths the target's batches are timed at. The plan's context, when smaller than the
# deepest, gets its own deepest depth instead (the deepest context a full batch still fits on).
DEPTHS = (0, 512, 2048)
# Deeper depths: fewer repeats (a walk there is slower, and the cost model takes the tile shape
# of each depth's own table). What they add to a profile is bounded by DEPTH_BUDGET_S: a depth is
# skipped when the walks so far say it would not fit (see measure).
DEEP_REPEATS = 3
DEPTH_BUDGET_S = 120.0

# Stability rules (spread = median / fastest - 1 over the repeats of one timing).
MAX_T1_SPREAD = 0.10  # t(1) anchors every ratio: it must be tight
# The other sizes are judged together: 14 sizes on a shared vCPU each see a slow second now and
# then (six quiet profiles here: typical spreads 3-14%, the worst size 17-31%), and the largest of 14
# noisy figures says more about the number of sizes than about the machine. What makes a profile
# wrong is the typical size drifting (a busy machine: the load check sees it too) or one size far
# off (a collapse the monotonicity check also catches).
MAX_TYPICAL_SPREAD = 0.15  # the median spread over t(k), k > 1
MAX_SPREAD = 0.50  # any one t(k)
MAX_DRAFT_SPREAD = 0.25  # the draft's t(1) (its only figure)
# Within one walk over the batch sizes, a size is timed back to back for about this long and the
# fastest run is the walk's sample (at most WALK_MAX_RUNS runs): see time_batches.
WALK_MIN_MS = 250.0
WALK_MAX_RUNS = 8
MONOTONE_FLOOR = 0.5  # a larger batch may not cost less than half a smaller one
BUSY_CORE_FRACTION = 0.25  # other processes using more than this share of the cores ...
BUSY_MIN_CORES = 0.5  # ... and at least this many cores: the machine is busy
BUSY_LOAD_PER_CORE = 1.5  # 1-minute load average above this per logical core: oversubscribed

# Filler context for the depths (repeated to the deepest one), code like the copy prompts.
_CONTEXT_TEXT = (
    "def merge_sort(items):\n    if len(items) <= 1:\n        return items\n"
    "    middle = len(items) // 2\n    left = merge_sort(items[:middle])\n"
    "    right = merge_sort(items[middle:])\n    return merge(left, right)\n\n"
) * 6
_SAMPLE_PROMPT = "Write a Python function that checks whether a string is a palindrome, with a docstring."
ALPHAS = (0.5, 0.7, 0.8, 0.9, 0.95)


# ---- noise: pure --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Load:
    """The machine's load over one window: CPU used by other processes (in cores), load average."""

    other_cores: float
    load_avg: float | None
    cores: int
    when: str = "during"  # "before" | "during"

    def to_json(self) -> dict:
        return {"when": self.when, "other_cores": round(self.other_cores, 2),
                "load_avg": None if self.load_avg is None else round(self.load_avg, 2), "cores": self.cores}


def typical_factor(runs: dict[int, list[float]]) -> float:
    """How much slower a typical pass is than the fastest: over the batch sizes, the median of
    (median of every timed run / fastest run). The tables keep the fastest runs (their ratios are
    the shape); a live pass is one run like any other, so live timing checks it against the
    fastest times this much slower (CostModel.typical)."""
    factors = [statistics.median(xs) / min(xs) for xs in runs.values() if xs and min(xs) > 0]
    return max(1.0, statistics.median(factors)) if factors else 1.0


def summarize(samples: Sequence[float]) -> tuple[float, float]:
    """(cost, spread) of repeated timings: the fastest one, and median / fastest - 1."""
    if not samples:
        raise ValueError("no samples")
    low = min(samples)
    return low, (statistics.median(samples) / low - 1.0) if low > 0 else 0.0


def busy_reason(load: Load) -> str | None:
    limit = max(BUSY_MIN_CORES, BUSY_CORE_FRACTION * load.cores)
    if load.other_cores > limit:
        return f"other processes used {load.other_cores:.1f} of {load.cores} cores {load.when} measuring"
    if load.when == "before" and load.load_avg is not None and load.load_avg > BUSY_LOAD_PER_CORE * load.cores:
        return f"load average {load.load_avg:.1f} on {load.cores} cores before measuring"
    return None


def check_stability(cost_ms: dict[int, float], spread: dict[int, float], loads: Sequence[Load] = (),
                    draft_spread: float | None = None) -> list[str]:
    """Why these timings cannot be trusted (empty: they can)."""
    reasons = [r for r in (busy_reason(x) for x in loads) if r]
    if spread.get(1, 0.0) > MAX_T1_SPREAD:
        reasons.append(f"t(1) varied by {spread[1]:.0%} between repeats (limit {MAX_T1_SPREAD:.0%})")
    others = [s for k, s in spread.items() if k != 1]
    if others and statistics.median(others) > MAX_TYPICAL_SPREAD:
        reasons.append(f"t(k) varied by {statistics.median(others):.0%} between repeats for a typical k "
                       f"(limit {MAX_TYPICAL_SPREAD:.0%})")
    noisy = [k for k, s in sorted(spread.items()) if k != 1 and s > MAX_SPREAD]
    if noisy:
        worst = max(noisy, key=lambda k: spread[k])
        reasons.append(f"t(k) varied by up to {spread[worst]:.0%} between repeats (k = {worst}; limit {MAX_SPREAD:.0%})")
    if draft_spread is not None and draft_spread > MAX_DRAFT_SPREAD:
        reasons.append(f"the draft's t(1) varied by {draft_spread:.0%} between repeats (limit {MAX_DRAFT_SPREAD:.0%})")
    ks = sorted(cost_ms)
    for i, b in enumerate(ks[1:], 1):
        a = max(ks[:i], key=lambda k: cost_ms[k])  # the dearest smaller batch
        if cost_ms[b] < MONOTONE_FLOOR * cost_ms[a]:
            reasons.append(f"t({b}) = {cost_ms[b]:.1f} ms is less than half of t({a}) = {cost_ms[a]:.1f} ms")
            break
    return reasons


class MeasurementAborted(Exception):
    """The machine is too busy to measure (found before or early on, so no time is wasted)."""

    def __init__(self, reasons: Sequence[str], loads: Sequence[Load] = ()):
        super().__init__("; ".join(reasons))
        self.reasons = list(reasons)
        self.loads = list(loads)


# ---- the result --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Measurement:
    target_ms: dict[int, float]  # k -> fastest ms of a k-token batch over the repeats, at depth 0
    draft_ms: float | None
    ngram_us: float
    draft_alpha: float | None
    cost: CostModel
    k_limit: int = 64  # the longest draft the engine will verify (exact CPU kernels cap it)
    target_spread: dict[int, float] = field(default_factory=dict)  # k -> median / fastest - 1
    draft_spread: float | None = None
    kernels: str = "fast"
    repeats: int = REPEATS
    loads: tuple[Load, ...] = ()
    reasons: tuple[str, ...] = ()  # why it is unstable; empty when stable
    depth_ms: dict[int, dict[int, float]] = field(default_factory=dict)  # depth > 0 -> {k: ms} there
    depth_spread: dict[int, dict[int, float]] = field(default_factory=dict)

    @property
    def stable(self) -> bool:
        return not self.reasons

    def verdicts(self) -> dict:
        """Best K and expected speedup for each drafter at a few acceptance rates, and at the measured one."""
        k_max = self.k_limit
        out = {}
        drafters = {"ngram": 0.0}
        if self.draft_ms is not None:
            drafters["draft"] = self.cost.draft_cost
        for name, c in drafters.items():
            rows = {}
            alphas = list(ALPHAS)
            if name == "draft" and self.draft_alpha is not None:
                alphas.append(round(self.draft_alpha, 3))
            for alpha in alphas:
                k, s = best_k(alpha, c, self.cost, k_max)
                rows[str(alpha)] = {"k": k, "speedup": round(s, 3)}
            out[name] = rows
        if self.draft_ms is not None and self.draft_alpha is not None:
            k, s = best_k(self.draft_alpha, self.cost.draft_cost, self.cost, k_max)
            out["draft_model_pays"] = k > 0
            out["draft_model_expected_speedup"] = round(s, 3)
            out["draft_model_best_k"] = k
        return out

    def to_json(self) -> dict:
        return {
            "kernels": self.kernels,
            "target_ms": {str(k): round(v, 3) for k, v in self.target_ms.items()},
            "target_spread": {str(k): round(v, 4) for k, v in self.target_spread.items()},
            "draft_ms": None if self.draft_ms is None else round(self.draft_ms, 3),
            "draft_spread": None if self.draft_spread is None else round(self.draft_spread, 4),
            "ngram_us": round(self.ngram_us, 2),
            "draft_alpha": self.draft_alpha,
            # t1_ms: the absolute scale, so a run can tell when the machine no longer matches it.
            "cost": {**self.cost.to_json(), "t1_ms": round(self.target_ms[1], 3)},
            "k_limit": self.k_limit,
            "repeats": self.repeats,
            "stable": self.stable,
            "unstable_reasons": list(self.reasons),
            "load": [x.to_json() for x in self.loads],
            "verdicts": self.verdicts(),
            "depths": {str(d): {"target_ms": {str(k): round(v, 3) for k, v in ms.items()},
                                "target_spread": {str(k): round(v, 4) for k, v in self.depth_spread.get(d, {}).items()}}
                       for d, ms in sorted(self.depth_ms.items())},
        }


def best_k(alpha: float, c: float, cost: CostModel, k_max: int) -> tuple[int, float]:
    best = (0, 1.0)
    for k in range(1, k_max + 1):
        s = speedup(alpha, k, c, cost)
        if s > best[1]:
            best = (k, s)
    return best


def cost_model(target_ms: dict[int, float], draft_ms: float | None,
               depth_ms: dict[int, dict[int, float]] | None = None) -> CostModel:
    """v(k, depth) = t(k)/t(1) at every measured k and depth (the model interpolates between them);
    c = draft t(1) / t(1) at depth 0."""
    return CostModel.from_ms({0: target_ms, **(depth_ms or {})}, draft_ms)


def depths_for(n_ctx: int, k_max: int, depths: Sequence[int] = DEPTHS) -> list[int]:
    """The depths to time k_max-row batches at in an n_ctx context: DEPTHS that fit, and the
    deepest that fits when the context is smaller than the deepest of DEPTHS."""
    room = n_ctx - k_max - 1
    out = [d for d in depths if d <= room] or [0]
    if max(depths) > room > out[-1]:
        out.append(room)
    return out


def filler_tokens(model, n: int) -> list[int]:
    """n tokens of filler context (the same ones on every call: the depths share one prefill)."""
    unit = model.tokenize(_CONTEXT_TEXT) or [0]
    return (unit * (n // len(unit) + 1))[:n]


# ---- timing ------------------------------------------------------------------------------------
def time_batches(model, ks: Sequence[int], repeats: int, progress, clock: Callable[[], float] = time.perf_counter,
                 after_walk: Callable[[], None] | None = None, min_walk_ms: float = WALK_MIN_MS,
                 depth: int = 0, runs: dict[int, list[float]] | None = None) -> dict[int, list[float]]:
    """ms of a k-token batch with `depth` filler tokens in the KV cache, `repeats` samples per k,
    interleaved across k.

    Every repeat walks all sizes (alternating direction, so a drift in machine speed does not
    favour one end); one untimed walk first builds each size's graph. Within a walk a size is run
    back to back until about `min_walk_ms` has passed and its sample is the fastest of those runs:
    a single 70 ms decode catches a hypervisor hiccup as easily as a whole slow minute, and the
    spread between walks should show the second, not the first. `after_walk` runs after each
    walk (it may raise to stop early). `runs`, when given, gets every timed run of each size, not
    only each walk's fastest (typical_factor). The model is left holding the `depth` filler tokens:
    a deeper call decodes only what it adds."""
    filler = filler_tokens(model, depth + max(ks))
    kept = common_prefix_len(model.tokens, filler[:depth])  # what an earlier, shallower call left
    model.trim(kept)
    if kept < depth:
        model.decode(filler[kept:depth])
    batch = filler[depth:]
    out: dict[int, list[float]] = {k: [] for k in ks}

    def run(k) -> float:
        model.trim(depth)
        t0 = clock()
        model.decode(batch[:k], range(k))
        return (clock() - t0) * 1000

    n_runs = {}
    for k in ks:  # warm-up: first graph builds and weight repacking are not steady-state costs
        first = run(k)
        n_runs[k] = max(1, min(WALK_MAX_RUNS, round(min_walk_ms / first))) if first > 0 else 1
    for rep in range(repeats):
        for k in (ks if rep % 2 == 0 else list(reversed(ks))):
            times = [run(k) for _ in range(n_runs[k])]
            out[k].append(min(times))
            if runs is not None:
                runs.setdefault(k, []).extend(times)
            progress.advance(1)
        if after_walk is not None:
            after_walk()
    model.trim(depth)
    return out


def time_depths(model, ks: Sequence[int], depths: Sequence[int], repeats: int, progress,
                clock: Callable[[], float] = time.perf_counter, after_walk: Callable[[], None] | None = None,
                min_walk_ms: float = WALK_MIN_MS, budget_s: float = DEPTH_BUDGET_S,
                runs: dict[int, list[float]] | None = None) -> dict[int, dict[int, list[float]]]:
    """time_batches at each depth, shallowest first (one growing prefill): {depth: {k: samples}}.

    The first depth gets `repeats`, the deeper ones DEEP_REPEATS. The deeper ones together get
    `budget_s`: before each, the last depth's time per walk (a deeper walk is slower still)
    estimates what it would take, and it and every deeper one are skipped when that would pass
    the budget; the cost model then extrapolates from the depths measured. `runs` gets every timed
    run at the first depth (time_batches)."""
    out: dict[int, dict[int, list[float]]] = {}
    spent = walk_s = 0.0
    for i, d in enumerate(sorted(depths)):
        reps = repeats if i == 0 else DEEP_REPEATS
        if i and spent + walk_s * (reps + 1) > budget_s:
            break
        t0 = clock()
        out[d] = time_batches(model, ks, reps, progress, clock=clock, after_walk=after_walk,
                              min_walk_ms=min_walk_ms, depth=d, runs=runs if i == 0 else None)
        took = clock() - t0
        walk_s = took / (reps + 1)  # the warm-up walk included
        if i:
            spent += took
    return out


class LoadMeter:
    """CPU time used by other processes between start() and stop(), in cores (psutil)."""

    def __init__(self):
        self._psutil = psutil
        self._me = psutil.Process()
        self.cores = psutil.cpu_count(logical=True) or os.cpu_count() or 1

    def start(self) -> None:
        self._t0 = time.monotonic()
        self._sys0 = self._psutil.cpu_times()
        self._own0 = self._me.cpu_times()

    def stop(self, when: str = "during") -> Load:
        wall = max(time.monotonic() - self._t0, 1e-6)
        sys1, own1 = self._psutil.cpu_times(), self._me.cpu_times()
        busy = _busy(sys1) - _busy(self._sys0)
        own = (own1.user + own1.system) - (self._own0.user + self._own0.system)
        try:
            load_avg = self._psutil.getloadavg()[0]
        except (AttributeError, OSError):
            load_avg = None
        return Load(max(0.0, (busy - own) / wall), load_avg, self.cores, when)

    def sample(self, seconds: float = 0.5) -> Load:
        """The load right now, over a short quiet window (before measuring)."""
        self.start()
        time.sleep(seconds)
        return self.stop("before")


def _busy(times) -> float:
    idle = times.idle + getattr(times, "iowait", 0.0)
    total = sum(times)
    # guest time is already counted in user on Linux
    total -= getattr(times, "guest", 0.0) + getattr(times, "guest_nice", 0.0)
    return total - idle


def time_ngram(n_tokens: int = 2048, calls: int = 200) -> float:
    """Microseconds per n-gram proposal on a context of n_tokens (incremental, as in generation)."""


    rng = random.Random(0)
    ctx = [rng.randrange(1000) for _ in range(n_tokens)]
    drafter = NgramDrafter()
    drafter.propose(ctx, 8)
    t0 = time.perf_counter()
    for i in range(calls):
        ctx.append(rng.randrange(1000))
        drafter.propose(ctx, 8)
    return (time.perf_counter() - t0) / calls * 1e6


def draft_acceptance(target_path: Path, draft_path: Path, plan, max_tokens: int = 48, exact: bool = False) -> float:
    """Per-token acceptance of the draft on a short greedy sample (draft mode, fixed K)."""

    cfg = EngineConfig(
        target_path,
        load_params(plan.target, plan),
        draft_path,
        load_params(plan.draft, plan) if plan.draft else load_params(plan.target, plan),
        spec=SpecConfig(mode="draft", draft_min=4, draft_max=4, draft_p_min=0.0),
        exact=exact,
    )
    with Engine(cfg) as engine:
        prompt = engine.chat_tokens([Message("user", _SAMPLE_PROMPT)])
        dec = engine.decoder(SamplingConfig())
        complete(engine.stream(prompt, max_tokens=max_tokens, decoder=dec))
        est = Acceptance(prior=0.5, weight=0.0, decay=1.0)
        for r in dec.stats.rounds:
            est.observe(r.drafted, r.accepted)
        return est.alpha if est.rounds else 0.0


def measure(target_path: Path, draft_path: Path | None, plan, *, ks: Sequence[int] | None = None,
            repeats: int = REPEATS, progress=None, exact: bool = False, load_meter: LoadMeter | None = None,
            stop_when_busy: bool = True, clock: Callable[[], float] = time.perf_counter) -> Measurement:
    """Time everything; with stop_when_busy, raise MeasurementAborted as soon as the machine is
    seen busy (before starting, or after any walk over the batch sizes): such a measurement
    would be rejected anyway, and on an oversubscribed CPU it can take many minutes. `clock`
    times the target's batches (tests script it)."""

    progress = progress or NullProgress()
    ks = list(ks or (KS_EXACT if exact else KS_FAST))
    meter = load_meter or LoadMeter()
    loads = [meter.sample()]
    if stop_when_busy and busy_reason(loads[0]):
        raise MeasurementAborted([busy_reason(loads[0])], loads)

    def check_load() -> None:
        now = meter.stop("during")
        if stop_when_busy and busy_reason(now):
            raise MeasurementAborted([f"{busy_reason(now)} (stopped early)"], [*loads, now])

    params = replace(load_params(plan.target, plan), exact=exact)
    depths = depths_for(params.n_ctx, max(ks))
    steps = len(ks) * (repeats + DEEP_REPEATS * (len(depths) - 1))
    progress.start("timing target batches", steps + (3 if draft_path else 1))
    runs: dict[int, list[float]] = {}  # every timed run at depth 0: typical_factor
    meter.start()
    try:
        with LlamaModel(target_path, params) as target:
            samples = time_depths(target, ks, depths, repeats, progress, clock=clock, after_walk=check_load, runs=runs)
            target.trim(0)
            limit = target.max_exact_batch
        draft_ms = draft_spread = alpha = None
        if draft_path is not None:
            with LlamaModel(draft_path, load_params(plan.draft or plan.target, plan)) as draft:
                draft_ms, draft_spread = summarize(time_batches(draft, [1], repeats, NullProgress())[1])
            progress.advance(1)
            alpha = draft_acceptance(target_path, draft_path, plan, exact=exact)
            progress.advance(1)
        ngram_us = time_ngram()
        progress.advance(1)
    finally:
        progress.done()
    loads.append(meter.stop("during"))
    tables = {d: _summarize_all(xs) for d, xs in samples.items()}
    target_ms, spread = tables.pop(0)
    depth_ms = {d: ms for d, (ms, _) in tables.items()}
    depth_spread = {d: sp for d, (_, sp) in tables.items()}
    k_limit = max(ks) if limit is None else min(max(ks), limit - 1)
    reasons = check_stability(target_ms, spread, loads, draft_spread)
    for d, (ms, sp) in tables.items():  # the same rules at every depth
        reasons += [f"at depth {d}: {r}" for r in check_stability(ms, sp)]
    cost = replace(cost_model(target_ms, draft_ms, depth_ms), typical=typical_factor(runs))
    return Measurement(target_ms, draft_ms, ngram_us, alpha, cost, k_limit,
                       spread, draft_spread, "exact" if exact else "fast", repeats, tuple(loads), tuple(reasons),
                       depth_ms, depth_spread)


def _summarize_all(samples: dict[int, list[float]]) -> tuple[dict[int, float], dict[int, float]]:
    ms, spread = {}, {}
    for k, xs in samples.items():
        ms[k], spread[k] = summarize(xs)
    return ms, spread
