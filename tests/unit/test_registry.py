"""The registry where the design puts it (models.toml at the top level, shipped in the package) and the
user's own registry, $EDGESPEC_HOME/models.toml, merged over the built-in one."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgespec import models
from edgespec.models import registry
from edgespec.models.sources import hf as hf_source
from edgespec.commands import cli
from edgespec.commands.root import main
from edgespec.errors import ConfigError

ROOT = Path(models.__file__).resolve().parents[2]
SHA = "b" * 64
BUILTIN_TARGET = "qwen2.5-coder-1.5b-instruct-q4_k_m"
SMOL = "smollm2-135m-instruct-q4_1"

MY_MODEL = f"""
[models."my-model"]
family = "mine"
architecture = "llama"
quant = "Q8_0"
params = "1B"
size = 1234
sha256 = "{SHA}"
hf = {{ repo = "me/my-model-GGUF", file = "my-model.gguf" }}
"""
MY_PAIR = f"""
[pairs."my-pair"]
target = "{BUILTIN_TARGET}"
draft = "my-model"
"""


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESPEC_HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    models._warned.clear()  # warnings are once per process; each test is its own "process"
    return tmp_path / "home"


def user_toml(home: Path, text: str) -> Path:
    path = home / "models.toml"
    path.write_text(text)
    return path


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "edgespec" and r.levelno == logging.WARNING]


# -- where the registry lives -----------------------------------------------------------------


def test_registry_is_at_the_top_level_and_the_package_links_to_it():
    top = ROOT / "models.toml"
    assert top.is_file() and not top.is_symlink()
    packaged = ROOT / "edgespec" / "models.toml"
    assert packaged.resolve() == top.resolve()  # one file: the package entry points at it
    assert models._builtin_registry_bytes() == top.read_bytes()


def test_builtin_registry_found_without_the_package_copy(monkeypatch):
    """An install where the package has no models.toml falls back to the checkout's top level."""

    class Missing:
        def joinpath(self, name):
            return self

        def read_bytes(self):
            raise FileNotFoundError(name)

    name = "models.toml"
    monkeypatch.setattr(registry.resources, "files", lambda pkg: Missing())
    assert models._builtin_registry_bytes() == (ROOT / "models.toml").read_bytes()


def test_wheel_ships_the_registry_as_a_real_file(tmp_path):
    """Build a wheel from a copy of the checkout (a copy, so no build/ or egg-info lands in the
    tree; pip's build isolation fetches setuptools like `scripts/setup` does) and load the registry
    from the installed files."""
    src = tmp_path / "src"
    shutil.copytree(ROOT / "edgespec", src / "edgespec", symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "models.toml"):
        shutil.copy2(ROOT / name, src / name)
    assert (src / "edgespec" / "models.toml").is_symlink()
    out = tmp_path / "whl"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(src)],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    (wheel,) = out.glob("edgespec-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        info = zf.getinfo("edgespec/models.toml")
        assert zf.read(info) == (ROOT / "models.toml").read_bytes()
        assert (info.external_attr >> 16) & 0o170000 != 0o120000  # a regular file, not a link
        zf.extractall(tmp_path / "site")
    # the installed package (not the checkout) is what load_registry reads
    script = "import edgespec, edgespec.models as m; r = m.load_registry(); print(edgespec.__file__, r.default_pair)"
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site"), "EDGESPEC_HOME": str(tmp_path / "h")}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr
    where, default = proc.stdout.split()
    assert where.startswith(str(tmp_path / "site")) and default == models.load_registry().default_pair


# -- the user's registry ------------------------------------------------------------------------


def test_no_user_registry_means_the_builtin_one(caplog):
    reg = models.load_registry()
    assert set(reg.origin.values()) == {"built-in"}
    assert set(reg.origin) == set(reg.models) | set(reg.pairs)
    assert warnings_of(caplog) == []


def test_user_models_and_pairs_are_added(home, caplog):
    path = user_toml(home, MY_MODEL + MY_PAIR)
    reg = models.load_registry()
    assert reg.models["my-model"].hf.repo == "me/my-model-GGUF"
    assert reg.pair("my-pair")[1].name == "my-model"
    assert reg.origin["my-model"] == reg.origin["my-pair"] == str(path)
    assert reg.origin[BUILTIN_TARGET] == "built-in"
    assert reg.default_pair == "qwen2.5-coder-1.5b+0.5b"  # not changed unless the user says so
    assert warnings_of(caplog) == []


def test_user_entry_replaces_the_builtin_one_of_that_name(home):
    text = MY_MODEL.replace('"my-model"', f'"{SMOL}"')
    path = user_toml(home, text)
    reg = models.load_registry()
    assert reg.models[SMOL].sha256 == SHA and reg.origin[SMOL] == str(path)
    assert len(reg.models) == len(models.load_registry(ROOT / "models.toml").models)


def test_user_default_pair(home):
    user_toml(home, 'default_pair = "my-pair"\n' + MY_MODEL + MY_PAIR)
    assert models.load_registry().pair()[1].name == "my-model"


@pytest.mark.parametrize("text, key, why", [
    (MY_MODEL.replace("size = 1234", 'size = "big"'), "models.my-model", "size must be a positive integer"),
    (MY_MODEL.replace('family = "mine"', "family = 7"), "models.my-model", "family must be a string"),
    (MY_MODEL.replace(SHA, "xyz"), "models.my-model", "sha256 must be 64 lowercase hex"),
    (MY_MODEL + "colour = 1\n", "models.my-model", "unknown key 'colour'"),
    (MY_MODEL.replace('hf = { repo = "me/my-model-GGUF", file = "my-model.gguf" }', ""), "models.my-model",
     "needs at least one source"),
    ('[models]\nbroken = 3\n', "models.broken", "must be a table"),
    ('models = 3\n', "models", "must be a table of tables"),
    (MY_MODEL + '[pairs."p2"]\ntarget = "my-model"\ndraft = "ghost"\n', "pairs.p2", "draft 'ghost' is not a known model"),
    (MY_MODEL + '[pairs."p3"]\ntarget = 1\ndraft = "my-model"\n', "pairs.p3", "target and draft must be model names"),
    ('default_pair = "nope"\n' + MY_MODEL, "default_pair", "'nope' is not a known pair"),
    ('default_pair = 5\n' + MY_MODEL, "default_pair", "5 is not a known pair"),
    ('colour = "blue"\n' + MY_MODEL, "unknown key 'colour'", "ignored"),
])
def test_a_bad_user_entry_is_one_line_and_the_rest_works(home, caplog, text, key, why):
    path = user_toml(home, text)
    reg = models.load_registry()
    lines = warnings_of(caplog)
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"{path}: {key}") and why in lines[0] and "\n" not in lines[0]
    # the built-in entries keep working
    assert reg.pair()[0].name == BUILTIN_TARGET and reg.origin[BUILTIN_TARGET] == "built-in"
    if "my-model" in text and key != "models.my-model":
        assert "my-model" in reg.models  # a fault elsewhere does not cost the good entry


@pytest.mark.parametrize("raw, why", [
    (b"[[oops\n", "invalid TOML"),
    (b"\xff\xfe not utf-8", "invalid TOML"),
])
def test_an_unreadable_user_registry_is_one_line(home, caplog, raw, why):
    (home / "models.toml").write_bytes(raw)
    reg = models.load_registry()
    (line,) = warnings_of(caplog)
    assert line.startswith(str(home / "models.toml")) and why in line and "built-in registry only" in line
    assert set(reg.origin.values()) == {"built-in"}


def test_a_warning_is_said_once_per_process(home, caplog):
    user_toml(home, 'default_pair = "nope"\n')
    for _ in range(3):
        models.load_registry()
    assert len(warnings_of(caplog)) == 1


def test_an_explicit_registry_file_stays_strict(tmp_path):
    path = tmp_path / "strict.toml"
    path.write_text('default_pair = "p"\n' + MY_MODEL)
    with pytest.raises(ConfigError, match="default_pair: unknown pair 'p'"):
        models.load_registry(path)


def test_the_builtin_registry_stays_strict(monkeypatch):
    monkeypatch.setattr(registry, "_builtin_registry_bytes", lambda: b'default_pair = 3\n')
    with pytest.raises(ConfigError, match=r"^models.toml \(built-in\): default_pair must be a string"):
        models.load_registry()


# -- through the CLI ------------------------------------------------------------------------------


def test_models_list_shows_where_each_entry_comes_from(home):
    path = user_toml(home, MY_MODEL + MY_PAIR)
    r = CliRunner().invoke(cli, ["models", "list", "--json"])
    assert r.exit_code == 0, r.output
    rows = {row["name"]: row for row in json.loads(r.output)}
    assert rows["my-model"]["origin"] == str(path) and rows[BUILTIN_TARGET]["origin"] == "built-in"
    r = CliRunner().invoke(cli, ["models", "list"], env={"COLUMNS": "300"})
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    row = next(line for line in lines if "my-model" in line and "mine" in line)
    assert row.rstrip(" │").endswith("user")
    assert next(line for line in lines if BUILTIN_TARGET in line).rstrip(" │").endswith("built-in")
    pair_row = next(line for line in lines if "my-pair" in line)
    assert pair_row.rstrip(" │").endswith("user") and BUILTIN_TARGET in pair_row
    assert "(default)" in next(line for line in lines if "qwen2.5-coder-1.5b+0.5b" in line)
    assert sum(f"user: {path}" in line for line in lines) == 2  # each table names the file once


def test_a_bad_user_entry_through_the_cli_is_one_warning_line(home, capsys):
    path = user_toml(home, MY_MODEL.replace("size = 1234", "size = -5") + MY_PAIR)
    main(["models", "list", "--json"])  # returns: success
    out, err = capsys.readouterr()
    assert err.splitlines() == [
        f"warning: {path}: models.my-model: size must be a positive integer of bytes, got -5; entry ignored",
        f"warning: {path}: pairs.my-pair: draft 'my-model' is not a known model; entry ignored",
    ]
    names = [row["name"] for row in json.loads(out)]
    assert "my-model" not in names and BUILTIN_TARGET in names


def test_a_user_model_resolves_by_name(home, monkeypatch):
    """A user entry is a registry entry like any other: pull fetches it from its source, verified."""
    import hashlib

    content = b"GGUF-but-not-really" * 10
    user_toml(home, MY_MODEL.replace("size = 1234", f"size = {len(content)}").replace(SHA, hashlib.sha256(content).hexdigest()))
    monkeypatch.setattr(hf_source, "_hf_download", lambda repo, file, progress: _write(home / "dl.bin", content))
    path = models.pull("my-model")
    assert path == models.cached_path(models.load_registry().models["my-model"]) and path.read_bytes() == content


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path
