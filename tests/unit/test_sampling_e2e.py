"""The whole decoder, sampling: what it emits is distributed as the *warped* target.

A fake target and a fake draft (different fixed tables, so drafts are often rejected) run through
SpeculativeDecoder under each warper combination. Both models' logits depend on the last two
tokens and the repeat penalty looks back 2 tokens, so the output is a Markov chain over
(previous, last) states whose transition rows are known exactly: warp(target logits, cfg,
history). Counted transitions must fit those rows (chi-square, 99.9% quantile, fixed seeds), must
never hit a token the warpers removed, and must *not* fit the draft's distribution or the
unwarped target by the same test (so the check has the power to fail).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import replace

import numpy as np
import pytest

from edgespec.controller import Controller
from edgespec.costs import CostModel
from edgespec.sampling import SamplingConfig, warp
from edgespec.drafters import ModelDrafter, NgramDrafter
from edgespec.speculative import SpecSettings, SpeculativeDecoder

from .fakes import FakeModel, table_lm

VOCAB = 6
TARGET = table_lm(11, vocab=VOCAB, sharp=1.5)
DRAFT = table_lm(12, vocab=VOCAB, sharp=1.5)
PROMPT = [1, 2, 3, 4, 5, 0]
RUNS, LENGTH = 60, 150  # 9k emitted tokens per combination
K = 3


def cfg(**kw) -> SamplingConfig:
    base = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0, repeat_last_n=2)
    base.update(kw)
    return SamplingConfig(**base)


COMBOS = {
    "temperature-0.7": ("draft", cfg(temperature=0.7)),
    "temperature-1.3-combined": ("combined", cfg(temperature=1.3)),
    "top-k-3": ("draft", cfg(top_k=3)),
    "top-p-0.7": ("draft", cfg(top_p=0.7)),
    "min-p-0.3": ("draft", cfg(min_p=0.3)),
    "repeat-penalty-1.8": ("draft", cfg(repeat_penalty=1.8)),
    "all-combined": ("combined", cfg(temperature=0.8, top_k=4, top_p=0.9, min_p=0.1, repeat_penalty=1.3)),
}


def chi2_quantile_999(df: int) -> float:
    """Wilson-Hilferty approximation of the chi-square 99.9% quantile (accurate to ~1% for df >= 3)."""
    z = 3.0902
    h = 2.0 / (9.0 * df)
    return df * (1.0 - h + z * math.sqrt(h)) ** 3


def generate(mode: str, sampling: SamplingConfig, seed: int) -> tuple[list[int], SpeculativeDecoder]:
    sampling = replace(sampling, seed=seed)
    target = FakeModel(TARGET, n_ctx=len(PROMPT) + LENGTH + 8, vocab=VOCAB, eos=-1)
    draft = FakeModel(DRAFT, n_ctx=len(PROMPT) + LENGTH + 8, vocab=VOCAB, eos=-1)
    ctl = Controller(CostModel(draft_cost=0.1), k_min=K, k_max=K, allow_off=False, learn_timing=False)
    dec = SpeculativeDecoder(
        target, sampling, ctl, SpecSettings(mode=mode, draft_max=K),
        ngram=NgramDrafter() if mode == "combined" else None,
        drafter=ModelDrafter(draft, sampling),
    )
    return [e.token for e in dec.generate(PROMPT, LENGTH)], dec


def transitions(mode: str, sampling: SamplingConfig):
    """Counts of next token per (previous, last) state over all runs, and the decoders' round logs."""
    counts: dict[tuple[int, int], np.ndarray] = defaultdict(lambda: np.zeros(VOCAB))
    rounds = []
    for seed in range(RUNS):
        out, dec = generate(mode, sampling, seed)
        assert len(out) == LENGTH
        ctx = list(PROMPT)
        for tok in out:
            counts[(ctx[-2], ctx[-1])][tok] += 1
            ctx.append(tok)
        rounds += dec.stats.rounds
    return counts, rounds


def expected_row(lm, sampling: SamplingConfig, state: tuple[int, int]) -> np.ndarray:
    history = list(PROMPT[:-2]) + list(state)  # only the last repeat_last_n (= 2) tokens matter
    return warp(lm(history), sampling, history)


def chi_square(counts: dict, rows: dict) -> tuple[float, int]:
    """Sum over states of Pearson's statistic; bins expected < 5 are pooled; inf on an impossible token."""
    stat, df = 0.0, 0
    for state, obs in counts.items():
        probs = rows[state]
        if obs[probs == 0].sum() > 0:
            return math.inf, 0
        n = obs.sum()
        order = np.argsort(probs)
        bins_o, bins_e, rest_o, rest_e = [], [], 0.0, 0.0
        for i in order:
            if probs[i] == 0:
                continue
            e = probs[i] * n
            if e < 5 or rest_e and rest_e < 5:
                rest_o, rest_e = rest_o + obs[i], rest_e + e
            else:
                bins_o.append(obs[i])
                bins_e.append(e)
        if rest_e:
            bins_o.append(rest_o)
            bins_e.append(rest_e)
        if len(bins_e) < 2:
            continue
        o, e = np.array(bins_o), np.array(bins_e)
        stat += float(((o - e) ** 2 / e).sum())
        df += len(e) - 1
    return stat, df


@pytest.mark.parametrize("name", list(COMBOS))
def test_emitted_tokens_follow_the_warped_target(name):
    mode, sampling = COMBOS[name]
    counts, rounds = transitions(mode, sampling)

    # Speculation really happened, with both accepted and rejected drafts.
    drafted = sum(r.drafted for r in rounds)
    accepted = sum(r.accepted for r in rounds)
    assert drafted > 1000 and 0.05 * drafted < accepted < 0.95 * drafted, (drafted, accepted)
    if mode == "combined":
        assert any(r.source == "ngram" for r in rounds) and any(r.source == "draft" for r in rounds)

    target_rows = {s: expected_row(TARGET, sampling, s) for s in counts}
    for state, obs in counts.items():
        removed = target_rows[state] == 0
        assert obs[removed].sum() == 0, f"{name}: state {state} emitted a token the warpers removed"

    stat, df = chi_square(counts, target_rows)
    assert df >= 20, df
    assert stat < chi2_quantile_999(df), (name, stat, df)

    # The same statistic rejects the draft's own distribution and the unwarped target softmax.
    draft_rows = {s: expected_row(DRAFT, sampling, s) for s in counts}
    plain = SamplingConfig(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    unwarped = {s: expected_row(TARGET, plain, s) for s in counts}
    for label, rows in (("draft", draft_rows), ("unwarped target", unwarped)):
        alt, alt_df = chi_square(counts, rows)
        assert alt > chi2_quantile_999(max(alt_df, 1)), (name, label, alt, alt_df)


def test_wilson_hilferty_matches_known_quantiles():
    for df, q in ((3, 16.27), (5, 20.52), (20, 45.31), (100, 149.45)):
        assert chi2_quantile_999(df) == pytest.approx(q, rel=0.02)


def test_same_seed_same_output_different_seed_different_output():
    mode, sampling = COMBOS["all-combined"]
    a, _ = generate(mode, sampling, 5)
    b, _ = generate(mode, sampling, 5)
    c, _ = generate(mode, sampling, 6)
    assert a == b and a != c
