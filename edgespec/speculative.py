"""The speculative decoding core: drafters, verification, and the decode loop.

Pure: no llama_cpp import, no printing. Models are reached through the `Model` protocol.
Each round drafts up to K tokens, verifies `[pending, d1..dK]` in ONE target batch, keeps the
longest valid prefix plus the target's own next token, and trims both KV caches to match.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterator, Protocol, Sequence

import numpy as np

from .controller import Controller
from .errors import ContextError
from .sampling import SamplingConfig, sample, warp


class Model(Protocol):
    n_vocab: int
    n_ctx: int
    tokens: list[int]  # what the KV cache holds, in order
    # optional: max_exact_batch (int | None), the largest batch whose logits equal 1-token decoding

    def decode(self, tokens: Sequence[int], logits_for: Sequence[int] = ()) -> np.ndarray: ...

    def trim(self, n_tokens: int) -> None: ...

    def is_eog(self, token: int) -> bool: ...


@dataclass(frozen=True)
class Draft:
    tokens: tuple[int, ...]
    source: str  # "ngram" | "draft"
    key: str  # the acceptance estimate this draft is judged under
    probs: tuple[np.ndarray, ...] | None = None  # q rows; None means a deterministic proposal


EMPTY = Draft((), "none", "none")


@dataclass(frozen=True)
class TokenEvent:
    token: int
    source: str  # "target" | "draft" | "ngram"
    round: int


def sync_kv(model: Model, context: Sequence[int]) -> list[int]:
    """Trim `model`'s cache to its common prefix with `context`; return the tokens still to decode."""
    common = _common_prefix_len(model.tokens, context)
    model.trim(common)
    return list(context[common:])


def _common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


# ---- drafters ---------------------------------------------------------------------------------
class NgramDrafter:
    """Prompt lookup: find an earlier occurrence of the context's suffix, propose what followed.

    When the text is copying a source (an edit of the input), the occurrence nearest to where the
    copy has got to is the right one, even for a 1-token suffix; otherwise the latest. Matches
    near that copy position are judged under their own acceptance key ("ngram/2@"), since they are
    far more reliable than a lookup anywhere in the text.
    Costs ~0, so it is also asked when speculation is off, to measure its acceptance for free.
    """

    name = "ngram"
    WINDOW = 8  # tokens either side of the expected copy position that still count as "in sync"

    def __init__(self, n_min: int = 1, n_max: int = 4):
        if not 1 <= n_min <= n_max:
            raise ValueError("need 1 <= n_min <= n_max")
        self.n_min, self.n_max = n_min, n_max
        self._reset()

    def _reset(self) -> None:
        self._ctx: list[int] = []
        self._index: dict[int, dict[tuple[int, ...], list[int]]] = {n: {} for n in range(self.n_min, self.n_max + 1)}
        self._copy: tuple[int, int] | None = None  # (source position used, context length then)

    def _update(self, context: Sequence[int]) -> None:
        if _common_prefix_len(self._ctx, context) < len(self._ctx):
            self._reset()
        start = len(self._ctx)
        self._ctx.extend(context[start:])
        ctx = self._ctx
        # Index n-grams ending before the last position, so a lookup of the suffix finds an earlier one.
        for end in range(max(start, 1), len(ctx)):
            for n, table in self._index.items():
                if end >= n:
                    table.setdefault(tuple(ctx[end - n : end]), []).append(end)

    def _expected(self) -> int | None:
        """Where in the text a copy in progress would have got to by now."""
        if self._copy is None:
            return None
        used, ctx_len = self._copy
        return used + len(self._ctx) - ctx_len

    def _pick(self, ends: list[int], expected: int | None) -> tuple[int, bool]:
        if expected is not None:
            near = min(ends, key=lambda e: abs(e - expected))
            if abs(near - expected) <= self.WINDOW:
                return near, True
        return ends[-1], False

    def propose(self, context: Sequence[int], max_len: int) -> Draft:
        if max_len <= 0:
            return EMPTY
        self._update(context)
        ctx = self._ctx
        expected = self._expected()
        fallback = None
        for n in range(self.n_max, self.n_min - 1, -1):
            if len(ctx) <= n:
                continue
            ends = self._index[n].get(tuple(ctx[-n:]))
            if not ends:
                continue
            end, in_sync = self._pick(ends, expected)
            if in_sync:
                return self._draft(end, n, max_len, "@")
            if fallback is None:
                fallback = (end, n)
        if fallback is None:
            return EMPTY
        return self._draft(fallback[0], fallback[1], max_len, "")

    def _draft(self, end: int, n: int, max_len: int, tag: str) -> Draft:
        self._copy = (end, len(self._ctx))
        return Draft(tuple(self._ctx[end : end + max_len]), "ngram", f"ngram/{n}{tag}")


class ModelDrafter:
    """A second, smaller model that drafts greedily (or samples, when the target samples)."""

    name = "draft"

    def __init__(self, model: Model, sampling: SamplingConfig, *, p_min: float = 0.0, n_vocab_target: int | None = None):
        self.model = model
        self.sampling = sampling
        self.p_min = p_min
        self.n_vocab_target = n_vocab_target or model.n_vocab
        # Its own stream, derived from the seed, so drafting never shifts the verifier's draws.
        self.rng = np.random.default_rng(None if sampling.seed is None else sampling.seed + 0x5EED)

    def propose(self, context: Sequence[int], max_len: int) -> Draft:
        m = self.model
        room = m.n_ctx - len(context)
        max_len = min(max_len, room)
        if max_len <= 0:
            return EMPTY
        todo = sync_kv(m, context)
        if not todo:  # the whole context is cached: re-decode the last token for its logits
            m.trim(len(context) - 1)
            todo = [context[-1]]
        row = m.decode(todo, [len(todo) - 1])[0]
        history = list(context)
        tokens: list[int] = []
        probs: list[np.ndarray] = []
        greedy = self.sampling.greedy
        for i in range(max_len):
            if greedy and self.p_min <= 0:
                tok = int(np.argmax(row))
            else:
                q = warp(row, self.sampling if not greedy else _SOFTMAX, history)
                tok = int(np.argmax(q)) if greedy else sample(q, self.rng)
                if greedy and q[tok] < self.p_min and tokens:
                    break  # low confidence: a wasted verify slot is likelier than a win
                if not greedy:
                    probs.append(self._pad(q))
            tokens.append(tok)
            history.append(tok)
            if i + 1 < max_len:
                row = m.decode([tok], [0])[0]
        return Draft(tuple(tokens), "draft", "draft", tuple(probs) if probs else None)

    def _pad(self, q: np.ndarray) -> np.ndarray:
        n = self.n_vocab_target
        if len(q) == n:
            return q
        out = np.zeros(n)
        m = min(n, len(q))
        out[:m] = q[:m]
        return out / out.sum()


# Full-softmax view of the draft's logits, used only for its confidence cut in greedy mode.
_SOFTMAX = SamplingConfig(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)


# ---- verification -----------------------------------------------------------------------------
def top2_margin(row: np.ndarray) -> float:
    """Top-1 minus top-2 logit: how near a tie the greedy choice in this row was."""
    top2 = np.partition(row, -2)[-2:]
    return float(top2[1] - top2[0])


def verify_greedy(draft: Sequence[int], logits: np.ndarray) -> tuple[int, int]:
    """Accept while the target's argmax matches; return (n_accepted, the target's next token)."""
    best = np.argmax(logits, axis=1)
    for i, tok in enumerate(draft):
        if int(best[i]) != tok:
            return i, int(best[i])
    return len(draft), int(best[len(draft)])


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
    mode: str = "auto"  # off | ngram | draft | combined | auto
    draft_min: int = 1
    draft_max: int = 16
    probe_every: int = 16  # rounds between probes of an "off" draft model (doubles while it stays off)
    probe_max: int = 256


class SpeculativeDecoder:
    """One generation at a time over a target (and optional drafters), yielding TokenEvents."""

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
    ):
        self.target = target
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
        self._shadow: tuple[str, int, tuple[int, ...]] | None = None
        # A backend whose logits are batch-invariant only up to some batch size says so.
        limit = getattr(target, "max_exact_batch", None)
        self._max_draft = settings.draft_max if limit is None else min(settings.draft_max, limit - 1)

    # ---- public --------------------------------------------------------------------------
    def generate(self, prompt: Sequence[int], max_tokens: int) -> Iterator[TokenEvent]:
        if not prompt:
            raise ContextError("empty prompt: nothing to continue from")
        if len(prompt) >= self.target.n_ctx:
            raise ContextError(
                f"the prompt is {len(prompt)} tokens but the context holds {self.target.n_ctx}; "
                "use a larger --ctx-size or a shorter prompt"
            )
        self.stats = st = LoopStats(start=time.perf_counter())
        ctx = list(prompt)
        emitted = 0
        try:
            self._prefill(ctx)
            round_no = 0
            while True:
                if emitted >= max_tokens:
                    st.finish_reason = "length"
                    return
                room = self.target.n_ctx - len(self.target.tokens) - 1
                if room < 0:
                    st.finish_reason = "length"
                    return
                k_cap = min(room, max_tokens - emitted - 1, self._max_draft)
                new, sources = self._round(ctx, k_cap)
                assert new, "every round emits at least one token"
                for tok, src in zip(new, sources):
                    if self.target.is_eog(tok):
                        st.finish_reason = "stop"
                        return
                    ctx.append(tok)
                    emitted += 1
                    st.token_times.append(time.perf_counter())
                    st.sources.append(src)
                    yield TokenEvent(tok, src, round_no)
                    if emitted >= max_tokens:
                        break
                round_no += 1
        finally:
            self._settle(ctx)

    # ---- steps ---------------------------------------------------------------------------
    def _prefill(self, ctx: list[int]) -> None:
        st = self.stats
        t0 = time.perf_counter()
        todo = sync_kv(self.target, ctx[:-1])
        st.prompt_tokens = len(ctx)
        st.prompt_cached = len(ctx) - 1 - len(todo)
        if todo:
            self.target.decode(todo)
        st.prompt_s = time.perf_counter() - t0

    def _round(self, ctx: list[int], k_cap: int) -> tuple[list[int], list[str]]:
        self._check_shadow(ctx)
        t0 = time.perf_counter()
        draft = self._draft(ctx, k_cap) if k_cap > 0 else EMPTY
        t1 = time.perf_counter()
        batch = [ctx[-1], *draft.tokens]
        base = len(self.target.tokens)
        logits = self.target.decode(batch, range(len(batch)))
        assert logits.shape[0] == len(draft.tokens) + 1, "one logits row per drafted token, plus one"
        n_acc, nxt = self._verify(ctx, draft, logits)
        t2 = time.perf_counter()
        if self.record_margins:
            self.stats.margins.extend(top2_margin(logits[i]) for i in range(n_acc + 1))
        self.target.trim(base + 1 + n_acc)
        if draft.tokens:
            self.controller.observe(draft.key, len(draft.tokens), n_acc)
            if draft.source == "draft":
                self.controller.observe_draft(len(draft.tokens), t1 - t0)
        self.controller.observe_verify(len(batch), t2 - t1)
        self.stats.rounds.append(RoundLog(len(draft.tokens), len(draft.tokens), n_acc, draft.source, t1 - t0, t2 - t1))
        tokens = [*draft.tokens[:n_acc], nxt]
        return tokens, [draft.source] * n_acc + ["target"]

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
        if mode == "off":
            return EMPTY
        c = self.controller
        candidate = EMPTY
        if self.ngram is not None and mode in ("ngram", "combined", "auto"):
            proposal = self.ngram.propose(ctx, min(k_cap, c.k_max))
            if proposal.tokens:
                k = c.choose(proposal.key, 0.0, len(proposal.tokens)).k
                if k == 0:
                    self._start_shadow(ctx, proposal)
                else:
                    candidate = Draft(proposal.tokens[:k], "ngram", proposal.key)
        if candidate.tokens or self.drafter is None or mode not in ("draft", "combined", "auto"):
            return candidate
        choice = c.choose("draft", c.cost.draft_cost, k_cap)
        k = choice.k
        if k == 0:
            k = self._probe_k(k_cap)
        else:
            self._probe_gap = self.settings.probe_every
            self._rounds_off = 0
        return self.drafter.propose(ctx, k) if k > 0 else EMPTY

    def _probe_k(self, k_cap: int) -> int:
        """While the draft model looks unprofitable, try it now and then (backing off) in case that changed."""
        if not self.controller.could_pay(self.controller.cost.draft_cost, k_cap):
            return 0
        self._rounds_off += 1
        if self._rounds_off < self._probe_gap:
            return 0
        self._rounds_off = 0
        self._probe_gap = min(self._probe_gap * 2, self.settings.probe_max)
        return min(self.controller.k_min + 1, k_cap, self.controller.k_max)

    # ---- free acceptance measurement for the n-gram drafter while it is off ---------------
    def _start_shadow(self, ctx: list[int], proposal: Draft) -> None:
        if self._shadow is None:
            self._shadow = (proposal.key, len(ctx), proposal.tokens)

    def _check_shadow(self, ctx: list[int]) -> None:
        if self._shadow is None:
            return
        key, at, tokens = self._shadow
        seen = ctx[at:]
        n = _common_prefix_len(tokens, seen)
        if n < len(tokens) and n == len(seen):
            return  # still unfolding
        self.controller.observe(key, len(tokens), n)
        self._shadow = None

    def _settle(self, ctx: list[int]) -> None:
        """Leave each KV cache holding a prefix of what was emitted (nothing beyond a stop)."""
        for model in (self.target, self.drafter.model if self.drafter else None):
            if model is not None:
                model.trim(_common_prefix_len(model.tokens, ctx))
        self._shadow = None
