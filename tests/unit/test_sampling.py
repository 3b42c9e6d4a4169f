import numpy as np
import pytest

from edgespec.errors import ConfigError
from edgespec.sampling import SamplingConfig, sample, warp
from edgespec.speculative import verify_sampled

# 99.9% quantiles of chi-square: a correct sampler fails each check with probability 0.001,
# and seeds are fixed, so these tests are deterministic.
CHI2_999 = {3: 16.27, 4: 18.47, 5: 20.52}
N = 20000


def chi_square(counts, probs):
    expected = probs * counts.sum()
    mask = expected > 0
    assert counts[~mask].sum() == 0, "sampled a token with zero target probability"
    return float((((counts - expected) ** 2)[mask] / expected[mask]).sum()), int(mask.sum()) - 1


PAIRS = [
    (np.array([0.5, 0.2, 0.1, 0.1, 0.1]), np.array([0.1, 0.1, 0.1, 0.2, 0.5])),
    (np.array([0.25, 0.25, 0.25, 0.25, 0.0]), np.array([0.0, 0.0, 0.5, 0.5, 0.0])),
    (np.array([0.7, 0.1, 0.1, 0.05, 0.05]), np.array([0.7, 0.1, 0.1, 0.05, 0.05])),
    (np.array([0.05, 0.05, 0.3, 0.3, 0.3]), np.array([0.9, 0.025, 0.025, 0.025, 0.025])),
]


@pytest.mark.parametrize("p,q", PAIRS)
def test_rejection_sampler_first_token_follows_target(p, q):
    rng = np.random.default_rng(42)
    counts = np.zeros(len(p))
    for _ in range(N):
        d = sample(q, rng)
        n_acc, nxt = verify_sampled([d], [q], [p, p], rng)
        counts[d if n_acc == 1 else nxt] += 1
    stat, df = chi_square(counts, p)
    assert stat < CHI2_999[df], (stat, counts / N, p)


@pytest.mark.parametrize("p", [PAIRS[0][0], PAIRS[3][0]])
def test_deterministic_proposal_follows_target(p):
    """An n-gram proposal is a point mass: accept with p(d), else resample p without d."""
    rng = np.random.default_rng(7)
    counts = np.zeros(len(p))
    for i in range(N):
        d = i % len(p)  # any fixed proposal scheme
        n_acc, nxt = verify_sampled([d], None, [p, p], rng)
        counts[d if n_acc else nxt] += 1
    # proposals cycle uniformly, so the mix over proposals must still be p
    stat, df = chi_square(counts, p)
    assert stat < CHI2_999[df]


def test_second_position_follows_target_given_first():
    p1 = np.array([0.6, 0.4, 0.0, 0.0])
    q1 = np.array([0.3, 0.7, 0.0, 0.0])
    p2 = np.array([0.1, 0.2, 0.3, 0.4])
    q2 = np.array([0.4, 0.3, 0.2, 0.1])
    rng = np.random.default_rng(3)
    counts = np.zeros(4)
    for _ in range(N):
        d1, d2 = sample(q1, rng), sample(q2, rng)
        n_acc, nxt = verify_sampled([d1, d2], [q1, q2], [p1, p2, p2], rng)
        seq = [d1, d2][:n_acc] + [nxt]
        if len(seq) >= 2:
            counts[seq[1]] += 1
    stat, df = chi_square(counts, p2)
    assert stat < CHI2_999[df]


def test_warp_greedy_is_one_hot():
    probs = warp(np.array([0.1, 3.0, 2.0], dtype=np.float32), SamplingConfig())
    assert probs.tolist() == [0.0, 1.0, 0.0]


def test_warp_top_k_top_p_min_p():
    logits = np.log(np.array([0.4, 0.3, 0.2, 0.06, 0.04])).astype(np.float32)
    cfg = SamplingConfig(temperature=1.0, top_k=3, top_p=1.0, min_p=0.0)
    assert np.count_nonzero(warp(logits, cfg)) == 3
    cfg = SamplingConfig(temperature=1.0, top_k=0, top_p=0.65, min_p=0.0)
    assert np.count_nonzero(warp(logits, cfg)) == 2
    cfg = SamplingConfig(temperature=1.0, top_k=0, top_p=1.0, min_p=0.4)
    assert np.count_nonzero(warp(logits, cfg)) == 3  # >= 0.4 * 0.4
    probs = warp(logits, SamplingConfig(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0))
    assert probs == pytest.approx([0.4, 0.3, 0.2, 0.06, 0.04], rel=1e-5)


def test_repeat_penalty_lowers_seen_tokens():
    logits = np.array([2.0, 2.0, -1.0], dtype=np.float32)
    cfg = SamplingConfig(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=2.0)
    probs = warp(logits, cfg, history=[0, 2])
    assert probs[0] < probs[1]


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"temperature": -1}, "--temperature"),
        ({"top_p": 0}, "--top-p"),
        ({"top_k": -2}, "--top-k"),
        ({"min_p": 1.5}, "--min-p"),
        ({"repeat_penalty": 0}, "--repeat-penalty"),
        ({"seed": -3}, "--seed"),
    ],
)
def test_invalid_sampling_values(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        SamplingConfig(**kwargs)


@pytest.mark.parametrize("temperature", [1e-310, 5e-324, 1e-300, 1e-6, 9.99e-6])
def test_tiny_and_denormal_temperatures_are_greedy(temperature):
    from edgespec.sampling import GREEDY_BELOW

    cfg = SamplingConfig(temperature=temperature, top_k=0, top_p=1.0, min_p=0.0)
    assert temperature < GREEDY_BELOW and cfg.greedy
    logits = np.array([3.0, 30.5, 30.4, -2.0], dtype=np.float32)
    with np.errstate(all="raise"):  # an overflow or a NaN would raise here
        probs = warp(logits, cfg)
    assert probs.tolist() == [0.0, 1.0, 0.0, 0.0]


def test_the_smallest_sampled_temperature_does_not_overflow():
    from edgespec.sampling import GREEDY_BELOW

    cfg = SamplingConfig(temperature=GREEDY_BELOW, top_k=0, top_p=1.0, min_p=0.0)
    assert not cfg.greedy
    logits = np.array([3.0, 30.5, 30.5, -2.0], dtype=np.float32)  # an exact tie stays a coin flip
    with np.errstate(over="raise", invalid="raise"):
        probs = warp(logits, cfg)
    assert np.isfinite(probs).all() and probs[1] == probs[2] == 0.5
