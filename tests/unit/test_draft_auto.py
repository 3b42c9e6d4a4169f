"""`--draft auto`: the compatible drafts among the models on this machine, ranked by the plan."""

from __future__ import annotations

import huggingface_hub.constants
import pytest

from edgespec.config import LoadConfig
from edgespec.draft_auto import best_draft, rank_drafts
from edgespec.hardware import HardwareInfo
from edgespec.models import _warned
from edgespec.session import AUTO, ModelChoice, _auto_draft

from .test_gguf import ARR, I32, STR, build, model_kvs, tokens
from .test_local_stores import ollama_model

GiB = 1 << 30
HW = HardwareInfo("Linux", "Test", 8, 16, (), 16 * GiB, 12 * GiB, 0)
Q8_0, F32 = 8, 0


def gguf(width: int, *, n_vocab=40, extra=()) -> bytes:
    """A model whose weights grow with `width` (cost follows bytes); its vocabulary from model_kvs."""
    tensors = [("token_embd.weight", Q8_0, [256, n_vocab]),
               ("blk.0.attn_norm.weight", F32, [256]),
               ("blk.0.attn_q.weight", Q8_0, [256, width]),
               ("blk.1.attn_q.weight", Q8_0, [256, width]),
               ("output.weight", Q8_0, [256, n_vocab])]
    return build(model_kvs(n_vocab, extra=extra), tensors)


@pytest.fixture(autouse=True)
def stores(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "ollama"))
    monkeypatch.setenv("EDGESPEC_LMSTUDIO_MODELS", str(tmp_path / "lm"))
    (tmp_path / "lm").mkdir()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    _warned.clear()
    return tmp_path


def test_ranks_compatible_drafts_by_expected_speedup(stores):
    root = stores / "ollama"
    target = ollama_model(root, "big", "latest", gguf(8192))
    ollama_model(root, "small", "latest", gguf(256))
    ollama_model(root, "medium", "latest", gguf(2048))
    ollama_model(root, "alias", "latest", gguf(8192))  # another name for the target's own blob
    other = [kv for kv in model_kvs(40) if kv[0] != "tokenizer.ggml.tokens"]
    other.append(("tokenizer.ggml.tokens", ARR, (STR, [f"x{i}" for i in range(40)])))
    ollama_model(root, "other-vocab", "latest", build(other, [("token_embd.weight", Q8_0, [256, 40])]))
    ranked = rank_drafts(target, HW)
    refs = [c.model.ref for c in ranked]
    assert "ollama:big:latest" not in refs and "ollama:alias:latest" not in refs  # the target itself
    assert "ollama:other-vocab:latest" not in refs  # another vocabulary
    assert refs[:2] == ["ollama:small:latest", "ollama:medium:latest"]
    small, medium = ranked[:2]
    assert small.vocab == "identical" and small.fits and not small.measured
    assert small.cost_ratio < medium.cost_ratio and small.expected_speedup > medium.expected_speedup
    assert best_draft(ranked) is small
    assert "ollama:small:latest: identical vocabularies" in small.line() and "from size" in small.line()


def test_near_compatible_draft_is_a_candidate(stores):
    root = stores / "ollama"
    types = [1] * 40
    types[6] = types[7] = 3  # two control tokens (past the first five ids, which llama.cpp exempts)

    def vocab_kvs(toks):
        kvs = [kv for kv in model_kvs(40) if kv[0] not in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type")]
        return kvs + [("tokenizer.ggml.tokens", ARR, (STR, toks)), ("tokenizer.ggml.token_type", ARR, (I32, types))]

    renamed = tokens(40)
    renamed[7] = "<|end|>"  # the draft's own name for a special: never drafted
    target = ollama_model(root, "big", "latest", build(vocab_kvs(tokens(40)), [
        ("token_embd.weight", Q8_0, [256, 40]), ("blk.0.attn_q.weight", Q8_0, [256, 8192]), ("output.weight", Q8_0, [256, 40])]))
    ollama_model(root, "near", "latest", build(vocab_kvs(renamed), [
        ("token_embd.weight", Q8_0, [256, 40]), ("output.weight", Q8_0, [256, 40])]))
    ranked = rank_drafts(target, HW)
    assert [(c.model.ref, c.vocab) for c in ranked] == [("ollama:near:latest", "mapped")]
    assert "compatible through a map of 1 special tokens" in ranked[0].pairing


def test_nothing_compatible(stores):
    target = ollama_model(stores / "ollama", "big", "latest", gguf(8192))
    assert rank_drafts(target, HW) == [] and best_draft([]) is None


def test_session_picks_the_best_and_says_which_in_one_line(stores):
    root = stores / "ollama"
    target = ollama_model(root, "big", "latest", gguf(8192))
    small = ollama_model(root, "small", "latest", gguf(256))
    load = LoadConfig(target="ollama:big", draft=AUTO)
    choice, path, notes = _auto_draft(ModelChoice("ollama:big", AUTO), target, HW, load)
    assert (choice, path) == (ModelChoice("ollama:big", "ollama:small:latest"), small)
    assert len(notes) == 1 and notes[0].startswith("--draft auto: ollama:small:latest: identical vocabularies")
    small.unlink()
    choice, path, notes = _auto_draft(ModelChoice("ollama:big", AUTO), target, HW, load)
    assert (choice.draft, path) == (None, None)
    assert notes == ("--draft auto: no draft model (none compatible on this machine; edgespec doctor ollama:big --drafts)",)
