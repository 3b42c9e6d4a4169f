"""Drafters: where proposed tokens come from. Pure: no llama_cpp, no printing.

- `NgramDrafter` (draft-free): follows the copy. When the output is reproducing text that is
  already in the context (an edited file, quoted lines), it keeps a pointer to where the copy has
  got to and proposes what follows there, as far as the controller wants. After an edit it finds
  the copy again within a token or two, and it learns the edit itself (a rename, a changed
  operator) so later occurrences are proposed already edited. Each proposal says which state it
  came from (how long the current copy run is, whether it was found near the old copy position),
  because that, not the drafter as a whole, predicts how much of it the target will accept.
- `ModelDrafter`: a second, smaller model with the same tokenizer, or one whose vocabulary differs
  only in special tokens (through compat.TokenMap).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from dataclasses import dataclass, replace
from typing import Callable, ClassVar, Protocol, Sequence, Union

import numpy as np

from .compat import TokenMap
from .sampling import SamplingConfig, sample, warp


class Model(Protocol):
    n_vocab: int
    n_ctx: int
    tokens: list[int]  # what the KV cache holds, in order
    # optional: max_exact_batch (int | None), the largest batch whose logits equal 1-token decoding

    def decode(self, tokens: Sequence[int], logits_for: Sequence[int] = ()) -> np.ndarray: ...

    def trim(self, n_tokens: int) -> None: ...

    def is_eog(self, token: int) -> bool: ...


Key = Union[str, "NgramState"]  # what a draft is judged under (controller.Key)


@dataclass(frozen=True)
class Draft:
    tokens: tuple[int, ...]
    source: str  # "ngram" | "draft"
    # The acceptance estimate this draft is judged under: the drafter's name ("draft"), or the
    # state it came from (NgramState) when a drafter has several (see Controller).
    key: Key
    probs: tuple[np.ndarray, ...] | None = None  # q rows; None means a deterministic proposal
    # Per drafted token, how much likelier than the key's rate it is to be accepted (1.0 = as likely;
    # a learnt edit seen made once, or a fork where an earlier copy broke, is a guess). None: all 1.0.
    confidence: tuple[float, ...] | None = None
    # The states the drafter's copy would be in at each drafted token, as (state, tokens) segments
    # from the first: a copy grows more likely to go on the longer it has held, so a long draft's
    # later tokens are judged (and learn) as the longer runs they would be. None: `key` throughout.
    path: tuple[tuple["NgramState", int], ...] | None = None
    # For a copy: how long it has held and how long this context's earlier copies held before they
    # broke (RunHistory), so the chance it goes on is also judged by this answer's own breaks.
    history: "RunHistory | None" = None

    def states(self, n: int) -> list[tuple[Key, int]]:
        """The (state, tokens) segments covering the first n drafted tokens."""
        if self.path is None:
            return [(self.key, n)] if n > 0 else []
        out, left = [], n
        for state, length in self.path:
            if left <= 0:
                break
            out.append((state, min(length, left)))
            left -= length
        return out

    def until_end(self, is_eog: Callable[[int], bool]) -> "Draft":
        """This draft up to its first end-of-generation token, not including it: rows past that token
        can never be part of the answer (a copy that runs into the chat template's end-of-turn, a draft
        model that ends its answer), and the token itself is what the target's row for the token before
        it yields anyway, so drafting it only adds a row."""
        for i, tok in enumerate(self.tokens):
            if is_eog(tok):
                if i == 0:
                    return EMPTY
                return replace(self, tokens=self.tokens[:i], probs=self.probs[:i] if self.probs else self.probs,
                               confidence=self.confidence[:i] if self.confidence else self.confidence)
        return self

    @property
    def prior(self) -> float | None:
        """Starting acceptance guess for a key not seen before (a state's own; None: the controller's)."""
        return self.key.prior if isinstance(self.key, NgramState) else None


EMPTY = Draft((), "none", "none")


@dataclass(frozen=True)
class RunHistory:
    """A copy's run so far and the lengths of the copy runs that ended earlier in the same context
    (sorted): in one answer copies tend to break at similar lengths (a typo every ~16 tokens, an
    e-mail address of ~10), which the per-state priors, learnt over many answers, do not know.
    Only runs that were once as short as this one count (NgramDrafter.history): a run found by a
    4-token match starts at 4, and its end says nothing about whether a 2-token one goes on."""

    run: int
    ended: tuple[int, ...] = ()
    resumes: int = 0  # the long copy this run picks up again after an edit: its length (0: none)

    @property
    def earned(self) -> int:
        """The copy's verified length: this run, and the long copy it resumes (controller.RISK_PER_RUN)."""
        return self.run + self.resumes

    def reaching(self, length: int) -> int:
        """How many of the ended runs held at least `length` tokens."""
        return len(self.ended) - bisect_left(self.ended, length)


def sync_kv(model: Model, context: Sequence[int]) -> list[int]:
    """Trim `model`'s cache to its common prefix with `context`; return the tokens still to decode."""
    common = common_prefix_len(model.tokens, context)
    model.trim(common)
    return list(context[common:])


def common_prefix_len(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    # Mostly one holds all of the other (the context only grew since the last round): say so with
    # one comparison in C, not a Python loop over every token of a long document each round.
    if n and a[n - 1] == b[n - 1] and (a[:n] == b[:n] if type(a) is type(b) is list else list(a[:n]) == list(b[:n])):
        return n
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


# ---- the copy-following n-gram drafter ---------------------------------------------------------
@dataclass
class Fork:
    """A context position where a copy broke: the text there differs from what another occurrence
    of the same lead-in went on with (a template's varying slot: the next JSON record's name after
    the previous record's `"name": "`). A later copy through it is a guess there."""

    broke: int = 1  # copies through here that broke at it (the one that made it a fork included)
    held: int = 0  # copies through here that went on

    @property
    def confidence(self) -> float:
        return (self.held + 1) / (self.held + self.broke + 2)


@dataclass
class Substitution:
    """An edit the output made to a source span, and what it did at the span's later occurrences.

    Three behaviours follow from the counts: "replace" (the output makes this edit consistently:
    propose it, as for a rename), "keep" (the output mostly leaves the span alone: copy it as it
    is), and "hazard" (it varies, e.g. `var` becoming `let` or `const`: end the draft before it and
    let the target decide that token, rather than betting a long verify batch on a guess).
    """

    src: tuple[int, ...]
    repl: tuple[int, ...]
    hits: int = 1  # occurrences the output edited this way (the one it was learnt from included)
    kept: int = 0  # occurrences the output left as they were
    other: int = 0  # occurrences the output changed some other way

    @property
    def confidence(self) -> float:
        """Chance the output makes this edit again (Laplace: an edit seen once is a 2-in-3 bet)."""
        return (self.hits + 2) / (self.hits + self.kept + self.other + 3)

    @property
    def state(self) -> str:
        against = self.kept + self.other
        if against == 0 or self.hits >= 3 * against:
            return "replace"
        if self.kept >= 2 * (self.hits + self.other):
            return "keep"
        return "hazard"


# Run-length buckets: tokens copied since the copy last (re)started, rounded down to one of these.
RUN_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
# A copy run this long is a long copy: its state is "copy" whatever found it, after an edit it is
# resumed as the same copy, and it is trusted on its own record (NgramState.trusted).
LONG_RUN = 16
# A copy found by an n-gram (n_max tokens at most) runs as far back as the output and its source
# agree, counted up to the longest run bucket: a prompt that ends inside a copy (a "continue", an
# editor's half-written file) is a long copy already, not a fresh 4-token find.
AGREE_MAX = RUN_BUCKETS[-1]


def run_bucket(run: int) -> int:
    return RUN_BUCKETS[max(0, bisect_left(RUN_BUCKETS, run + 1) - 1)] if run >= 1 else 1


# An echo's longest run bucket, the last one under LONG_RUN: an echo that held LONG_RUN tokens is
# a copy (copy_path).
ECHO_TOP = run_bucket(LONG_RUN - 1)


# The states NgramDrafter._copy_draft and propose() can produce, each with its starting acceptance
# guess. A long verified run predicts a long accepted draft; a fresh 1-token match does not.
# "copy": a run of LONG_RUN+ tokens, or one found next to where the last copy broke;
# "resume": that, shorter than LONG_RUN, after a copy that had been long; "find": a match found
# anywhere in the prompt, shorter than LONG_RUN; "echo": the same found in this answer's own
# output (a phrase or code idiom the answer repeats: a template, not a source it copies; on the
# recorded answers such finds held about as well as prompt finds for a few tokens, worse from 8 on,
# and none held to LONG_RUN — README, *Echoes*); "edit": just after a divergence, guessing it was
# a substitution. The guesses are per-token acceptance measured on recorded greedy outputs of the
# built-in prompts (see README), rounded down; the controller replaces them with what it sees
# within a few rounds.
PRIORS: dict[tuple[str, int | None], float] = {
    **{("copy", r): p for r, p in zip(RUN_BUCKETS, (0.7, 0.8, 0.85, 0.9, 0.96, 0.985, 0.99))},
    **{("resume", r): p for r, p in zip(RUN_BUCKETS[:4], (0.8, 0.85, 0.9, 0.93))},
    **{("find", r): p for r, p in zip(RUN_BUCKETS[:4], (0.2, 0.4, 0.7, 0.88))},
    **{("echo", r): p for r, p in zip(RUN_BUCKETS[:4], (0.2, 0.25, 0.75, 0.75))},
    ("edit", None): 0.6,
}


@dataclass(frozen=True)
class NgramState:
    """Which state of the n-gram drafter a proposal came from: that, not the drafter as a whole,
    predicts how much of it the target accepts. Only the states in PRIORS exist."""

    kind: str  # "copy" | "resume" | "find" | "echo" | "edit"
    run: int | None = None  # the run bucket (RUN_BUCKETS); None for "edit"
    drafter: ClassVar[str] = "ngram"  # whose states pool together in the controller

    def __post_init__(self):
        if (self.kind, self.run) not in PRIORS:
            raise ValueError(f"the n-gram drafter has no state {self.kind!r} with run {self.run!r}")

    @property
    def prior(self) -> float:
        return PRIORS[(self.kind, self.run)]

    @property
    def trusted(self) -> bool:
        """A long verified copy: evidence of its own, so the drafter's pooled record does not cap it."""
        return self.kind == "copy" and self.run >= LONG_RUN

    def __str__(self) -> str:
        return f"ngram/{self.kind}" if self.run is None else f"ngram/{self.kind}/r{self.run}"


EDIT = NgramState("edit")


class NgramDrafter:
    """Copy-following prompt lookup over the whole context (prompt and output so far).

    State, updated token by token as the context grows:
    - `pointer`: the context position whose token the copy expects next (None: not copying);
    - `run`: how many tokens in a row the output has copied from there;
    - after a divergence, where it happened, so the copy can be found again nearby and the edit
      learnt as a `Substitution` once the copy has resumed for CONFIRM tokens.
    Costs microseconds per token, so it is also asked when speculation is off, to measure its
    acceptance for free.
    """

    name = "ngram"
    WINDOW = 8  # tokens either side of the expected copy position where a match counts as the copy
    CONFIRM = 3  # tokens the copy must resume for before an edit is learnt
    SUB_MAX = 8  # longest source or replacement span learnt as a substitution
    EDIT_GUESS = 3  # tokens after a divergence during which the copy is guessed to go on (substitution)
    # A match found anywhere that held for fewer tokens is a guess: it does not move the divergence
    # point, and just after an edit the edit's own guess is proposed before it.
    WEAK_FIND = 4
    GUESS_RUN = 8  # a match found anywhere must have held this long for its break to be guessed as an edit
    # A match found anywhere is looked for among this many of its n-gram's latest occurrences: the
    # one the output agrees with furthest back is where the copy comes from (repeated lines, a
    # template's records: the latest occurrence of four tokens is often another one).
    FAR_CANDIDATES = 16

    def __init__(self, n_min: int = 1, n_max: int = 4):
        if not 1 <= n_min <= n_max:
            raise ValueError("need 1 <= n_min <= n_max")
        self.n_min, self.n_max = n_min, n_max
        self._answer_at: int | None = None  # start()'s prompt length, taken up by the next proposal
        self._reset()

    def start(self, prompt_len: int) -> None:
        """A generation begins after `prompt_len` tokens of context: a match found from there on is
        the answer echoing itself ("echo"), one before it a source ("find"). Not called, the first
        context the drafter sees after a reset is taken for the prompt."""
        self._answer_at = prompt_len

    def _reset(self) -> None:
        self._ctx: list[int] = []
        self._answer_from: int | None = None  # where the current answer's output starts
        self._index: dict[int, dict[tuple[int, ...], list[int]]] = {n: {} for n in range(self.n_min, self.n_max + 1)}
        self.pointer: int | None = None
        self.run = 0
        self.origin = "find"  # "copy": found near the previous copy position; "find": anywhere
        self._queue: list[int] = []  # replacement tokens still expected inside a substitution
        self._after_queue: int | None = None  # pointer once the queue is through
        self._in_sub: Substitution | None = None  # the edit whose replacement the queue holds
        self.prev_run = 0  # length of the copy run before the last divergence (0: none)
        self._div: tuple[int, int] | None = None  # (source pointer, output index) of the last divergence
        self._div_guess = False  # whether that divergence broke a real copy (then its edit is guessed)
        self._div_real = False  # whether it broke a copy at all, not a short match found by chance
        self._pending: Substitution | None = None
        self.subs: dict[int, list[Substitution]] = {}
        self.ended: list[int] = []  # lengths of the copy runs that broke in this context, sorted
        self._ended_from: dict[int, list[int]] = {}  # the same, by the run's length when it was found
        self._start = 0  # the current run's length when it was found (the n-gram it matched)
        self.forks: dict[int, Fork] = {}  # context positions where a copy broke (Fork)

    # ---- following the context ---------------------------------------------------------
    def _update(self, context: Sequence[int]) -> None:
        if common_prefix_len(self._ctx, context) < len(self._ctx):
            self._reset()
        if self._answer_at is not None:
            self._answer_from, self._answer_at = self._answer_at, None
        first = not self._ctx
        if first and self._answer_from is None:
            self._answer_from = len(context)
        start = len(self._ctx)
        self._ctx.extend(context[start:])
        for i in range(start, len(self._ctx)):
            self._index_ending_at(i)
            if not first:  # a new prompt is only indexed: the copy state follows the output
                self._step(i)
        if first and self._ctx:
            self._resync(len(self._ctx) - 1)  # the prompt's own end may already be a copy

    def _index_ending_at(self, i: int) -> None:
        ctx = self._ctx
        for n, table in self._index.items():
            if i >= n:
                table.setdefault(tuple(ctx[i - n : i]), []).append(i)

    def _sub_at(self, p: int) -> Substitution | None:
        ctx = self._ctx
        for sub in self.subs.get(ctx[p], ()):
            if tuple(ctx[p : p + len(sub.src)]) == sub.src:
                return sub
        return None

    def _step(self, i: int) -> None:
        """Token i was appended: advance the copy, or note a divergence and look for the copy again."""
        t = self._ctx[i]
        if self._queue:  # inside a learnt edit's replacement
            if self._follow_replacement(t):
                return
        elif self.pointer is not None and self.pointer < i:
            if self._follow_copy(t):
                return
        self._diverged(i)

    def _follow_replacement(self, t: int) -> bool:
        """Whether token t is the next one of the replacement being followed."""
        if self._queue[0] == t:
            self._queue.pop(0)
            self.run += 1
            if not self._queue:
                self._in_sub.hits += 1
                self.pointer = self._after_queue
            return True
        self._queue = []
        self._in_sub.other += 1
        return False

    def _follow_copy(self, t: int) -> bool:
        """Whether token t goes on with the copy at the pointer (as it is, or as a learnt edit)."""
        p = self.pointer
        sub = self._sub_at(p)
        keeps = self._ctx[p] == t
        # Follow the learnt edit when the output does (the source's own token first if the edit is off).
        if sub is not None and sub.repl[0] == t and (sub.state != "keep" or not keeps):
            self.run += 1
            if len(sub.repl) > 1:
                self._queue, self._after_queue, self._in_sub = list(sub.repl[1:]), p + len(sub.src), sub
            else:
                sub.hits += 1
                self.pointer = p + len(sub.src)
            return True
        if keeps:
            if sub is not None:
                sub.kept += 1
            fork = self.forks.get(p)
            if fork is not None:
                fork.held += 1
            self.pointer = p + 1
            self.run += 1
            if self._pending is not None and self.run >= self.CONFIRM:
                self._learn(self._pending)
                self._pending = None
            return True
        if sub is not None:
            sub.other += 1
        return False

    def _diverged(self, i: int) -> None:
        """Token i broke the copy (or there was none): remember where, and look for it again."""
        if self.pointer is not None and self.run > 0:
            # A short match found anywhere that fails is a wrong guess, not where the copy broke:
            # keep the last real divergence, so the copy can still be found again near it (a
            # re-indented line: source "  self.x", output "self.x"; "self" alone first matches
            # some other line, then ".x" lands next to the original position).
            if not (self.origin == "find" and self.run < self.WEAK_FIND and self._div is not None):
                self._div = (self.pointer, i)
                # only a break in a copy that had really held is worth guessing the edit of
                self._div_guess = self.origin == "copy" or self.run >= self.GUESS_RUN
                self._div_real = self.origin == "copy" or self.run >= self.WEAK_FIND
                # A fork needs a copy that had held; a short chance match breaking says nothing
                # about the text at either end (and forks from those cut good copies short).
                if self.run >= (self.CONFIRM if self.origin == "copy" else self.GUESS_RUN):
                    self._fork_at(self.pointer)
                    self._fork_at(i)
            if self.origin == "copy" or self.run >= LONG_RUN:
                self.prev_run = max(self.run, self.prev_run if self.run < LONG_RUN else 0)
            insort(self.ended, self.run)
            insort(self._ended_from.setdefault(self._start, []), self.run)
        self._pending = None
        self.run = 0
        self._resync(i)

    def _resync(self, i: int) -> None:
        """Find where the copy resumes after token i: near where it would be, else anywhere."""
        ctx = self._ctx
        expected = None
        if self._div is not None:
            p_div, o_div = self._div
            expected = p_div + (i + 1 - o_div)  # as if the edit replaced as many tokens as it wrote
        best_far = None
        for n in range(self.n_max, self.n_min - 1, -1):
            if i + 1 < n:
                continue
            ends = self._index[n].get(tuple(ctx[i + 1 - n : i + 1]))
            if not ends:
                continue
            if expected is not None:
                near = _nearest(ends, expected)
                if abs(near - expected) <= self.WINDOW:
                    # Found again near a chance match that broke: still a guess (a "find"), though
                    # the edit it implies is learnt like any other (a rename in the copy's first
                    # tokens). Labelled a copy, it drafted into free text at the copy's 0.7 prior.
                    self._copy_from(near, self._agreement(near, i, n), "copy" if self._div_real else "find", i, near=True)
                    return
            if best_far is None:
                best_far = self._furthest(ends, i, n)
        if best_far is not None:
            self._copy_from(best_far[1], best_far[0], "find", i, near=False)
        else:
            self.pointer = None

    def _furthest(self, ends: list[int], i: int, n: int) -> tuple[int, int]:
        """Of the latest FAR_CANDIDATES occurrences of the n-gram ending at token i, the one the
        output agrees with furthest back (of equals, the latest), as (agreement, pointer)."""
        ctx = self._ctx
        best = (n, ends[-1])
        before = ctx[i - n] if i >= n else None
        for end in reversed(ends[-self.FAR_CANDIDATES:]):
            if end > n and ctx[end - n - 1] == before:  # agrees beyond the n-gram: worth counting
                agreed = self._agreement(end, i, n)
                if agreed > best[0]:
                    best = (agreed, end)
        return best

    def _agreement(self, pointer: int, i: int, matched: int) -> int:
        """How many tokens up to token i agree with those before `pointer` (`matched` known to),
        counted up to AGREE_MAX: the copy's run as the text shows it, not the n-gram that found it."""
        ctx = self._ctx
        while matched < AGREE_MAX and matched < pointer and ctx[pointer - matched - 1] == ctx[i - matched]:
            matched += 1
        return matched

    def _copy_from(self, pointer: int, matched: int, origin: str, i: int, *, near: bool) -> None:
        self.pointer, self.run, self.origin = pointer, matched, origin
        self._start = matched
        self._pending = None
        if near:
            p_div, o_div = self._div
            src = tuple(self._ctx[p_div : pointer - matched])
            repl = tuple(self._ctx[o_div : i + 1 - matched])
            if src and repl and src != repl and len(src) <= self.SUB_MAX and len(repl) <= self.SUB_MAX and pointer - matched >= p_div:
                self._pending = Substitution(src, repl)

    def _fork_at(self, p: int) -> None:
        fork = self.forks.get(p)
        if fork is None:
            self.forks[p] = Fork()
        else:
            fork.broke += 1

    def _learn(self, sub: Substitution) -> None:
        known = self.subs.setdefault(sub.src[0], [])
        for old in known:
            if old.src == sub.src:
                old.repl = sub.repl  # the latest way it was edited (_step counted the change as "other")
                return
        known.append(sub)

    # ---- proposing -----------------------------------------------------------------------
    def continuation(self, pointer: int, max_len: int, queue: Sequence[int] = ()) -> tuple[tuple[int, ...], tuple[float, ...] | None]:
        """What the copy says comes next from `pointer`, with learnt edits applied; and, when an edit
        was applied or the copy goes through a fork, the confidence of each token (see Draft.confidence)."""
        ctx = self._ctx
        out = list(queue[:max_len])
        conf = [1.0] * len(out)
        guessed = False
        p = pointer
        while len(out) < max_len and p < len(ctx):
            sub = self._sub_at(p)
            state = sub.state if sub is not None else "keep"
            if state == "hazard":
                break  # the target decides this one; a draft past it would likely be thrown away
            if state == "replace":
                out.extend(sub.repl)
                conf.extend([sub.confidence] + [1.0] * (len(sub.repl) - 1))
                guessed = True
                p += len(sub.src)
            else:
                out.append(ctx[p])
                fork = self.forks.get(p)
                conf.append(1.0 if fork is None else fork.confidence)
                guessed = guessed or fork is not None
                p += 1
        return tuple(out[:max_len]), (tuple(conf[:max_len]) if guessed else None)

    def propose(self, context: Sequence[int], max_len: int) -> Draft:
        if max_len <= 0:
            return EMPTY
        self._update(context)
        copying = self.pointer is not None and self.run >= 1
        if copying and (self.origin == "copy" or self.run >= self.WEAK_FIND):
            return self._copy_draft(max_len)
        if self._div is not None and self._div_guess:
            p_div, o_div = self._div
            since = len(self._ctx) - o_div
            if since <= self.EDIT_GUESS:
                # Just after an edit: guess that it replaced as many tokens as it wrote, and go on copying.
                return _ngram(*self.continuation(p_div + since, max_len), EDIT)
        return self._copy_draft(max_len) if copying else EMPTY

    def _copy_draft(self, max_len: int) -> Draft:
        start = self._after_queue if self._queue else self.pointer
        tokens, confidence = self.continuation(start, max_len, self._queue)
        # the same long copy, picked up again after an edit: it carries that copy's length
        resumes = self.prev_run if self.origin == "copy" and self.prev_run >= LONG_RUN else 0
        kind = "resume" if resumes else self.origin
        if kind == "find" and self._answer_from is not None and self.pointer >= self._answer_from:
            kind = "echo"
        path = copy_path(kind, self.run, len(tokens))
        return _ngram(tokens, confidence, path[0][0] if path else NgramState(kind, 1), path, self.history(resumes))

    def history(self, resumes: int = 0) -> RunHistory:
        """The current run against the ended runs that were once as short (RunHistory)."""
        if all(start <= self.run for start in self._ended_from):
            return RunHistory(self.run, tuple(self.ended), resumes)
        return RunHistory(self.run, tuple(sorted(
            end for start, ends in self._ended_from.items() if start <= self.run for end in ends)), resumes)


def copy_path(kind: str, run: int, n: int) -> tuple[tuple[NgramState, int], ...]:
    """The states of a copy in state `kind` with `run` tokens held, over its next n tokens (the
    i-th drafted token is drafted at run + i): "copy" from LONG_RUN on, run buckets as they grow.
    An echo is a copy once it has held LONG_RUN tokens, not before: its drafted tokens past that
    stay at its own last bucket's rate (no recorded echo held that long)."""
    out: list[list] = []
    for r in range(run, run + n):
        if kind == "echo" and run < LONG_RUN:
            state = NgramState(kind, min(run_bucket(r), ECHO_TOP))
        else:
            state = NgramState("copy" if r >= LONG_RUN else kind, run_bucket(r))
        if out and out[-1][0] == state:
            out[-1][1] += 1
        else:
            out.append([state, 1])
    return tuple((s, k) for s, k in out)


def _ngram(tokens: tuple[int, ...], confidence: tuple[float, ...] | None, state: NgramState,
           path: tuple[tuple[NgramState, int], ...] | None = None, history: RunHistory | None = None) -> Draft:
    return Draft(tokens, "ngram", state, confidence=confidence, path=path, history=history) if tokens else EMPTY


def _nearest(ends: list[int], target: int) -> int:
    j = bisect_left(ends, target)
    if j == 0:
        return ends[0]
    if j == len(ends):
        return ends[-1]
    return ends[j] if ends[j] - target < target - ends[j - 1] else ends[j - 1]


# ---- the draft model --------------------------------------------------------------------------
class ModelDrafter:
    """A second, smaller model that drafts greedily (or samples, when the target samples).

    With a `token_map` (a near-compatible pair, see compat.py) it reads the target's context
    through the map, never proposes a token the target lacks (masked before argmax or sampling),
    and hands back target ids with q rows over the target's vocabulary.
    """

    name = "draft"

    def __init__(self, model: Model, sampling: SamplingConfig, *, p_min: float = 0.0, n_vocab_target: int | None = None,
                 token_map: TokenMap | None = None):
        self.model = model
        self.sampling = sampling
        self.p_min = p_min
        self.n_vocab_target = n_vocab_target or model.n_vocab
        self.token_map = token_map
        self._blocked = ~token_map.draftable(model.n_vocab) if token_map is not None else None
        # Its own stream, derived from the seed, so drafting never shifts the verifier's draws.
        self.rng = np.random.default_rng(None if sampling.seed is None else sampling.seed + 0x5EED)

    def view(self, context: Sequence[int]) -> Sequence[int]:
        """The target context as the draft model reads it (the same ids unless there is a map)."""
        return context if self.token_map is None else self.token_map.draft_context(context)

    def behind(self, context: Sequence[int]) -> int:
        """How many tokens the draft model would decode before it could draft after `context`."""
        view = self.view(context)
        return len(view) - common_prefix_len(self.model.tokens, view)

    def settle(self, context: Sequence[int]) -> None:
        """Leave the draft model's cache holding a prefix of (its view of) `context`."""
        self.model.trim(common_prefix_len(self.model.tokens, self.view(context)))

    def propose(self, context: Sequence[int], max_len: int) -> Draft:
        m = self.model
        context = self.view(context)
        if not context:
            return EMPTY
        room = m.n_ctx - len(context)
        max_len = min(max_len, room)
        if max_len <= 0:
            return EMPTY
        todo = sync_kv(m, context)
        if not todo:  # the whole context is cached: re-decode the last token for its logits
            m.trim(len(context) - 1)
            todo = [context[-1]]
        row = self._masked(m.decode(todo, [len(todo) - 1])[0])
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
                    probs.append(self._over_target(q))
            tokens.append(tok)
            history.append(tok)
            if m.is_eog(tok):
                break  # its answer ends here: nothing after it can be accepted
            if i + 1 < max_len:
                row = self._masked(m.decode([tok], [0])[0])
        if self.token_map is not None:
            tokens = self.token_map.draft_to_target[tokens].tolist()
        return Draft(tuple(tokens), "draft", "draft", tuple(probs) if probs else None)

    def _masked(self, row: np.ndarray) -> np.ndarray:
        return row if self._blocked is None else np.where(self._blocked, -np.inf, row)

    def _over_target(self, q: np.ndarray) -> np.ndarray:
        """The draft's q row as a distribution over the target's ids."""
        n = self.n_vocab_target
        if self.token_map is not None:
            out = np.zeros(n)
            d2t = self.token_map.draft_to_target
            ids = np.nonzero(q[: len(d2t)])[0]
            ids = ids[(d2t[ids] >= 0) & (d2t[ids] < n)]
            out[d2t[ids]] = q[ids]
            return out / out.sum()
        if len(q) == n:
            return q
        out = np.zeros(n)
        m = min(n, len(q))
        out[:m] = q[:m]
        return out / out.sum()


# Full-softmax view of the draft's logits, used only for its confidence cut in greedy mode.
_SOFTMAX = SamplingConfig(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
