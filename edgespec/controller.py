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

from dataclasses import dataclass, field, replace
from typing import Protocol, Sequence, Union

from .costs import CostModel
from .timing import LiveTiming

# A drafter state is judged at most POOL_MARGIN above the drafter's pooled recent acceptance (all
# its states together), once that pool holds POOL_MIN_ROUNDS rounds; trusted states (long verified
# copies) are exempt. See Controller.capped_alpha.
POOL_MIN_ROUNDS = 3
POOL_MARGIN = 0.1
POOL_DECAY = 0.7  # the pool follows the last few rounds: text turns from prose to a copy quickly
# A copy draft's chance to hold to its i-th token blends the states' rates along its path with how
# this answer's earlier copies ended (Controller.choose's `history`): the path counts as this many
# of the answer's own runs, so a few earlier breaks shade a long bet and many decide it (weights
# 2 to 16 were compared in the replay harness on five machines' costs: see README).
HISTORY_WEIGHT = 8.0
# One earlier run as long as this one is an anecdote, not a pattern: the history counts from this many
# such runs on. Counted from one, a single long earlier run lifted a short find's bet to a 64-row batch
# that broke at once, and a single earlier break cut a long copy's drafts short (README, *The replay
# harness*).
HISTORY_MIN_RUNS = 2
# A draft must be expected to beat plain decoding by this much: a weak state's rate comes from a few
# shadow rounds, and short bets expected to gain a few percent on it lost more often than not where
# small batches are cheap (replay harness; the margins compared are in README, *The replay harness*).
DRAFT_MARGIN = 0.04
# A copy's draft may risk at most RISK_BASE + RISK_PER_RUN x (its run so far, History.earned) target
# passes: what it costs beyond the single pass it replaces if its first token is wrong. The states'
# rates are averages over answers whose long copies mostly went on for hundreds of tokens; an answer
# that quotes one sentence of a long document holds the same run for a sentence and then breaks, and
# a 64-row bet on it is a loss plain decoding never makes up where wide batches are dear. A run earns
# its bets as it grows (the longer a copy has held, the longer it tends to go on). The constants were
# compared in the replay harness over ten machines' costs (README, *A bet earned by the run*).
RISK_BASE = 4.0
RISK_PER_RUN = 0.6
# A draft expected to gain less than this is a close call: a shape error could have made it, so it
# gives way to a single pass when live timing needs one (timing.SHAPE_ANCHOR).
ANCHOR_GAIN = 1.3


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


class History(Protocol):
    """How long a copy has held and how its context's earlier copies ended (drafters.RunHistory)."""

    run: int

    @property
    def earned(self) -> int: ...  # the copy's verified length: this run and the long copy it resumes

    def reaching(self, length: int) -> int: ...  # earlier runs that held at least `length` tokens


class State(Protocol):
    """One of a drafter's states (drafters.NgramState): a draft is judged by its state's record."""

    drafter: str  # the drafter whose states pool together (Controller.pooled)

    @property
    def trusted(self) -> bool: ...  # evidence of its own: not capped by the pool

    @property
    def prior(self) -> float: ...  # its starting acceptance guess (_prior_of)


# What a draft is judged under: a drafter's name (one estimate for the drafter, as for the draft
# model's "draft") or one of its states.
Key = Union[str, State]


def _prior_of(key: Key) -> float | None:
    """The starting guess a state carries for itself (None: a drafter's name, judged by priors)."""
    return None if isinstance(key, str) else key.prior


def _pool_of(key: Key) -> str | None:
    """The drafter whose pooled record the key's rounds feed (None: a drafter without states)."""
    return None if isinstance(key, str) else key.drafter


@dataclass(frozen=True)
class Choice:
    k: int
    expected_speedup: float
    expected_tokens: float = 1.0  # what the round is expected to emit (the target's own token included)


@dataclass(frozen=True)
class Load:
    """What the rest of a batch holds when one sequence's draft length is chosen: each other
    sequence's rows, the tokens those rows are expected to emit, the drafting time spent on them
    (in target-token units), and the prompt chunks read in the same pass. With several sequences
    in one batch a drafted row competes with every other sequence's rows, so it is worth less than
    it would be alone.

    Prompt chunks are work the step does anyway: they shape what a drafted row adds to the pass
    (llama.cpp's split), but their time is not a cost a draft is judged against. Counted in the
    base, a 64-token chunk made every draft in its step look nearly free (a few more rows on a
    long pass) and the steps that read prompts grew long.

    `streams`: the sequences have a KV stream each, so llama.cpp runs the batch in equal-split
    passes (ubatch_sizes); False: one unified cache, one pass for all the rows."""

    seq_rows: tuple[int, ...] = ()
    tokens: float = 0.0
    draft_cost: float = 0.0
    prompt_rows: tuple[int, ...] = ()
    streams: bool = True

    @property
    def rows(self) -> int:
        return sum(self.seq_rows) + sum(self.prompt_rows)

    def plus(self, rows: int, tokens: float, draft_cost: float = 0.0) -> "Load":
        return replace(self, seq_rows=(*self.seq_rows, rows), tokens=self.tokens + tokens,
                       draft_cost=self.draft_cost + draft_cost)

    def expecting(self, later: int) -> "Load":
        """With `later` sequences still to plan, one row each (the least they can add)."""
        return replace(self, seq_rows=(*self.seq_rows, *[1] * later), tokens=self.tokens + later)


def ubatch_sizes(seq_rows: Sequence[int], streams: bool = True) -> list[int]:
    """How llama.cpp runs a batch whose sequences each have their own KV stream: in passes where
    every sequence still holding rows adds the same number (its "equal split"). Rows (5, 1, 1, 1)
    are two passes, of 4 rows and then 4 of the first sequence; equal rows are one pass. In one
    unified cache (streams False) every batch is one pass."""
    if not streams:
        rows = sum(r for r in seq_rows if r > 0)
        return [rows] if rows else []
    left = sorted(r for r in seq_rows if r > 0)
    sizes, done = [], 0
    for i, r in enumerate(left):
        if r > done:
            sizes.append((len(left) - i) * (r - done))
            done = r
    return sizes


def batch_cost(cost: "CostModel", seq_rows: Sequence[int], depth: int = 0, streams: bool = True) -> float:
    """A multi-sequence batch's cost in single-token passes: the sum of its passes' costs (read
    at one depth: the sequence being planned's)."""
    if len(seq_rows) == 1:  # one sequence: one pass of its rows (every round of a lone decode)
        return cost.v(seq_rows[0], depth) if seq_rows[0] > 0 else 0.0
    return sum(cost.v(n, depth) for n in ubatch_sizes(seq_rows, streams))


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
        margin: float = DRAFT_MARGIN,
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
        self._ks: dict[tuple, list[int]] = {}  # _lengths's answers
        self.acceptance: dict[Key, Acceptance] = {}
        self.pooled: dict[str, Acceptance] = {}  # per drafter, all its states together (see capped_alpha)
        # Timing learnt online; checked against the profile's typical t(k, depth) when the cost model
        # has an absolute scale (a profile measured on a busy machine is replaced by the live
        # estimate, see timing.py). A copy: live timing may replace this controller's tables.
        profile = replace(cost, verify=dict(cost.verify), deeper=dict(cost.deeper))
        self.timing = LiveTiming(reference=(lambda k, d: profile.typical_ms(k, d) / 1000.0) if cost.t1_ms else None)

    def estimate(self, key: Key, prior: float | None = None) -> Acceptance:
        """The acceptance estimate for `key`; a new one starts from the configured prior for the key
        (or its drafter), else from the drafter's own guess for that state, else 0.5."""
        est = self.acceptance.get(key)
        if est is None:
            fallback = 0.5 if prior is None else prior
            start = self.priors.get(key, self.priors.get(_pool_of(key), fallback))
            # The prior counts as one run of its own expected length (1/(1 - prior) tokens), so a
            # state believed to copy ~30 tokens at a time is not written off by one early miss.
            est = self.acceptance[key] = Acceptance(prior=start, weight=max(2.0, min(50.0, 1.0 / (1.0 - start))))
        return est

    def capped_alpha(self, key: Key, prior: float | None = None) -> float:
        """The key's acceptance, capped at POOL_MARGIN above its drafter's pooled recent record.

        States are many (20 for the n-gram drafter) and each learns only from its own rounds; one
        lucky round (a 12-token shadow that held) makes a weak state look strong for a while. In
        free text every such state's next draft is a loss; the pool, fed by every state, says the
        text is not copying. A trusted state (a verified copy run of 16+ tokens) has strong
        evidence of its own and is not capped."""
        est = self.estimate(key, prior)
        pool = _pool_of(key)
        pooled = self.pooled.get(pool) if pool is not None else None
        if pooled is None or key.trusted or pooled.rounds < POOL_MIN_ROUNDS:
            return est.alpha
        return min(est.alpha, pooled.alpha + POOL_MARGIN)

    def choose(self, key: Key, draft_cost: float, k_cap: int | None = None, *, prior: float | None = None,
               confidence: Sequence[float] | None = None, load: Load | None = None,
               depth: int | None = None, path: Sequence[tuple[Key, int]] | None = None,
               history: History | None = None) -> Choice:
        """The K with the most expected tokens per unit time. `confidence[i]` (when given) scales the
        chance of accepting drafted token i on top of the key's per-token rate: a drafter that knows
        a position is a guess (a learnt edit it has seen made only once) says so there. `depth`: the
        tokens in the target's KV cache before this round's verify batch (costs grow with it; None:
        not said, read as 0 — a decoder that does not know it gets today's depth-0 costs). `path`:
        the states the drafted tokens would be drafted in, as (state, tokens) segments from `key`
        (a copy's run grows along its draft): each token is judged at its own state's rate.
        `history`: the copy's run and how this context's earlier runs ended; the chance the draft
        holds to its i-th token is (runs that held run + i + HISTORY_WEIGHT x the path's chance) /
        (runs that held run + HISTORY_WEIGHT), over the earlier runs that held as long as this one,
        once there are HISTORY_MIN_RUNS of them. With a history (a copy), a draft whose rows would
        add more than RISK_BASE + RISK_PER_RUN x history.earned passes (its run, and the long copy
        it picks up again after an edit) is not considered.

        With `load` (the other sequences of the batch), the throughput judged is the whole batch's:
        (load.tokens + E(K)) / (load.draft_cost + K c + cost of the batch with K + 1 more rows),
        against K = 0; the step's prompt chunks change what the K rows add to the pass, not the
        base they are judged against. Without it (one sequence) this is E(K) / (K c + v(K + 1))
        against plain decoding's 1."""
        depth = depth or 0
        alpha = self.capped_alpha(key, prior)
        hi = self.k_max if k_cap is None else min(self.k_max, k_cap)
        load = load or Load()
        others, spent = load.tokens, load.draft_cost
        decoding = spent + batch_cost(self.cost, (*load.seq_rows, 1), depth, load.streams)  # the decode rows' pass alone
        base = (others + 1.0) / decoding
        with_prompts = (*load.prompt_rows, *load.seq_rows)
        plain = batch_cost(self.cost, (*with_prompts, 1), depth, load.streams)

        costed: dict[int, float] = {}  # the risk limit and the rate read the same figure: each k costed once

        def added(k: int) -> float:  # what a k-token draft's rows add to this pass
            got = costed.get(k)
            if got is None:
                got = costed[k] = batch_cost(self.cost, (*with_prompts, k + 1), depth, load.streams) - plain
            return got

        def rate(tokens: float, k: int) -> float:
            return (others + tokens) / (decoding + k * draft_cost + added(k)) / base

        best = Choice(0, 1.0)
        # A forced mode with a short proposal still uses what it has.
        lo = self.k_min if self.allow_off else min(self.k_min, max(hi, 1))
        # the measured batch sizes (drafts + 1) are where the cost staircase steps: always compared
        ks = self._lengths(lo, hi)
        gain = None
        rates = self._rates(path, hi) if path is not None else None
        guessed = confidence is not None and any(c < 1.0 for c in confidence[:hi])
        seen = history.reaching(history.run) if history is not None else 0
        if seen < HISTORY_MIN_RUNS:
            seen = 0
        if guessed or seen or (rates is not None and any(r != alpha for r in rates)):
            gain = [1.0]  # gain[k]: expected tokens from a k-token draft (the target's own token included)
            held = sure = 1.0  # the states' chance the copy holds this far; the learnt edits' confidence
            for i in range(hi):
                held *= alpha if rates is None or i >= len(rates) else rates[i]
                sure *= confidence[i] if confidence is not None and i < len(confidence) else 1.0
                p = held
                if seen:
                    p = (history.reaching(history.run + i + 1) + HISTORY_WEIGHT * held) / (seen + HISTORY_WEIGHT)
                gain.append(gain[-1] + p * sure)
        if guessed:
            # stopping right before a guess is often the best choice: always consider it
            ks = sorted(set(ks) | {i for i, c in enumerate(confidence[:hi]) if c < 1.0 and lo <= i})
        if history is not None:
            allowed = RISK_BASE + RISK_PER_RUN * history.earned
            ks = [k for k in ks if k * draft_cost + added(k) <= allowed] or ([] if self.allow_off else ks[:1])
        # A lone sequence's k rows add v(k + 1) - 1 >= 0 passes and a draft's tokens grow with k, so once
        # the longest draft's tokens over the drafting time of k tokens (and one pass) cannot beat what
        # must be beaten, no longer draft can: a dear draft model's long lengths are never costed.
        lone = bool(ks) and self.allow_off and not (with_prompts or others or spent)
        most = (expected_tokens(alpha, ks[-1]) if gain is None else gain[ks[-1]]) if lone else 0.0
        for k in ks:
            if lone and most / (1.0 + k * draft_cost) < max(best.expected_speedup, 1.0 + self.margin):
                break
            tokens = expected_tokens(alpha, k) if gain is None else gain[k]
            s = rate(tokens, k) if k > 0 else 1.0
            if s > best.expected_speedup or (not self.allow_off and best.k == 0):
                best = Choice(k, s, tokens)
        if self.allow_off and best.expected_speedup < 1.0 + self.margin:
            return Choice(0, 1.0)
        if (self.allow_off and self.learn_timing and not load.seq_rows and best.expected_speedup < ANCHOR_GAIN
                and self.timing.wants_single):
            return Choice(0, 1.0)  # a close call: a single pass anchors live timing (timing.SHAPE_ANCHOR)
        return best

    def _lengths(self, lo: int, hi: int) -> list[int]:
        """The draft lengths a round compares: candidate_ks, and one less than every measured batch
        size (where the cost staircase steps). The same few (lo, hi) come every round: kept, for as
        long as the sizes the costs know stay the same (live timing without a profile adds some; a
        depth's table is never rewritten)."""
        cost = self.cost
        key = (lo, hi, tuple(cost.verify), tuple(cost.deeper))
        got = self._ks.get(key)
        if got is None:
            got = self._ks[key] = sorted(set(candidate_ks(lo, hi)) | {m - 1 for m in cost.sizes() if lo <= m - 1 <= hi})
        return got

    def _rates(self, path: Sequence[tuple[Key, int]], n: int) -> list[float]:
        """Per drafted token (the first n), the acceptance rate of the state it would be drafted in."""
        out: list[float] = []
        for state, length in path:
            if len(out) >= n:
                break
            out.extend([self.capped_alpha(state, _prior_of(state))] * min(length, n - len(out)))
        return out

    def could_pay(self, draft_cost: float, k_cap: int | None = None, alpha: float = 0.98, gain: float = 1.1,
                  *, depth: int | None = None) -> bool:
        """Whether a near-perfect drafter at this cost would beat plain decoding by `gain`.

        If not, probing it is a sure loss: the cost alone rules it out, whatever it would accept.
        """
        hi = self.k_max if k_cap is None else min(self.k_max, k_cap)
        return any(speedup(alpha, k, draft_cost, self.cost, depth or 0) >= gain for k in candidate_ks(1, hi))

    def observe_path(self, segments: Sequence[tuple[Key, int]], accepted: int) -> None:
        """A round drafted along `segments` ((state, tokens), see choose's `path`) that accepted
        `accepted` tokens: each state learns from its own tokens, up to the first rejected one."""
        at = drafted = 0
        for state, length in segments:
            if at > accepted:
                break
            self.estimate(state, _prior_of(state)).observe(length, min(length, accepted - at))
            drafted += min(length, accepted - at + 1)
            at += length
        pool = _pool_of(segments[0][0]) if segments else None
        if pool is not None:  # the pool follows rounds (POOL_DECAY), one observation each
            self.pooled.setdefault(pool, Acceptance(decay=POOL_DECAY)).observe(drafted, min(accepted, drafted))

    def observe(self, key: Key, drafted: int, accepted: int, *, prior: float | None = None) -> None:
        self.estimate(key, prior).observe(drafted, accepted)
        pool = _pool_of(key)
        if pool is not None:
            self.pooled.setdefault(pool, Acceptance(decay=POOL_DECAY)).observe(drafted, accepted)

    # ---- timing ----------------------------------------------------------------------
    def observe_verify(self, n_tokens: int, seconds: float, *, depth: int | None = None) -> None:
        """One target pass of n_tokens rows that ran with `depth` tokens already in the KV cache."""
        if not self.learn_timing or seconds <= 0:
            return
        self.timing.observe_verify(n_tokens, seconds, depth or 0)
        self._apply_live_timing()

    def observe_draft(self, n_tokens: int, seconds: float) -> None:
        if not self.learn_timing or n_tokens <= 0 or seconds <= 0:
            return
        self.timing.observe_draft(n_tokens, seconds)
        self._apply_live_timing()

    def _apply_live_timing(self) -> None:
        if self.timing.reference is not None:
            # A measured profile keeps its tables (every batch size, at every depth measured), its
            # shape corrected where this run's passes say it has drifted (timing.py). Stale (the
            # machine's speed moved by a third) the same holds: only the scale moved, and the scale
            # does not choose a draft length.
            self.cost.live_shape = self.timing.shape()
            if not self.timing.stale:
                return
        else:
            self.cost.verify.update(self.timing.live_verify())
        c = self.timing.live_draft_cost()
        if c is not None:
            self.cost.draft_cost = c

    @property
    def profile_stale(self) -> bool:
        """Whether this run found the saved profile's speed off by more than timing.STALE_RATIO (its
        tables still give the shape, corrected by live timing; the draft's cost is then live)."""
        return self.timing.stale
