"""Real GGUF models from the packs. CI pulls them (scripts/test); a missing one is fetched here, into
the caller's model cache (tests/conftest.py: the session's own EDGESPEC_HOME links its models/ there).

A test that needs the controller's decisions fixed says so with FIXED_COST: in-process as the
decoder's cost model with timing not learnt (`fixed_decoder`), and for CLI runs as the measured
costs of a profile saved in a home of the test's own (`write_fixed_profile`): the runs then read
no profile of the caller's, and `profile --show` or scripts/run find one without measuring.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest

from edgespec import models, profile_store
from edgespec.controller import Controller
from edgespec.costs import CostModel
from edgespec.engine import PRIORS
from edgespec.hardware import HardwareInfo
from edgespec.speculative import SpeculativeDecoder

from ..conftest import DRAFT, SHARED_MODELS, SMALL, TARGET  # noqa: F401  (the tests here import them from this module)

ENTRY = [sys.executable, "-c", "from edgespec.commands import main; main()"]

# Costs under which drafting pays from the first round: verifying k tokens costs little more than
# one (a GPU's shape), and a drafted token a tenth of a target token. Far from any CPU's real
# costs on purpose: with them the controller drafts whenever a drafter proposes anything.
FIXED_COST = CostModel(verify={k: 1.0 + 0.02 * (k - 1) for k in (2, 3, 4, 5, 6, 7, 8, 12, 16)}, draft_cost=0.1)


@pytest.fixture(scope="session")
def model_path():
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = models.resolve(name)
        return cache[name]

    return get


@pytest.fixture(scope="session")
def pair_engine(model_path):
    """One loaded default pair for the whole session (loading costs seconds)."""
    from edgespec.backend.model import LoadParams
    from edgespec.config import SpecConfig
    from edgespec.engine import Engine, EngineConfig

    params = LoadParams(n_ctx=4096, n_threads=2)
    # exact: the equality tests compare speculative with plain decoding token for token
    cfg = EngineConfig(model_path(TARGET), params, model_path(DRAFT), params, spec=SpecConfig(mode="auto"), exact=True)
    engine = Engine(cfg)
    yield engine
    engine.close()


def fixed_decoder(engine, sampling, mode: str = "auto", cost: CostModel = FIXED_COST) -> SpeculativeDecoder:
    """`engine`'s decoder for `mode`, its controller replaced by one that uses `cost` and learns no
    timing: what it decides then depends on the drafts' acceptance only, never on how fast this
    machine happens to be right now."""
    dec = engine.decoder(sampling, mode)
    dec.controller = Controller(replace(cost, verify=dict(cost.verify)), k_min=engine.limits.draft_min,
                                k_max=dec.settings.draft_max, allow_off=mode == "auto", learn_timing=False,
                                priors=PRIORS)
    return dec


@contextmanager
def edgespec_home(home: Path):
    """In-process calls read and write `home` meanwhile (as a CLI run with EDGESPEC_HOME=home would)."""
    before = os.environ.get("EDGESPEC_HOME")
    os.environ["EDGESPEC_HOME"] = str(home)
    try:
        yield
    finally:
        if before is None:
            del os.environ["EDGESPEC_HOME"]
        else:
            os.environ["EDGESPEC_HOME"] = before


def new_home(root: Path) -> Path:
    """An empty EDGESPEC_HOME that shares the model cache."""
    home = root / "home"
    home.mkdir()
    (home / "models").symlink_to(SHARED_MODELS, target_is_directory=True)
    return home


def write_fixed_profile(home: Path, cost: CostModel = FIXED_COST, *args: str) -> list[Path]:
    """Save in `home` the profile `edgespec profile [ARGS]` would save on this machine (hardware,
    offload plan, the default pair unless ARGS name others), with `cost` as the measured costs of
    both kernel kinds, without measuring. Returns the profile files (target alone, and the pair)."""
    r = subprocess.run([*ENTRY, "profile", "--no-measure", "--json", "-t", "2", *args],
                       env={**os.environ, "EDGESPEC_HOME": str(home)}, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    files = sorted((home / "profiles").glob("*.json"))
    assert files, r.stdout[-2000:]
    measured = {"cost": cost.to_json(), "stable": True}
    with edgespec_home(home):
        for path in files:
            record = json.loads(path.read_text())
            data = {**record["data"], "measurements": {"fast": measured, "exact": measured}}
            saved = profile_store.save_profile(data, hw=HardwareInfo.from_json(record["hardware"]),
                                               target_sha_or_name=record["target"], draft=record["draft"])
            assert saved == path
    return files


def saved_costs(home: Path) -> dict[str, dict]:
    """{profile file name: {kernels: cost}} of every profile saved in `home`."""
    return {p.name: profile_store.saved_costs(json.loads(p.read_text())) for p in sorted((home / "profiles").glob("*.json"))}
