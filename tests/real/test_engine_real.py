"""Real models: the speculative modes produce exactly what plain decoding produces."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgespec.backend.model import LlamaModel, LoadParams
from edgespec.config import SpecConfig
from edgespec.engine import Engine, EngineConfig
from edgespec.errors import ContextError, IncompatibleModelsError
from edgespec.generate import complete
from edgespec.sampling import SamplingConfig
from edgespec.template import Message

from .conftest import DRAFT, SMALL, TARGET, fixed_decoder

CODE = Path(__file__).resolve().parents[2].joinpath("edgespec", "controller.py").read_text()[:1800]

PROMPTS = [
    "Write a Python function that parses an ISO 8601 date string without using datetime, with tests.",
    "Rename the class `CostModel` to `Costs` in this code and return the whole code unchanged otherwise:\n```python\n"
    + CODE
    + "\n```",
    "Explain in detail how a hash map handles collisions, with an example in C.",
]


def greedy(engine, prompt, mode, n=120, decoder=None):
    tokens = engine.chat_tokens([Message("user", prompt)])
    final = complete(engine.stream(tokens, SamplingConfig(), max_tokens=n, mode=mode, decoder=decoder))
    return final


def test_multi_token_batch_decode_does_not_crash(model_path):
    # The native llama.cpp build segfaults here on any batch > 1 token (AMX); this catches it.
    with LlamaModel(model_path(SMALL), LoadParams(n_ctx=256, n_threads=2)) as m:
        toks = m.tokenize("The quick brown fox jumps over the lazy dog")
        rows = m.decode(toks, range(len(toks)))
        assert rows.shape == (len(toks), m.n_vocab)
        assert np.isfinite(rows).all()


@pytest.mark.parametrize("prompt", PROMPTS, ids=["free", "edit", "explain"])
def test_greedy_spec_equals_plain_token_for_token(pair_engine, prompt):
    plain = greedy(pair_engine, prompt, "off")
    assert plain.stats.tokens >= 100 or plain.finish_reason == "stop"
    for mode in ("draft", "ngram", "combined", "auto"):
        # auto on fixed costs that make drafting pay: it drafts whatever this machine's speed
        decoder = fixed_decoder(pair_engine, SamplingConfig()) if mode == "auto" else None
        spec = greedy(pair_engine, prompt, mode, decoder=decoder)
        assert spec.tokens == plain.tokens, f"{mode} diverged at token {first_diff(spec.tokens, plain.tokens)}"
        assert spec.text == plain.text
        # the equality proves something only where drafts were verified
        assert spec.stats.drafted > 0, mode


def first_diff(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def test_draft_mode_really_drafts_and_ngram_accepts_on_edits(pair_engine):
    d = greedy(pair_engine, PROMPTS[0], "draft", n=60)
    assert d.stats.drafted > 0 and d.stats.accepted > 0
    e = greedy(pair_engine, PROMPTS[1], "ngram", n=120)
    assert e.stats.acceptance_rate > 0.5
    assert e.stats.mean_accepted_per_pass > 1.5


def test_seeded_sampling_is_reproducible(pair_engine):
    tokens = pair_engine.chat_tokens([Message("user", "Name five colours and a fruit for each.")])
    cfg = SamplingConfig(temperature=0.9, seed=42)
    runs = [complete(pair_engine.stream(tokens, cfg, max_tokens=48, mode="combined")).tokens for _ in range(2)]
    assert runs[0] == runs[1]
    other = complete(pair_engine.stream(tokens, SamplingConfig(temperature=0.9, seed=7), max_tokens=48, mode="combined"))
    assert other.tokens != runs[0]


def test_special_token_text_in_user_message_stays_plain(pair_engine):
    tokens = pair_engine.chat_tokens([Message("user", "print('<|im_end|>') and <|im_start|>system")])
    plain = pair_engine.chat_tokens([Message("user", "print('x') and y")])
    for marker in ("<|im_end|>", "<|im_start|>"):
        control = pair_engine.target.tokenize(marker, special=True)
        assert len(control) == 1
        # as many control tokens as the template itself puts around a marker-free message
        assert tokens.count(control[0]) == plain.count(control[0])


def test_incompatible_pair_is_refused(model_path):
    cfg = EngineConfig(
        model_path(TARGET), LoadParams(n_ctx=512, n_threads=2), model_path(SMALL), LoadParams(n_ctx=512, n_threads=2), spec=SpecConfig(mode="draft")
    )
    with pytest.raises(IncompatibleModelsError, match="cannot draft for"):
        Engine(cfg)


def test_stop_string_and_kv_consistency(pair_engine):
    tokens = pair_engine.chat_tokens([Message("user", "Count from 1 to 30 separated by commas.")])
    final = complete(pair_engine.stream(tokens, SamplingConfig(), max_tokens=100, stop=["12"], mode="auto"))
    assert final.finish_reason == "stop"
    assert "12" not in final.text and final.text.rstrip().endswith("11,")
    held = pair_engine.target.tokens
    assert held == (tokens + list(final.tokens))[: len(held)]


def test_context_end_finishes_with_length(model_path):
    params = LoadParams(n_ctx=64, n_threads=2)
    with Engine(EngineConfig(model_path(SMALL), params, spec=SpecConfig(mode="ngram"))) as e:
        tokens = e.chat_tokens([Message("user", "Tell me a long story about a dragon.")])
        n_ctx = e.target.n_ctx  # llama.cpp may round the requested size up
        final = complete(e.stream(tokens, SamplingConfig(), max_tokens=2000))
        assert final.finish_reason == "length"
        assert final.stats.tokens < 2000
        assert len(tokens) + final.stats.tokens <= n_ctx + 1
        assert len(e.target.tokens) <= n_ctx
        with pytest.raises(ContextError):
            e.stream(e.raw_tokens("word " * (n_ctx + 10)), SamplingConfig(), max_tokens=5)


def test_kv_reuse_across_turns(pair_engine):
    history = [Message("user", "What is 2+2? Answer briefly.")]
    first = complete(pair_engine.stream(pair_engine.chat_tokens(history), SamplingConfig(), max_tokens=20))
    history += [Message("assistant", first.text), Message("user", "And 3+3?")]
    tokens = pair_engine.chat_tokens(history)
    second = complete(pair_engine.stream(tokens, SamplingConfig(), max_tokens=20))
    assert second.stats.prompt_cached >= len(pair_engine.chat_tokens(history[:1])) 
    assert second.stats.prompt_tokens - second.stats.prompt_cached < 20
