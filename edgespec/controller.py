"""Draft-length control from a cost model.

Per round, speculating K tokens with per-token acceptance alpha yields on average
E(K) = (1 - alpha^(K+1)) / (1 - alpha) tokens and costs K*c + v(K+1) target-pass units,
where c is the draft cost per token relative to one target token and v(k) = t(k)/t(1)
is the cost of verifying k tokens in one batch (at the round's context depth: costs.py).
Plain decoding is E=1 at cost v(1)=1. We pick the K that maximises E(K) / (K*c + v(K+1));
K = 0 (no speculation) is a valid answer.
Pure: no llama_cpp, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

from .costs import CostModel
from .timing import LiveTiming

# A drafter state is judged at most POOL_MARGIN above the drafter's pooled recent acceptance (all
# its states together), once that pool holds POOL_MIN_ROUNDS rounds; states whose prior is at
# least POOL_TRUSTED (long verified copies) are exempt. See Controller.capped_alpha.
POOL_MIN_ROUNDS = 3
POOL_MARGIN = 0.1
POOL_TRUSTED = 0.95
POOL_DECAY = 0.7  # the pool follows the last few rounds: text turns from prose to a copy quickly


def expected_tokens(alpha: float, k: int) -> float:
    if k <= 0:
        return 1.0
    if alpha >= 1.0:
        return k + 1.0
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def speedup(alpha: float, k: int, c: float, cost: CostModel, depth: int = 0) -> float:
    """Expected tokens per unit time relative to plain decoding, with `depth` tokens in the KV cache."""
    if k <= 0:
        return 1.0
    return expected_tokens(alpha, k) / (k * c + cost.v(k + 1, depth))


@dataclass
class Acceptance:
    """Decayed estimate of the per-token acceptance rate from (drafted, accepted) rounds.

    A round that accepts a of d drafted tokens shows a successes and one failure if a < d:
    the maximum-likelihood estimate of a truncated geometric.
    """

    prior: float = 0.5
    weight: float = 2.0  # pseudo-observations behind the prior
    decay: float = 0.9
    successes: float = 0.0
    failures: float = 0.0
    rounds: int = 0

    @property
    def alpha(self) -> float:
        s = self.successes + self.prior * self.weight
        f = self.failures + (1.0 - self.prior) * self.weight
        return s / (s + f)

    def observe(self, drafted: int, accepted: int) -> None:
        if drafted <= 0:
            return
        self.successes = self.successes * self.decay + accepted
        self.failures = self.failures * self.decay + (1.0 if accepted < drafted else 0.0)
        self.rounds += 1


def candidate_ks(lo: int, hi: int) -> list[int]:
    """Draft lengths worth comparing: every one up to 8, then a sparser grid (speedup is smooth in K,
    and this runs every round), always including both ends."""
    grid = [k for k in range(lo, min(hi, 8) + 1)]
    step = 2
    k = 10
    while k < hi:
        if k >= lo:
            grid.append(k)
        k += step
        step = 4 if k >= 16 else 2
        step = 8 if k >= 32 else step
    if hi >= lo and (not grid or grid[-1] != hi):
        grid.append(hi)
    return grid


@dataclass(frozen=True)
class Choice:
    k: int
    expected_speedup: float


class Controller:
    """Chooses the draft length per drafter key; learns acceptance and (optionally) timing online."""

    def __init__(
        self,
        cost: CostModel,
        *,
        k_min: int = 1,
        k_max: int = 16,
        allow_off: bool = True,
        learn_timing: bool = True,
        margin: float = 0.02,
        priors: dict[str, float] | None = None,
    ):
        if not 1 <= k_min <= k_max:
            raise ValueError(f"need 1 <= draft-min ({k_min}) <= draft-max ({k_max})")
        self.cost = cost
        self.k_min, self.k_max = k_min, k_max
        self.allow_off = allow_off
        self.learn_timing = learn_timing
        self.margin = margin
        self.priors = dict(priors or {})
        self.acceptance: dict[str, Acceptance] = {}
        self.pooled: dict[str, Acceptance] = {}  # per drafter, all its states together (see capped_alpha)
        # Timing learnt online; checked against the profile's own t(k, depth) when the cost model
        # has an absolute scale (a profile measured on a busy machine is replaced by the live
        # estimate, see timing.py). A copy: live timing may replace this controller's tables.
        profile = replace(cost, verify=dict(cost.verify), deeper=dict(cost.deeper))
        self.timing = LiveTiming(reference=(lambda k, d: profile.t_ms(k, d) / 1000.0) if cost.t1_ms else None)

    def estimate(self, key: str, prior: float | None = None) -> Acceptance:
        """The acceptance estimate for `key`; a new one starts from the configured prior for the key
        (or its drafter), else from the drafter's own guess for that state, else 0.5."""
        est = self.acceptance.get(key)
        if est is None:
            base = key.split("/")[0]
            start = self.priors.get(key, self.priors.get(base, 0.5 if prior is None else prior))
            # The prior counts as one run of its own expected length (1/(1 - prior) tokens), so a
            # state believed to copy ~30 tokens at a time is not written off by one early miss.
            est = self.acceptance[key] = Acceptance(prior=start, weight=max(2.0, min(50.0, 1.0 / (1.0 - start))))
        return est

    def capped_alpha(self, key: str, prior: float | None = None) -> float:
        """The key's acceptance, capped at POOL_MARGIN above its drafter's pooled recent record.

        States are many (28 for the n-gram drafter) and each learns only from its own rounds; one
        lucky round (a 12-token shadow that held) makes a weak state look strong for a while. In
        free text every such state's next draft is a loss; the pool, fed by every state, says the
        text is not copying. States with strong evidence of their own (a 16+-token verified copy
        run: prior >= POOL_TRUSTED) are not capped."""
        est = self.estimate(key, prior)
        base = key.split("/")[0]
        pooled = self.pooled.get(base)
        if key == base or est.prior >= POOL_TRUSTED or pooled is None or pooled.rounds < POOL_MIN_ROUNDS:
            return est.alpha
        return min(est.alpha, pooled.alpha + POOL_MARGIN)

    def choose(self, key: str, draft_cost: float, k_cap: int | None = None, *, prior: float | None = None,
               confidence: Sequence[float] | None = None, depth: int | None = None) -> Choice:
        """The K with the most expected tokens per unit time. `confidence[i]` (when given) scales the
        chance of accepting drafted token i on top of the key's per-token rate: a drafter that knows
        a position is a guess (a learnt edit it has seen made only once) says so there. `depth`: the
        tokens in the target's KV cache before this round's verify batch (costs grow with it; None:
        not said, read as 0 — a decoder that does not know it gets today's depth-0 costs)."""
        depth = depth or 0
        alpha = self.capped_alpha(key, prior)
        hi = self.k_max if k_cap is None else min(self.k_max, k_cap)
        best = Choice(0, 1.0)
        # A forced mode with a short proposal still uses what it has.
        lo = self.k_min if self.allow_off else min(self.k_min, max(hi, 1))
        # the measured batch sizes (drafts + 1) are where the cost staircase steps: always compared
        ks = sorted(set(candidate_ks(lo, hi)) | {m - 1 for m in self.cost.sizes() if lo <= m - 1 <= hi})
        gain = None
        if confidence is not None and any(c < 1.0 for c in confidence[:hi]):
            gain = [1.0]  # gain[k]: expected tokens from a k-token draft (the target's own token included)
            p = 1.0
            for i in range(hi):
                p *= alpha * (confidence[i] if i < len(confidence) else 1.0)
                gain.append(gain[-1] + p)
            # stopping right before a guess is often the best choice: always consider it
            ks = sorted(set(ks) | {i for i, c in enumerate(confidence[:hi]) if c < 1.0 and lo <= i})
        for k in ks:
            if gain is None:
                s = speedup(alpha, k, draft_cost, self.cost, depth)
            else:
                s = gain[k] / (k * draft_cost + self.cost.v(k + 1, depth)) if k > 0 else 1.0
            if s > best.expected_speedup or (not self.allow_off and best.k == 0):
                best = Choice(k, s)
        if self.allow_off and best.expected_speedup < 1.0 + self.margin:
            return Choice(0, 1.0)
        return best

    def could_pay(self, draft_cost: float, k_cap: int | None = None, alpha: float = 0.98, gain: float = 1.1,
                  *, depth: int | None = None) -> bool:
        """Whether a near-perfect drafter at this cost would beat plain decoding by `gain`.

        If not, probing it is a sure loss: the cost alone rules it out, whatever it would accept.
        """
        hi = self.k_max if k_cap is None else min(self.k_max, k_cap)
        return any(speedup(alpha, k, draft_cost, self.cost, depth or 0) >= gain for k in candidate_ks(1, hi))

    def observe(self, key: str, drafted: int, accepted: int, *, prior: float | None = None) -> None:
        self.estimate(key, prior).observe(drafted, accepted)
        base = key.split("/")[0]
        if base != key:
            self.pooled.setdefault(base, Acceptance(decay=POOL_DECAY)).observe(drafted, accepted)

    # ---- timing ----------------------------------------------------------------------
    def observe_verify(self, n_tokens: int, seconds: float, *, depth: int | None = None) -> None:
        """One target pass of n_tokens rows that ran with `depth` tokens already in the KV cache."""
        if not self.learn_timing or seconds <= 0:
            return
        if self.timing.observe_verify(n_tokens, seconds, depth or 0):
            # The profile disagrees with this run: its tables go, live estimates take their place.
            self.cost.forget_measured()
        self._apply_live_timing()

    def observe_draft(self, n_tokens: int, seconds: float) -> None:
        if not self.learn_timing or n_tokens <= 0 or seconds <= 0:
            return
        self.timing.observe_draft(n_tokens, seconds)
        self._apply_live_timing()

    def _apply_live_timing(self) -> None:
        if self.timing.reference is not None and not self.timing.stale:
            # A measured profile that this run agrees with: its costs (repeated, interleaved, the
            # fastest of each) are better than one run's passes, whose noise (a slow 64-row batch
            # now and then) otherwise moved the draft lengths: three identical runs of one copy
            # prompt here drafted 428, 338 and 450 tokens and ran at 35.7, 22.9 and 29.7 tok/s.
            return
        self.cost.verify.update(self.timing.live_verify())
        c = self.timing.live_draft_cost()
        if c is not None:
            self.cost.draft_cost = c

    @property
    def profile_stale(self) -> bool:
        """Whether live timing replaced the saved profile's costs in this controller."""
        return self.timing.stale
