"""The README's command examples, executed, so they cannot rot.

Each `edgespec ...` line of the README's Commands block runs as written, in a scratch EDGESPEC_HOME
that shares the model cache; EDGESPEC_MAX_TOKENS keeps answers short (an explicit -n still wins).
`chat` is interactive: it is driven in tests/real/test_chat_pty.py, here only its --help runs.
`rpc-server` runs until stopped: it is started in the background, serves the `--rpc` example that
follows it, and is stopped with Ctrl-C (SIGINT) at the end.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edgespec import paths

README = Path(__file__).resolve().parents[2] / "README.md"
# Examples whose documented outcome is a non-zero exit (doctor on an incompatible pair).
EXPECTED_EXIT = {"edgespec doctor qwen2.5-coder-1.5b-instruct-q4_k_m smollm2-135m-instruct-q4_1": 1}


def examples() -> list[str]:
    block = README.read_text().split("## Commands", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    lines = [re.sub(r"\s+#.*$", "", line).strip() for line in block.splitlines()]
    return [line for line in lines if "edgespec " in line]


def test_readme_has_examples_for_every_command():
    cmds = {line.split("edgespec ", 1)[1].split()[0] for line in examples()}
    assert {"prompt", "chat", "bench", "profile", "doctor", "models", "rpc-server"} <= cmds


@pytest.fixture(scope="module")
def scratch_home(tmp_path_factory, model_path):
    from .conftest import DRAFT, SMALL, TARGET

    for name in (TARGET, DRAFT, SMALL):
        model_path(name)
    home = tmp_path_factory.mktemp("home")
    (home / "models").symlink_to(paths.models_dir())
    return home


@pytest.fixture(scope="module")
def servers():
    running: list[subprocess.Popen] = []
    yield running
    for proc in running:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0


def _serve(line: str, env: dict, servers: list) -> None:
    from edgespec.backend import rpc
    from edgespec.errors import InputError

    port = re.search(r"--port (\d+)", line).group(1)
    proc = subprocess.Popen(line.split(), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    servers.append(proc)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read().decode()
        try:
            rpc.probe(f"127.0.0.1:{port}", timeout=2)
            return
        except InputError:
            time.sleep(0.2)
    pytest.fail(f"{line}: no answer on port {port} within 60 s")


@pytest.mark.parametrize("line", examples())
def test_readme_example_runs(line, scratch_home, servers):
    if " chat" in line:
        line += " --help"
    env = dict(os.environ, EDGESPEC_HOME=str(scratch_home), EDGESPEC_MAX_TOKENS="16", EDGESPEC_THREADS="2")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    if " rpc-server" in line:
        _serve(line, env, servers)
        return
    r = subprocess.run(["bash", "-c", line], env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == EXPECTED_EXIT.get(line, 0), f"{line}\n{r.stderr[-2000:]}"
    assert "Traceback" not in r.stderr
