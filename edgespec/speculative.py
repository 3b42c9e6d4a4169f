"""The speculative decoding core: verification and the decode loop (the drafters are in drafters.py).

Pure: no llama_cpp import, no printing. Models are reached through the `Model` protocol.
Each round drafts up to K tokens, verifies `[pending, d1..dK]` in ONE target batch, keeps the
longest valid prefix plus the target's own next token, and trims both KV caches to match.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator, Sequence

import numpy as np

from .config import DEFAULT_DRAFT_MAX, Mode
from .controller import Controller, Load
from .drafters import EMPTY, Draft, Model, ModelDrafter, NgramDrafter, common_prefix_len, sync_kv
from .errors import ContextError
from .sampling import SamplingConfig, sample, warp

__all__ = ["LoopStats", "RoundLog", "SpecSettings", "SpeculativeDecoder", "TokenEvent", "top2_margin",
           "verify_greedy", "verify_sampled"]


@dataclass(frozen=True)
class TokenEvent:
    token: int
    source: str  # "target" | "draft" | "ngram"
    round: int


# ---- verification -----------------------------------------------------------------------------
def top2_margin(row: np.ndarray) -> float:
    """Top-1 minus top-2 logit: how near a tie the greedy choice in this row was."""
    top2 = np.partition(row, -2)[-2:]
    return float(top2[1] - top2[0])


def verify_greedy(draft: Sequence[int], logits: np.ndarray) -> tuple[int, int]:
    """Accept while the target's argmax matches; return (n_accepted, the target's next token).

    Row by row: a long draft rejected early leaves most rows unread (each is a vocabulary-wide argmax).
    """
    for i, tok in enumerate(draft):
        best = int(np.argmax(logits[i]))
        if best != tok:
            return i, best
    return len(draft), int(np.argmax(logits[len(draft)]))


def verify_sampled(
    draft: Sequence[int],
    q_rows: Sequence[np.ndarray] | None,
    p_rows: Sequence[np.ndarray],
    rng: np.random.Generator,
) -> tuple[int, int]:
    """Leviathan/Chen rejection sampling: the output is distributed exactly as the target's p.

    Accept d_i with probability min(1, p(d_i)/q(d_i)); on rejection sample from
    normalize(max(0, p - q)); if all are accepted, the bonus token comes from p.
    A deterministic proposal (q_rows None) is the point mass q = 1 at d_i.
    """
    for i, tok in enumerate(draft):
        p = p_rows[i]
        q_tok = 1.0 if q_rows is None else float(q_rows[i][tok])
        if q_tok > 0 and rng.random() * q_tok < p[tok]:
            continue
        if q_rows is None:
            residual = p.copy()
            residual[tok] = 0.0
        else:
            residual = np.maximum(p - q_rows[i], 0.0)
        total = residual.sum()
        return i, sample(residual / total if total > 0 else p, rng)
    return len(draft), sample(p_rows[len(draft)], rng)


# ---- the loop ---------------------------------------------------------------------------------
@dataclass
class RoundLog:
    k: int
    drafted: int
    accepted: int
    source: str
    draft_s: float
    verify_s: float


@dataclass
class LoopStats:
    prompt_tokens: int = 0
    prompt_cached: int = 0
    prompt_s: float = 0.0
    rounds: list[RoundLog] = field(default_factory=list)
    token_times: list[float] = field(default_factory=list)  # perf_counter at each emitted token
    sources: list[str] = field(default_factory=list)
    start: float = 0.0
    finish_reason: str | None = None
    # With record_margins: per emitted token, the target's top-1 minus top-2 logit in the row that
    # chose it (how close a call it was; bench --verify judges divergences by it).
    margins: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class SpecSettings:
    mode: Mode = Mode.AUTO
    draft_max: int = DEFAULT_DRAFT_MAX  # the longest draft a round may verify (the controller's k_max)
    probe_every: int = 16  # rounds between probes of an "off" draft model (doubles while it stays off)
    probe_max: int = 256

    def __post_init__(self):
        object.__setattr__(self, "mode", Mode(self.mode))


class SpeculativeDecoder:
    """One sequence's generation over a target (and optional drafters).

    `generate` runs it alone, yielding TokenEvents. A batch scheduler runs the same steps for many
    sequences at once: `start`, prefill chunks (`prefill_chunk`/`prefilled`), then per round
    `plan` (the rows to verify) and `apply` (their logits -> emitted tokens), and `close`."""

    def __init__(
        self,
        target: Model,
        sampling: SamplingConfig,
        controller: Controller,
        settings: SpecSettings,
        *,
        ngram: NgramDrafter | None = None,
        drafter: ModelDrafter | None = None,
        record_margins: bool = False,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.target = target
        self.clock = clock  # every time the decoder records or learns from (tests script it)
        self.record_margins = record_margins
        self.sampling = sampling
        self.controller = controller
        self.settings = settings
        self.ngram = ngram
        self.drafter = drafter
        self.rng = np.random.default_rng(sampling.seed)
        self.stats = LoopStats()
        self._probe_gap = settings.probe_every
        self._rounds_off = 0
        self._shadow: tuple[Draft, int] | None = None
        self._ctx: list[int] = []
        self._todo: list[int] = []
        self._pending: Draft | None = None
        self._load: Load | None = None
        self._expected = 1.0
        # A backend whose logits are batch-invariant only up to some batch size says so.
        limit = getattr(target, "max_exact_batch", None)
        self._max_draft = settings.draft_max if limit is None else min(settings.draft_max, limit - 1)

    # ---- one sequence, start to end -------------------------------------------------------
    def generate(self, prompt: Sequence[int], max_tokens: int) -> Iterator[TokenEvent]:
        """Decode alone: the steps a batch scheduler runs for many sequences, with one (here the
        prompt is read in a batch of its own and the first round follows it; the batcher runs a
        prompt's last chunk and its first round together)."""
        self.start(prompt, max_tokens)
        try:
            if self.prefill_left:
                todo = self._todo
                self.target.decode(todo)
                self.prefilled(len(todo))
            while not self.done:
                batch = self.plan()
                t0 = self.clock()
                logits = self.target.decode(batch, range(len(batch)))
                yield from self.apply(logits, self.clock() - t0, len(batch))
        finally:
            self.close()

    # ---- the steps, for a scheduler ------------------------------------------------------
    def start(self, prompt: Sequence[int], max_tokens: int) -> None:
        """Begin a generation: what the target's cache lacks of the prompt is left to prefill."""
        if not prompt:
            raise ContextError("empty prompt: nothing to continue from")
        if len(prompt) >= self.target.n_ctx:
            raise ContextError(
                f"the prompt is {len(prompt)} tokens but the context holds {self.target.n_ctx}; "
                "use a larger --ctx-size or a shorter prompt"
            )
        self.stats = st = LoopStats(start=self.clock())
        self._ctx = list(prompt)
        if self.ngram is not None:
            self.ngram.start(len(self._ctx))  # what follows is this answer's own (drafters: "echo")
        self._max_tokens = max_tokens
        self._emitted = 0
        self._round_no = 0
        self._pending: Draft | None = None
        self._draft_s = 0.0
        self._todo = sync_kv(self.target, self._ctx[:-1])  # the last token goes with the first verify
        st.prompt_tokens = len(self._ctx)
        st.prompt_cached = len(self._ctx) - 1 - len(self._todo)
        if not self._todo:
            st.prompt_s = self.clock() - st.start
            self._check_end()

    @property
    def prefill_left(self) -> int:
        return len(self._todo)

    def prefill_chunk(self, n: int) -> list[int]:
        """The next n prompt tokens to decode (the caller decodes them, then calls prefilled)."""
        return self._todo[:n]

    def prefilled(self, n: int) -> None:
        self._read(n)
        if not self._todo:
            self._check_end()

    def _read(self, n: int) -> None:
        if not n:
            return
        del self._todo[:n]
        if not self._todo:
            self.stats.prompt_s = self.clock() - self.stats.start

    @property
    def done(self) -> bool:
        return self.stats.finish_reason is not None

    @property
    def context(self) -> list[int]:
        return self._ctx

    def plan(self, *, k_limit: int | None = None, load: Load | None = None) -> list[int]:
        """Draft for the next round; return the rows to verify: the last token, then the drafts.

        `k_limit` caps the draft (a batch's row budget); `load` is what the rest of the batch
        already holds, so the draft length is chosen for the whole batch's throughput.

        Planned before the prompt is all read, the round goes in the same batch as the rest of it
        (`prefill_chunk(prefill_left)`, then these rows): the first token comes with the prompt's
        last chunk instead of a pass later."""
        assert not self.done, "plan() before the end"
        ctx = self._ctx
        self._base = len(self.target.tokens) + len(self._todo)  # the cache's tokens before this round's rows
        room = self.target.n_ctx - self._base - 1
        k_cap = min(room, self._max_tokens - self._emitted - 1, self._max_draft)
        if k_limit is not None:
            k_cap = min(k_cap, k_limit)
        self._check_shadow(ctx)
        t0 = self.clock()
        self._load = load
        draft = self._draft(ctx, k_cap) if k_cap > 0 else EMPTY
        self._draft_s = self.clock() - t0
        self._pending = draft
        return [ctx[-1], *draft.tokens]

    def apply(self, logits: np.ndarray, verify_s: float, batch_rows: int) -> list[TokenEvent]:
        """Verify the planned round against its logits rows; return the tokens it emits.

        `verify_s` and `batch_rows`: how long the batch that held these rows took, and how many
        rows it had in all (other sequences' included): what the controller learns timing from."""
        draft, self._pending = self._pending, None
        assert draft is not None, "apply() follows plan()"
        assert logits.shape[0] == len(draft.tokens) + 1, "one logits row per drafted token, plus one"
        self._read(len(self._todo))  # the rest of the prompt, if planned with it, was read in the same batch
        n_acc, nxt = self._verify(self._ctx, draft, logits)
        if self.record_margins:
            self.stats.margins.extend(top2_margin(logits[i]) for i in range(n_acc + 1))
        self.target.trim(self._base + 1 + n_acc)
        if draft.tokens:
            drafted = len(draft.tokens)
            if draft.confidence is not None and n_acc < drafted and draft.confidence[n_acc] < 1.0:
                drafted = n_acc  # rejected at a guessed edit: the drafter's own record of that edit learns from it, not the state
            self.controller.observe_path(draft.states(drafted), n_acc)
            if draft.source == "draft":
                self.controller.observe_draft(len(draft.tokens), self._draft_s)
        self.controller.observe_verify(batch_rows, verify_s, depth=self._base)
        self.stats.rounds.append(RoundLog(len(draft.tokens), len(draft.tokens), n_acc, draft.source,
                                          self._draft_s, verify_s))
        new = [*draft.tokens[:n_acc], nxt]
        sources = [draft.source] * n_acc + ["target"]
        st = self.stats
        out: list[TokenEvent] = []
        for i, (tok, src) in enumerate(zip(new, sources)):
            if self.target.is_eog(tok):
                st.finish_reason = "stop"
                # drafts at or after the end of the answer were not part of it
                st.rounds[-1].accepted = min(st.rounds[-1].accepted, i)
                return out
            self._ctx.append(tok)
            self._emitted += 1
            st.token_times.append(self.clock())
            st.sources.append(src)
            out.append(TokenEvent(tok, src, self._round_no))
            if self._emitted >= self._max_tokens:
                break
        self._round_no += 1
        self._check_end()
        return out

    def close(self) -> None:
        """End the generation (finished or not): each cache keeps a prefix of what was emitted."""
        self._pending = None
        self._settle(self._ctx)

    @property
    def planned(self) -> Draft:
        """The draft of the round planned and not yet applied (EMPTY when none)."""
        return self._pending or EMPTY

    @property
    def expected_tokens(self) -> float:
        """What the planned round is expected to emit (the controller's estimate)."""
        return self._expected

    def _check_end(self) -> None:
        if self._emitted >= self._max_tokens or self.target.n_ctx - len(self.target.tokens) - 1 < 0:
            self.stats.finish_reason = "length"

    def _verify(self, ctx: list[int], draft: Draft, logits: np.ndarray) -> tuple[int, int]:
        if self.sampling.greedy:
            return verify_greedy(draft.tokens, logits)
        history = list(ctx)
        p_rows = []
        for i in range(logits.shape[0]):
            p_rows.append(warp(logits[i], self.sampling, history))
            if i < len(draft.tokens):
                history.append(draft.tokens[i])
        return verify_sampled(draft.tokens, draft.probs, p_rows, self.rng)

    def _draft(self, ctx: list[int], k_cap: int) -> Draft:
        mode = self.settings.mode
        self._expected = 1.0
        if mode is Mode.OFF:
            return EMPTY
        c = self.controller
        load = self._load
        depth = self._base  # tokens in the KV cache before this round's rows
        candidate = EMPTY
        if self.ngram is not None and mode.uses_ngram:
            proposal = self.ngram.propose(ctx, min(k_cap, c.k_max)).until_end(self.target.is_eog)
            if proposal.tokens:
                choice = c.choose(proposal.key, 0.0, len(proposal.tokens), prior=proposal.prior,
                                  confidence=proposal.confidence, load=load, depth=depth, path=proposal.path,
                                  history=proposal.history)
                if choice.k == 0:
                    self._start_shadow(ctx, proposal)
                else:
                    candidate = replace(proposal, tokens=proposal.tokens[: choice.k])
                    self._expected = choice.expected_tokens
        if candidate.tokens or self.drafter is None or not mode.uses_draft_model:
            return candidate
        choice = c.choose("draft", c.cost.draft_cost, k_cap, load=load, depth=depth)
        self._expected = choice.expected_tokens
        k = choice.k
        if k == 0:
            k = self._probe_k(ctx, k_cap)
        else:
            self._probe_gap = self.settings.probe_every
            self._rounds_off = 0
        return self.drafter.propose(ctx, k).until_end(self.target.is_eog) if k > 0 else EMPTY

    # A probe is a bet of a few drafted tokens, but a draft model that has not seen the context must
    # first decode all of it (after a long prompt that costs more than the probe could win back, on
    # a model the costs already said does not pay; README: "the probe rule"). Probe only a cache this close.
    PROBE_CATCHUP_MAX = 32

    def _probe_k(self, ctx: list[int], k_cap: int) -> int:
        """While the draft model looks unprofitable, try it now and then (backing off) in case that changed."""
        # the cheap test first: after a long prompt the draft model is behind in every round
        if self.drafter.behind(ctx) > self.PROBE_CATCHUP_MAX:
            return 0
        if not self.controller.could_pay(self.controller.cost.draft_cost, k_cap, depth=self._base):
            return 0
        self._rounds_off += 1
        if self._rounds_off < self._probe_gap:
            return 0
        self._rounds_off = 0
        self._probe_gap = min(self._probe_gap * 2, self.settings.probe_max)
        return min(self.controller.k_min + 1, k_cap, self.controller.k_max)

    # ---- free acceptance measurement for the n-gram drafter while it is off ---------------
    # Long enough to see a copy hold, short enough to resolve within a few tokens: a 60-token
    # shadow would report only after 60 tokens, and the state it measures would be long gone.
    SHADOW_MAX = 12

    def _start_shadow(self, ctx: list[int], proposal: Draft) -> None:
        if self._shadow is None:
            self._shadow = (replace(proposal, tokens=proposal.tokens[: self.SHADOW_MAX]), len(ctx))

    def _check_shadow(self, ctx: list[int]) -> None:
        if self._shadow is None:
            return
        proposal, at = self._shadow
        tokens, seen = proposal.tokens, ctx[at:]
        n = common_prefix_len(tokens, seen)
        if n < len(tokens) and n == len(seen):
            return  # still unfolding
        self.controller.observe_path(proposal.states(len(tokens)), n)
        self._shadow = None

    def _settle(self, ctx: list[int]) -> None:
        """Leave each KV cache holding a prefix of what was emitted (nothing beyond a stop)."""
        self.target.trim(common_prefix_len(self.target.tokens, ctx))
        if self.drafter is not None:
            self.drafter.settle(ctx)
        self._shadow = None
