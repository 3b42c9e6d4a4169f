"""The cost model: v(k, depth) from tables measured at a few context depths, and old profiles."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgespec.controller import Controller
from edgespec.costs import CostModel, staircase

# Shaped like the AVX2 machine of issue 25: a single pass slows a lot with the context, a batch little.
DEEP = CostModel.from_ms({0: {1: 70.0, 8: 448.0, 16: 560.0, 64: 2135.0},
                          512: {1: 110.0, 8: 460.0, 16: 580.0, 64: 2200.0},
                          2048: {1: 150.0, 8: 520.0, 16: 660.0, 64: 2500.0}})


def test_a_profile_from_before_depth_tables_answers_the_same_at_every_depth():
    old = CostModel.from_json({"verify": {"2": 1.4, "8": 3.0}, "draft_cost": 0.4, "t1_ms": 60.0})
    assert not old.deeper and not old.depth_aware
    for depth in (0, 300, 5000):
        assert old.v(8, depth) == 3.0
        assert old.v(5, depth) == 3.0  # the staircase: the next measured size
        assert old.t_ms(8, depth) == pytest.approx(180.0)
    assert old.to_json() == {"verify": {"2": 1.4, "8": 3.0}, "draft_cost": 0.4, "t1_ms": 60.0}


def test_measured_depths_are_answered_exactly_and_in_between_linearly():
    assert DEEP.depths() == [0, 512, 2048]
    assert DEEP.t_ms(1, 512) == pytest.approx(110.0)
    assert DEEP.v(8, 512) == pytest.approx(460.0 / 110.0)
    assert DEEP.t_ms(8, 256) == pytest.approx((448.0 + 460.0) / 2)
    assert DEEP.t_ms(1, 256) == pytest.approx(90.0)
    assert DEEP.v(8, 256) == pytest.approx(454.0 / 90.0)
    # v(k) falls with the depth here: batches grow less than single passes
    assert DEEP.v(16, 0) > DEEP.v(16, 512) > DEEP.v(16, 2048)


def test_within_one_depth_the_staircase_rule_holds():
    # 12 is not measured: the next measured size's cost, at that depth
    assert DEEP.t_ms(12, 512) == pytest.approx(580.0)
    assert DEEP.v(12, 0) == pytest.approx(560.0 / 70.0)
    assert staircase({8: 3.0, 16: 4.0}, 12) == 4.0


def test_below_the_smallest_measured_size_a_batch_costs_at_least_one_pass():
    # live timing whose first batch was a prompt's last chunk with a round (52 rows) that ran as
    # fast as a single pass: the flattest slope down from it must not reach zero (a division by it)
    assert staircase({52: 1.0}, 2) == 1.0
    assert staircase({52: 1.0}, 51) == pytest.approx(1.0)
    assert staircase({8: 4.5}, 2) == pytest.approx(1.5)  # the line to v(1) = 1, as before


def test_beyond_the_deepest_table_costs_keep_growing_as_in_the_last_stretch():
    per_token = (150.0 - 110.0) / (2048 - 512)
    assert DEEP.t_ms(1, 4096) == pytest.approx(150.0 + per_token * 2048)
    shrinking = CostModel.from_ms({0: {1: 70.0, 8: 500.0}, 512: {1: 80.0, 8: 450.0}})
    assert shrinking.t_ms(8, 4096) == pytest.approx(450.0)  # never extrapolated downwards


def test_json_round_trip_keeps_every_depth_and_ignores_a_damaged_one():
    data = DEEP.to_json()
    assert set(data["depths"]) == {"512", "2048"}
    again = CostModel.from_json(data)
    assert again == DEEP
    data["depths"]["999"] = {"verify": {"2": 1.1}}  # no t1_ms
    data["depths"]["x"] = {"t1_ms": 50.0}
    assert CostModel.from_json(data).depths() == [0, 512, 2048]


def test_a_live_shape_scales_v_where_timed_and_by_the_batches_pooled_elsewhere():
    live = replace(DEEP, verify=dict(DEEP.verify), live_shape={16: 1.25, 0: 1.1})
    for depth in (0, 300, 2048, 4096):
        assert live.v(16, depth) == pytest.approx(DEEP.v(16, depth) * 1.25)
        assert live.v(8, depth) == pytest.approx(DEEP.v(8, depth) * 1.1)  # not timed: the pooled factor
        assert live.v(1, depth) == 1.0
        assert live.t_ms(16, depth) == DEEP.t_ms(16, depth)  # the profile's own times stay as measured
    assert replace(DEEP, live_shape={2: 0.1}).v(2) == 1.0  # never below one pass
    assert DEEP.live_shape == {} and DEEP.v(16) == pytest.approx(560.0 / 70.0)  # the original untouched


def test_the_choice_drafts_longer_at_depth_where_batches_grow_less_than_single_passes():
    ctl = Controller(replace(DEEP, verify=dict(DEEP.verify), deeper=dict(DEEP.deeper)), k_max=63, priors={"x": 0.9})
    shallow = ctl.choose("x", 0.0).k
    deep = ctl.choose("x", 0.0, depth=2048).k
    assert deep > shallow
    assert ctl.choose("x", 0.0, depth=None).k == shallow  # a caller that does not say: depth 0
    assert not ctl.could_pay(0.0, 63, alpha=0.3) and ctl.could_pay(0.0, 63, alpha=0.9, depth=2048)


def test_sizes_are_those_of_every_depth():
    cost = CostModel.from_ms({0: {1: 10.0, 2: 15.0}, 512: {1: 12.0, 2: 17.0, 8: 40.0}})
    assert cost.sizes() == {2, 8}
    with pytest.raises(ValueError):
        CostModel.from_ms({0: {2: 1.0}})


def test_the_typical_factor_is_stored_and_scales_the_typical_pass_only():
    cost = CostModel.from_ms({0: {1: 30.0, 8: 90.0}, 512: {1: 40.0, 8: 100.0}})
    cost.typical = 1.15
    back = CostModel.from_json(cost.to_json())
    assert back.typical == pytest.approx(1.15)
    assert back.typical_ms(8, 512) == pytest.approx(100.0 * 1.15)
    assert back.t_ms(8, 512) == pytest.approx(100.0) and back.v(8, 512) == pytest.approx(2.5)  # the shape is the fastest runs'
    assert "typical" not in CostModel.from_ms({0: {1: 30.0}}).to_json()  # 1.0: not written


@pytest.mark.parametrize("bad", [0.5, -1, "fast", None, 50.0])
def test_a_damaged_typical_factor_reads_as_none(bad):
    data = {**CostModel.from_ms({0: {1: 30.0, 8: 90.0}}).to_json(), "typical": bad}
    assert CostModel.from_json(data).typical == 1.0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 80), st.integers(0, 5000), st.sampled_from([None, {}, {16: 1.25, 0: 1.1}])),
                min_size=1, max_size=40))
def test_answers_kept_for_the_round_are_those_computed_afresh(queries):
    """The cost model keeps its answers at the depth last asked (each round asks many sizes at one
    depth, twice or more): in any order of sizes, depths and live-shape changes, every answer is the
    one a model that never answered before gives."""
    kept = CostModel.from_json(DEEP.to_json())
    for k, depth, shape in queries:
        if shape is not None:
            kept.live_shape = shape
        fresh = replace(CostModel.from_json(DEEP.to_json()), live_shape=kept.live_shape)
        assert kept.v(k, depth) == fresh.v(k, depth)
        assert kept.t_ms(k, depth) == fresh.t_ms(k, depth)
