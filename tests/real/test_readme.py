"""The README's command examples, executed, so they cannot rot.

Each `edgespec ...` line of the README's Commands block runs as written, in a scratch EDGESPEC_HOME
that shares the model cache; EDGESPEC_MAX_TOKENS keeps answers short (an explicit -n still wins).
`chat` is interactive: it is driven in tests/real/test_chat_pty.py, here only its --help runs.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
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
    assert {"prompt", "chat", "bench", "profile", "doctor", "models"} <= cmds


@pytest.fixture(scope="module")
def scratch_home(tmp_path_factory, model_path):
    from .conftest import DRAFT, SMALL, TARGET

    for name in (TARGET, DRAFT, SMALL):
        model_path(name)
    home = tmp_path_factory.mktemp("home")
    (home / "models").symlink_to(paths.models_dir())
    return home


@pytest.mark.parametrize("line", examples())
def test_readme_example_runs(line, scratch_home):
    if " chat" in line:
        line += " --help"
    env = dict(os.environ, EDGESPEC_HOME=str(scratch_home), EDGESPEC_MAX_TOKENS="16", EDGESPEC_THREADS="2")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    r = subprocess.run(["bash", "-c", line], env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == EXPECTED_EXIT.get(line, 0), f"{line}\n{r.stderr[-2000:]}"
    assert "Traceback" not in r.stderr
