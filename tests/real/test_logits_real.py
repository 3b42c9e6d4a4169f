"""Real target: a row of a k-row verify batch against single-token decoding of the same tokens.

Exact kernels (`LoadParams(exact=True)`): bit for bit for k = 2..7, with a short KV cache and
past 512 cells. Fast kernels (the default): the drift is measured and printed (run with -s) for
k up to 64, and must stay below bench's near-tie threshold, which judges fast-kernel divergences.
Also: an exact target verifies at most 7 rows per batch, and loads without weight repacking and
flash attention.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgespec.bench.results import NEAR_TIE_LOGIT
from edgespec.backend.model import EXACT_MAX_BATCH, LlamaModel, LoadParams
from edgespec.controller import Controller
from edgespec.costs import CostModel
from edgespec.engine import Engine, EngineConfig
from edgespec.sampling import SamplingConfig
from edgespec.drafters import ModelDrafter
from edgespec.speculative import SpecSettings, SpeculativeDecoder

from .conftest import DRAFT, TARGET

SOURCE = Path(__file__).resolve().parents[2].joinpath("edgespec", "controller.py").read_text()
PROMPTS = {
    "code": "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "prose": "The history of the printing press begins in the fifteenth century, when",
    "long": SOURCE[:2200],  # ~600 tokens: past flash attention's split-KV threshold (512 cells)
}
RAW_PROMPT = "def reverse(s):\n    \"\"\"Return s reversed.\"\"\"\n"
N_CTX = 2048
TOP = 8  # candidates a flip could go to: the single row's top tokens
GREEDY = SamplingConfig()


def prefix_and_batch(model: LlamaModel, text: str, k: int) -> tuple[list[int], list[int], np.ndarray]:
    """The prompt without its last token, a k-token verify batch [last, greedy continuation...],
    and the single-token logits of each batch row (decoded one token at a time)."""
    tokens = model.tokenize(text)
    prefix, batch = tokens[:-1], [tokens[-1]]
    model.reset()
    model.decode(prefix)
    rows = []
    for _ in range(k):
        row = model.decode([batch[-1]], [0])[0].copy()
        rows.append(row)
        batch.append(int(np.argmax(row)))
    return prefix, batch[:k], np.array(rows)


def batched_rows(model: LlamaModel, prefix: list[int], batch: list[int]) -> np.ndarray:
    model.trim(len(prefix))
    assert model.tokens == prefix
    return model.decode(batch, range(len(batch))).copy()


def drift(batched: np.ndarray, single: np.ndarray) -> tuple[float, float, float]:
    """(largest |logit difference|, largest |top-2 margin difference|, largest drift of
    top-1 minus any of the single row's top tokens: what a greedy flip needs to exceed)."""
    abs_drift = float(np.max(np.abs(batched - single)))
    margin = pair = 0.0
    for b, s in zip(batched, single):
        sb, ss = np.sort(b)[-2:], np.sort(s)[-2:]
        margin = max(margin, abs(float(sb[1] - sb[0]) - float(ss[1] - ss[0])))
        top = np.argsort(s)[-TOP:]
        best = top[-1]
        pair = max(pair, float(np.max(np.abs((b[best] - b[top]) - (s[best] - s[top])))))
    return abs_drift, margin, pair


@pytest.fixture(scope="module")
def exact_target(model_path):
    with LlamaModel(model_path(TARGET), LoadParams(n_ctx=N_CTX, n_threads=2, exact=True)) as m:
        yield m


@pytest.fixture(scope="module")
def fast_target(model_path):
    with LlamaModel(model_path(TARGET), LoadParams(n_ctx=N_CTX, n_threads=2)) as m:
        yield m


@pytest.mark.parametrize("name", ["code", "long"])
def test_exact_batch_rows_equal_single_token_rows_bit_for_bit(exact_target, name):
    m = exact_target
    prefix, batch, single = prefix_and_batch(m, PROMPTS[name], EXACT_MAX_BATCH)
    if name == "long":
        assert len(prefix) > 512, len(prefix)
    for k in range(2, EXACT_MAX_BATCH + 1):
        rows = batched_rows(m, prefix, batch[:k])
        for i in range(k):
            assert np.array_equal(rows[i], single[i]), (
                f"k={k} row {i} at KV {len(prefix) + i}: max |diff| {np.max(np.abs(rows[i] - single[i]))}"
            )


def test_fast_kernel_drift_stays_below_the_near_tie_threshold(fast_target):
    m = fast_target
    sizes = [2, 3, 4, 5, 6, 7, 8, 16, 64]
    worst = {"abs": (0.0, ""), "margin": (0.0, ""), "pair": (0.0, "")}
    lines = []
    for name, text in PROMPTS.items():
        prefix, batch, single = prefix_and_batch(m, text, max(sizes))
        for k in sizes:
            rows = batched_rows(m, prefix, batch[:k])
            assert np.isfinite(rows).all()
            figures = dict(zip(("abs", "margin", "pair"), drift(rows, single[:k])))
            lines.append(f"{name:5s} KV {len(prefix):4d} k={k:2d}: max|dlogit| {figures['abs']:.4f}  "
                         f"max|dmargin| {figures['margin']:.4f}  max|d(top1-topj)| {figures['pair']:.4f}")
            for key, value in figures.items():
                if value > worst[key][0]:
                    worst[key] = (value, f"{name} k={k}")
    print("\nfast kernels vs single-token decoding, " + TARGET)
    print("\n".join(lines))
    print("largest: " + "; ".join(f"{k} {v:.4f} ({where})" for k, (v, where) in worst.items()))
    # A batch row picks b over plain decoding's a only if l_a - l_b moved by more than it was in
    # the plain row, which is at least the plain top-2 margin. So every divergence happens at a
    # plain margin below the largest drift of (top-1 - top-j): bench --verify's near-tie threshold
    # must cover that drift, or it fails runs that only met a near-tie.
    assert worst["pair"][0] < NEAR_TIE_LOGIT, worst


class Recording:
    """The real model, with the size of every decode call recorded."""

    def __init__(self, model):
        self._model = model
        self.calls: list[int] = []

    def decode(self, tokens, logits_for=()):
        self.calls.append(len(tokens))
        return self._model.decode(tokens, logits_for)

    def __getattr__(self, name):  # n_vocab, n_ctx, tokens, trim, is_eog, max_exact_batch, ...
        return getattr(self._model, name)


def verify_batches(engine: Engine, n: int = 40) -> tuple[list[int], list[int]]:
    """Verify batch sizes of a draft-mode run that always wants 16 drafts, and the output."""
    target = Recording(engine.target)
    ctl = Controller(CostModel(draft_cost=0.01), k_min=16, k_max=16, allow_off=False, learn_timing=False)
    dec = SpeculativeDecoder(target, GREEDY, ctl, SpecSettings(mode="draft", draft_max=16),
                             drafter=ModelDrafter(engine.draft, GREEDY))
    engine.reset()
    out = [e.token for e in dec.generate(engine.raw_tokens(RAW_PROMPT), n)]
    return target.calls[1:], out  # [0] is the prefill


def test_exact_target_verifies_at_most_seven_rows(pair_engine):
    assert pair_engine.config.exact and pair_engine.target.max_exact_batch == EXACT_MAX_BATCH
    sizes, out = verify_batches(pair_engine)
    assert sizes and max(sizes) == EXACT_MAX_BATCH, sizes  # the cap binds: 16 drafts were wanted
    # and the capped output is plain greedy decoding's
    engine = pair_engine
    engine.reset()
    plain_decoder = SpeculativeDecoder(engine.target, GREEDY, Controller(CostModel()), SpecSettings(mode="off"))
    plain = [e.token for e in plain_decoder.generate(engine.raw_tokens(RAW_PROMPT), len(out))]
    assert out == plain


def test_fast_target_is_not_capped(model_path):
    params = LoadParams(n_ctx=1024, n_threads=2)
    with Engine(EngineConfig(model_path(TARGET), params, model_path(DRAFT), params)) as engine:
        assert engine.target.max_exact_batch is None
        sizes, _ = verify_batches(engine, n=24)
    assert max(sizes) > EXACT_MAX_BATCH, sizes


@pytest.mark.parametrize("exact", [True, False])
def test_exact_target_loads_without_repacking_or_flash_attention(model_path, monkeypatch, exact):
    from edgespec.backend import model as backend

    lc = backend.ensure_backend()
    seen = {}
    load, init = lc.llama_model_load_from_file, lc.llama_init_from_model

    def recording_load(path, mp):
        seen.setdefault("use_extra_bufts", mp.use_extra_bufts)  # the target loads first
        return load(path, mp)

    def recording_init(model, cp):
        seen.setdefault("flash_attn_type", cp.flash_attn_type)
        return init(model, cp)

    monkeypatch.setattr(lc, "llama_model_load_from_file", recording_load)
    monkeypatch.setattr(lc, "llama_init_from_model", recording_init)
    params = LoadParams(n_ctx=256, n_threads=2)
    with Engine(EngineConfig(model_path(TARGET), params, exact=exact)) as engine:
        assert engine.target.params.exact is exact
        assert engine.target.max_exact_batch == (EXACT_MAX_BATCH if exact else None)
    if exact:
        assert seen == {"use_extra_bufts": False, "flash_attn_type": 0}  # no repacked weights, no flash attention
    else:
        assert seen == {"use_extra_bufts": True, "flash_attn_type": -1}  # llama.cpp's defaults: repack, flash auto
