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

    def decode(self, tokens, logits_for=()):
        tokens = list(tokens)
        assert len(self.tokens) + len(tokens) <= self.n_ctx, "fake context overflow"
        start = len(self.tokens)
        self.tokens.extend(tokens)
        self.decode_calls.append(len(tokens))
        rows = [self.lm(self.tokens[: start + i + 1]) for i in logits_for]
        return np.array(rows, dtype=np.float32).reshape(len(rows), self.n_vocab)

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
