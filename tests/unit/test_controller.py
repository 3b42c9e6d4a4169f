import pytest
from hypothesis import given
from hypothesis import strategies as st

from edgespec.controller import DRAFT_MARGIN, POOL_MARGIN, Acceptance, Controller, expected_tokens, speedup
from edgespec.costs import CostModel
from edgespec.drafters import NgramState

CPU = CostModel(verify={2: 1.42, 4: 1.54, 5: 1.97, 8: 2.85}, draft_cost=0.6)


def test_expected_tokens_formula():
    assert expected_tokens(0.0, 5) == pytest.approx(1.0)
    assert expected_tokens(1.0, 5) == 6.0
    assert expected_tokens(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)


def test_controller_turns_off_a_costly_draft_model():
    ctl = Controller(CPU, k_max=16, priors={"draft": 0.8})
    assert ctl.choose("draft", 0.6).k == 0  # c = 0.6 with these verify costs never pays at alpha 0.8


def test_controller_turns_on_a_free_accurate_drafter():
    ctl = Controller(CPU, k_max=16, priors={"ngram": 0.9})  # the drafter's prior, for every one of its states
    choice = ctl.choose(NgramState("copy", 4), 0.0)
    assert choice.k >= 3
    assert choice.expected_speedup > 1.5


def test_controller_off_for_free_but_inaccurate_drafter():
    ctl = Controller(CPU, k_max=16, priors={"ngram": 0.2})
    assert ctl.choose(NgramState("copy", 1), 0.0).k == 0


def test_a_draft_must_be_expected_to_gain_the_margin_over_plain():
    # one drafted token into a 2-row batch that costs 1.5 passes: expected (1 + alpha) / 1.5
    two_rows = CostModel(verify={2: 1.5})
    gain = lambda alpha: (1 + alpha) / 1.5
    under, over = 0.545, 0.59
    assert 1.0 < gain(under) < 1.0 + DRAFT_MARGIN < gain(over)
    assert Controller(two_rows, k_max=1, priors={"draft": under}).choose("draft", 0.0).k == 0
    taken = Controller(two_rows, k_max=1, priors={"draft": over}).choose("draft", 0.0)
    assert taken.k == 1 and taken.expected_speedup == pytest.approx(gain(over))
    # a forced mode drafts whatever the margin
    assert Controller(two_rows, k_max=1, allow_off=False, priors={"draft": under}).choose("draft", 0.0).k == 1


def test_forced_mode_never_off():
    ctl = Controller(CPU, k_min=2, k_max=6, allow_off=False, priors={"draft": 0.1})
    assert ctl.choose("draft", 0.9).k == 2


def test_learns_acceptance():
    est = Acceptance(prior=0.5)
    for _ in range(30):
        est.observe(4, 4)
    assert est.alpha > 0.9
    for _ in range(30):
        est.observe(4, 0)
    assert est.alpha < 0.2


def test_cost_model_interpolates_and_extrapolates():
    assert CPU.v(1) == 1.0
    assert CPU.v(3) == pytest.approx(1.54)  # between measured sizes: the next one's cost (a staircase)
    assert CPU.v(10) > CPU.v(8)
    assert CostModel().v(5) == pytest.approx(3.0)


def test_learns_timing():
    ctl = Controller(CostModel(), learn_timing=True)
    ctl.observe_verify(1, 0.1)
    ctl.observe_verify(5, 0.3)
    assert ctl.cost.v(5) == pytest.approx(3.0)
    ctl.observe_draft(2, 0.1)
    assert ctl.cost.draft_cost == pytest.approx(0.5)


def test_invalid_bounds():
    with pytest.raises(ValueError):
        Controller(CPU, k_min=5, k_max=2)


def test_speedup_plain_is_one():
    assert speedup(0.9, 0, 0.0, CPU) == 1.0


def test_could_pay_rules_out_a_draft_model_too_costly_even_when_perfect():
    ctl = Controller(CostModel(verify={2: 2.01, 4: 2.6, 7: 3.98}, draft_cost=0.47), k_max=6)
    assert not ctl.could_pay(0.47)
    assert ctl.could_pay(0.05)


def test_a_drafter_state_is_judged_no_higher_than_the_drafters_recent_record():
    ctl = Controller(CPU, k_max=16, learn_timing=False)
    fresh = Controller(CPU, k_max=16, learn_timing=False)
    for key in (NgramState("find", 1), NgramState("find", 2), NgramState("find", 4)):  # free text: every state misses
        ctl.observe(key, 3, 0, prior=0.7)
    pooled = ctl.pooled["ngram"].alpha
    assert pooled < 0.4
    assert ctl.capped_alpha(NgramState("find", 8), 0.88) == pytest.approx(pooled + POOL_MARGIN)
    assert fresh.capped_alpha(NgramState("find", 8), 0.88) == pytest.approx(0.88)  # no record yet: the prior
    assert ctl.choose(NgramState("find", 8), 0.0, 16, prior=0.88).k == 0
    assert fresh.choose(NgramState("find", 8), 0.0, 16, prior=0.88).k > 0
    # one lucky round does not make a weak state look strong while the others keep missing
    ctl.observe(NgramState("find", 1), 12, 12, prior=0.2)
    for key in (NgramState("find", 2), NgramState("find", 4), NgramState("copy", 1)):
        ctl.observe(key, 3, 0, prior=0.7)
    assert ctl.estimate(NgramState("find", 1)).alpha > 0.7
    assert ctl.capped_alpha(NgramState("find", 1)) < ctl.estimate(NgramState("find", 1)).alpha
    # a long verified copy run is its own evidence: its prior stands (the state says so, not the prior's value)
    assert ctl.capped_alpha(NgramState("copy", 32), 0.985) == pytest.approx(0.985)
    assert ctl.capped_alpha(NgramState("copy", 16), 0.96) == pytest.approx(0.96)
    # a high prior alone earns nothing: a resumed copy shorter than that is judged by the pool
    cap = ctl.pooled["ngram"].alpha + POOL_MARGIN
    assert cap < 0.93 and ctl.capped_alpha(NgramState("resume", 8), 0.93) == pytest.approx(cap)
    # and the record recovers within a few good rounds (text turned from prose to a copy)
    for _ in range(4):
        ctl.observe(NgramState("copy", 16), 8, 8, prior=0.96)
    assert ctl.pooled["ngram"].alpha > 0.85


def test_a_draft_whose_run_grows_into_a_long_copy_is_judged_at_each_tokens_own_state():
    ctl = Controller(CPU, k_max=16, learn_timing=False)
    weak, strong = NgramState("find", 8), NgramState("copy", 16)
    alone = ctl.choose(weak, 0.0, 16, prior=0.5)
    growing = ctl.choose(weak, 0.0, 16, prior=0.5, path=[(weak, 2), (strong, 14)])
    # past the first two tokens the copy would be a long one (prior 0.96): more is expected of a long draft
    assert growing.expected_tokens > alone.expected_tokens and growing.k >= alone.k
    same = ctl.choose(weak, 0.0, 16, prior=0.5, path=[(weak, 16)])
    assert same == alone  # a path of the key alone changes nothing


def test_a_round_along_a_path_teaches_each_state_its_own_tokens_up_to_the_first_rejected():
    ctl = Controller(CPU, k_max=16, learn_timing=False)
    a, b, c = NgramState("find", 4), NgramState("find", 8), NgramState("copy", 16)
    ctl.observe_path([(a, 4), (b, 8), (c, 4)], accepted=6)  # rejected at the 7th: b's third token
    assert (ctl.acceptance[a].successes, ctl.acceptance[a].failures) == (4, 0)
    assert (ctl.acceptance[b].successes, ctl.acceptance[b].failures) == (2, 1)
    assert c not in ctl.acceptance  # never reached
    pool = ctl.pooled["ngram"]
    assert pool.rounds == 1 and (pool.successes, pool.failures) == (6, 1)  # one round for the pool
    ctl.observe_path([(a, 4), (b, 8)], accepted=12)
    assert ctl.acceptance[b].failures == pytest.approx(0.9) and ctl.pooled["ngram"].rounds == 2


def test_a_copy_is_judged_by_how_long_this_answers_earlier_copies_held():
    from edgespec.controller import HISTORY_MIN_RUNS, HISTORY_WEIGHT
    from edgespec.drafters import RunHistory

    cheap = CostModel(verify={k: 1 + 0.1 * (k - 1) for k in range(2, 65)})
    copy8, copy16 = NgramState("copy", 8), NgramState("copy", 16)
    path = [(copy8, 8), (copy16, 16)]

    def choice(history):
        ctl = Controller(cheap, k_max=24, learn_timing=False)
        return ctl.choose(copy8, 0.0, 24, prior=copy8.prior, path=path, history=history)

    fresh = choice(None)
    assert choice(RunHistory(run=8)) == fresh  # no earlier run: the states' rates alone
    # many earlier copies broke at 12 tokens: a copy 8 tokens in is expected to break 4 tokens on
    short = choice(RunHistory(run=8, ended=(12,) * 20))
    assert short.k < fresh.k and short.expected_tokens < 6.0
    # earlier runs that broke before this one's length say nothing about it
    assert choice(RunHistory(run=8, ended=(3, 5, 7) * 10)) == fresh
    # earlier copies that all held past the draft make a long bet likelier than the priors say
    long = choice(RunHistory(run=8, ended=(200,) * 20))
    assert long.k >= fresh.k and long.expected_tokens > fresh.expected_tokens
    # a single earlier run is an anecdote: the states' rates alone, whichever way it went
    assert HISTORY_MIN_RUNS == 2
    assert choice(RunHistory(run=8, ended=(12,))) == fresh == choice(RunHistory(run=8, ended=(3, 200)))
    # from two on, each weighs as one of the answer's runs against HISTORY_WEIGHT for the path's chance
    two = choice(RunHistory(run=8, ended=(12, 12)))
    assert short.expected_tokens < two.expected_tokens < fresh.expected_tokens and HISTORY_WEIGHT > 2


def test_a_copy_bets_no_more_than_its_run_has_earned():
    from edgespec.controller import RISK_BASE, RISK_PER_RUN
    from edgespec.drafters import RunHistory, copy_path

    # a machine where wide batches are dear and a 64-row batch happens to cost less than a 48-row one
    # (one of the Zen 4 tables at depth 2,048)
    dear = CostModel(verify={2: 1.81, 4: 3.17, 8: 7.03, 16: 8.54, 24: 13.51, 32: 16.7, 48: 23.66, 64: 21.64})

    def choice(run, key=None):
        ctl = Controller(dear, k_max=63, learn_timing=False)
        path = copy_path("copy", run, 63)
        state = path[0][0]
        if key is not None:
            return ctl.choose(key, 0.0, 63, prior=0.99)
        return ctl.choose(state, 0.0, 63, prior=state.prior, path=path, history=RunHistory(run=run))

    # a quote 19 tokens in: the states' rates alone would bet 63 (expected ~30 tokens for ~22 passes)
    quote = choice(19)
    risk = dear.v(quote.k + 1) - 1
    assert 0 < quote.k < 63 and risk <= RISK_BASE + RISK_PER_RUN * 19
    # a copy that has held 64 tokens has earned the wide bet
    assert choice(64).k == 63
    # and so has a long copy picked up again after an edit (a typo fixed), from its first token on,
    # where this answer's resumed copies have held (their states learnt at 0.97)
    path = copy_path("resume", 1, 63)
    learnt = {state: 0.97 for state, _ in path}

    def picked_up(history):
        ctl = Controller(dear, k_max=63, learn_timing=False, priors=learnt)
        return ctl.choose(path[0][0], 0.0, 63, prior=0.97, path=path, history=history)

    resumed, fresh = picked_up(RunHistory(run=1, resumes=64)), picked_up(RunHistory(run=1))
    assert resumed.k > fresh.k and dear.v(fresh.k + 1) - 1 <= RISK_BASE + RISK_PER_RUN < dear.v(resumed.k + 1) - 1
    # the limit is a copy's: a drafter without a run (the draft model) is judged on its rates alone
    assert choice(19, key="draft").k == 63


# A lone round's draft lengths past the point where even the longest draft's tokens over the drafting
# time could not beat the best so far are not costed (Controller.choose): the choice must be the one
# costing every length would make, on any costs, including batch costs that are not monotone in k.
@given(alpha=st.floats(0.0, 0.999), c=st.floats(0.0, 1.5), k_cap=st.integers(1, 63), depth=st.integers(0, 3000),
       rows=st.lists(st.floats(1.0, 40.0), min_size=6, max_size=6), grow=st.floats(1.0, 2.5),
       confidence=st.one_of(st.none(), st.lists(st.sampled_from([1.0, 1.0, 0.7, 0.3]), min_size=1, max_size=63)))
def test_a_choice_skips_only_lengths_that_could_not_win(alpha, c, k_cap, depth, rows, grow, confidence):
    sizes = (2, 4, 8, 16, 32, 64)
    t0 = {1: 30.0, **{k: 30.0 * v for k, v in zip(sizes, rows)}}
    cost = CostModel.from_ms({0: t0, 2048: {k: t * (grow if k == 1 else 1.0 + (grow - 1.0) / 2) for k, t in t0.items()}})
    ctl = Controller(cost, k_max=63, learn_timing=False, priors={"draft": alpha})
    got = ctl.choose("draft", c, k_cap, depth=depth, confidence=confidence)

    hi = min(63, k_cap)
    gain, held, sure = [1.0], 1.0, 1.0
    for i in range(hi):
        held *= alpha
        sure *= confidence[i] if confidence is not None and i < len(confidence) else 1.0
        gain.append(gain[-1] + held * sure)
    ks = set(ctl._lengths(1, hi))
    if confidence is not None and any(x < 1.0 for x in confidence[:hi]):
        ks |= {i for i, x in enumerate(confidence[:hi]) if x < 1.0 and i >= 1}
    else:
        gain = [expected_tokens(alpha, k) for k in range(hi + 1)]
    best_k, best = 0, 1.0
    for k in sorted(ks):
        rate = gain[k] / (1.0 + k * c + (cost.v(k + 1, depth) - 1.0))
        if rate > best:
            best_k, best = k, rate
    if best < 1.0 + DRAFT_MARGIN:
        best_k, best = 0, 1.0
    assert (got.k, got.expected_speedup) == (best_k, pytest.approx(best))
