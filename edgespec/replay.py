"""Replay: what a drafting policy would have drafted, accepted and cost on a recorded answer.

A greedy answer is fixed by the target whatever drafts it (up to near-ties, see README
*Exactness*), so a recording of one — the prompt's tokens and the answer's — and a machine's
measured costs t(k, depth) say what any policy would have done on that machine: each round's
draft is checked against the recording, and each verify batch of k rows costs t(k, depth) at the
depth it ran (sizes the table lacks filled in as CPU kernels run them: `charged`). Every policy
knows what it knows live: the generation budget, not where the answer ends (drafts that run past an
answer that stops early are paid for), and the model's end tokens (a draft that copies one from the
prompt ends the answer there). The policies:

- "auto": edgespec's own decoder (speculative.py) with the copy-following n-gram drafter and the
  controller as they are, over a target that answers from the recording;
- "ngram-simple" / "ngram-simple-16": llama.cpp's `--spec-type ngram-simple` (common/ngram-map.cpp:
  the last 12 tokens looked up in the history, the latest match's next 48 — or 16 — tokens drafted,
  nothing under 12);
- "ngram-mod": llama.cpp's `--spec-type ngram-mod` (common/speculative.cpp: a table of 24-grams
  to their next token, drafts chained from it, kept only at 48+ tokens, at most 64; the table
  emptied after 5 rounds in a row accepting under a quarter);
- "plain": one token per pass.

`replay_live` runs "auto" from a saved profile on a machine whose costs have moved since, with
live timing on (a scripted clock charged each pass): how well the decoder notices and corrects.

Only generation is modelled (prefill costs every policy the same), and no draft model (its
proposals are not in a recording). Pure: no llama_cpp, no clock; recordings and cost tables are
JSON files (tests/data/).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from .config import DraftLimits, SpecConfig
from .controller import Controller
from .costs import CostModel
from .drafters import NgramDrafter, common_prefix_len
from .sampling import SamplingConfig
from .speculative import SpecSettings, SpeculativeDecoder

EOS = 0  # the recording's tokens are renumbered 1..V; 0 ends the answer
# An answer taken up late (Recording.taken_up) keeps at least this many tokens to generate: one
# 48-token draft of llama.cpp's ngram-simple, so every policy has room for a long draft.
MIN_LEFT = 48


# ---- inputs ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Recording:
    id: str
    category: str
    prompt: tuple[int, ...]
    answer: tuple[int, ...]
    # The model's end-of-generation tokens: a draft that copies one from the prompt (the chat
    # template's end-of-turn after a quoted block) ends the answer there, as it does live.
    eog: tuple[int, ...] = ()
    # The generation budget the answer was recorded under (None: not recorded, read as the answer's
    # own length). Live, no policy knows where an answer ends: drafts are cut by the budget left, and
    # rows drafted past the end of an answer that stops early are paid for (README, *The replay harness*).
    max_tokens: int | None = None

    @classmethod
    def from_json(cls, data: dict) -> "Recording":
        budget = data.get("max_tokens")
        return cls(str(data["id"]), str(data.get("category", "")), tuple(data["prompt"]), tuple(data["answer"]),
                   tuple(data.get("eog", ())), None if budget is None else int(budget))

    @classmethod
    def load(cls, path: str | Path) -> "Recording":
        return cls.from_json(json.loads(Path(path).read_text(encoding="utf-8")))

    @property
    def budget(self) -> int:
        """Tokens the answer may take: the recorded budget, else the answer and its end."""
        return len(self.answer) + 1 if self.max_tokens is None else max(self.max_tokens, len(self.answer))

    def dense(self) -> tuple[list[int], list[int]]:
        """Prompt and answer renumbered 1..V (the fake target's logits stay small), EOS appended;
        the model's end-of-generation tokens are EOS wherever they appear."""
        eog = set(self.eog)
        ids: dict[int, int] = {}
        for t in (*self.prompt, *self.answer):
            if t not in eog:
                ids.setdefault(t, len(ids) + 1)
        return [EOS if t in eog else ids[t] for t in self.prompt], [ids[t] for t in self.answer] + [EOS]

    def cut(self, n: int) -> "Recording":
        """The answer as a generation with a budget of n tokens has it: its first n, the budget n
        (an answer cut there fills it; one that stopped before keeps its own)."""
        return replace(self, answer=self.answer[:n], max_tokens=min(n, self.budget))

    def taken_up(self, every: int, *, left: int = MIN_LEFT) -> list["Recording"]:
        """The answer taken up again from every `every`-th token on, the tokens before moved into the
        prompt (named id@start): prompts that end inside the answer, as a "continue" or an editor's
        half-written file does. Starts that leave fewer than `left` tokens to generate are skipped."""
        if every < 1:
            raise ValueError(f"every must be at least 1, not {every}")
        return [replace(self, id=f"{self.id}@{s}", prompt=self.prompt + self.answer[:s], answer=self.answer[s:],
                        max_tokens=None if self.max_tokens is None else self.max_tokens - s)
                for s in range(every, len(self.answer) - left + 1, every)]


def load_cost_table(path: str | Path) -> CostModel:
    """A stored machine cost table: {"depths": {"0": {"t_ms": {"1": ..., "8": ...}}, ...}, ...}."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    ms = {int(d): {int(k): float(v) for k, v in table["t_ms"].items()} for d, table in data["depths"].items()}
    return CostModel.from_ms(ms, data.get("draft_ms"))


# ---- the outcome ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Replayed:
    policy: str
    tokens: int  # answer tokens emitted (the end-of-answer token not counted)
    passes: int  # target passes during generation
    drafted: int
    accepted: int
    ms: float  # modelled generation time
    batches: tuple[tuple[int, int], ...] = field(default=(), repr=False)  # (rows, depth) of each pass

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.ms * 1000.0 if self.ms > 0 else 0.0

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None


# ---- a target that answers from the recording ------------------------------------------------------
class RecordedTarget:
    """The `Model` protocol over a recording: each row's argmax is the recorded next token."""

    def __init__(self, prompt: Sequence[int], truth: Sequence[int], vocab: int, budget: int | None = None):
        self.prompt_len = len(prompt)
        self.truth = list(truth)  # the answer, then EOS
        self.n_vocab = vocab
        self.n_ctx = len(prompt) + max(len(truth), budget or 0) + 64
        self.tokens: list[int] = []
        self.passes: list[tuple[int, int]] = []  # (rows, depth) of each pass after the prefill

    def decode(self, tokens, logits_for=()):
        tokens = list(tokens)
        start = len(self.tokens)
        if start >= self.prompt_len - 1:
            self.passes.append((len(tokens), start))
        self.tokens.extend(tokens)
        rows = np.full((len(logits_for), self.n_vocab), -10.0, dtype=np.float32)
        for r, i in enumerate(logits_for):
            at = start + i + 1 - self.prompt_len  # the answer position this row predicts
            rows[r, self.truth[min(max(at, 0), len(self.truth) - 1)]] = 10.0
        return rows

    def trim(self, n: int) -> None:
        del self.tokens[n:]

    def is_eog(self, token: int) -> bool:
        return token == EOS


class ScriptedClock:
    """The decoder's clock in a live replay: it moves only when a pass is charged."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class TimedTarget(RecordedTarget):
    """A recorded target whose every pass advances the clock by what it costs on the machine
    (`charge`, at the pass's depth), times a seeded log-normal noise of `noise` (a run's passes
    are never the profile's to the millisecond)."""

    def __init__(self, prompt, truth, vocab, budget=None, *, clock: ScriptedClock, charge: CostModel, noise: float,
                 seed: int):
        super().__init__(prompt, truth, vocab, budget)
        self.clock, self.charge, self.noise = clock, charge, noise
        self.rng = np.random.default_rng(seed)

    def decode(self, tokens, logits_for=()):
        tokens = list(tokens)
        ms = self.charge.t_ms(len(tokens), len(self.tokens))
        self.clock.now += ms * float(np.exp(self.rng.normal(0.0, self.noise))) / 1000.0 if self.noise else ms / 1000.0
        return super().decode(tokens, logits_for)


def _cost_of(passes: Sequence[tuple[int, int]], cost: CostModel) -> float:
    return sum(cost.t_ms(rows, depth) for rows, depth in passes)


# ggml's CPU kernels for quantized weights (ggml-cpu/repack.cpp, used on every x86 machine with AVX2)
# multiply a batch's rows four at a time and the one to three left over one by one (gemv), so a row
# past a multiple of four costs about what a row-by-row product costs, not a line's share (README,
# *The replay harness*: t(17), t(33), t(49), t(65) measured against t(16) ... t(64)).
TILE_ROWS = 4


def charged(cost: CostModel, up_to: int = 80, *, tiles: bool = True) -> CostModel:
    """What each pass is charged: the table with every batch size up to `up_to` filled in, at each depth.

    Measured sizes cost what was measured. Between them, a batch of 4m rows costs the line between
    the measured sizes either side (past the largest, its last stretch's slope); with `tiles`, a
    batch of 4m + r rows (r = 1..3) costs that plus r rows charged one by one, each at the table's
    own row-by-row step (t(5) - t(4) where both were measured, else t(3) - t(2): two and three rows
    run one by one), and never less than the line. Without `tiles`, every size lies on the line:
    the least an unmeasured size can cost. The controller itself still assumes the next measured
    size's cost (costs.staircase): the most it can cost."""
    def fill(ms: dict[int, float]) -> dict[int, float]:
        ks = sorted(ms)

        def line(k: int) -> float:
            if k in ms:
                return ms[k]
            lo = max((x for x in ks if x <= k), default=ks[0])
            hi = min((x for x in ks if x > k), default=None)
            if hi is None:  # past the largest: the last stretch's slope
                a, b = (ks[-2], ks[-1]) if len(ks) > 1 else (ks[-1], ks[-1])
                slope = (ms[b] - ms[a]) / (b - a) if b > a else 0.0
                return ms[b] + max(slope, 0.0) * (k - b)
            return ms[lo] + (ms[hi] - ms[lo]) * (k - lo) / (hi - lo)

        step = ms[5] - ms[4] if 4 in ms and 5 in ms else (ms[3] - ms[2] if 2 in ms and 3 in ms else 0.0)
        out = {}
        for k in range(1, up_to + 1):
            left = k % TILE_ROWS
            if not tiles or k in ms or k < TILE_ROWS or not left:
                out[k] = line(k)
            else:
                out[k] = max(line(k), line(k - left) + left * step)
        return out

    tables = {0: {1: cost.t1_ms, **{k: v * cost.t1_ms for k, v in cost.verify.items()}}}
    for d, t in cost.deeper.items():
        tables[d] = {1: t.t1_ms, **{k: v * t.t1_ms for k, v in t.verify.items()}}
    return CostModel.from_ms({d: fill(ms) for d, ms in tables.items()}, None)


# ---- the policies ------------------------------------------------------------------------------------
def _decode_auto(rec: Recording, profile: CostModel, target_of: Callable[..., RecordedTarget], *, spec: SpecConfig,
                 learn_timing: bool, clock: ScriptedClock) -> tuple[RecordedTarget, list]:
    """edgespec's decoder (--spec auto, no draft model) on this recording, choosing from `profile`;
    the target is target_of(prompt, truth, vocab, budget). Returns the target (its passes) and the rounds."""
    prompt, truth = rec.dense()
    target = target_of(prompt, truth, max([*prompt, *truth]) + 1, rec.budget)
    k_max = DraftLimits.of(spec, profile).draft_max
    ctl = Controller(CostModel.from_json(profile.to_json()), k_min=spec.draft_min, k_max=k_max, allow_off=True,
                     learn_timing=learn_timing)
    dec = SpeculativeDecoder(target, SamplingConfig(), ctl, SpecSettings(mode="auto", draft_max=k_max),
                             ngram=NgramDrafter(spec.ngram_min, spec.ngram_max), clock=clock)
    out = [e.token for e in dec.generate(prompt, rec.budget)]
    assert out == truth[: len(out)] and len(out) == len(truth) - 1, "the replayed answer is the recording"
    return target, dec.stats.rounds


def _outcome(policy: str, target: RecordedTarget, rounds, charge: CostModel) -> Replayed:
    return Replayed(policy, len(target.truth) - 1, len(target.passes), sum(r.drafted for r in rounds),
                    sum(r.accepted for r in rounds), _cost_of(target.passes, charge), tuple(target.passes))


def replay_auto(rec: Recording, cost: CostModel, *, spec: SpecConfig = SpecConfig(),
                charge: CostModel | None = None) -> Replayed:
    """edgespec's decoder as it is (--spec auto, no draft model) on this recording, choosing from
    `cost`; its passes charged from `charge` (default: `cost`)."""
    target, rounds = _decode_auto(rec, cost, RecordedTarget, spec=spec, learn_timing=False, clock=ScriptedClock())
    return _outcome("auto", target, rounds, charge or cost)


def replay_live(rec: Recording, profile: CostModel, machine: CostModel, *, noise: float = 0.05, seed: int = 0,
                spec: SpecConfig = SpecConfig(), charge: CostModel | None = None) -> Replayed:
    """edgespec's decoder choosing from a saved `profile` on a `machine` whose costs may have moved
    since (measured later, or another machine): its passes take the machine's time (`charge`,
    default: the machine's table filled in by `charged`) on a scripted clock, and live timing
    checks and corrects the profile as it does in a real run."""
    clock, charge = ScriptedClock(), charge or charged(machine)

    def timed(prompt, truth, vocab, budget):
        return TimedTarget(prompt, truth, vocab, budget, clock=clock, charge=charge, noise=noise, seed=seed)

    target, rounds = _decode_auto(rec, profile, timed, spec=spec, learn_timing=True, clock=clock)
    return _outcome("auto-live", target, rounds, charge)


class NgramSimple:
    """llama.cpp's ngram-simple (common_ngram_simple_draft), on token lists."""

    def __init__(self, size_n: int = 12, size_m: int = 48):
        self.n, self.m = size_n, size_m

    def begin(self, prompt: Sequence[int]) -> None:
        pass

    def draft(self, ctx: Sequence[int]) -> list[int]:
        tokens, n = ctx[:-1], self.n  # llama.cpp keeps the last sampled token apart
        cur = len(tokens)
        if cur <= n + self.m + 1:
            return []
        pattern = list(tokens[cur - n + 1:]) + [ctx[-1]]
        first = pattern[0]
        for j in range(cur - n - 1, 0, -1):  # backwards, position 0 never (it means "no match")
            if tokens[j] == first and list(tokens[j:j + n]) == pattern:
                copy = min(self.m, cur - (j + n))
                return list(tokens[j + n:j + n + copy]) if copy >= n else []
        return []

    def accept(self, n_accepted: int) -> None:
        pass


class NgramMod:
    """llama.cpp's ngram-mod (common_speculative_impl_ngram_mod); a dict stands for its 4M-entry hash
    table (collisions there are rare at these lengths)."""

    def __init__(self, n_match: int = 24, n_min: int = 48, n_max: int = 64):
        self.n, self.n_min, self.n_max = n_match, n_min, n_max
        self.table: dict[tuple[int, ...], int] = {}
        self.i_last = 0
        self.n_low = 0
        self.n_draft_last = 0

    def _add(self, tokens: Sequence[int], lo: int, hi: int) -> None:
        for i in range(lo, hi):
            self.table[tuple(tokens[i:i + self.n])] = tokens[i + self.n]

    def begin(self, prompt: Sequence[int]) -> None:
        self.i_last = self.n_draft_last = 0
        if len(prompt) < self.n:
            return
        self._add(prompt, 0, len(prompt) - self.n)
        self.i_last = len(prompt) - self.n

    def draft(self, ctx: Sequence[int]) -> list[int]:
        tokens, n = ctx[:-1], self.n
        self.n_draft_last = 0
        cur = len(tokens)
        if cur < n:
            return []
        if self.i_last + 32 < cur:  # new n-grams go in in chunks
            self._add(tokens, self.i_last, cur - n)
            self.i_last = cur - n
        key = list(tokens[cur - n + 1:]) + [ctx[-1]]
        out: list[int] = []
        for i in range(self.n_max):
            nxt = self.table.get(tuple(key[i:i + n]))
            if nxt is None:
                if i < self.n_min:
                    return []
                break
            key.append(nxt)
            out.append(nxt)
        self.n_draft_last = len(out)
        return out

    def accept(self, n_accepted: int) -> None:
        if self.n_draft_last > 0:
            if n_accepted / self.n_draft_last < 0.25:
                self.n_low += 1
                if self.n_low >= 5:
                    self.table.clear()
                    self.n_low = self.i_last = 0
            else:
                self.n_low = 0


class Plain:
    def begin(self, prompt: Sequence[int]) -> None:
        pass

    def draft(self, ctx: Sequence[int]) -> list[int]:
        return []

    def accept(self, n_accepted: int) -> None:
        pass


def replay_fixed(name: str, drafter, rec: Recording, cost: CostModel) -> Replayed:
    """llama-speculative-simple's loop: draft what the drafter gives, cut to the budget left as the tool
    cuts it (n_predict - produced - 1, with n_predict = max_tokens - 1 as scripts/compare_llamacpp runs
    it), verify [last, draft...] in one batch, keep the matching prefix and the target's token. Rows
    drafted past the answer's end are paid for; a drafted end token ends the answer (not counted kept)."""
    prompt, truth = rec.dense()
    answer = len(truth) - 1
    ctx = list(prompt)
    drafter.begin(ctx[:-1])
    emitted = drafted = accepted = 0
    passes = []
    while True:
        draft = drafter.draft(ctx)[: max(rec.budget - 2 - emitted, 0)]
        passes.append((len(draft) + 1, len(ctx) - 1))
        n = common_prefix_len(draft, truth[emitted:])
        drafted += len(draft)
        drafter.accept(n)
        accepted += min(n, answer - emitted)
        new = truth[emitted:emitted + n + 1]
        if new[-1] == EOS:
            emitted += len(new) - 1
            break
        ctx += new
        emitted += len(new)
    return Replayed(name, emitted, len(passes), drafted, accepted, _cost_of(passes, cost), tuple(passes))


POLICIES: dict[str, Callable[[], object]] = {
    "plain": Plain,
    "ngram-simple": NgramSimple,
    "ngram-simple-16": lambda: NgramSimple(12, 16),
    "ngram-mod": NgramMod,
}


def replay(policy: str, rec: Recording, cost: CostModel, *, charge: CostModel | None = None) -> Replayed:
    """`policy` on `rec`: the controller decides from `cost` (what the profile measured); each pass is
    charged from `charge` (default: `cost` with every size filled in, charged)."""
    if policy != "auto" and policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r} (known: auto, {', '.join(POLICIES)})")
    charge = charge or charged(cost)
    if policy == "auto":
        return replay_auto(rec, cost, charge=charge)
    return replay_fixed(policy, POLICIES[policy](), rec, charge)
