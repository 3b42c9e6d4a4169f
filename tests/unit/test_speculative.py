import numpy as np
import pytest

from edgespec.controller import Controller
from edgespec.costs import CostModel
from edgespec.drafters import NgramState
from edgespec.errors import ContextError
from edgespec.sampling import SamplingConfig
from edgespec.speculative import (
    ModelDrafter,
    NgramDrafter,
    SpecSettings,
    SpeculativeDecoder,
    verify_greedy,
)

from .fakes import EOS, AdversarialLM, FakeModel, plain_greedy, table_lm

GREEDY = SamplingConfig(temperature=0.0)
LM = table_lm(7)
PROMPT = [3, 5, 2, 6]


def no_eos(lm):
    def wrapped(ctx):
        out = lm(ctx).copy()
        out[EOS] = -1e9
        return out

    return wrapped


def make(target_lm, draft_lm=None, mode="draft", k_min=1, k_max=4, n_ctx=256, sampling=GREEDY, allow_off=False):
    target = FakeModel(target_lm, n_ctx=n_ctx)
    drafter = ModelDrafter(FakeModel(draft_lm, n_ctx=n_ctx), sampling) if draft_lm else None
    ctl = Controller(CostModel(draft_cost=0.1), k_min=k_min, k_max=k_max, allow_off=allow_off, learn_timing=False)
    dec = SpeculativeDecoder(target, sampling, ctl, SpecSettings(mode=mode), ngram=NgramDrafter(), drafter=drafter)
    return dec, target, drafter


def run(dec, prompt, n):
    return [e.token for e in dec.generate(prompt, n)]


def test_identity_draft_accepts_everything_and_matches_plain():
    lm = no_eos(LM)
    dec, target, _ = make(lm, lm, k_max=4)
    out = run(dec, PROMPT, 40)
    assert out == plain_greedy(lm, PROMPT, 40)
    rounds = dec.stats.rounds
    assert all(r.accepted == r.drafted for r in rounds)
    assert sum(r.drafted for r in rounds) > 0
    # each round verified [pending + drafts] in one batch
    verify_batches = target.decode_calls[1:]
    assert verify_batches == [r.drafted + 1 for r in rounds]


def test_adversarial_draft_accepts_nothing_and_output_is_unchanged():
    lm = no_eos(LM)
    dec, _, _ = make(lm, AdversarialLM(lm), k_max=3)
    out = run(dec, PROMPT, 30)
    assert out == plain_greedy(lm, PROMPT, 30)
    assert all(r.accepted == 0 for r in dec.stats.rounds)
    assert all(e == "target" for e in dec.stats.sources)


def test_partial_agreement_matches_plain_for_many_drafts():
    target_lm = no_eos(table_lm(1, sharp=1.0))
    for seed in range(2, 8):
        draft_lm = table_lm(seed, sharp=1.0)
        dec, _, _ = make(target_lm, draft_lm, k_max=5)
        assert run(dec, PROMPT, 50) == plain_greedy(target_lm, PROMPT, 50)


def eos_at(position, base):
    """Target emits EOS once the context reaches a given length."""

    def lm(ctx):
        out = base(ctx).copy()
        out[EOS] = 1e9 if len(ctx) == position else -1e9
        return out

    return lm


def test_eos_inside_an_accepted_draft_ends_output_exactly_there():
    base = no_eos(LM)
    lm = eos_at(len(PROMPT) + 6, base)
    dec, target, drafter = make(lm, lm, k_max=8)  # identity: the draft model proposes EOS in the end
    out = run(dec, PROMPT, 50)
    assert out == plain_greedy(lm, PROMPT, 50)
    assert len(out) == 6
    assert dec.stats.finish_reason == "stop"
    # a proposal of EOS alone is no draft: the target's own row yields it
    assert dec.stats.rounds[-1].drafted == 0 and target.decode_calls[-1] == 1
    ctx = PROMPT + out
    for m in (target, drafter.model):
        assert m.tokens == ctx[: len(m.tokens)]


def test_max_tokens_mid_draft():
    lm = no_eos(LM)
    dec, target, drafter = make(lm, lm, k_min=4, k_max=8)
    out = run(dec, PROMPT, 7)
    assert out == plain_greedy(lm, PROMPT, 7)
    assert dec.stats.finish_reason == "length"
    ctx = PROMPT + out
    assert target.tokens == ctx[: len(target.tokens)]
    assert drafter.model.tokens == ctx[: len(drafter.model.tokens)]
    # never drafts beyond what max_tokens can use: a round that may still emit `left` tokens
    # drafts at most left - 1 (the target adds one), and the cap really binds here
    left, capped = 7, 0
    for r in dec.stats.rounds:
        assert r.drafted <= left - 1, (r, left)
        capped += r.drafted == left - 1
        left -= r.accepted + 1
    assert capped >= 1
    assert [b - 1 for b in target.decode_calls[1:]] == [r.drafted for r in dec.stats.rounds]


def test_context_end_mid_draft_finishes_with_length():
    lm = no_eos(LM)
    dec, target, _ = make(lm, lm, k_min=4, k_max=8, n_ctx=20)
    out = run(dec, PROMPT, 100)
    assert dec.stats.finish_reason == "length"
    assert out == plain_greedy(lm, PROMPT, len(out))
    assert len(PROMPT) + len(out) <= 21
    assert len(target.tokens) <= 20


def test_prompt_longer_than_context_is_refused():
    dec, _, _ = make(LM, LM, n_ctx=8)
    with pytest.raises(ContextError, match="context"):
        run(dec, list(range(1, 8)) * 2, 5)


def test_every_round_emits_at_least_one_token():
    lm = no_eos(LM)
    dec, _, _ = make(lm, AdversarialLM(lm))
    out = run(dec, PROMPT, 25)
    assert len(dec.stats.rounds) == len(out)


def test_ngram_mode_matches_plain_and_drafts_on_repetition():
    # a target that repeats a cycle: lookup should find it
    cycle = [4, 5, 6, 7, 3]

    def lm(ctx):
        out = np.full(8, -5.0, dtype=np.float32)
        out[cycle[(cycle.index(ctx[-1]) + 1) % len(cycle)] if ctx[-1] in cycle else 4] = 5.0
        return out

    dec, _, _ = make(lm, None, mode="ngram", k_max=6)
    out = run(dec, [1, 4], 40)
    assert out == plain_greedy(lm, [1, 4], 40)
    accepted = sum(r.accepted for r in dec.stats.rounds if r.source == "ngram")
    assert accepted > 20


def test_auto_mode_turns_ngram_on_for_copying_and_stays_exact():
    cycle = [4, 5, 6, 7, 3, 2]

    def lm(ctx):
        out = np.full(8, -5.0, dtype=np.float32)
        out[cycle[(cycle.index(ctx[-1]) + 1) % len(cycle)] if ctx[-1] in cycle else 4] = 5.0
        return out

    target = FakeModel(lm)
    ctl = Controller(CostModel(verify={2: 1.4, 3: 1.5, 4: 1.6, 5: 1.9, 8: 2.8}), k_max=8, learn_timing=False)
    dec = SpeculativeDecoder(target, GREEDY, ctl, SpecSettings(mode="auto"), ngram=NgramDrafter())
    out = run(dec, [1, 4], 80)
    assert out == plain_greedy(lm, [1, 4], 80)
    assert max(a.alpha for k, a in ctl.acceptance.items() if isinstance(k, NgramState)) > 0.9
    assert sum(r.accepted for r in dec.stats.rounds) > 50


def test_auto_mode_keeps_a_useless_draft_model_off():
    lm = no_eos(LM)
    target = FakeModel(lm)
    drafter = ModelDrafter(FakeModel(AdversarialLM(lm)), GREEDY)
    cost = CostModel(verify={2: 1.42, 4: 1.54, 5: 1.97, 8: 2.85}, draft_cost=0.6)
    ctl = Controller(cost, k_max=8, learn_timing=False, priors={"draft": 0.6})
    dec = SpeculativeDecoder(target, GREEDY, ctl, SpecSettings(mode="auto", probe_every=8), drafter=drafter)
    out = run(dec, PROMPT, 120)
    assert out == plain_greedy(lm, PROMPT, 120)
    drafted_rounds = [r for r in dec.stats.rounds if r.drafted]
    # only sparse probes, backing off
    assert 0 < len(drafted_rounds) <= 5


def test_auto_mode_never_probes_a_draft_model_that_would_first_have_to_read_a_long_prompt():
    # A probe drafts a couple of tokens, but a draft that has not seen the prompt decodes all of it
    # first (7.7 s after a 600-token prompt on 2 cores): probing is only allowed near the context.
    lm = no_eos(LM)
    target = FakeModel(lm, n_ctx=512)
    draft_model = FakeModel(AdversarialLM(lm), n_ctx=512)
    cost = CostModel(verify={2: 1.42, 4: 1.54, 5: 1.97, 8: 2.85}, draft_cost=0.6)
    ctl = Controller(cost, k_max=8, learn_timing=False, priors={"draft": 0.6})
    dec = SpeculativeDecoder(target, GREEDY, ctl, SpecSettings(mode="auto", probe_every=8),
                             drafter=ModelDrafter(draft_model, GREEDY))
    prompt = [2 + (i * 5) % 5 for i in range(SpeculativeDecoder.PROBE_CATCHUP_MAX + 40)]
    out = run(dec, prompt, 120)
    assert out == plain_greedy(lm, prompt, 120)
    assert draft_model.decode_calls == []
    assert not [r for r in dec.stats.rounds if r.drafted]


def test_verify_greedy_bonus_token_when_all_accepted():
    logits = np.eye(4, dtype=np.float32)[[1, 2, 3]]
    assert verify_greedy([1, 2], logits) == (2, 3)
    assert verify_greedy([1, 3], logits) == (1, 2)


def test_ngram_drafter_prefers_longest_and_latest_match():
    d = NgramDrafter(n_min=1, n_max=3)
    ctx = [1, 2, 3, 9, 1, 2, 3, 7, 5, 2, 3]
    draft = d.propose(ctx, 3)
    assert draft.tokens == (7, 5, 2)  # "2 3" last seen before "7 5 2"; 3-gram "5 2 3" absent
    assert draft.key == NgramState("find", 2)  # found anywhere (no copy in progress), 2 tokens matched
    assert d.propose([1, 2, 3, 4], 3).tokens == ()
    # context that is not an extension resets the index
    assert d.propose([8, 8, 8], 2).tokens == (8,)


def test_ngram_follows_the_copy_position_after_a_substitution():
    # source: 1 2 9 3 9 4 9 5 ; the copy replaced "2" by "7": after "7 9" the in-sync "9" is the one
    # followed by 3 (near the copy position), not the latest one (followed by 5).
    d = NgramDrafter(n_min=1, n_max=3)
    source = [1, 2, 9, 3, 9, 4, 9, 5, 0]
    d.propose(source + [1], 4)  # starts copying from position 1
    draft = d.propose(source + [1, 7, 9], 3)
    assert draft.tokens == (3, 9, 4)
    # found again near the copy position; the copy it resumes had held one token when it broke, so
    # it may have been a chance match: the state is still a guess ("find"), not a copy's
    assert draft.key == NgramState("find", 1)


def test_seeded_sampling_is_reproducible():
    lm = no_eos(table_lm(3, sharp=1.0))
    draft_lm = table_lm(4, sharp=1.0)
    cfg = SamplingConfig(temperature=0.8, top_k=0, top_p=1.0, min_p=0.0, seed=1234)
    outs = []
    for _ in range(2):
        dec, _, _ = make(lm, draft_lm, k_max=3, sampling=cfg)
        outs.append(run(dec, PROMPT, 40))
    assert outs[0] == outs[1]
    cfg2 = SamplingConfig(temperature=0.8, top_k=0, top_p=1.0, min_p=0.0, seed=99)
    dec, _, _ = make(lm, draft_lm, k_max=3, sampling=cfg2)
    assert run(dec, PROMPT, 40) != outs[0]


def test_verify_batches_respect_the_backend_exact_batch_limit():
    lm = no_eos(LM)
    dec, target, _ = make(lm, lm, k_min=1, k_max=8)
    target.max_exact_batch = 3
    dec = SpeculativeDecoder(target, GREEDY, dec.controller, SpecSettings(mode="draft", draft_max=8), drafter=ModelDrafter(FakeModel(lm), GREEDY))
    out = run(dec, PROMPT, 30)
    assert out == plain_greedy(lm, PROMPT, 30)
    assert max(target.decode_calls[1:]) <= 3
