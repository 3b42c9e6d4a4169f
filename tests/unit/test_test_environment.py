"""The test session's own environment (tests/conftest.py) and scripts/test's refusal to pass quietly
without the GPU suite."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from edgespec import paths

from ..conftest import SHARED_MODELS, TEST_KNOBS

ROOT = Path(__file__).resolve().parents[2]


def test_the_session_has_its_own_home_and_no_caller_settings():
    home = paths.home()
    assert home.parent == Path(tempfile.gettempdir()) and home.name.startswith("edgespec-test-home-")
    assert not (home / "models.toml").exists() and not paths.profiles_dir().exists()
    assert paths.models_dir().resolve() == SHARED_MODELS.resolve()  # the caller's model cache, linked
    assert {n for n in os.environ if n.startswith("EDGESPEC_")} <= {"EDGESPEC_HOME", *TEST_KNOBS}


def test_a_caller_setting_does_not_reach_the_tests(tmp_path):
    """A session started with EDGESPEC_* settings and a home of the caller's sees none of them."""
    caller_home = tmp_path / "caller"
    (caller_home / "models").mkdir(parents=True)
    env = {**os.environ, "EDGESPEC_HOME": str(caller_home), "EDGESPEC_SPEC": "draft", "EDGESPEC_MAX_TOKENS": "3",
           "EDGESPEC_CORPUS_SEED": "99"}
    probe = tmp_path / "test_probe.py"
    probe.write_text(
        "import os\n"
        "from edgespec import paths\n"
        "def test_probe():\n"
        f"    assert paths.home() != __import__('pathlib').Path({str(caller_home)!r})\n"
        f"    assert paths.models_dir().resolve() == __import__('pathlib').Path({str(caller_home / 'models')!r}).resolve()\n"
        "    assert 'EDGESPEC_SPEC' not in os.environ and 'EDGESPEC_MAX_TOKENS' not in os.environ\n"
        "    assert os.environ['EDGESPEC_CORPUS_SEED'] == '99'\n")
    # the probe runs with tests/conftest.py as a plugin, as every test here runs under it
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest", str(probe)],
                       env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]


def test_a_runner_that_ignores_signals_does_not_pass_the_ignore_to_the_tests_children(tmp_path):
    """Started under nohup and in a background shell (SIGHUP and SIGINT ignored), the session's
    children still get the signals the real tests send them."""
    probe = tmp_path / "test_probe.py"
    probe.write_text(
        "import signal, subprocess, sys\n"
        "def test_probe():\n"
        "    code = 'import signal; print([signal.getsignal(s) == signal.SIG_IGN for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)])'\n"
        "    out = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True).stdout\n"
        "    assert out.strip() == '[False, False, False]', out\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}

    def ignoring():
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)

    run = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest", str(probe)]
    r = subprocess.run(run, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120, preexec_fn=ignoring)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    # the probe can fail: without the session's conftest the ignores reach the child
    bare = subprocess.run(run[:6] + [str(probe)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          preexec_fn=ignoring)
    assert bare.returncode != 0 and "[True, True, True]" in bare.stdout


def test_scripts_test_refuses_to_leave_the_gpu_suite_out_quietly():
    env = {**os.environ, "EDGESPEC_TEST_VULKAN": "0"}
    r = subprocess.run(["bash", str(ROOT / "scripts" / "test")], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr.strip() == ("[test] EDGESPEC_TEST_VULKAN=0: use 1 (run the GPU suite, the default) or skip "
                                "(leave it out; the run says it is incomplete)")
