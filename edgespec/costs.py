"""What a verify batch costs on this machine: v(k, depth) = t(k, depth) / t(1, depth).

The profile times k-row target batches at a few context depths (the number of tokens already in
the KV cache when the batch runs). Costs grow with the depth, and not alike for every batch size
(README, *How it works*: a single pass can slow down far more than a verify batch), so v(k) read
at depth 0 misjudges drafts deep in a long prompt. The cost model answers at the depth of the round:

- within one measured depth, the staircase rule: between measured sizes, the next measured one's
  cost (CPU kernels work in row tiles); outside them, the nearest end's slope;
- between measured depths, each t(k) linearly in the depth (attention is linear in the cells it
  reads); beyond the deepest, the last stretch's growth per token, never below none.

A cost model without depth tables (a profile saved before they were measured, live timing, the
prior) answers the same v(k) at every depth, as before. Pure: no llama_cpp, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

# Conservative CPU-shaped prior until the profile or live timing says otherwise:
# verifying k tokens costs about 1 + 0.5 (k - 1) single-token passes on a small CPU (measured here).
PRIOR_VERIFY_SLOPE = 0.5
MIN_SLOPE = 0.02  # extrapolating past the largest measured batch: never below 1 + 0.02 per row
ANY_SIZE = 0  # CostModel.live_shape's key for the factor of all batches together (sizes not timed)


def staircase(verify: Mapping[int, float], k: int, slope: float = PRIOR_VERIFY_SLOPE) -> float:
    """v(k) from one depth's measured table {k: t(k)/t(1)}."""
    if k <= 1:
        return 1.0
    if k in verify:
        return verify[k]
    # the nearest measured sizes either side (one pass, no sorting: this runs for every candidate
    # draft length of every round)
    below = above = None
    for x in verify:
        if 1 < x < k and (below is None or x > below):
            below = x
        elif x > k and (above is None or x < above):
            above = x
    if below is None and above is None:
        return 1.0 + slope * (k - 1)
    if below is not None and above is not None:
        # Between measured sizes, the next measured one's cost: CPU kernels work in row tiles,
        # so cost is a staircase, not a line (measured on 2 cores: t(16) 257 ms, t(17) 313,
        # t(20) 345, t(24) 408; a line from 16 to 24 says 276 for 17). Unmeasured sizes
        # may cost up to that much; the measured, tile-aligned ones are what the choice should use.
        return max(verify[above], verify[below])
    # Outside the measured range: extend with the slope of the nearest end; below the smallest
    # measured size, never under one pass (a table of one large batch that ran at a single pass's
    # speed, as live timing may first see, would otherwise extrapolate to nothing).
    a = below if below is not None else above
    end_slope = max((verify[a] - 1.0) / (a - 1), MIN_SLOPE)
    return max(1.0, verify[a] + end_slope * (k - a))


@dataclass(frozen=True)
class DepthCosts:
    """One measured depth: t(1) in ms and v(k) = t(k)/t(1) there."""

    t1_ms: float
    verify: Mapping[int, float]
    # t_ms's answers: a measured table never changes, and the controller reads the same sizes every round
    _steps: dict[tuple[int, float], float] = field(default_factory=dict, init=False, repr=False, compare=False)

    def t_ms(self, k: int, slope: float = PRIOR_VERIFY_SLOPE) -> float:
        got = self._steps.get((k, slope))
        if got is None:
            got = self._steps[k, slope] = self.t1_ms * staircase(self.verify, k, slope)
        return got


@dataclass
class CostModel:
    """Relative costs: v(k, depth) for a k-token verify batch; c = draft token / target token.

    `verify` and `t1_ms` are the table at depth 0 (a profile from before depth tables: its only
    table, read as depth 0); `deeper` holds the tables measured at depths > 0. Without a profile,
    live timing writes `verify`; with one, `live_shape` (see Controller)."""

    verify: dict[int, float] = field(default_factory=dict)
    draft_cost: float = 0.6
    slope: float = PRIOR_VERIFY_SLOPE
    t1_ms: float | None = None  # the profile's own t(1) at depth 0: live timing is checked against it
    deeper: dict[int, DepthCosts] = field(default_factory=dict)
    # Live timing's correction to the profile's shape: {k: factor} for the batch sizes this run
    # timed and ANY_SIZE for the rest, v(k) multiplied by it (timing.LiveTiming.shape). Replaced
    # whole, never mutated: copies made with dataclasses.replace share it.
    live_shape: Mapping[int, float] = field(default_factory=dict)
    # A typical pass over the fastest: the tables hold each size's fastest run (measure.py), a live
    # pass is one run like any other, and on a jittery VM the median run is well above the fastest
    # (README, *How it works*): checked against the fastest alone, a profile measured minutes
    # before was called stale (measure.typical_factor; 1.0: a profile saved before it was measured).
    typical: float = 1.0
    # v(k) before live timing's correction, and t(1) in ms, at the depth last asked (one round's
    # candidate lengths are all costed at that round's depth, by each choice the round makes). Only for
    # depth tables: they come from a profile and are never rewritten (live timing rewrites `verify`
    # only without one).
    # Not locked: one thread decodes (the server's too: scheduler's edgespec-generate thread).
    _at_depth: int | None = field(default=None, init=False, repr=False, compare=False)
    _at: dict[int, float] = field(default_factory=dict, init=False, repr=False, compare=False)
    _around_at: tuple[int, int | None, int] = field(default=(0, None, 0), init=False, repr=False, compare=False)
    _t1_at: float = field(default=1.0, init=False, repr=False, compare=False)
    _table0: DepthCosts | None = field(default=None, init=False, repr=False, compare=False)

    # ---- answers ------------------------------------------------------------------------------
    @property
    def depth_aware(self) -> bool:
        return bool(self.deeper) and self.t1_ms is not None

    def v(self, k: int, depth: int = 0) -> float:
        if k <= 1:
            return 1.0
        if not self.depth_aware or depth <= 0:
            base = staircase(self.verify, k, self.slope)
        else:
            if depth != self._at_depth:
                around = self._around(depth)
                self._at_depth, self._at, self._around_at = depth, {}, around
                self._t1_at = self._t_ms(1, depth, around)
            base = self._at.get(k)
            if base is None:
                base = self._at[k] = self._t_ms(k, depth, self._around_at) / self._t1_at
        return max(1.0, base * self.shape_factor(k))

    def shape_factor(self, k: int) -> float:
        """Live timing's correction at batch size k: its own where this size was timed, else that of
        all batches together; none before live timing has said anything."""
        if not self.live_shape or k <= 1:
            return 1.0
        return self.live_shape.get(k, self.live_shape.get(ANY_SIZE, 1.0))

    def t_ms(self, k: int, depth: int = 0) -> float | None:
        """Milliseconds of a k-row batch at this depth; None without an absolute scale (no profile)."""
        if self.t1_ms is None:
            return None
        if not self.depth_aware:
            return self.t1_ms * staircase(self.verify, k, self.slope)
        return self._t_ms(k, depth)

    def typical_ms(self, k: int, depth: int = 0) -> float | None:
        """What a typical k-row pass at this depth takes (t_ms times `typical`): live timing's reference."""
        t = self.t_ms(k, depth)
        return None if t is None else t * self.typical

    def t1_at(self, depth: int = 0) -> float | None:
        """t(1) in ms at this depth (None without a profile)."""
        return self.t_ms(1, depth)

    def sizes(self) -> set[int]:
        """Every batch size measured at some depth (where the cost staircase steps)."""
        out = set(self.verify)
        for table in self.deeper.values():
            out |= set(table.verify)
        return {k for k in out if k > 1}

    def depths(self) -> list[int]:
        return [0, *sorted(self.deeper)] if self.depth_aware else [0]

    def _around(self, depth: int) -> tuple[int, int | None, int]:
        """The measured depths about this one: the deepest not past it (lo; 0 is always measured),
        the next deeper (hi; None past the deepest) and, past the deepest, the one before lo. No
        lists: this runs for every candidate draft length of every round."""
        lo, hi = 0, None
        for d in self.deeper:
            if d <= depth and d > lo:
                lo = d
            elif d > depth and (hi is None or d < hi):
                hi = d
        prev = 0
        if hi is None:
            for d in self.deeper:
                if prev < d < lo:
                    prev = d
        return lo, hi, prev

    def _t_ms(self, k: int, depth: int, around: tuple[int, int | None, int] | None = None) -> float:
        depth = max(depth, 0)
        lo, hi, prev = around or self._around(depth)
        t_lo = self._table_ms(lo, k)
        if hi is not None:
            return t_lo + (self._table_ms(hi, k) - t_lo) * (depth - lo) / (hi - lo)
        # beyond the deepest table: its last stretch's growth per token, never a shrinking cost
        growth = (t_lo - self._table_ms(prev, k)) / (lo - prev)
        return t_lo + max(0.0, growth) * (depth - lo)

    def _table_ms(self, depth: int, k: int) -> float:
        """t(k) in ms from the table measured at exactly this depth."""
        if depth:
            return self.deeper[depth].t_ms(k, self.slope)
        if self._table0 is None:  # `verify` as a table of its own, for its kept steps
            self._table0 = DepthCosts(self.t1_ms or 0.0, self.verify)
        return self._table0.t_ms(k, self.slope)

    # ---- storage ------------------------------------------------------------------------------
    def to_json(self) -> dict:
        data = {"verify": {str(k): v for k, v in sorted(self.verify.items())}, "draft_cost": self.draft_cost}
        if self.t1_ms is not None:
            data["t1_ms"] = self.t1_ms
        if self.typical != 1.0:
            data["typical"] = self.typical
        if self.deeper:
            data["depths"] = {str(d): {"t1_ms": t.t1_ms, "verify": {str(k): v for k, v in sorted(t.verify.items())}}
                              for d, t in sorted(self.deeper.items())}
        return data

    @classmethod
    def from_json(cls, data: dict) -> "CostModel":
        t1 = data.get("t1_ms")
        typical = data.get("typical", 1.0)
        deeper = {}
        raw = data.get("depths")
        if isinstance(raw, dict):
            for d, table in raw.items():
                try:
                    depth, t1_d = int(d), float(table["t1_ms"])
                    verify = {int(k): float(v) for k, v in table.get("verify", {}).items()}
                except (KeyError, TypeError, ValueError, AttributeError):
                    continue  # one damaged depth is ignored, not the profile
                if depth > 0 and t1_d > 0:
                    deeper[depth] = DepthCosts(t1_d, verify)
        return cls(
            verify={int(k): float(v) for k, v in data.get("verify", {}).items()},
            draft_cost=float(data.get("draft_cost", 0.6)),
            t1_ms=float(t1) if isinstance(t1, (int, float)) and t1 > 0 else None,
            deeper=deeper,
            typical=float(typical) if isinstance(typical, (int, float)) and 1.0 <= typical < 10.0 else 1.0,
        )

    @classmethod
    def from_ms(cls, target_ms: Mapping[int, Mapping[int, float]], draft_ms: float | None = None) -> "CostModel":
        """From measured milliseconds {depth: {k: t(k)}} (each depth with k = 1); c = draft t(1) / t(1) at
        the shallowest depth (the draft's cost grows with the context as the target's does)."""
        ds = sorted(target_ms)
        if not ds or any(1 not in target_ms[d] for d in ds):
            raise ValueError("every depth needs t(1)")

        def table(ms: Mapping[int, float]) -> tuple[float, dict[int, float]]:
            t1 = ms[1]
            return t1, {k: max(1.0, v / t1) for k, v in ms.items() if k > 1}

        t1, verify = table(target_ms[ds[0]])  # the shallowest (0 in every profile) is the base table
        deeper = {d: DepthCosts(*table(target_ms[d])) for d in ds[1:]}
        return cls(verify=verify, draft_cost=(draft_ms / t1) if draft_ms else 0.0, t1_ms=t1, deeper=deeper)
