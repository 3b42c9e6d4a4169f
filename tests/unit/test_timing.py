"""Online correction of a stale profile: LiveTiming on scripted durations, the controller's use of it,
and the whole decoder on a fake model driven by a fake clock."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from edgespec.controller import Controller
from edgespec.costs import CostModel
from edgespec.sampling import SamplingConfig
from edgespec.speculative import SpecSettings, SpeculativeDecoder
from edgespec.controller import Load
from edgespec.timing import SHAPE_ANCHOR, SHAPE_MIN_PASSES, STALE_MESSAGE, STALE_PASSES, LiveTiming

from .fakes import FakeModel, table_lm

MS = 1e-3


def profile_seconds(t1_ms: float, verify: dict[int, float] | None = None, deeper=None):
    """A profile's t(k, depth) in seconds, as the controller hands it to LiveTiming."""
    cost = CostModel(verify=dict(verify or {}), t1_ms=t1_ms, deeper=dict(deeper or {}))
    return lambda k, depth: cost.t_ms(k, depth) * MS


def feed(timing: LiveTiming, seconds, n_tokens=1):
    became = [timing.observe_verify(n_tokens, s) for s in seconds]
    return [i for i, b in enumerate(became) if b]


def test_stale_after_twenty_passes_off_by_more_than_thirty_percent():
    t = LiveTiming(reference=profile_seconds(30))
    assert feed(t, [60 * MS] * (STALE_PASSES - 1)) == [] and not t.stale
    assert feed(t, [60 * MS]) == [0] and t.stale  # the 20th pass
    assert feed(t, [60 * MS] * 5) == []  # reported once
    assert t.live_t1() == pytest.approx(60 * MS)


def test_faster_than_the_profile_is_stale_too():
    t = LiveTiming(reference=profile_seconds(60))
    feed(t, [30 * MS] * STALE_PASSES)
    assert t.stale


def test_within_thirty_percent_is_never_stale():
    t = LiveTiming(reference=profile_seconds(30))
    feed(t, [38 * MS, 22 * MS] * 100)  # +27% / -27%
    assert not t.stale


def test_a_few_slow_passes_do_not_condemn_a_good_profile():
    t = LiveTiming(reference=profile_seconds(30))
    feed(t, ([30 * MS] * 3 + [150 * MS] * 2) * 20)  # 40% of passes hit by a busy neighbour
    assert not t.stale


def test_batches_are_checked_against_the_profiles_v_of_k():
    ok = LiveTiming(reference=profile_seconds(30, {4: 2.0}))
    feed(ok, [60 * MS] * 40, n_tokens=4)  # exactly what the profile predicts for 4 tokens
    assert not ok.stale and ok.live_t1() is None  # no 1-token pass yet, nothing to anchor to
    slow = LiveTiming(reference=profile_seconds(30, {4: 2.0}))
    feed(slow, [120 * MS] * STALE_PASSES, n_tokens=4)
    assert slow.stale
    # stale with no 1-token pass: t(1) implied by the batches through the profile's shape
    assert slow.live_t1() == pytest.approx(60 * MS)
    assert slow.live_verify() == {4: pytest.approx(2.0)}


def test_no_profile_means_nothing_to_be_stale_against():
    t = LiveTiming(reference=None)
    feed(t, [500 * MS] * 100)
    assert not t.stale and not t.take_notice()
    assert t.live_t1() == pytest.approx(500 * MS)


def test_notice_is_taken_once():
    t = LiveTiming(reference=profile_seconds(30))
    assert not t.take_notice()
    feed(t, [90 * MS] * STALE_PASSES)
    assert t.take_notice() and not t.take_notice()


# ---- the controller --------------------------------------------------------------------------
def profiled_cost(t1_ms: float, verify: dict[int, float]) -> CostModel:
    cost = CostModel(verify=dict(verify), draft_cost=0.2)
    cost.t1_ms = t1_ms  # the profile's absolute scale (measure.py stores it with the costs)
    return cost


def test_a_stale_profile_keeps_its_tables_and_live_timing_corrects_their_shape():
    # A profile measured elsewhere says batches are nearly free; this machine says otherwise.
    ctl = Controller(profiled_cost(30.0, {2: 1.05, 4: 1.1, 8: 1.2}), k_max=8)
    for _ in range(STALE_PASSES):
        ctl.observe_verify(1, 60 * MS)
    assert ctl.profile_stale
    assert ctl.cost.verify == {2: 1.05, 4: 1.1, 8: 1.2}  # twice as slow throughout: the same shape
    assert ctl.cost.v(4) == pytest.approx(1.1)
    for _ in range(SHAPE_MIN_PASSES):
        ctl.observe_verify(4, 150 * MS)
    assert ctl.cost.v(4) == pytest.approx(2.5)  # as timed: 150 ms against 60
    assert ctl.cost.v(8) == pytest.approx(1.2 * 2.5 / 1.1)  # not timed: the batches' factor
    ctl.observe_draft(3, 45 * MS)
    assert ctl.cost.draft_cost == pytest.approx(0.25)


def test_a_drifted_shape_is_corrected_before_the_profile_is_stale():
    # t(1) as profiled, 4-row batches 40% dearer: not stale (the median pass agrees), but the
    # draft lengths must see it
    ctl = Controller(profiled_cost(30.0, {2: 1.5, 4: 2.0, 8: 3.0}), k_max=8)
    for _ in range(SHAPE_MIN_PASSES):
        ctl.observe_verify(1, 30 * MS)
        ctl.observe_verify(4, 84 * MS)
    assert not ctl.profile_stale
    assert ctl.cost.v(4) == pytest.approx(2.8) and ctl.cost.v(8) == pytest.approx(4.2)
    assert ctl.cost.verify == {2: 1.5, 4: 2.0, 8: 3.0}


def test_a_size_timed_as_profiled_keeps_its_cost_when_other_sizes_drifted():
    ctl = Controller(profiled_cost(30.0, {4: 2.0, 8: 3.0, 16: 4.0}), k_max=15)
    for _ in range(SHAPE_MIN_PASSES):
        ctl.observe_verify(1, 30 * MS)
        ctl.observe_verify(4, 60 * MS)  # as profiled
        ctl.observe_verify(8, 135 * MS)  # 50% dearer
    assert ctl.cost.v(4) == pytest.approx(2.0)
    assert ctl.cost.v(8) == pytest.approx(4.5)
    assert ctl.cost.v(16) == pytest.approx(4.0 * 1.25)  # not timed: the median of all six batches


def test_a_close_call_gives_way_to_a_single_pass_when_live_timing_has_none():
    ctl = Controller(profiled_cost(30.0, {2: 1.02, 4: 1.5}), k_max=3)
    assert ctl.timing.wants_single  # nothing timed yet
    close = ctl.choose("x", 0.0, prior=0.3)  # a 1-token draft for 2% more: a close call
    sure = ctl.choose("y", 0.0, prior=0.95)
    assert close.k == 0 and sure.k == 3
    for _ in range(SHAPE_MIN_PASSES):
        ctl.observe_verify(1, 30 * MS)
    assert not ctl.timing.wants_single and ctl.choose("x", 0.0, prior=0.3).k > 0
    for _ in range(SHAPE_ANCHOR):
        ctl.observe_verify(2, 30.6 * MS)
    assert ctl.timing.wants_single and ctl.choose("x", 0.0, prior=0.3).k == 0
    ctl.observe_verify(1, 30 * MS)
    assert not ctl.timing.wants_single
    # a batch of several sequences has no single passes to give: nothing is held back there
    busy = Controller(profiled_cost(30.0, {2: 1.02, 4: 1.5}), k_max=3)
    assert busy.choose("x", 0.0, prior=0.3, load=Load(seq_rows=(2,), tokens=1.5)).k > 0
    off = Controller(profiled_cost(30.0, {2: 1.02, 4: 1.5}), k_max=3, learn_timing=False)
    assert off.choose("x", 0.0, prior=0.3).k > 0


def test_controller_with_a_good_profile_keeps_it_for_unseen_sizes():
    ctl = Controller(profiled_cost(30.0, {2: 1.5, 8: 3.0}), k_max=8)
    for _ in range(50):
        ctl.observe_verify(1, 31 * MS)
    assert not ctl.profile_stale and ctl.cost.verify == {2: 1.5, 8: 3.0}


def test_controller_with_a_good_profile_is_not_moved_by_noisy_passes():
    # Passes that agree with the profile on the whole (not stale) but are noisy per size: the
    # profile's own costs stand; the draft lengths must not follow one slow 16-row batch.
    ctl = Controller(profiled_cost(30.0, {2: 1.5, 8: 3.0, 16: 4.0}), k_max=15)
    before = ctl.choose("x", 0.0, prior=0.95).k
    for i in range(STALE_PASSES * 2):
        ctl.observe_verify(1, 30 * MS)
        ctl.observe_verify(16, (4.0 if i % 3 else 9.0) * 30 * MS)
    assert not ctl.profile_stale
    assert ctl.cost.verify == {2: 1.5, 8: 3.0, 16: 4.0}
    assert ctl.choose("x", 0.0, prior=0.95).k == before == 15


def test_controller_without_learning_ignores_timing():
    ctl = Controller(profiled_cost(30.0, {2: 1.5}), learn_timing=False)
    for _ in range(50):
        ctl.observe_verify(1, 90 * MS)
    assert not ctl.profile_stale and ctl.cost.verify == {2: 1.5}


# ---- the decoder on a fake clock -------------------------------------------------------------
class FakeClock:
    def __init__(self):
        self.now = 100.0

    def perf_counter(self):
        return self.now


class SlowModel(FakeModel):
    """Every target pass advances the fake clock: this machine is twice as slow as the profile says."""

    def __init__(self, clock, t1_s, **kw):
        super().__init__(table_lm(5), **kw)
        self.clock = clock
        self.t1_s = t1_s

    def decode(self, tokens, logits_for=()):
        self.clock.now += self.t1_s * (1 + 0.5 * (len(list(tokens)) - 1))
        return super().decode(tokens, logits_for)

    def is_eog(self, token):
        return False


def run_plain(monkeypatch, live_t1_s, tokens=40):
    clock = FakeClock()
    ctl = Controller(profiled_cost(30.0, {2: 1.05, 8: 1.2}), k_max=8)
    dec = SpeculativeDecoder(SlowModel(clock, live_t1_s, n_ctx=512), SamplingConfig(), ctl, SpecSettings(mode="off"),
                             clock=clock.perf_counter)
    out = list(dec.generate([1, 2, 3], tokens))
    assert len(out) == tokens
    return ctl


def test_decoder_on_a_slower_machine_goes_live_and_says_so_once(monkeypatch):
    from edgespec.render.common import print_stale_notice

    ctl = run_plain(monkeypatch, 60 * MS)
    assert ctl.profile_stale and ctl.timing.live_t1() == pytest.approx(60 * MS)
    buf = io.StringIO()
    con = Console(file=buf, width=120)
    print_stale_notice(con, ctl)
    print_stale_notice(con, ctl)
    assert buf.getvalue().splitlines() == [STALE_MESSAGE]


def test_decoder_on_the_profiled_machine_keeps_the_profile(monkeypatch):
    from edgespec.render.common import print_stale_notice

    ctl = run_plain(monkeypatch, 30 * MS)
    assert not ctl.profile_stale and ctl.cost.verify == {2: 1.05, 8: 1.2}
    buf = io.StringIO()
    print_stale_notice(Console(file=buf), ctl)
    assert buf.getvalue() == ""


# ---- like with like: a pass at depth d against the profile at d -------------------------------------
def machine_ms(k: int, depth: int) -> float:
    """This machine's true pass time: single passes slow with the context much faster than batches
    (the shape issue 25 measured on an AVX2 EPYC: t(1) 70 -> 109 ms after ~450 tokens)."""
    base = {1: 70.0, 2: 120.0, 4: 200.0, 8: 448.0, 16: 560.0}[k]
    return base + (0.085 if k == 1 else 0.02) * depth


def depth_profile(depths=(0, 512, 2048)) -> CostModel:
    cost = CostModel.from_ms({d: {k: machine_ms(k, d) for k in (1, 2, 4, 8, 16)} for d in depths})
    cost.draft_cost = 0.2
    return cost


def long_prompt_passes(n_prompt=450, n_passes=60, slower=1.0):
    """(rows, depth, seconds) of a generation after an n_prompt-token prompt: plain passes and
    4-, 8- and 16-row verify batches, each +-10% of the machine's time (`slower`: a slower machine)."""
    depth = n_prompt
    for i in range(n_passes):
        k = (1, 4, 1, 8, 1, 16)[i % 6]
        noise = (0.9, 1.1, 1.0, 1.05, 0.95)[i % 5]
        yield k, depth, machine_ms(k, depth) * noise * slower * MS
        depth += 1 if k == 1 else k // 2


def test_a_fresh_profile_is_never_called_stale_by_a_long_prompt():
    ctl = Controller(depth_profile(), k_max=15)
    for k, depth, s in long_prompt_passes(n_prompt=450):
        ctl.observe_verify(k, s, depth=depth)
    assert not ctl.profile_stale and ctl.cost.deeper  # the profile's tables stay in use
    deeper = Controller(depth_profile(), k_max=15)
    for k, depth, s in long_prompt_passes(n_prompt=3000):  # past the deepest table: extrapolated
        deeper.observe_verify(k, s, depth=depth)
    assert not deeper.profile_stale


def test_the_same_passes_against_one_depth_are_what_called_it_stale():
    # the profile measured at depth 0 only (today's saved profiles) and a decoder that does not
    # say the depth: the long prompt's passes look 30%+ slow, and a good profile is thrown away
    old = CostModel.from_ms({0: {k: machine_ms(k, 0) for k in (1, 2, 4, 8, 16)}})
    ctl = Controller(old, k_max=15)
    for k, depth, s in long_prompt_passes(n_prompt=450):
        ctl.observe_verify(k, s, depth=depth)
    assert ctl.profile_stale


def test_a_slower_machine_is_still_found_at_any_depth():
    ctl = Controller(depth_profile(), k_max=15)
    for k, depth, s in long_prompt_passes(n_prompt=450, slower=1.6):
        ctl.observe_verify(k, s, depth=depth)
    # 1.6 times slower at every size and depth: stale, and the profile's shape still holds
    assert ctl.profile_stale and ctl.cost.deeper == depth_profile().deeper and ctl.cost.live_shape == {}


def test_a_shape_drifted_at_depth_is_corrected_against_the_profile_at_that_depth():
    # the machine's batches grew 30% dearer relative to single passes since the profile; every
    # pass runs deep in a long prompt, where the profile's own v(k) is much lower than at depth 0
    ctl = Controller(depth_profile(), k_max=15)
    for k, depth, s in long_prompt_passes(n_prompt=1500):
        ctl.observe_verify(k, s * (1.3 if k > 1 else 1.0), depth=depth)
    assert not ctl.profile_stale
    truth = CostModel.from_ms({d: {k: machine_ms(k, d) * (1.3 if k > 1 else 1.0) for k in (1, 2, 4, 8, 16)}
                               for d in (0, 512, 2048)})
    for k in (4, 8, 16):
        assert ctl.cost.v(k, 1600) == pytest.approx(truth.v(k, 1600), rel=0.1)
    assert ctl.cost.shape_factor(2) == pytest.approx(1.3, rel=0.05)  # not timed: the batches' factor


class DepthClockModel(FakeModel):
    """Every pass advances the fake clock by machine_ms(rows, tokens already in the cache)."""

    def __init__(self, clock, **kw):
        super().__init__(table_lm(5), **kw)
        self.clock = clock

    def decode(self, tokens, logits_for=()):
        tokens = list(tokens)
        self.clock.now += machine_ms(len(tokens) if len(tokens) in (1, 2, 4, 8, 16) else 16, len(self.tokens)) * MS
        return super().decode(tokens, logits_for)

    def is_eog(self, token):
        return False


class DepthOfTarget(Controller):
    """Fills in the depth the decoder knows (its target's KV length) where the decoder does not
    pass it yet: the call the decoder makes is observe_verify(rows, seconds, depth=kv_length)."""

    def __init__(self, model, *a, **kw):
        super().__init__(*a, **kw)
        self.model = model

    def observe_verify(self, n_tokens, seconds, *, depth=None):
        super().observe_verify(n_tokens, seconds, depth=len(self.model.tokens) - n_tokens if depth is None else depth)


def test_the_decoder_on_a_scripted_clock_after_a_long_prompt_keeps_a_fresh_profile(monkeypatch):
    clock = FakeClock()
    model = DepthClockModel(clock, n_ctx=1024)
    ctl = DepthOfTarget(model, depth_profile(), k_max=8)
    dec = SpeculativeDecoder(model, SamplingConfig(), ctl, SpecSettings(mode="off"), clock=clock.perf_counter)
    out = list(dec.generate(list(range(1, 8)) * 64, 40))  # a 448-token prompt
    assert len(out) == 40 and not ctl.profile_stale
    stale = Controller(CostModel.from_ms({0: {k: machine_ms(k, 0) for k in (1, 2, 4, 8, 16)}}), k_max=8)
    model = DepthClockModel(clock, n_ctx=1024)
    list(SpeculativeDecoder(model, SamplingConfig(), stale, SpecSettings(mode="off"),
                            clock=clock.perf_counter).generate(list(range(1, 8)) * 64, 40))
    assert stale.profile_stale  # the depth-0 profile against the same passes


# ---- like with like: a typical pass against the profile's typical pass --------------------------------
def fastest_profile(typical: float) -> CostModel:
    """The profile of depth_profile's machine as `edgespec profile` stores it: each size's fastest
    run, which on a jittery machine is well below what a pass typically takes (machine_ms)."""
    cost = CostModel.from_ms({d: {k: machine_ms(k, d) / typical for k in (1, 2, 4, 8, 16)} for d in (0, 512, 2048)})
    cost.typical = typical
    return cost


def test_a_fresh_profile_of_fastest_runs_is_not_called_stale_by_typical_passes():
    # the fastest runs 25% under the typical pass: every live pass, deep in a long prompt, is ~1.33x
    # the stored time, past the 30% limit; against the typical pass it is as profiled
    ctl = Controller(fastest_profile(1.33), k_max=15)
    for k, depth, s in long_prompt_passes(n_prompt=450):
        ctl.observe_verify(k, s, depth=depth)
    assert not ctl.profile_stale and ctl.cost.live_shape == {}
    # the same tables without the factor (a profile saved before it was measured) call it stale
    old = fastest_profile(1.33)
    old.typical = 1.0
    ctl = Controller(old, k_max=15)
    for k, depth, s in long_prompt_passes(n_prompt=450):
        ctl.observe_verify(k, s, depth=depth)
    assert ctl.profile_stale


def test_the_typical_factor_does_not_hide_a_slower_machine():
    ctl = Controller(fastest_profile(1.2), k_max=15)
    for k, depth, s in long_prompt_passes(n_prompt=450, slower=1.5):
        ctl.observe_verify(k, s, depth=depth)
    assert ctl.profile_stale


def test_the_decoder_on_a_scripted_clock_keeps_a_profile_of_fastest_runs(monkeypatch):
    clock = FakeClock()
    model = DepthClockModel(clock, n_ctx=1024)
    ctl = DepthOfTarget(model, fastest_profile(1.33), k_max=8)
    dec = SpeculativeDecoder(model, SamplingConfig(), ctl, SpecSettings(mode="off"), clock=clock.perf_counter)
    assert len(list(dec.generate(list(range(1, 8)) * 64, 40))) == 40
    assert not ctl.profile_stale
