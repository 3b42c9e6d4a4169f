"""Logit warpers shared by the draft and the target, so p and q are shaped the same way.

Pure numpy. `warp` turns one row of logits into a probability vector (float64, sums to 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .errors import ConfigError

# A temperature below this samples as greedy (argmax). At T = 1e-5 the runner-up keeps less than
# float64's epsilon (2^-52, e^-36) of the top token's probability unless their logits lie within
# 36·T ≈ 4e-4 of each other, so sampling returned the argmax anyway; and dividing float32-sized
# logits by a denormal temperature (1e-310) overflows to inf and turns the distribution into NaN
# (garbage tokens). vLLM draws the line at the same 1e-5 (_SAMPLING_EPS).
GREEDY_BELOW = 1e-5


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 0.0
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    seed: int | None = None

    def __post_init__(self):
        checks = [
            (self.temperature >= 0, f"--temperature must be >= 0 (got {self.temperature})"),
            (self.top_k >= 0, f"--top-k must be >= 0; 0 disables it (got {self.top_k})"),
            (0 < self.top_p <= 1, f"--top-p must be in (0, 1] (got {self.top_p})"),
            (0 <= self.min_p < 1, f"--min-p must be in [0, 1) (got {self.min_p})"),
            (self.repeat_penalty > 0, f"--repeat-penalty must be > 0 (got {self.repeat_penalty})"),
            (self.repeat_last_n >= 0, f"--repeat-last-n must be >= 0 (got {self.repeat_last_n})"),
            (self.seed is None or 0 <= self.seed < 2**63, f"--seed must be a non-negative integer (got {self.seed})"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW


def apply_repeat_penalty(logits: np.ndarray, history: Sequence[int], cfg: SamplingConfig) -> np.ndarray:
    if cfg.repeat_penalty == 1.0 or cfg.repeat_last_n == 0 or not history:
        return logits
    recent = np.unique(np.asarray(history[-cfg.repeat_last_n :], dtype=np.int64))
    out = np.array(logits, dtype=np.float32, copy=True)
    vals = out[recent]
    # llama.cpp's rule: divide positive logits, multiply negative ones.
    out[recent] = np.where(vals > 0, vals / cfg.repeat_penalty, vals * cfg.repeat_penalty)
    return out


def warp(logits: np.ndarray, cfg: SamplingConfig, history: Sequence[int] = ()) -> np.ndarray:
    """Probability vector after penalties, temperature, top-k, top-p and min-p (in llama.cpp's order)."""
    logits = apply_repeat_penalty(logits, history, cfg)
    n = logits.shape[-1]
    if cfg.greedy:
        probs = np.zeros(n)
        probs[int(np.argmax(logits))] = 1.0
        return probs
    idx = np.arange(n) if cfg.top_k == 0 or cfg.top_k >= n else np.argpartition(logits, -cfg.top_k)[-cfg.top_k :]
    vals = logits[idx].astype(np.float64) / cfg.temperature
    order = np.argsort(-vals, kind="stable")
    idx, vals = idx[order], vals[order]
    p = np.exp(vals - vals[0])
    p /= p.sum()
    keep = len(p)
    if cfg.top_p < 1.0:
        # keep the smallest prefix whose mass reaches top_p (at least one token)
        keep = min(keep, int(np.searchsorted(np.cumsum(p), cfg.top_p)) + 1)
    if cfg.min_p > 0.0:
        keep = min(keep, max(1, int(np.sum(p[:keep] >= cfg.min_p * p[0]))))
    probs = np.zeros(n)
    kept = p[:keep]
    probs[idx[:keep]] = kept / kept.sum()
    return probs


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    # Inverse-CDF with one uniform: cheaper than rng.choice on a 150k vocabulary.
    cdf = np.cumsum(probs)
    u = rng.random() * cdf[-1]
    return int(min(np.searchsorted(cdf, u, side="right"), len(probs) - 1))
