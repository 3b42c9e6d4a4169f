"""The draft length chosen from acceptance and scripted verify costs."""

from __future__ import annotations

import pytest

from edgespec.config import DraftLimits, SpecConfig
from edgespec.controller import Controller, candidate_ks, speedup
from edgespec.costs import CostModel

# A small CPU with repacked weights: a 2-row batch costs 2 rows, large batches are cheap per row
# (measured shape on this project's 2-core machines: v(16) ~ 7.8, v(64) ~ 23.5).
CPU_LONG_PAYS = CostModel(verify={2: 1.97, 3: 2.64, 4: 3.02, 8: 4.9, 12: 6.6, 16: 7.8, 24: 10.8, 32: 13.5, 48: 18.9, 64: 23.5})
# A machine where every extra row costs a full pass: no draft can pay, however good.
FLAT = CostModel(verify={2: 2.0, 4: 4.0, 8: 8.0, 16: 16.0, 32: 32.0, 64: 64.0})
# A GPU-like table: 16 rows for 2.5 passes.
GPU = CostModel(verify={2: 1.05, 4: 1.1, 8: 1.3, 16: 2.5, 32: 4.5, 64: 8.5})


def best(cost: CostModel, alpha: float, k_max: int = 63) -> int:
    ctl = Controller(cost, k_max=k_max, priors={"x": alpha})
    return ctl.choose("x", 0.0).k


def test_long_drafts_chosen_only_when_acceptance_is_high_and_large_batches_are_cheap():
    assert best(CPU_LONG_PAYS, 0.995) >= 48
    assert 12 <= best(CPU_LONG_PAYS, 0.98) <= 40
    assert best(CPU_LONG_PAYS, 0.9) <= 12
    assert best(CPU_LONG_PAYS, 0.5) == 0  # a coin flip never pays for a 2-row batch here


def test_where_rows_cost_full_passes_nothing_pays():
    for alpha in (0.5, 0.9, 0.99):
        assert best(FLAT, alpha) == 0


def test_a_gpu_table_drafts_long_even_at_moderate_acceptance():
    assert best(GPU, 0.9) >= 6
    assert best(GPU, 0.6) >= 2


def test_the_choice_is_the_best_of_all_lengths_up_to_the_grid():
    for cost in (CPU_LONG_PAYS, GPU):
        for alpha in (0.8, 0.95, 0.99):
            k = best(cost, alpha)
            exhaustive = max(speedup(alpha, j, 0.0, cost) for j in range(1, 64))
            assert speedup(alpha, k, 0.0, cost) >= 0.97 * exhaustive


def test_candidate_grid():
    assert candidate_ks(1, 63)[:8] == list(range(1, 9)) and candidate_ks(1, 63)[-1] == 63
    assert candidate_ks(5, 5) == [5]
    assert candidate_ks(9, 9) == [9]
    assert all(a < b for a, b in zip(candidate_ks(1, 63), candidate_ks(1, 63)[1:]))


@pytest.mark.parametrize(
    "verify,expected",
    [({}, 16), ({2: 2.0, 8: 4.9, 64: 23.5}, 63), ({2: 2.0, 7: 3.9, 8: 4.0}, 7)],
)
def test_default_draft_max_follows_what_the_profile_measured(verify, expected):
    cost = CostModel(verify=verify) if verify else None
    assert DraftLimits.of(SpecConfig(), cost) == DraftLimits(1, expected)  # the engine's rule, in one place


# Measured on a 2-vCPU Xeon (fast kernels, 1.5B Q4_K_M): cost steps at row tiles, t(16) < t(12).
TILED = CostModel(verify={2: 1.43, 3: 1.88, 4: 1.72, 5: 2.16, 6: 2.58, 7: 3.01, 8: 3.09, 12: 3.96, 16: 3.99,
                          24: 6.1, 32: 7.08, 48: 10.14, 64: 12.2})


@pytest.mark.parametrize("alpha", [0.8, 0.9, 0.95, 0.98, 0.995])
def test_drafts_fill_a_measured_batch_size_on_a_staircase(alpha):
    # A draft of k tokens is a (k + 1)-row batch; between measured sizes the cost is the next
    # measured one's, so the best draft ends exactly on a measured size (3, 7, 15, 31, 47, 63).
    k = best(TILED, alpha)
    assert k + 1 in TILED.verify
    assert TILED.v(17) == TILED.v(24) and TILED.v(13) == TILED.v(16)
