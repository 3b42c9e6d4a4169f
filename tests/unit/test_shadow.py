"""The n-gram drafter's free "shadow" measurement while the controller has it off.

When the controller refuses an n-gram proposal (k = 0), the decoder keeps the proposal and, as
the target's own tokens arrive, checks how much of it they matched; the state it came from is
then judged on that, at no cost. A draft that is never sent cannot otherwise be measured, so a
state that is off would stay off whatever the text does.
"""

from __future__ import annotations

import numpy as np

from edgespec.controller import Controller
from edgespec.costs import CostModel
from edgespec.drafters import NgramDrafter, NgramState
from edgespec.sampling import SamplingConfig
from edgespec.speculative import SpecSettings, SpeculativeDecoder

from .fakes import FakeModel

CYCLE = 31
VOCAB = CYCLE + 1  # token 0 (EOS) is never chosen
# A cycle, then its start again: the n-gram drafter proposes 4 5 6 ... (28 tokens, then 1 2 3)
PROMPT = [*range(1, CYCLE + 1), 1, 2, 3]
# Verifying a batch costs 10 single passes per extra token: no draft length can pay, so the
# controller refuses every proposal, however good (at most (k + 1) tokens for 1 + 10 k passes).
NOTHING_PAYS = CostModel(verify={k: 1.0 + 10.0 * (k - 1) for k in range(2, 18)}, draft_cost=0.0)


def cycle_lm(step: int):
    """The target continues `last + step` around 1..CYCLE (step 1 copies the prompt's cycle)."""

    def lm(ctx):
        out = np.full(VOCAB, -10.0, dtype=np.float32)
        out[(ctx[-1] - 1 + step) % CYCLE + 1] = 10.0
        return out

    return lm


class Recording(Controller):
    """A controller that notes each acceptance observation with how many tokens had been emitted."""

    def __init__(self, emitted: list[int]):
        super().__init__(NOTHING_PAYS, k_min=1, k_max=16, allow_off=True, learn_timing=False)
        self.emitted = emitted
        self.observed: list[tuple[str, int, int, int]] = []  # (key, drafted, accepted, emitted so far)

    def observe_path(self, segments, accepted):
        # a round: the state it was proposed in, the tokens it would have drafted, those that matched
        self.observed.append((segments[0][0], sum(n for _, n in segments), accepted, len(self.emitted)))
        super().observe_path(segments, accepted)


def decoder(step: int, emitted: list[int]) -> SpeculativeDecoder:
    ctl = Recording(emitted)
    target = FakeModel(cycle_lm(step), n_ctx=256, vocab=VOCAB)
    return SpeculativeDecoder(target, SamplingConfig(), ctl, SpecSettings(mode="auto"), ngram=NgramDrafter())


def test_a_refused_copy_is_measured_when_its_shadow_resolves_and_the_state_gains():
    emitted: list[int] = []
    dec = decoder(1, emitted)
    ctl = dec.controller
    estimates = []  # the first shadow's state's estimate after each token
    for event in dec.generate(PROMPT, 30):
        emitted.append(event.token)
        key = ctl.observed[0][0] if ctl.observed else None
        estimates.append(ctl.acceptance[key].alpha if key else None)
    # nothing was drafted: every round verified the target's own token alone
    assert all(r.k == 0 for r in dec.stats.rounds) and set(dec.stats.sources) == {"target"}
    assert emitted == [(3 + i) % CYCLE + 1 for i in range(30)]  # the copy
    # the first shadow (12 tokens, the longest kept) resolved once its 12th token had been emitted,
    # all of it matched, and the state's estimate rose from its prior then, not before
    key, drafted, accepted, at = ctl.observed[0]
    assert isinstance(key, NgramState) and (drafted, accepted, at) == (12, 12, 12)
    prior = ctl.estimate(key).prior
    assert estimates[:12] == [None] * 12
    assert estimates[12] > prior
    # later shadows keep measuring while it stays off
    assert len(ctl.observed) >= 2 and all(a == d for _, d, a, _ in ctl.observed)


def test_a_refused_copy_the_target_does_not_follow_lowers_the_state():
    emitted: list[int] = []
    dec = decoder(2, emitted)  # the target steps by 2: a proposed copy of the cycle is wrong at once
    ctl = dec.controller
    for event in dec.generate(PROMPT, 20):
        emitted.append(event.token)
    assert all(r.k == 0 for r in dec.stats.rounds)
    key, drafted, accepted, at = ctl.observed[0]
    # resolved at the first token, none of it accepted; the state now expects less than its prior
    assert drafted > 1 and accepted == 0 and at == 1
    assert ctl.acceptance[key].alpha < ctl.acceptance[key].prior


def test_the_shadow_is_dropped_when_the_generation_settles():
    emitted: list[int] = []
    dec = decoder(1, emitted)
    ctl = dec.controller
    gen = dec.generate(PROMPT, 30)
    for event in gen:
        emitted.append(event.token)
        if len(emitted) == 5:
            break
    gen.close()  # the consumer stopped (a stop string, a client gone): the shadow was 5 of 12 in
    assert ctl.observed == []
    # A next generation over another context must not judge the old proposal against it. One token
    # only: it drafts nothing (no new shadow), so any observation would be the stale shadow's.
    other = [*range(CYCLE, 0, -1), 5, 5, 5, 5, 5]  # longer than the first context, unlike it from there
    assert len(list(dec.generate(other, 1))) == 1
    assert ctl.observed == []
