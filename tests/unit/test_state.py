"""Corrupt or foreign state under $EDGESPEC_HOME: damaged profiles, cache files whose sha256 record
is missing or wrong, a user models.toml with a wrong type. Each is one warning line (or, for
profiles, treated as absent), the state is ignored or re-verified, and nothing is deleted without
a line saying so."""

from __future__ import annotations

import hashlib
import json
import logging
import os

import pytest

from edgespec import models, profile_store
from edgespec.models import store
from edgespec.models.sources import hf as hf_source
from edgespec.commands.root import main
from edgespec.hardware import GiB, HardwareInfo

from .fakes import tiny_registry_entry

HW = HardwareInfo(
    os="Linux", cpu_model="Test CPU", physical_cores=2, logical_cores=2, cpu_features=("AVX2",),
    ram_total=24 * GiB, ram_available=20 * GiB, swap_total=0, gpus=(),
    gpu_offload_supported=False, rpc_supported=False, llama_cpp_version="0.3.36",
)
CONTENT = b"GGUF" + bytes(range(256)) * 20
SHA = hashlib.sha256(CONTENT).hexdigest()
ENTRY = tiny_registry_entry(CONTENT)


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("EDGESPEC_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    models._warned.clear()
    (home / "models.toml").write_text(ENTRY)
    return home


@pytest.fixture
def source(monkeypatch, tmp_path):
    """The Hugging Face source, faked: serves CONTENT and counts the downloads."""
    calls = []

    def download(repo, file, progress):
        calls.append(file)
        path = tmp_path / "hub" / file
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(CONTENT)
        return path

    monkeypatch.setattr(hf_source, "_hf_download", download)
    monkeypatch.setattr(hf_source, "_hf_cached", lambda repo, file: None)
    return calls


def entry():
    return models.load_registry().models["tiny"]


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "edgespec" and r.levelno >= logging.WARNING]


def put_in_cache(content: bytes, sidecar: str | None) -> tuple:
    """The file, and a record written before it (as when the file changed after it was verified)."""
    path = models.cached_path(entry())
    path.parent.mkdir(parents=True, exist_ok=True)
    side = path.with_name(path.name + ".sha256")
    if sidecar is not None:
        side.write_text(sidecar)
        os.utime(side, ns=(1_000_000_000, 1_000_000_000))
    path.write_bytes(content)
    return path, side


# -- the model cache ------------------------------------------------------------------------------


@pytest.mark.parametrize("sidecar", [None, "", "0" * 64 + "  tiny.gguf\n", "\xff garbage", f"{SHA[:-1]}"])
def test_right_file_with_missing_or_wrong_record_is_reverified_and_kept(caplog, source, sidecar):
    path, side = put_in_cache(CONTENT, sidecar)
    assert models.resolve("tiny", allow_download=False) == path
    assert source == []  # nothing fetched: the bytes hashed right
    assert side.read_text().split()[0] == SHA  # the record is repaired
    (line,) = warnings_of(caplog)
    assert line == f"{path}: its sha256 record was missing, wrong or older than the file; the file hashed correctly and is kept"
    models.resolve("tiny", allow_download=False)
    assert len(warnings_of(caplog)) == 1  # trusted now: no second hashing, no second line


@pytest.mark.parametrize("content, why", [
    (CONTENT[:-1] + b"X", "its sha256 does not match the registry's"),
    (CONTENT + b"X", f"{len(CONTENT) + 1} bytes, but the registry says {len(CONTENT)}"),
])
@pytest.mark.parametrize("sidecar", [None, f"{SHA}  tiny.gguf\n"])
def test_wrong_file_is_not_used_and_says_so(caplog, source, content, why, sidecar):
    path, _ = put_in_cache(content, sidecar)
    with pytest.raises(models.ModelNotFoundError, match="is not downloaded"):
        models.resolve("tiny", allow_download=False)
    assert path.read_bytes() == content  # a run that may not download deletes nothing
    (line,) = warnings_of(caplog)
    assert line == f"{path}: {why}; not trusted (a download replaces it: edgespec models pull tiny)"


def test_a_record_newer_than_the_file_is_trusted_without_hashing(caplog, monkeypatch):
    path, side = put_in_cache(CONTENT, None)
    side.write_text(f"{SHA}  tiny.gguf\n")
    monkeypatch.setattr(store, "_hash_file", lambda *a: pytest.fail("hashed a verified file"))
    assert models.resolve("tiny", allow_download=False) == path and warnings_of(caplog) == []


def test_pull_replaces_a_wrong_file_after_saying_so(caplog, source):
    path, _ = put_in_cache(CONTENT[:-1] + b"X", None)
    assert models.pull("tiny") == path
    assert path.read_bytes() == CONTENT and source == ["tiny.gguf"]
    (line,) = warnings_of(caplog)
    assert "its sha256 does not match" in line and "a download replaces it" in line


def test_the_warning_reaches_the_user_as_one_line(source, capsys):
    path, _ = put_in_cache(CONTENT, None)
    main(["models", "pull", "tiny"])
    out, err = capsys.readouterr()
    assert out.strip() == f"tiny: {path}"
    assert [line for line in err.splitlines() if line.strip()] == [
        f"warning: {path}: its sha256 record was missing, wrong or older than the file; the file hashed correctly and is kept"]


def test_leftover_temp_files_of_a_killed_pull_are_not_models(source):
    """A .part file from a killed process is never taken for the model; the next pull fetches."""
    directory = models.models_dir()
    directory.mkdir(parents=True)
    (directory / ".tiny.abc123.part").write_bytes(CONTENT)
    assert models.is_cached(entry()) is False
    models.pull("tiny")
    assert models.is_cached(entry()) and source == ["tiny.gguf"]


# -- profiles (profile_store is another module's: this pins what it does today) ---------------------

DATA = {"costs": {"exact": {"t1_ms": 30.0}}, "draft_k": 4}


@pytest.mark.parametrize("damage", [
    lambda text: text[: len(text) // 2],  # truncated mid-write
    lambda text: text.replace("{", "[", 1),  # garbled
    lambda text: "\udcff".join([text[:10], text[10:]]).encode("utf-8", "surrogateescape").decode("latin-1"),
    lambda text: json.dumps(["not", "a", "record"]),  # foreign JSON
    lambda text: json.dumps({**json.loads(text), "data": "oops"}),  # wrong type inside
    lambda text: "",
])
def test_a_damaged_profile_is_treated_as_absent_and_kept(damage):
    path = profile_store.save_profile(DATA, hw=HW, target_sha_or_name="t", draft="d")
    damaged = damage(path.read_text())
    path.write_text(damaged, encoding="latin-1")
    assert profile_store.load_profile(HW, "t", "d") is None  # absent: the run measures or estimates
    assert path.read_text(encoding="latin-1") == damaged  # not deleted
    # `profile --show` names it; a new measurement replaces it atomically
    profile_store.save_profile({"x": 1}, hw=HW, target_sha_or_name="other", draft=None)
    latest = profile_store.latest_profile()
    assert any(str(path) in w and "unreadable" in w for w in latest["warnings"])
    profile_store.save_profile(DATA, hw=HW, target_sha_or_name="t", draft="d")
    assert profile_store.load_profile(HW, "t", "d")["data"] == DATA
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]


def test_a_profile_from_another_version_is_ignored_not_deleted(monkeypatch):
    path = profile_store.save_profile(DATA, hw=HW, target_sha_or_name="t", draft=None)
    record = json.loads(path.read_text())
    record["edgespec_version"] = "0.0.1"
    path.write_text(json.dumps(record))
    assert profile_store.load_profile(HW, "t", None) is None
    assert path.exists()


# -- a user models.toml with a wrong type ------------------------------------------------------------


@pytest.mark.parametrize("text, key", [
    (ENTRY.replace(f"size = {len(CONTENT)}", f'size = "{len(CONTENT)}"'), "models.tiny"),
    (ENTRY.replace('quant = "Q4_0"', "quant = [1, 2]"), "models.tiny"),
    (ENTRY.replace('hf = { repo = "owner/tiny-GGUF", file = "tiny.gguf" }', 'hf = "owner/tiny-GGUF"'), "models.tiny"),
    ('pairs = ["a", "b"]\n' + ENTRY, "pairs"),
    ('default_pair = ["x"]\n' + ENTRY, "default_pair"),
])
def test_a_wrong_type_in_the_user_registry_is_one_line(home, text, key, capsys):
    (home / "models.toml").write_text(text)
    main(["models", "list", "--json"])
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"warning: {home / 'models.toml'}: {key}"), lines
    names = {row["name"] for row in json.loads(out)}
    assert "smollm2-135m-instruct-q4_1" in names  # the built-in registry still works
    assert ("tiny" in names) == (key != "models.tiny")
    assert (home / "models.toml").read_text() == text  # never rewritten


def test_home_files_are_left_alone_by_a_run(home, source):
    """A full pull leaves only the model, its record and the lock: nothing else appears or goes."""
    (home / "notes.txt").write_text("mine")
    models.pull("tiny")
    found = sorted(str(p.relative_to(home)) for p in home.rglob("*"))
    assert found == ["locks", "locks/tiny.lock", "models", "models.toml", "models/tiny.gguf",
                     "models/tiny.gguf.sha256", "notes.txt"]
    assert (home / "notes.txt").read_text() == "mine"
    assert os.access(models.cached_path(entry()), os.R_OK)


# -- doctor on a file that is not a model -----------------------------------------------------------


@pytest.mark.parametrize("content, why, code", [
    (b"PK\x03\x04 a zip", "not a GGUF file", 4),
    (b"GGUF\x03\x00\x00\x00" + b"\xff" * 16, "impossible for this file size", 4),
    (None, "no such file", 3),
])
def test_doctor_names_a_bad_file_once(tmp_path, capsys, content, why, code):
    from edgespec.doctor import diagnose

    path = tmp_path / "bad.gguf"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(SystemExit) as exit_:
        main(["doctor", str(path)])
    assert exit_.value.code == code  # 3 missing, 4 malformed: the documented codes
    out, err = capsys.readouterr()
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 1 and why in lines[0], out
    assert lines[0].count(str(path)) == 1, lines[0]
    assert err == ""
    assert diagnose([str(path)]).exit_code == code


def test_a_file_changed_after_its_record_is_hashed_again(caplog, source):
    """A record older than the file (the file replaced or edited in place since) is not trusted blindly."""
    path, side = put_in_cache(CONTENT, f"{SHA}  tiny.gguf\n")  # the record predates the file
    assert models.resolve("tiny", allow_download=False) == path
    (line,) = warnings_of(caplog)
    assert "older than the file" in line and "hashed correctly and is kept" in line
    assert side.stat().st_mtime_ns >= path.stat().st_mtime_ns  # the repaired record is current
