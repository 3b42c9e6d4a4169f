"""Running a bench: each generation from clean caches with a fresh controller, repeats with the
order of modes rotated, and the greedy verification runs."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable, Sequence, TypeVar

from ..config import Mode, require_at_least_one
from ..errors import InputError
from ..generate import Final
from ..sampling import SamplingConfig
from ..template import Message
from .prompts import BenchPrompt, runnable_modes
from .results import BenchResult, Difference, verify_runs
from .stats import Run

T = TypeVar("T")

DEFAULT_MAX_TOKENS = 128  # for a prompt without its own max_tokens
WARMUP_TOKENS = 8


@dataclass(frozen=True)
class BenchEvent:
    """A run about to start (run None) or finished, for the command's per-run lines."""

    index: int  # 1-based number of this run within its phase
    total: int
    run: Run | None  # None: the run is about to start
    prompt_id: str
    mode: str
    repeat: int
    phase: str = "timed"  # "warmup" | "timed" | "verify" | "margins"


Report = Callable[[BenchEvent], None]


class Runner:
    """Runs one generation on an Engine from clean caches with a fresh controller."""

    def __init__(self, engine):
        self.engine = engine
        self._tokens: dict[str, list[int]] = {}

    def tokens(self, p: BenchPrompt) -> list[int]:
        if p.id not in self._tokens:
            messages = ([Message("system", p.system)] if p.system else []) + [Message("user", p.prompt)]
            # the prefill goes on from the template's assistant header, read as text (never as control tokens)
            prefill = self.engine.target.tokenize(p.prefill, special=False) if p.prefill else []
            self._tokens[p.id] = self.engine.chat_tokens(messages) + prefill
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
        extra_ms = self._draft_prefill_ms(decoder, mode, tokens)
        final: Final | None = None
        for item in engine.stream(tokens, sampling, max_tokens=max_tokens, decoder=decoder):
            if isinstance(item, Final):
                final = item
        assert final is not None
        self.reset()
        stale = bool(getattr(decoder.controller, "profile_stale", False))
        margins = tuple(decoder.stats.margins) if record_margins else ()
        return Run(p.id, p.category, mode, repeat, final.stats, tuple(final.tokens), extra_ms, stale, margins)

    @staticmethod
    def _draft_prefill_ms(decoder, mode: str, tokens: list[int]) -> float:
        """The draft model's prompt processing, done up front so generation tok/s excludes it.
        Not in auto: there the draft model is read lazily, only if the controller uses it."""
        if decoder.drafter is None or Mode(mode).adaptive or len(tokens) <= 1:
            return 0.0
        t0 = time.perf_counter()
        decoder.drafter.model.decode(tokens[:-1])
        return (time.perf_counter() - t0) * 1000


def rotated(items: Sequence[T], repeat: int, prompt_index: int) -> list[T]:
    """The order of one prompt's runs in one repeat, rotated per repeat and per prompt: no mode
    always runs first or last, and each repeat's figures (of which the median is reported) mix
    the orders."""
    turn = (repeat + prompt_index) % len(items)
    return [*items[turn:], *items[:turn]]


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
    on_event: Report | None = None,
) -> BenchResult:
    require_at_least_one("--repeats", repeats)
    require_at_least_one("--max-tokens", max_tokens)
    if not prompts:
        raise InputError("no prompts to run")
    modes, skipped = runnable_modes(list(modes), engine.draft is not None)
    result = BenchResult(modes=list(modes), prompts=list(prompts), skipped=skipped, exact=exact)
    if Mode.AUTO in modes and engine.draft is None:
        result.notes.append("auto ran without a draft model (n-gram drafting only)")
    bench = _Bench(Runner(engine), list(prompts), modes, max_tokens, on_event or (lambda _e: None))
    if warmup:
        bench.warm_up(sampling)
    result.runs = bench.timed(sampling, repeats)
    if verify:
        result.verified = True
        checked = result.runs if sampling.greedy else bench.greedy_runs()  # timed runs sampled: greedy ones
        result.differences = verify_runs(checked)
        if result.differences and not exact:
            result.differences = bench.with_margins(result.differences, checked)
    return result


@dataclass
class _Bench:
    """The phases of one run_bench over the same runner, prompts, modes and token budget."""

    runner: Runner
    prompts: list[BenchPrompt]
    modes: list[Mode]
    max_tokens: int | None
    report: Report

    def warm_up(self, sampling: SamplingConfig) -> None:
        """The first decodes (graph allocation, page faults) are slower than the rest: untimed."""
        first = self.prompts[0]
        for i, m in enumerate(self.modes, 1):
            self.report(BenchEvent(i, len(self.modes), None, first.id, m, 0, "warmup"))
            self.runner.run(first, m, sampling, min(WARMUP_TOKENS, budget(first, self.max_tokens)))

    def timed(self, sampling: SamplingConfig, repeats: int) -> list[Run]:
        runs: list[Run] = []
        total = len(self.prompts) * repeats * len(self.modes)
        for rep in range(repeats):
            for i, p in enumerate(self.prompts):
                for m in rotated(self.modes, rep, i):
                    n = len(runs) + 1
                    self.report(BenchEvent(n, total, None, p.id, m, rep))
                    runs.append(self.runner.run(p, m, sampling, budget(p, self.max_tokens), rep))
                    self.report(BenchEvent(n, total, runs[-1], p.id, m, rep))
        return runs

    def greedy_runs(self) -> list[Run]:
        runs: list[Run] = []
        total = len(self.prompts) * len(self.modes)
        for p in self.prompts:
            for m in self.modes:
                self.report(BenchEvent(len(runs) + 1, total, None, p.id, m, 0, "verify"))
                runs.append(self.runner.run(p, m, SamplingConfig(), budget(p, self.max_tokens)))
        return runs

    def with_margins(self, diffs: Sequence[Difference], checked: Sequence[Run]) -> list[Difference]:
        def plain_with_margins(p: BenchPrompt) -> Run:
            return self.runner.run(p, Mode.OFF, SamplingConfig(), budget(p, self.max_tokens), record_margins=True)

        return attach_margins(diffs, plain_with_margins, {p.id: p for p in self.prompts}, checked, self.report)


def attach_margins(diffs: Sequence[Difference], plain_with_margins: Callable[[BenchPrompt], Run],
                   prompts: dict[str, BenchPrompt], checked: Sequence[Run], report: Report = lambda _e: None,
                   ) -> list[Difference]:
    """Each divergence with the plain run's top-2 logit margin at its position.

    Only prompts that diverged are decoded again (plain, untimed, recording margins), so timed
    runs never pay for the margins. Plain decoding is deterministic; should the re-run disagree
    with the run that was compared, its margin is not trusted (None, so the divergence fails)."""
    out = []
    ids = list(dict.fromkeys(d.prompt_id for d in diffs))
    margins: dict[str, tuple[float, ...] | None] = {}
    for i, pid in enumerate(ids, 1):
        report(BenchEvent(i, len(ids), None, pid, Mode.OFF, 0, "margins"))
        run = plain_with_margins(prompts[pid])
        ref = next(r for r in checked if r.prompt_id == pid and r.mode == Mode.OFF)
        margins[pid] = run.margins if run.tokens == ref.tokens else None
    for d in diffs:
        m = margins.get(d.prompt_id)
        margin = m[d.position] if m is not None and d.position < len(m) else None
        out.append(replace(d, margin=margin))
    return out
