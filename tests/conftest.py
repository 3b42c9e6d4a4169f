"""Shared by every suite: a clean environment, the packs' model names, and the `real` marker on every
test in the real-model suites (tests/real, tests/gpu: they load real GGUF models).

A test run proves what edgespec does, not what the caller's own settings make it do. Before any test
is collected (so that module-level code sees it too) the session drops every EDGESPEC_* variable
but the test suite's own knobs (TEST_KNOBS) and gets its own EDGESPEC_HOME, a temporary directory:
no models.toml of the user's, no saved profile, nothing left behind. Its models/ is a link to the
caller's model cache (what `scripts/test` pulled into the caller's EDGESPEC_HOME), so the real
suites find the models there without downloading them again, and a model missing from that
cache is fetched into it once, not into the temporary home.

The session also starts its children with SIGINT, SIGTERM and SIGHUP handled as by default. edgespec
keeps ignoring a signal it was started told to ignore (`nohup edgespec serve` must survive a
hang-up), and an ignored signal is inherited through fork and exec: a runner started under nohup
(SIGHUP ignored) or in a background shell (SIGINT ignored) would otherwise hand that to every
child the signal tests send it to, and those tests would see a child that rightly ignores it.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from pathlib import Path

import pytest

from edgespec import paths

TARGET = "qwen2.5-coder-1.5b-instruct-q4_k_m"
DRAFT = "qwen2.5-coder-0.5b-instruct-q4_k_m"
SMALL = "smollm2-135m-instruct-q4_1"

REAL_SUITES = ("/tests/real/", "/tests/gpu/")

# EDGESPEC_* variables that tune the tests themselves (how many fuzz examples, which corpus), not
# edgespec: they pass through.
TEST_KNOBS = frozenset({"EDGESPEC_FUZZ_EXAMPLES", "EDGESPEC_FUZZ_RANDOM", "EDGESPEC_CORPUS_SEED", "EDGESPEC_CORPUS_SCALE"})

# Where the caller's models are, read before the environment is cleaned.
SHARED_MODELS: Path = paths.models_dir()
_HOME: Path | None = None


# What a child would be started with, per signal, had the runner passed no ignore on: SIGINT stays
# Python's own handler here (children start with the default), the others the default.
_DEFAULTS = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL, signal.SIGHUP: signal.SIG_DFL}


def pytest_configure(config):
    global _HOME
    for sig, handler in _DEFAULTS.items():
        if signal.getsignal(sig) is signal.SIG_IGN:
            signal.signal(sig, handler)
    for name in [n for n in os.environ if n.startswith("EDGESPEC_") and n not in TEST_KNOBS]:
        del os.environ[name]
    _HOME = Path(tempfile.mkdtemp(prefix="edgespec-test-home-"))
    SHARED_MODELS.mkdir(parents=True, exist_ok=True)
    (_HOME / "models").symlink_to(SHARED_MODELS, target_is_directory=True)
    os.environ["EDGESPEC_HOME"] = str(_HOME)


def pytest_unconfigure(config):
    if _HOME is not None:
        shutil.rmtree(_HOME, ignore_errors=True)  # the models/ link goes, not what it points to


def pytest_collection_modifyitems(items):
    for item in items:
        if any(suite in str(item.fspath) for suite in REAL_SUITES):
            item.add_marker(pytest.mark.real)
