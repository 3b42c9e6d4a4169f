"""Models people already have, with the shipped test models: an Ollama store and an LM Studio folder
built here (links to the real files; nothing copied), and a near-compatible draft made from the
shipped Qwen2.5-Coder-0.5B by rewriting its special tokens, BOS and vocabulary size."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgespec.backend.model import LoadParams
from edgespec.compat import pair_vocabularies
from edgespec.config import SpecConfig
from edgespec.engine import Engine, EngineConfig
from edgespec.errors import IncompatibleModelsError
from edgespec.generate import complete
from edgespec.gguf import read_gguf
from edgespec.sampling import SamplingConfig
from edgespec.template import Message

from .conftest import DRAFT, SMALL, TARGET

REWRITE = Path(__file__).with_name("gguf_rewrite.py")
# What a family variant changes: a BOS of its own that the tokenizer adds, special tokens renamed
# (two of them swapped, so they map by text to other ids) and fewer padding rows at the end.
NEAR = {"rename": {"151646": "<｜begin▁of▁sentence｜>", "151659": "<｜fim▁begin｜>",
                   "151663": "<|file_sep|>", "151664": "<|repo_name|>"},
        "bos": 151646, "add_bos": True, "n_vocab": 151900}
CHANGED_ID = 1000


def run_cli(*args, env):
    return subprocess.run([sys.executable, "-c", "from edgespec.commands import main; main()", *args],
                          capture_output=True, timeout=600, env=env)


def ollama_store(ollama: Path, name: str, tag: str, model: Path) -> Path:
    """An Ollama store as Ollama lays it out: a manifest naming a blob (a link to `model`)."""
    digest = hashlib.sha256(model.read_bytes()).hexdigest()
    (ollama / "blobs").mkdir(parents=True)
    (ollama / "blobs" / f"sha256-{digest}").symlink_to(model)
    manifest = ollama / "manifests" / "registry.ollama.ai" / "library" / name / tag
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": [
        {"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{digest}", "size": model.stat().st_size}]}))
    return ollama


@pytest.fixture(scope="module")
def stores(tmp_path_factory, model_path):
    """An Ollama store (manifest + blob linking to smollm2) and an LM Studio folder (linking to the
    0.5B), and the environment that points edgespec at them."""
    root = tmp_path_factory.mktemp("stores")
    ollama = ollama_store(root / "ollama", "smollm2", "135m", model_path(SMALL))
    half = ollama / "manifests" / "registry.ollama.ai" / "library" / "half" / "latest"
    half.parent.mkdir(parents=True)
    half.write_text(json.dumps({"layers": [{"mediaType": "application/vnd.ollama.image.model", "digest": "sha256:" + "0" * 64}]}))
    lmstudio = root / "lmstudio" / "Qwen" / "Qwen2.5-Coder-0.5B-Instruct-GGUF"
    lmstudio.mkdir(parents=True)
    (lmstudio / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf").symlink_to(model_path(DRAFT))
    env = {**os.environ, "OLLAMA_MODELS": str(ollama), "EDGESPEC_LMSTUDIO_MODELS": str(root / "lmstudio"),
           "HF_HUB_CACHE": str(root / "hf"), "HF_HUB_OFFLINE": "1"}
    return env


def test_scan_finds_the_stores_and_warns_once_for_a_half_written_one(stores, model_path):
    r = run_cli("models", "scan", "--json", env=stores)
    assert r.returncode == 0, r.stderr.decode()
    rows = {row["ref"]: row for row in json.loads(r.stdout)}
    smol = rows["ollama:smollm2:135m"]
    assert smol["architecture"] == "llama" and smol["size"] == model_path(SMALL).stat().st_size
    qwen = rows["lmstudio:Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"]
    assert qwen["architecture"] == "qwen2" and qwen["quant"] == "Q4_K_M"
    assert qwen["vocab"] == rows[TARGET]["vocab"] != smol["vocab"]  # the edgespec cache is listed too
    warnings = [line for line in r.stderr.decode().splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "half/latest: its model blob" in warnings[0], warnings


def test_references_work_on_commands(stores):
    r = run_cli("prompt", "-m", "ollama:smollm2:135m", "--spec", "off", "-n", "3", "-c", "256", "Hello", env=stores)
    assert r.returncode == 0, r.stderr.decode()
    r = run_cli("doctor", TARGET, "-md", "lmstudio:Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF", "--drafts", "--json", env=stores)
    data = json.loads(r.stdout)
    assert data["pair"]["compatible"] and data["pair"]["detail"].startswith("identical vocabularies")
    refs = [d["ref"] for d in data["drafts"]]
    assert refs[0] in (DRAFT, "lmstudio:Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf")
    assert "ollama:smollm2:135m" not in refs  # another vocabulary


@pytest.fixture(scope="module")
def near_pair(tmp_path_factory, model_path):
    """(near-compatible draft, the same with one ordinary token changed), written by a helper process."""
    root = tmp_path_factory.mktemp("near")
    near, changed = root / "qwen-near.gguf", root / "qwen-changed.gguf"
    spec_changed = {**NEAR, "rename": {**NEAR["rename"], str(CHANGED_ID): "zzzz"}}
    for path, spec in ((near, NEAR), (changed, spec_changed)):
        proc = subprocess.run([sys.executable, str(REWRITE), str(model_path(DRAFT)), str(path), json.dumps(spec)],
                              capture_output=True, timeout=600)
        assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    return near, changed


def test_near_compatible_pair_maps_and_decodes_exactly(near_pair, model_path):
    near, _ = near_pair
    target = read_gguf(model_path(TARGET), vocab=True).vocab
    draft = read_gguf(near, vocab=True).vocab
    pairing = pair_vocabularies(target, draft, target_name="t", draft_name="d")
    m = pairing.token_map
    assert pairing.kind == "mapped" and m.n_special == 20
    assert (m.target_to_draft[151663], m.target_to_draft[151664]) == (151664, 151663)  # by text, not by id
    assert m.target_to_draft[151646] == m.target_to_draft[151659] == -1  # renamed: never drafted
    assert (m.target_bos, m.draft_bos) == (None, 151646)
    params = LoadParams(n_ctx=512, n_threads=2)
    with Engine(EngineConfig(model_path(TARGET), params, near, params, spec=SpecConfig(mode="draft"), exact=True)) as engine:
        assert engine.token_map is not None
        tokens = engine.chat_tokens([Message("user", "Write a Python function that adds two numbers.")])
        plain = complete(engine.stream(tokens, SamplingConfig(), max_tokens=12, mode="off"))
        drafted = complete(engine.stream(tokens, SamplingConfig(), max_tokens=12, mode="draft"))
    assert drafted.tokens == plain.tokens
    assert drafted.stats.accepted > 0  # the map really carries the draft's proposals


def test_one_changed_ordinary_token_is_refused_naming_it(near_pair, model_path):
    _, changed = near_pair
    target = read_gguf(model_path(TARGET), vocab=True).vocab
    with pytest.raises(IncompatibleModelsError, match=rf"token {CHANGED_ID} is '.+' in t but 'zzzz' in d$"):
        pair_vocabularies(target, read_gguf(changed, vocab=True).vocab, target_name="t", draft_name="d")
    r = run_cli("doctor", TARGET, "-md", str(changed), env=os.environ.copy())
    assert r.returncode == 1 and f"token {CHANGED_ID} is" in r.stdout.decode() and "incompatible" in r.stdout.decode()


def test_the_issues_own_command_an_ollama_target_with_draft_auto(tmp_path, model_path):
    """`edgespec prompt -m ollama:qwen2.5-coder:1.5b --draft auto "hi"` on a machine with that Ollama
    model (a store laid out as Ollama lays it, the blob a link to the shipped 1.5B): it answers and
    says in one line which draft it picked (the shipped 0.5B, the only one that shares the vocabulary)."""
    model_path(DRAFT)
    ollama = ollama_store(tmp_path / "ollama", "qwen2.5-coder", "1.5b", model_path(TARGET))
    env = {**os.environ, "OLLAMA_MODELS": str(ollama), "EDGESPEC_LMSTUDIO_MODELS": str(tmp_path / "none"),
           "HF_HUB_CACHE": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1"}
    r = run_cli("prompt", "-m", "ollama:qwen2.5-coder:1.5b", "--draft", "auto", "-n", "4", "-c", "512", "-t", "2",
                "hi", env=env)
    err = r.stderr.decode()
    assert r.returncode == 0, err
    assert r.stdout.decode().strip()
    picked = [line for line in err.splitlines() if "draft" in line.lower() and DRAFT.split("-q")[0] in line]
    assert len(picked) == 1, err
