"""Local stores found in place: Ollama's manifests and blobs, LM Studio's folders, the Hugging Face
cache and the edgespec cache, built in tmp dirs here; broken stores cost one warning line each."""

from __future__ import annotations

import hashlib
import json
import logging

import huggingface_hub.constants
import pytest
from click.testing import CliRunner

from edgespec.commands import cli
from edgespec.errors import ModelNotFoundError
from edgespec.models import _warned, resolve
from edgespec.models.local import local_models
from edgespec.models.sources import ollama

from .test_gguf import TENSORS, build, model_kvs

GGUF = build(model_kvs(), TENSORS)
OTHER = build(model_kvs(60), TENSORS)  # another vocabulary


@pytest.fixture(autouse=True)
def stores(tmp_path, monkeypatch):
    """Every store root inside tmp_path (nothing of the real machine's is read)."""
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "ollama"))
    monkeypatch.setenv("EDGESPEC_LMSTUDIO_MODELS", str(tmp_path / "lmstudio"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("HOME", str(tmp_path / "nohome"))
    _warned.clear()
    return tmp_path


def ollama_model(root, name, tag, data, *, namespace="library", host="registry.ollama.ai", blob=True):
    digest = hashlib.sha256(data).hexdigest()
    manifest = root / "manifests" / host / namespace / name / tag
    manifest.parent.mkdir(parents=True, exist_ok=True)
    manifest.write_text(json.dumps({
        "schemaVersion": 2,
        "layers": [
            {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "0" * 64, "size": 3},
            {"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{digest}", "size": len(data)},
        ],
    }))
    if blob:
        (root / "blobs").mkdir(parents=True, exist_ok=True)
        (root / "blobs" / f"sha256-{digest}").write_bytes(data)
    return root / "blobs" / f"sha256-{digest}"


def lmstudio_model(root, publisher, repo, name, data):
    path = root / publisher / repo / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def warnings_of(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


def test_ollama_references(stores):
    root = stores / "ollama"
    blob = ollama_model(root, "qwen2.5-coder", "1.5b", GGUF)
    latest = ollama_model(root, "tiny", "latest", OTHER)
    user = ollama_model(root, "tiny", "q4", GGUF, namespace="someone")
    hf = ollama_model(root, "repo-GGUF", "Q4_K_M", OTHER, namespace="owner", host="hf.co")
    assert resolve("ollama:qwen2.5-coder:1.5b") == blob
    assert resolve("ollama:tiny") == latest == resolve("ollama:tiny:latest")
    assert resolve("ollama:someone/tiny:q4") == user
    assert resolve("ollama:hf.co/owner/repo-GGUF:Q4_K_M") == hf
    with pytest.raises(ModelNotFoundError, match=r"ollama:tiny:nope: no such Ollama model in .*ollama pull tiny:nope"):
        resolve("ollama:tiny:nope")
    with pytest.raises(ModelNotFoundError, match="bad reference"):
        resolve("ollama:../x")


def test_ollama_parse_and_name_round_trip():
    for ref in ("ollama:a:latest", "ollama:u/a:t", "ollama:hf.co/o/r:Q4"):
        assert ollama.ref_of(*ollama.parse_ref(ref)) == ref
    assert ollama.parse_ref("ollama:a") == ("registry.ollama.ai", "library", "a", "latest")


def test_ollama_half_written_manifest_is_an_error_naming_it(stores):
    ollama_model(stores / "ollama", "tiny", "latest", GGUF, blob=False)
    with pytest.raises(ModelNotFoundError, match="model blob sha256-.* is missing"):
        resolve("ollama:tiny")


def test_lmstudio_references(stores):
    root = stores / "lmstudio"
    one = lmstudio_model(root, "pub", "Tiny-GGUF", "tiny-Q4_K_M.gguf", GGUF)
    lmstudio_model(root, "pub", "Tiny-GGUF", "mmproj-tiny-f16.gguf", OTHER)  # a projector: not a choice
    lmstudio_model(root, "pub", "Two-GGUF", "a.gguf", GGUF)
    two = lmstudio_model(root, "pub", "Two-GGUF", "b.gguf", OTHER)
    assert resolve("lmstudio:pub/Tiny-GGUF") == one == resolve("lmstudio:pub/Tiny-GGUF/tiny-Q4_K_M.gguf")
    assert resolve("lmstudio:pub/Two-GGUF/b.gguf") == two
    with pytest.raises(ModelNotFoundError, match=r"holds 2 GGUF files \(a.gguf, b.gguf\); name one"):
        resolve("lmstudio:pub/Two-GGUF")
    with pytest.raises(ModelNotFoundError, match="not found in LM Studio's models folder"):
        resolve("lmstudio:pub/None-GGUF")


def test_scan_lists_every_store_with_header_facts(stores, caplog):
    ollama_model(stores / "ollama", "tiny", "latest", GGUF)
    lmstudio_model(stores / "lmstudio", "pub", "Tiny-GGUF", "tiny.gguf", OTHER)
    (stores / "home" / "models").mkdir(parents=True)
    (stores / "home" / "models" / "mine.gguf").write_bytes(GGUF)
    rows = {r.ref: r for r in local_models()}
    assert set(rows) == {"ollama:tiny:latest", "lmstudio:pub/Tiny-GGUF/tiny.gguf",
                         str(stores / "home" / "models" / "mine.gguf")}
    tiny = rows["ollama:tiny:latest"]
    assert (tiny.store, tiny.name, tiny.architecture, tiny.quant, tiny.size) == (
        "ollama", "Tiny Test", "llama", "Q4_K_M", len(GGUF))
    # equal vocabularies, equal fingerprints; another vocabulary, another one
    assert tiny.vocab == rows[str(stores / "home" / "models" / "mine.gguf")].vocab
    assert tiny.vocab != rows["lmstudio:pub/Tiny-GGUF/tiny.gguf"].vocab
    assert warnings_of(caplog) == []


def test_broken_stores_cost_one_warning_line_each(stores, caplog):
    root = stores / "ollama"
    ollama_model(root, "good", "latest", GGUF)
    ollama_model(root, "half", "latest", OTHER, blob=False)
    bad = root / "manifests" / "registry.ollama.ai" / "library" / "junk" / "latest"
    bad.parent.mkdir(parents=True)
    bad.write_text("{not json")
    lmstudio_model(stores / "lmstudio", "pub", "Bad-GGUF", "bad.gguf", b"GGUF" + b"\0" * 10)
    rows = [r.ref for r in local_models()]
    assert rows == ["ollama:good:latest"]
    lines = warnings_of(caplog)
    assert len(lines) == 3, lines
    assert any("half/latest: its model blob" in line and "unfinished pull" in line for line in lines)
    assert any("junk/latest: not a JSON manifest" in line for line in lines)
    assert any("Bad-GGUF/bad.gguf: unsupported GGUF version" in line and line.endswith("skipped") for line in lines)


def test_missing_configured_store_is_a_warning_and_defaults_are_silent(stores, monkeypatch, caplog):
    monkeypatch.setenv("OLLAMA_MODELS", str(stores / "no-such-ollama"))
    monkeypatch.delenv("EDGESPEC_LMSTUDIO_MODELS")  # defaults under $HOME, which has none
    assert local_models() == []
    lines = warnings_of(caplog)
    assert len(lines) == 1 and "no-such-ollama: not an Ollama store" in lines[0]


def test_hf_cache_files_are_listed_by_reference(stores):
    snapshot = stores / "hf" / "models--owner--Tiny-GGUF" / "snapshots" / ("a" * 40)
    blob = stores / "hf" / "models--owner--Tiny-GGUF" / "blobs" / ("b" * 64)
    blob.parent.mkdir(parents=True)
    blob.write_bytes(GGUF)
    snapshot.mkdir(parents=True)
    (snapshot / "tiny.gguf").symlink_to(blob)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("a" * 40)
    rows = local_models()
    assert [(r.ref, r.store) for r in rows] == [("hf:owner/Tiny-GGUF/tiny.gguf", "huggingface")]


def test_cli_scan_and_list_local(stores):
    ollama_model(stores / "ollama", "tiny", "latest", GGUF)
    runner = CliRunner()
    for args in (["models", "scan", "--json"], ["models", "list", "--local", "--json"]):
        r = runner.invoke(cli, args)
        assert r.exit_code == 0, r.output
        rows = json.loads(r.output)
        assert [row["ref"] for row in rows] == ["ollama:tiny:latest"] and rows[0]["size"] == len(GGUF)
    r = runner.invoke(cli, ["models", "scan"])
    assert r.exit_code == 0 and "ollama:tiny:latest" in r.output
