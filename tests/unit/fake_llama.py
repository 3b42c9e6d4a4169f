"""A fake LlamaModel for the engine, the batcher and the server: several sequences in one "context",
byte-level tokens, and a language that always answers with a fixed reply.

It behaves like the real one where the code under test could notice: `decode_parts` runs every
sequence's rows in one call and returns views into one logits buffer that the next decode
overwrites; each sequence has its own KV mirror and context budget; a gate can hold a decode (so a
test can keep a request in flight), and the threads that touch it are recorded.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Sequence

import numpy as np

from edgespec.backend.model import LoadParams, SavedSeq
from edgespec.engine import Engine, EngineConfig

REPLY = "Hello from the fake model, one token at a time."
EOS, BOS = 0, 1
OFFSET = 2  # token id = byte value + OFFSET
VOCAB = 256 + OFFSET


def reply_lm(reply: bytes):
    """Next token: the reply continues from the longest suffix of the context that is a prefix of
    it (from its start when none is), then EOS. Greedy decoding of any prompt gives the reply."""
    ids = [b + OFFSET for b in reply]

    def logits(ctx: Sequence[int]) -> np.ndarray:
        n = 0
        for k in range(min(len(ids), len(ctx)), 0, -1):
            if list(ctx[-k:]) == ids[:k]:
                n = k
                break
        row = np.zeros(VOCAB, dtype=np.float32)
        row[ids[n] if n < len(ids) else EOS] = 10.0
        row[(n * 7 + 3) % VOCAB] += 2.0  # a runner-up, so sampling has somewhere to go
        return row

    return logits


class FakeSeq:
    def __init__(self, model: "FakeLlama", seq_id: int):
        self.model, self.seq_id = model, seq_id
        self.tokens: list[int] = []

    n_ctx = property(lambda self: self.model.n_ctx)
    n_vocab = property(lambda self: self.model.n_vocab)
    max_exact_batch = property(lambda self: self.model.max_exact_batch)

    def is_eog(self, token: int) -> bool:
        return token == EOS

    def decode(self, tokens, logits_for=()):
        return self.model.decode_parts([(self, tokens, logits_for)])[0]

    def trim(self, n: int) -> None:
        del self.tokens[n:]

    def reset(self) -> None:
        self.tokens = []

    def copy_prefix(self, src: "FakeSeq", n: int) -> None:
        assert src.model is self.model and src is not self and 0 < n <= len(src.tokens)
        self.model.copies.append((src.seq_id, self.seq_id, n))
        self.tokens = list(src.tokens[:n])

    def save(self) -> SavedSeq:
        self.model.saves.append((self.seq_id, len(self.tokens)))
        return SavedSeq(tuple(self.tokens), None, 0)

    def restore(self, saved: SavedSeq, n: int) -> bool:
        assert 0 < n <= saved.n_tokens
        self.model.restores.append((self.seq_id, n))
        self.tokens = list(saved.tokens[:n])
        return True


class FakeLlama:
    bos, eos, add_bos = BOS, EOS, False
    n_vocab = VOCAB

    def __init__(self, reply: str = "", *, lm=None, n_seq: int = 1, n_ctx: int = 2048, n_batch: int = 512,
                 max_exact_batch: int | None = None):
        self.lm = lm or reply_lm(reply.encode())
        self.n_ctx, self.n_batch, self.max_exact_batch = n_ctx, n_batch, max_exact_batch
        self.unified_kv = max_exact_batch is None and n_seq > 1  # as LoadParams.unified_kv
        self._seqs = [FakeSeq(self, i) for i in range(n_seq)]
        self._buffer = np.zeros((n_batch, VOCAB), dtype=np.float32)
        self.batches: list[list[tuple[int, int, int]]] = []  # per decode: (seq id, rows, logits rows) per part
        self.gate = threading.Event()  # clear it to hold the next decode (the next one hold_if picks)
        self.gate.set()
        self.hold_if = None  # parts -> bool
        self.held = threading.Event()  # set while a decode waits at the gate
        self.threads: set[str] = set()
        self.copies: list[tuple[int, int, int]] = []  # (from seq, to seq, tokens) of each prefix copy
        self.saves: list[tuple[int, int]] = []  # (seq, tokens) of each sequence saved to host memory
        self.restores: list[tuple[int, int]] = []  # (seq, tokens) of each saved prefix restored

    n_seq = property(lambda self: len(self._seqs))
    tokens = property(lambda self: self._seqs[0].tokens)

    def seq(self, i: int) -> FakeSeq:
        return self._seqs[i]

    def _touch(self) -> None:
        self.threads.add(threading.current_thread().name)

    # ---- vocabulary ----------------------------------------------------------------------
    def tokenize(self, text: str, *, special: bool = False, add_bos: bool = False) -> list[int]:
        self._touch()
        return ([BOS] if add_bos else []) + [b + OFFSET for b in text.encode()]

    def token_bytes(self, token: int) -> bytes:
        return bytes([token - OFFSET]) if token >= OFFSET else b""

    def token_text(self, token: int) -> str:
        return {EOS: "</s>", BOS: "<s>"}.get(token, self.token_bytes(token).decode("latin-1"))

    def is_eog(self, token: int) -> bool:
        return token == EOS

    def chat_template(self) -> str | None:
        return None

    # ---- decoding ------------------------------------------------------------------------
    def decode(self, tokens, logits_for=()):
        return self._seqs[0].decode(tokens, logits_for)

    def trim(self, n: int) -> None:
        self._seqs[0].trim(n)

    def decode_parts(self, parts):
        self._touch()
        if not self.gate.is_set() and (self.hold_if is None or self.hold_if(parts)):
            self.held.set()
            self.gate.wait()
            self.held.clear()
        parts = [(s, list(t), list(w)) for s, t, w in parts]
        assert sum(len(t) for _, t, _ in parts) <= self.n_batch, "more rows than the batch holds"
        for s, t, _ in parts:
            assert len(s.tokens) + len(t) <= self.n_ctx, "fake context overflow"
        self.batches.append([(s.seq_id, len(t), len(w)) for s, t, w in parts if t])
        out, row = [], 0
        for s, t, want in parts:
            start = len(s.tokens)
            s.tokens.extend(t)
            first = row
            for i in want:
                self._buffer[row] = self.lm(s.tokens[: start + i + 1])
                row += 1
            out.append(self._buffer[first:row])  # a view: the next decode overwrites it
        return out

    def reset(self) -> None:
        for s in self._seqs:
            s.tokens = []

    def close(self) -> None:
        pass


class FakeEngine(Engine):
    """The real Engine (decoders, batcher, controller) over a fake multi-sequence model."""

    def __init__(self, reply: str = REPLY, *, n_seq: int = 1, n_ctx: int = 2048):
        target = FakeLlama(reply, n_seq=n_seq, n_ctx=n_ctx)
        super().__init__(EngineConfig(Path("fake.gguf"), LoadParams(), n_seq=n_seq), models=(target, None))
        self.gate, self.waiting, self.threads = target.gate, target.held, target.threads
        self.generations: list[dict] = []  # per admitted request: sampling, max_tokens, emitted, closed

    def decoder(self, sampling, mode=None, **kw):
        dec = super().decoder(sampling, mode, **kw)
        record = {"emitted": 0, "sampling": sampling, "closed": False}
        self.generations.append(record)
        apply, close = dec.apply, dec.close

        def counted_apply(*args):
            events = apply(*args)
            record["emitted"] += len(events)
            return events

        def recorded_close():
            record["closed"] = True
            close()

        dec.apply, dec.close = counted_apply, recorded_close
        return dec
