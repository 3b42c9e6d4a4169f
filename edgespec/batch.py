"""Many sequences, one target pass per step: continuous batching with speculative drafts.

Pure: no llama_cpp, no printing. Each active sequence is a `SpeculativeDecoder` bound to its own
KV sequence of the same target. A step gives every sequence still reading its prompt a chunk of it
and every decoding sequence its last token plus the drafts its controller chose, and runs them as
one `decode_parts` call; then each sequence verifies its own rows. Draft lengths are chosen for the
whole batch: a sequence planned later sees the rows and expected tokens of those planned before it
(`controller.Load`), so drafts shrink as the batch fills and speculation turns off where batching
already keeps the machine busy.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

from .controller import Load
from .costs import CostModel
from .speculative import SpeculativeDecoder, TokenEvent

# Rows a step holds while it reads a prompt beside running streams (their rows included). A step's
# time is every running stream's inter-token latency, so a long prompt is read in chunks between
# decode rounds instead of freezing the others for its whole prefill; a larger chunk reads the
# prompt sooner (each step also pays for the streams' rows) but makes every other stream wait
# longer per token. The chunk is PREFILL_STEP_S at the profile's prefill speed, never fewer than
# PREFILL_CHUNK rows (prefill_rows): 4 clients on a Zen 5 EPYC, whose 64-row batch takes ~0.5 s,
# got TTFT p95 6.7 s with 128-row steps against 7.6 s with 64 (3 runs each, tok/s level; 256 rows:
# p95 no better, p50 worse). With nobody decoding, a step reads whole prompts, shortest first, up to
# a batch (n_batch); one that does not fit in what is left waits for the next step: the short ones
# start decoding after this step instead of after a long prompt's first batch.
PREFILL_CHUNK = 64
PREFILL_STEP_S = 1.0
# CPU kernels multiply weights with rows four at a time (llama.cpp's repacked K-quant GEMM) and each
# row left over separately, at nearly a single pass's cost: 64 prompt rows + 3 decode rows took 30%
# longer than 61 + 3. A step that reads a prompt ends its chunk where the rows fill whole tiles.
ROW_TILE = 4


def prefill_rows(cost: CostModel, n_batch: int) -> int:
    """The rows of a step that reads a prompt beside running streams: as many as the profile's
    64-row batch says take PREFILL_STEP_S, in whole row tiles, between PREFILL_CHUNK and n_batch
    (PREFILL_CHUNK without a profile)."""
    t = cost.t_ms(PREFILL_CHUNK)
    rows = PREFILL_CHUNK if not t else int(PREFILL_STEP_S * 1000.0 / t * PREFILL_CHUNK) // ROW_TILE * ROW_TILE
    return max(min(PREFILL_CHUNK, n_batch), min(rows, n_batch))


class BatchModel(Protocol):
    unified_kv: bool  # one KV cache for all sequences (one pass per batch), not a stream each

    def decode_parts(self, parts: Sequence[tuple[object, Sequence[int], Sequence[int]]]) -> list[np.ndarray]: ...


@dataclass(frozen=True)
class StepResult:
    events: dict[int, list[TokenEvent]]  # by member index: the tokens each emitted this step
    rows: int  # rows in the target batch (verify rows and prefill tokens)
    seconds: float


class Batcher:
    """Runs steps over a changing set of decoders that share one target model."""

    def __init__(self, target: BatchModel, *, n_batch: int, max_exact_batch: int | None = None,
                 prefill_chunk: int = PREFILL_CHUNK):
        self.target = target
        self.n_batch = n_batch
        # exact kernels: verify rows must stay below the batch size where kernels change, and
        # prompt tokens never share a batch with verify rows (each prompt is read on its own)
        self.max_rows = n_batch if max_exact_batch is None else min(n_batch, max_exact_batch)
        self.exact = max_exact_batch is not None
        self.prefill_chunk = max(1, min(prefill_chunk, n_batch))
        self._turn = 0

    def step(self, members: Sequence[SpeculativeDecoder]) -> StepResult:
        """One target pass for all members (done ones are skipped; more than one pass only when
        exact kernels cap the rows below the number of sequences). Returns what each emitted."""
        t0 = time.perf_counter()
        events: dict[int, list[TokenEvent]] = {}
        live = [i for i, d in enumerate(members) if not d.done]
        decoding = [i for i in live if not members[i].prefill_left]
        parts, finishing = self._prefill(members, [i for i in live if members[i].prefill_left], len(decoding))
        total = 0
        if decoding or finishing:
            # whose drafts are planned first (and so see the emptiest batch) rotates every step
            self._turn = (self._turn + 1) % max(1, len(decoding))
            order = decoding[self._turn:] + decoding[: self._turn] + finishing
            while order:
                room = self.max_rows - sum(len(p[1]) for p in parts)
                group, order = order[: max(1, room)], order[max(1, room):]
                total += self._verify(members, group, parts, events)
                parts = []
        if parts:  # prompt chunks with nobody decoding
            total += sum(len(p[1]) for p in parts)
            self._decode(members, parts, events, 0.0)
        return StepResult(events, total, time.perf_counter() - t0)

    def _prefill(self, members, reading: list[int], n_decoding: int) -> tuple[list, list[int]]:
        """Prompt chunks for this step, shortest prompt first (a short one is not kept behind a long
        one), and the sequences whose prompt ends in this step: their first round is planned with
        the rest of the prompt (SpeculativeDecoder.plan), so they emit in this step. Exact kernels
        decode the chunks alone now, one sequence at a time in whole chunks, so a prompt's chunks
        (and so its KV) are the same whatever else runs."""
        parts, finishing = [], []
        # with nobody waiting on tokens, a step may read a whole batch of prompt; otherwise the step
        # holds prefill_chunk rows (prefill_rows) with each decoding sequence's one
        budget = max(1, min(self.prefill_chunk, self.n_batch) - n_decoding) if n_decoding else self.n_batch
        reading = sorted(reading, key=lambda i: members[i].prefill_left)
        if self.exact:
            reading = reading[:1]
            budget = self.prefill_chunk
        for i in reading:
            left = members[i].prefill_left
            if (parts or finishing) and not n_decoding and left > budget:
                break
            if not self.exact and left < budget:  # the rest of the prompt and the round's first row
                finishing.append(i)
                budget -= left + 1
                continue
            chunk = members[i].prefill_chunk(budget) if budget > 0 else []
            if not chunk:
                break
            budget -= len(chunk)
            if self.exact:
                self.target.decode_parts([(members[i].target, chunk, [])])
                members[i].prefilled(len(chunk))
            else:
                parts.append((members[i].target, chunk, [], i))
        return parts, finishing

    def _verify(self, members, group: list[int], parts: list, events) -> int:
        """Plan each sequence's round seeing what the batch holds (prompt chunks, the rounds planned
        before it, one row for each sequence still to plan); decode them together; apply. A sequence
        still reading its prompt reads the rest of it in the same batch, just before its round."""
        rest = [members[i].prefill_left for i in group if members[i].prefill_left]
        # one sequence alone runs as one pass with a KV stream too
        streams = not self.target.unified_kv and len(group) + len(parts) > 1
        load = Load(prompt_rows=(*(len(p[1]) for p in parts), *rest), streams=streams)
        alone = len(group) == 1 and not parts and not rest
        for n, i in enumerate(group):
            d = members[i]
            later = len(group) - n - 1  # each later sequence needs at least its one row
            limit = max(0, self.max_rows - load.rows - later - 1)
            ahead = load.expecting(later)
            prompt = d.prefill_chunk(d.prefill_left)
            batch = d.plan(k_limit=limit, load=None if alone else ahead)
            parts.append((d.target, prompt + batch, list(range(len(prompt), len(prompt) + len(batch))), i))
            drafted = d.planned.source == "draft" and bool(d.planned.tokens)
            load = load.plus(len(batch), d.expected_tokens,
                             (len(batch) - 1) * d.controller.cost.draft_cost if drafted else 0.0)
        parts = self._whole_tiles(parts)
        self._decode(members, parts, events, time.perf_counter())
        return sum(len(p[1]) for p in parts)

    @staticmethod
    def _whole_tiles(parts: list) -> list:
        """Shorten the step's prompt chunks (the last first) so its rows fill whole ROW_TILEs; a
        chunk cut to nothing waits for the next step."""
        extra = sum(len(p[1]) for p in parts) % ROW_TILE
        out = []
        for seq, toks, want, i in reversed(parts):
            if extra and not want:
                cut = min(extra, len(toks))
                toks, extra = toks[: len(toks) - cut], extra - cut
                if not toks:
                    continue
            out.append((seq, toks, want, i))
        return out[::-1]

    def _decode(self, members, parts: list, events, t1: float) -> None:
        outs = self.target.decode_parts([(seq, toks, want) for seq, toks, want, _ in parts])
        seconds = time.perf_counter() - t1 if t1 else 0.0
        rows = sum(len(p[1]) for p in parts)
        for (_, toks, want, i), logits in zip(parts, outs):
            if not want:
                members[i].prefilled(len(toks))
            else:
                events[i] = members[i].apply(logits, seconds, rows)
