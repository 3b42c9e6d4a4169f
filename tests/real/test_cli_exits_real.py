"""The real CLI on real models: exit 130 on Ctrl-C mid-answer, exit 9 when nothing fits,
EDGESPEC_* variables in a real process, and --show-drafts colouring the n-gram tokens."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import time

import pytest

from edgespec import session
from edgespec.commands import main
from edgespec.hardware import GiB, MiB, HardwareInfo

from .conftest import SMALL, TARGET

ENTRY = [sys.executable, "-c", "from edgespec.commands import main; main()"]
ANSI = re.compile(r"\x1b\[[0-9;]*m")
EDIT = ("Copy this text exactly, changing nothing:\n"
        "The cache stores recent entries. The cache evicts old entries. The cache is small.")


def run_cli(*args, env=None):
    return subprocess.run([*ENTRY, *args], capture_output=True, timeout=600, env={**os.environ, **(env or {})})


@pytest.fixture(scope="module", autouse=True)
def models_present(model_path):
    for name in (TARGET, SMALL):
        model_path(name)


def test_ctrl_c_mid_answer_exits_130():
    # SIGINT as a terminal sends it; the child starts with the default handler even when this
    # test runs in a background shell that ignores SIGINT.
    proc = subprocess.Popen(
        [*ENTRY, "prompt", "Write a very long story about a lighthouse keeper.", "-m", SMALL, "--spec", "off",
         "-n", "2000", "-t", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 300)
        assert ready, "no answer text within 300 s"
        first = os.read(proc.stdout.fileno(), 1024)
        assert first.strip()
        time.sleep(0.5)  # well inside the answer (2000 tokens take minutes)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = err.decode()
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert "interrupted" in err  # the stats footer's finish reason
    assert (first + out).strip()  # what was answered so far stays on stdout


def tiny_machine(*args, **kwargs) -> HardwareInfo:
    return HardwareInfo("Linux", "Tiny CPU", 1, 1, (), 64 * MiB, 32 * MiB, 0)


def test_models_that_cannot_fit_exit_9(monkeypatch, capsys):
    monkeypatch.setattr(session, "detect", tiny_machine)
    with pytest.raises(SystemExit) as exit:
        main(["prompt", "hi", "-m", TARGET, "--spec", "off", "-t", "2"])
    out, err = capsys.readouterr()
    assert exit.value.code == 9, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err and out == ""


def test_machine_big_enough_is_not_refused(monkeypatch, capsys):
    # The same path with a plausible machine plans fine: exit 9 above came from the memory.
    monkeypatch.setattr(session, "detect", lambda *a, **k: HardwareInfo("Linux", "CPU", 2, 2, (), 16 * GiB, 12 * GiB, 0))
    main(["prompt", "hi", "-m", SMALL, "--spec", "off", "-t", "2", "-n", "2", "-q"])
    assert capsys.readouterr().out.strip()


def test_env_vars_in_a_real_process():
    env = {"EDGESPEC_MODEL": SMALL, "EDGESPEC_SPEC": "ngram", "EDGESPEC_MAX_TOKENS": "5", "EDGESPEC_THREADS": "2"}
    r = run_cli("prompt", "Count from one to twenty in words.", "--json", env=env)
    assert r.returncode == 0, r.stderr.decode()
    stats = json.loads(r.stdout)["stats"]
    assert stats["mode"] == "ngram" and 0 < stats["tokens"] <= 5


def test_show_drafts_colours_ngram_tokens():
    args = ("prompt", EDIT, "-m", TARGET, "--spec", "ngram", "-n", "40", "-t", "2", "--exact", "-q")
    coloured = run_cli(*args, "--show-drafts", env={"FORCE_COLOR": "1", "TERM": "xterm-256color"})
    assert coloured.returncode == 0, coloured.stderr.decode()
    out = coloured.stdout.decode()
    cyan = re.findall(r"\x1b\[36m(.*?)\x1b\[0m", out, flags=re.S)
    assert cyan and "".join(cyan).strip(), out  # n-gram tokens were accepted and marked
    assert "\x1b[32m" not in out  # no draft model in ngram mode
    plain = run_cli(*args, env={"FORCE_COLOR": "1", "TERM": "xterm-256color"})
    assert plain.returncode == 0
    assert not ANSI.search(plain.stdout.decode())  # colour only with --show-drafts
    assert ANSI.sub("", out) == plain.stdout.decode()  # same answer, only marked
