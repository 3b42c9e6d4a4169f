"""Several edgespec processes at once on one $EDGESPEC_HOME: two pulls of one model, a run that needs
a model while a pull of it is under way, two processes saving the same profile.

Each process is a real interpreter running the CLI's entry point (or the library call a command
makes) with only the network source faked; the steps are ordered by marker files, not by sleeps, so
the overlap the test is about really happens every run.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edgespec import models

from .fakes import tiny_registry_entry

ROOT = Path(models.__file__).resolve().parents[2]
CONTENT = b"GGUF" + os.urandom(64) + bytes(range(256)) * 400
SHA = hashlib.sha256(CONTENT).hexdigest()
ENTRY = tiny_registry_entry(CONTENT)
WAIT = 60  # seconds a step may take on a slow, shared machine before the test gives up

# A process with a fake Hugging Face source. The download announces itself (marker DOWNLOADING),
# then blocks until the test creates RELEASE; a process that finds the lock taken says so (marker
# WAITING) before it waits. Every download is logged, one line each.
PRELUDE = r"""
import os, sys, time
from pathlib import Path
import filelock
from edgespec import models
tmp = Path(os.environ["T_DIR"]); me = os.environ["T_NAME"]

def download(repo, file, progress):
    with open(tmp / "downloads.log", "a") as log:
        log.write(me + "\n")
    (tmp / f"{me}.downloading").touch()
    deadline = time.time() + 60
    while not (tmp / "release").exists() and time.time() < deadline:
        time.sleep(0.02)
    out = tmp / f"{me}.blob"
    out.write_bytes((tmp / "source.bin").read_bytes())
    return out

from edgespec.models.sources import hf
hf._hf_download = download
hf._hf_cached = lambda repo, file: None

_acquire = filelock.FileLock.acquire
def acquire(self, timeout=None, *args, **kwargs):
    try:
        return _acquire(self, timeout, *args, **kwargs)
    except filelock.Timeout:
        (tmp / f"{me}.waiting").touch()
        raise
filelock.FileLock.acquire = acquire
"""

PULL = PRELUDE + r"""
from edgespec.commands import main
main(["models", "pull", "tiny"])
"""

RESOLVE = PRELUDE + r"""
# what `prompt` and `chat` do first (session.resolve): the model's path, fetched if need be
path = models.resolve("tiny")
print(path, path.stat().st_size)
"""


@pytest.fixture
def home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    (home / "models.toml").write_text(ENTRY)
    monkeypatch.setenv("EDGESPEC_HOME", str(home))
    return home


def start(tmp_path, home, name: str, script: str) -> subprocess.Popen:
    env = {**os.environ, "EDGESPEC_HOME": str(home), "T_DIR": str(tmp_path), "T_NAME": name,
           "HF_HUB_OFFLINE": "1"}
    (tmp_path / "source.bin").write_bytes(CONTENT)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def wait_for(path: Path, proc: subprocess.Popen, *, instead: Path | None = None) -> None:
    """Until `path` appears; fail at once if the process ends or `instead` appears first."""
    deadline = time.monotonic() + WAIT
    while not path.exists():
        if instead is not None and instead.exists():
            pytest.fail(f"{instead.name} appeared where {path.name} was expected")
        if proc.poll() is not None:
            out, err = proc.communicate()
            pytest.fail(f"process ended before {path.name} appeared (status {proc.returncode}): {err[-2000:]}")
        assert time.monotonic() < deadline, f"{path.name} did not appear within {WAIT} s"
        time.sleep(0.02)


def finish(proc: subprocess.Popen) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=WAIT)
    return proc.returncode, out, err


def cache_listing(home: Path) -> list[str]:
    return sorted(p.name for p in (home / "models").iterdir())


def test_two_pulls_of_one_model_download_once(tmp_path, home):
    first = start(tmp_path, home, "first", PULL)
    wait_for(tmp_path / "first.downloading", first)
    second = start(tmp_path, home, "second", PULL)
    wait_for(tmp_path / "second.waiting", second, instead=tmp_path / "second.downloading")  # the lock held it back
    (tmp_path / "release").touch()
    results = [finish(first), finish(second)]
    path = home / "models" / "tiny.gguf"
    for code, out, err in results:
        assert code == 0, err
        assert out.strip() == f"tiny: {path}"
    assert (tmp_path / "downloads.log").read_text().split() == ["first"]
    assert path.read_bytes() == CONTENT
    assert cache_listing(home) == ["tiny.gguf", "tiny.gguf.sha256"]  # one verified file, no temp files


def test_a_run_started_during_a_pull_waits_and_uses_the_finished_file(tmp_path, home):
    pull = start(tmp_path, home, "pull", PULL)
    wait_for(tmp_path / "pull.downloading", pull)
    run = start(tmp_path, home, "run", RESOLVE)
    wait_for(tmp_path / "run.waiting", run, instead=tmp_path / "run.downloading")
    assert not (home / "models" / "tiny.gguf").exists()  # nothing half-written for it to pick up
    (tmp_path / "release").touch()
    code, out, err = finish(pull)
    assert code == 0, err
    code, out, err = finish(run)
    assert code == 0, err
    assert out.split() == [str(home / "models" / "tiny.gguf"), str(len(CONTENT))]
    assert (tmp_path / "downloads.log").read_text().split() == ["pull"]


def test_a_run_after_a_killed_pull_fetches_again(tmp_path, home):
    """The lock dies with its holder: a pull killed mid-download does not block the next one."""
    pull = start(tmp_path, home, "pull", PULL)
    wait_for(tmp_path / "pull.downloading", pull)
    pull.kill()
    pull.communicate(timeout=WAIT)
    (tmp_path / "release").touch()
    run = start(tmp_path, home, "run", RESOLVE)
    code, out, err = finish(run)
    assert code == 0, err
    assert (tmp_path / "downloads.log").read_text().split() == ["pull", "run"]
    assert cache_listing(home) == ["tiny.gguf", "tiny.gguf.sha256"]


SAVER = r"""
import os, sys, time
from pathlib import Path
from edgespec import profile_store
from edgespec.hardware import GiB, HardwareInfo
hw = HardwareInfo(os="Linux", cpu_model="Test CPU", physical_cores=2, logical_cores=2, cpu_features=(),
                  ram_total=8 * GiB, ram_available=4 * GiB, swap_total=0, gpus=(),
                  gpu_offload_supported=False, rpc_supported=False, llama_cpp_version="0.3.36")
tmp = Path(os.environ["T_DIR"]); me = os.environ["T_NAME"]
n = int(sys.argv[1])
for i in range(n):
    profile_store.save_profile({"writer": me, "i": i, "pad": "x" * 20000}, hw=hw, target_sha_or_name="t", draft="d")
    if i == n // 2:  # half-way: pause until the test lets this writer go on
        (tmp / f"{me}.mid").touch()
        deadline = time.time() + 60
        while not (tmp / f"{me}.go").exists():
            if time.time() > deadline:
                sys.exit("never released")
            time.sleep(0.02)
"""


def test_two_processes_saving_one_profile_never_leave_half_a_file(tmp_path, home):
    """Both writers save concurrently up to half-way, then the rest one after the other, while the
    test reads the profile all along: every read is one whole record, and each writer's is read."""
    from edgespec import profile_store
    from edgespec.hardware import GiB, HardwareInfo

    hw = HardwareInfo(os="Linux", cpu_model="Test CPU", physical_cores=2, logical_cores=2, cpu_features=(),
                      ram_total=8 * GiB, ram_available=4 * GiB, swap_total=0, gpus=(),
                      gpu_offload_supported=False, rpc_supported=False, llama_cpp_version="0.3.36")
    n = 150
    writers = {name: start(tmp_path, home, name, SAVER.replace("sys.argv[1]", str(n))) for name in ("a", "b")}
    seen = []  # the writer of each record read, in order

    def read() -> None:
        record = profile_store.load_profile(hw, "t", "d")
        if record is not None:  # None only before the first save lands
            data = record["data"]
            assert data["writer"] in ("a", "b") and len(data["pad"]) == 20000 and 0 <= data["i"] < n
            seen.append(data["writer"])

    def read_until(done) -> None:
        deadline = time.monotonic() + WAIT
        while not done():
            read()
            for name, w in writers.items():
                if w.poll() is not None and not (tmp_path / f"{name}.go").exists():
                    pytest.fail(f"writer {name} ended before it was let go on: {w.communicate()[1][-2000:]}")
            assert time.monotonic() < deadline, f"the writers did not get there within {WAIT} s"

    read_until(lambda: all((tmp_path / f"{name}.mid").exists() for name in writers))
    read()  # both paused: the profile holds the last save of one of them
    first = seen[-1]
    order = [("b" if first == "a" else "a"), first]  # the other goes on first, so both are read
    for name in order:
        (tmp_path / f"{name}.go").touch()
        read_until(lambda w=writers[name]: w.poll() is not None)
        read()  # it has finished: its last record is what the profile holds
        assert seen[-1] == name
        code, _, err = finish(writers[name])
        assert code == 0, err
    assert set(seen) == {"a", "b"}
    final = profile_store.load_profile(hw, "t", "d")["data"]
    assert final == {"writer": order[-1], "i": n - 1, "pad": "x" * 20000}
    files = sorted(p.name for p in (home / "profiles").iterdir())
    assert len(files) == 1 and files[0].endswith(".json")  # no temp files left behind
    assert json.loads((home / "profiles" / files[0]).read_text())["data"] == final


# -- a signal that arrives while C code is calling back into Python ------------------------------------

CALLBACK_SCRIPT = r"""
import ctypes, os, signal, sys, time
from edgespec.commands import root

def log_line():  # stands for llama.cpp's log callback: Python code called from C
    os.kill(os.getpid(), signal.SIGTERM)
    end = time.monotonic() + 0.3
    while time.monotonic() < end:  # the handler runs here, inside the callback
        pass

if sys.argv[1] == "registered":
    root._C_CALLBACKS = root._C_CALLBACKS | {("<string>", "log_line")}
callback = ctypes.CFUNCTYPE(None)(log_line)

@root.cli.command("work")
def work():
    callback()  # through libffi, as llama.cpp calls its log callback
    print("after the callback", flush=True)
    time.sleep(1)
    print("ran on", flush=True)

root.main(["work"])
"""


@pytest.mark.parametrize("registered", [True, False])
def test_a_signal_during_a_c_callback_is_not_lost(registered):
    """Raised inside a ctypes callback, the exception would be printed and dropped and the run would go on;
    edgespec sends the signal again once the callback has returned."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-c", CALLBACK_SCRIPT, "registered" if registered else "not"],
                          env=env, capture_output=True, text=True, timeout=WAIT)
    if registered:
        assert (proc.returncode, proc.stderr) == (143, "terminated (SIGTERM)\n")
        assert "ran on" not in proc.stdout
    else:  # what happens without the re-delivery: the signal is lost in the callback
        assert "Exception ignored on calling ctypes callback function" in proc.stderr
        assert proc.stdout == "after the callback\nran on\n" and proc.returncode == 0
