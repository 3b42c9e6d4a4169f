"""Live timing of the target and the draft, checked against the saved profile.

The controller's costs come from `edgespec profile`; a profile measured on a busy machine (or
before the machine changed) lies, and every decision built on it is wrong. This module learns
t(1), t(k) and the draft's cost from the passes a generation makes anyway, and notices when the
profile disagrees with them for long enough: then the live estimate replaces it (in memory only).

Like is compared with like: a pass of k rows that ran with d tokens in the KV cache is checked
against the profile's t(k, d) (costs.py), so a long prompt, whose passes are slower because the
context is longer, does not make a fresh profile look stale.

Pure: durations come in as seconds from whatever clock the caller uses; no I/O, no printing. The
caller reads `stale` / `take_notice()` and says so (the render layer prints STALE_MESSAGE).
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from .costs import ANY_SIZE

# A profile is stale when the median of the last STALE_PASSES target passes, each compared with
# what the profile predicts for its batch size, is off by more than STALE_RATIO either way.
# The median over a window, not a streak: one quick pass must not hide a busy minute, and one
# slow pass (a page fault, a context switch) must not condemn a good profile.
STALE_RATIO = 0.30
STALE_PASSES = 20
STALE_MESSAGE = "profile looks stale: using live timing; rerun edgespec profile"
EMA_WEIGHT = 0.2  # weight of the newest pass in the running estimates
# The profile's shape (v(k) = t(k)/t(1)) drifts with the machine even while its scale holds: on
# one Xeon t(1) fell by a third within hours and v(16) rose from 3.6 to 4.2. Each batch size's
# recent passes, against the profile's time for them at their depth, correct v(k) by the ratio of
# their median to single passes' median: over the last SHAPE_WINDOW passes of a size, counted
# once both have SHAPE_MIN_PASSES, and only past SHAPE_TOLERANCE (closer is noise: one slow
# batch must not move the draft lengths between identical runs).
SHAPE_WINDOW = 9
SHAPE_MIN_PASSES = 3
SHAPE_TOLERANCE = 0.1
# The correction is anchored on single passes; a decoder drafting every round (batches the profile
# calls nearly free) makes none, and would never learn they are not. After SHAPE_ANCHOR passes
# without one, a round whose draft is a close call is decoded plain (Controller.choose).
SHAPE_ANCHOR = 16


def _ema(prev: float | None, x: float) -> float:
    return x if prev is None else (1.0 - EMA_WEIGHT) * prev + EMA_WEIGHT * x


@dataclass
class LiveTiming:
    """Running estimates of pass times (seconds) and the profile's staleness verdict.

    reference(k, depth): the profile's seconds for a k-token pass with `depth` tokens in the KV
    cache (None: no measured profile, nothing to check).
    """

    reference: Callable[[int, int], float] | None = None
    window: int = STALE_PASSES
    tolerance: float = STALE_RATIO
    t1: float | None = None  # live seconds per 1-token target pass
    tk: dict[int, float] = field(default_factory=dict)  # live seconds per k-token target pass, k > 1
    draft_per_token: float | None = None
    stale: bool = False
    _ratios: deque = field(default_factory=deque, repr=False)
    _implied_t1: deque = field(default_factory=deque, repr=False)
    _by_size: dict = field(default_factory=dict, repr=False)  # k -> recent seconds / profile's, per size
    _batches: deque = field(default_factory=lambda: deque(maxlen=SHAPE_WINDOW), repr=False)  # any k > 1
    _since_single: int = 0  # passes since the last single-row one
    _noticed: bool = False

    def __post_init__(self) -> None:
        self._ratios = deque(maxlen=self.window)
        self._implied_t1 = deque(maxlen=self.window)

    # ---- observations -----------------------------------------------------------------------
    def observe_verify(self, n_tokens: int, seconds: float, depth: int = 0) -> bool:
        """Record one target pass of n_tokens run at `depth`; True when this pass made the profile stale."""
        if n_tokens < 1 or seconds <= 0:
            return False
        self._since_single = 0 if n_tokens == 1 else self._since_single + 1
        if n_tokens == 1:
            self.t1 = _ema(self.t1, seconds)
        else:
            self.tk[n_tokens] = _ema(self.tk.get(n_tokens), seconds)
        if self.reference is None:
            return False
        expected = self.reference(n_tokens, depth)
        if not expected or expected <= 0:
            return False
        ratio = seconds / expected
        self._by_size.setdefault(n_tokens, deque(maxlen=SHAPE_WINDOW)).append(ratio)
        if n_tokens > 1:
            self._batches.append(ratio)
        if self.stale:
            return False
        # t(1) at this depth implied by the pass, for the cost model once the profile is stale
        self._implied_t1.append(ratio * self.reference(1, depth))
        self._ratios.append(ratio)
        if len(self._ratios) < self.window:
            return False
        if abs(statistics.median(self._ratios) - 1.0) > self.tolerance:
            self.stale = True
            return True
        return False

    def observe_draft(self, n_tokens: int, seconds: float) -> None:
        if n_tokens > 0 and seconds > 0:
            self.draft_per_token = _ema(self.draft_per_token, seconds / n_tokens)

    # ---- what the cost model should use -----------------------------------------------------
    def live_t1(self) -> float | None:
        """Seconds per 1-token pass: measured when there were such passes; once the profile is
        stale, otherwise implied by the recent k-token passes (the profile's shape, live scale)."""
        if self.t1 is not None:
            return self.t1
        if self.stale and self._implied_t1:
            return statistics.median(self._implied_t1)
        return None

    def live_verify(self) -> dict[int, float]:
        """v(k) = t(k)/t(1) for every batch size seen live (never below 1)."""
        t1 = self.live_t1()
        if not t1:
            return {}
        return {k: max(1.0, t / t1) for k, t in self.tk.items()}

    @property
    def wants_single(self) -> bool:
        """Whether the shape correction needs a single pass to anchor it (SHAPE_ANCHOR)."""
        if self.reference is None:
            return False
        return len(self._by_size.get(1, ())) < SHAPE_MIN_PASSES or self._since_single >= SHAPE_ANCHOR

    def shape(self) -> dict[int, float]:
        """{k: factor} correcting the profile's v(k) for each batch size timed often enough, and
        for the rest (ANY_SIZE) all batches' together (CostModel.live_shape); a factor within
        SHAPE_TOLERANCE of 1 is 1. Empty while nothing needs correcting."""
        singles = self._by_size.get(1)
        if not singles or len(singles) < SHAPE_MIN_PASSES:
            return {}
        r1 = statistics.median(singles)

        def factor(ratios) -> float:
            f = statistics.median(ratios) / r1
            return f if abs(f - 1.0) > SHAPE_TOLERANCE else 1.0

        sizes = {ANY_SIZE: self._batches, **{k: r for k, r in self._by_size.items() if k > 1}}
        out = {k: factor(r) for k, r in sizes.items() if len(r) >= SHAPE_MIN_PASSES}
        return out if any(f != 1.0 for f in out.values()) else {}

    def live_draft_cost(self) -> float | None:
        t1 = self.live_t1()
        if not t1 or self.draft_per_token is None:
            return None
        return self.draft_per_token / t1

    def take_notice(self) -> bool:
        """True once, the first time it is asked after the profile went stale."""
        if self.stale and not self._noticed:
            self._noticed = True
            return True
        return False
