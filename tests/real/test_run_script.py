"""`scripts/run "q" 2>/dev/null` prints only the answer: set-up, pip and downloads go to stderr. Runs
the real script (set-up already done, so it only checks and reuses) in a fresh EDGESPEC_HOME that
shares the model cache and holds a saved profile of this machine (fixed costs), so the script finds
it and does not measure: whether a measurement would succeed here is the machine's load, not the
script's behaviour (`edgespec profile` itself is run by test_readme.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import DRAFT, TARGET, new_home, saved_costs, write_fixed_profile

pytestmark = pytest.mark.real

ROOT = Path(__file__).resolve().parents[2]
QUESTION = "Name three primary colours, comma-separated."
# --exact: greedy speculative output is then identical to plain decoding, so the answer is known.
ARGS = ["-n", "12", "--exact", "-t", "2"]


def test_run_prints_only_the_answer_on_stdout(tmp_path, model_path):
    model_path(TARGET), model_path(DRAFT)  # the pair is cached (the script would fetch it otherwise)
    home = new_home(tmp_path)
    write_fixed_profile(home)
    costs = saved_costs(home)
    env = {**os.environ, "EDGESPEC_HOME": str(home), "EDGESPEC_VENV": str(Path(sys.executable).parent.parent)}

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
    # ... while the set-up went to stderr, with the prompt's stats footer
    assert "[setup]" in run.stderr
    assert "tokens/pass" in run.stderr
    # a saved profile with fast-kernel costs: the script did not measure again, nor touch it
    assert "offload plan" not in run.stderr and "saved profile:" not in run.stderr
    assert saved_costs(home) == costs
