"""`scripts/run "q" 2>/dev/null` prints only the answer: set-up, pip, downloads and the first run's
profile all go to stderr. Runs the real script (set-up already done, so it only checks and reuses)
in a fresh EDGESPEC_HOME that shares the model cache, so the first-run profile path runs too."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgespec import paths

pytestmark = pytest.mark.real

ROOT = Path(__file__).resolve().parents[2]
QUESTION = "Name three primary colours, comma-separated."
# --exact: greedy speculative output is then identical to plain decoding, so the answer is known.
ARGS = ["-n", "12", "--exact", "-t", "2"]


def test_run_prints_only_the_answer_on_stdout(tmp_path, model_path):
    from .conftest import DRAFT, TARGET

    model_path(TARGET), model_path(DRAFT)  # the pair is cached (the script would fetch it otherwise)
    home = tmp_path / "home"
    home.mkdir()
    (home / "models").symlink_to(paths.models_dir(), target_is_directory=True)
    env = {**os.environ, "EDGESPEC_HOME": str(home), "EDGESPEC_VENV": str(Path(sys.executable).parent.parent)}
    for var in ("EDGESPEC_EXACT", "EDGESPEC_SPEC", "EDGESPEC_MODEL", "EDGESPEC_MODEL_DRAFT", "EDGESPEC_PAIR"):
        env.pop(var, None)

    run = subprocess.run([str(ROOT / "scripts" / "run"), QUESTION, *ARGS], env=env, capture_output=True,
                         text=True, timeout=1800)
    assert run.returncode == 0, run.stderr[-3000:]

    edgespec = Path(sys.executable).parent / "edgespec"
    plain = subprocess.run([str(edgespec), "prompt", QUESTION, *ARGS, "--spec", "off"], env=env,
                           capture_output=True, text=True, timeout=600)
    assert plain.returncode == 0, plain.stderr[-3000:]
    assert plain.stdout.strip()
    # stdout holds exactly the answer: what plain decoding of the same prompt prints, nothing else
    assert run.stdout == plain.stdout
    # ... while the set-up and the first run's profile went to stderr
    assert "[setup]" in run.stderr
    assert "offload plan" in run.stderr  # the first run's profile tables
    # the profile is saved, or (busy machine) says in one line why not: the answer comes either way
    assert "saved profile:" in run.stderr or "error: profile un" in run.stderr or "error: profile not measured" in run.stderr
    assert "tokens/pass" in run.stderr  # the prompt's stats footer
