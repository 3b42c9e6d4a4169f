"""`edgespec profile --measure`: time the target's verify batches, the draft, the n-gram lookup,
and the draft's acceptance on a short sample; derive the cost model and a starting verdict."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, replace
from pathlib import Path

from .backend.model import LlamaModel
from .controller import Acceptance, CostModel, speedup
from .engine import Engine, EngineConfig
from .generate import complete
from .models import NullProgress
from .plan import Plan
from .session import load_params
from .speculative import NgramDrafter

# Enough context that timings reflect real attention cost, small enough to be quick.
_CONTEXT_TEXT = (
    "def merge_sort(items):\n    if len(items) <= 1:\n        return items\n"
    "    middle = len(items) // 2\n    left = merge_sort(items[:middle])\n"
    "    right = merge_sort(items[middle:])\n    return merge(left, right)\n\n"
) * 6
_SAMPLE_PROMPT = "Write a Python function that checks whether a string is a palindrome, with a docstring."
ALPHAS = (0.5, 0.7, 0.8, 0.9, 0.95)


@dataclass(frozen=True)
class Measurement:
    target_ms: dict[int, float]  # k -> median ms of a k-token batch
    draft_ms: float | None
    ngram_us: float
    draft_alpha: float | None
    cost: CostModel
    k_limit: int = 16  # the longest draft the engine will verify (exact CPU kernels cap it)

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
            "target_ms": {str(k): round(v, 3) for k, v in self.target_ms.items()},
            "draft_ms": None if self.draft_ms is None else round(self.draft_ms, 3),
            "ngram_us": round(self.ngram_us, 2),
            "draft_alpha": self.draft_alpha,
            "cost": self.cost.to_json(),
            "k_limit": self.k_limit,
            "verdicts": self.verdicts(),
        }


def best_k(alpha: float, c: float, cost: CostModel, k_max: int) -> tuple[int, float]:
    best = (0, 1.0)
    for k in range(1, k_max + 1):
        s = speedup(alpha, k, c, cost)
        if s > best[1]:
            best = (k, s)
    return best


def _median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return statistics.median(times)


def time_batches(model: LlamaModel, ks, repeats: int, progress) -> dict[int, float]:
    context = model.tokenize(_CONTEXT_TEXT)
    model.reset()
    model.decode(context)
    base = len(model.tokens)
    filler = context[:64]
    out = {}

    def run(k):
        model.trim(base)
        model.decode(filler[:k], range(k))

    run(1)  # warm-up: first graph build and weight repacking are not steady-state costs
    for k in ks:
        out[k] = _median_ms(lambda: run(k), repeats)
        progress.advance(1)
    model.trim(0)
    return out


def time_ngram(n_tokens: int = 2048, calls: int = 200) -> float:
    """Microseconds per n-gram proposal on a context of n_tokens (incremental, as in generation)."""
    import random

    rng = random.Random(0)
    ctx = [rng.randrange(1000) for _ in range(n_tokens)]
    drafter = NgramDrafter()
    drafter.propose(ctx, 8)
    t0 = time.perf_counter()
    for i in range(calls):
        ctx.append(rng.randrange(1000))
        drafter.propose(ctx, 8)
    return (time.perf_counter() - t0) / calls * 1e6


def draft_acceptance(target_path: Path, draft_path: Path, plan: Plan, max_tokens: int = 48) -> float:
    """Per-token acceptance of the draft on a short greedy sample (draft mode, fixed K)."""
    from .config import SpecConfig
    from .sampling import SamplingConfig
    from .template import Message

    cfg = EngineConfig(
        target_path,
        load_params(plan.target, plan),
        draft_path,
        load_params(plan.draft, plan) if plan.draft else load_params(plan.target, plan),
        spec=SpecConfig(mode="draft", draft_min=4, draft_max=4, draft_p_min=0.0),
    )
    with Engine(cfg) as engine:
        prompt = engine.chat_tokens([Message("user", _SAMPLE_PROMPT)])
        dec = engine.decoder(SamplingConfig())
        complete(engine.stream(prompt, max_tokens=max_tokens, decoder=dec))
        est = Acceptance(prior=0.5, weight=0.0, decay=1.0)
        for r in dec.stats.rounds:
            est.observe(r.drafted, r.accepted)
        return est.alpha if est.rounds else 0.0


def measure(target_path: Path, draft_path: Path | None, plan: Plan, *, k_max: int = 16, repeats: int = 5, progress=None, exact: bool = False) -> Measurement:
    progress = progress or NullProgress()
    ks = list(range(1, k_max + 1))
    progress.start("timing target batches", len(ks) + (3 if draft_path else 1))
    try:
        with LlamaModel(target_path, replace(load_params(plan.target, plan), exact=exact)) as target:
            target_ms = time_batches(target, ks, repeats, progress)
            limit = target.max_exact_batch
        draft_ms = alpha = None
        if draft_path is not None:
            with LlamaModel(draft_path, load_params(plan.draft or plan.target, plan)) as draft:
                draft_ms = time_batches(draft, [1], repeats, NullProgress())[1]
            progress.advance(1)
            alpha = draft_acceptance(target_path, draft_path, plan)
            progress.advance(1)
        ngram_us = time_ngram()
        progress.advance(1)
    finally:
        progress.done()
    t1 = target_ms[1]
    cost = CostModel(
        verify={k: max(1.0, v / t1) for k, v in target_ms.items() if k > 1},
        draft_cost=(draft_ms / t1) if draft_ms else 0.0,
    )
    k_limit = k_max if limit is None else min(k_max, limit - 1)
    return Measurement(target_ms, draft_ms, ngram_us, alpha, cost, k_limit)

