"""Fake models over a tiny vocabulary for testing the speculative core without llama.cpp."""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

EOS = 0
VOCAB = 8


def table_lm(seed: int, vocab: int = VOCAB, sharp: float = 3.0) -> Callable[[Sequence[int]], np.ndarray]:
    """A deterministic 'language': logits depend on the last two tokens through a fixed random table."""
    rng = np.random.default_rng(seed)
    table = rng.normal(size=(vocab, vocab, vocab)) * sharp

    def logits(ctx: Sequence[int]) -> np.ndarray:
        a = ctx[-2] if len(ctx) >= 2 else 1
        b = ctx[-1]
        return table[a % vocab, b % vocab].astype(np.float32)

    return logits


class FakeModel:
    def __init__(self, lm: Callable[[Sequence[int]], np.ndarray], n_ctx: int = 256, vocab: int = VOCAB, eos: int = EOS):
        self.lm = lm
        self.n_ctx = n_ctx
        self.n_vocab = vocab
        self.eos = eos
        self.tokens: list[int] = []
        self.decode_calls: list[int] = []  # batch sizes, to check one batch per verify
        # One logits buffer for every decode, as llama.cpp has: the rows a decode returns are a view
        # into it, valid only until the next decode. Code that keeps a row across decodes reads the
        # next decode's logits (or NaN, past the rows it wrote) and fails here as it would for real.
        self._logits = np.full((1, vocab), np.nan, dtype=np.float32)

    def decode(self, tokens, logits_for=()):
        tokens = list(tokens)
        logits_for = list(logits_for)
        assert len(self.tokens) + len(tokens) <= self.n_ctx, "fake context overflow"
        start = len(self.tokens)
        self.tokens.extend(tokens)
        self.decode_calls.append(len(tokens))
        buf = self._logits
        buf.fill(np.nan)  # a row kept from the last decode now reads NaN (or this decode's logits)
        if len(logits_for) > len(buf):
            buf = self._logits = np.full((len(logits_for), self.n_vocab), np.nan, dtype=np.float32)
        for row, i in enumerate(logits_for):
            buf[row] = self.lm(self.tokens[: start + i + 1])
        return buf[: len(logits_for)]

    def trim(self, n):
        del self.tokens[n:]

    def is_eog(self, token):
        return token == self.eos


class AdversarialLM:
    """Always prefers a token the reference model does not pick (so drafts are never accepted)."""

    def __init__(self, reference):
        self.reference = reference

    def __call__(self, ctx):
        ref = self.reference(ctx)
        out = np.full_like(ref, -10.0)
        out[(int(np.argmax(ref)) + 1) % len(ref)] = 10.0
        return out


def plain_greedy(lm, prompt, max_tokens, eos=EOS):
    ctx = list(prompt)
    out = []
    for _ in range(max_tokens):
        tok = int(np.argmax(lm(ctx)))
        if tok == eos:
            break
        out.append(tok)
        ctx.append(tok)
    return out


def tiny_registry_entry(content: bytes, source: str = 'hf = { repo = "owner/tiny-GGUF", file = "tiny.gguf" }') -> str:
    """A user models.toml entry `tiny` for `content` (size and sha256 filled in), fetched from `source`."""
    import hashlib

    return f"""
[models.tiny]
family = "t"
architecture = "llama"
quant = "Q4_0"
params = "1M"
size = {len(content)}
sha256 = "{hashlib.sha256(content).hexdigest()}"
{source}
"""
