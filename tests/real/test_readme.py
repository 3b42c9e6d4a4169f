"""The README's command examples, executed, so they cannot rot.

Each `edgespec ...` line of the README's Commands block runs as written, in a scratch EDGESPEC_HOME
that shares the model cache and holds a saved profile of this machine with fixed costs (so what
`profile --show` shows does not depend on whether `profile` could measure here just now);
EDGESPEC_MAX_TOKENS keeps answers short (an explicit -n still wins).
`chat` is interactive: it is driven in tests/real/test_chat_pty.py, here only its --help runs.
`rpc-server` runs until stopped: it is started in the background, serves the `--rpc` example that
follows it, and is stopped with Ctrl-C (SIGINT) at the end.
"""

from __future__ import annotations

import os
import json
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import DRAFT, SMALL, TARGET, new_home, saved_costs, write_fixed_profile

README = Path(__file__).resolve().parents[2] / "README.md"
# A hang catcher, not a speed check: the slowest example (`bench --category copy ... --verify`: 45 runs,
# each reading its prompt from empty caches) came within seconds of the old 900 s on a slow 2-vCPU machine.
EXAMPLE_TIMEOUT_S = 1800
# Examples whose documented outcome is a non-zero exit (doctor on an incompatible pair).
EXPECTED_EXIT = {"edgespec doctor qwen2.5-coder-1.5b-instruct-q4_k_m smollm2-135m-instruct-q4_1": 1}


def examples() -> list[str]:
    block = README.read_text().split("## Commands", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    lines = [re.sub(r"\s+#.*$", "", line).strip() for line in block.splitlines()]
    return [line for line in lines if "edgespec " in line]


def test_readme_has_examples_for_every_command():
    cmds = {line.split("edgespec ", 1)[1].split()[0] for line in examples()}
    assert {"prompt", "chat", "bench", "profile", "doctor", "models", "rpc-server"} <= cmds


# `edgespec profile` on a busy or noisy machine: one line, and the saved costs stay (README, profile).
REFUSAL = re.compile(
    r"error: profile (not measured, the machine is busy \(.+\): kept the saved profile's costs; rerun "
    r"`edgespec profile` when it is quiet, or pass --force to measure anyway"
    r"|unstable \(.+\): kept the saved profile's costs; rerun `edgespec profile` on a quiet machine, "
    r"or pass --force to use this measurement)")


@pytest.fixture(scope="module")
def scratch_home(tmp_path_factory, model_path):
    for name in (TARGET, DRAFT, SMALL):
        model_path(name)
    home = new_home(tmp_path_factory.mktemp("readme"))
    write_fixed_profile(home)
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
    env = dict(os.environ, EDGESPEC_HOME=str(scratch_home), EDGESPEC_MAX_TOKENS="16", EDGESPEC_THREADS="2",
               COLUMNS="250")  # Rich tables in a pipe: wide enough that no name is cut
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    if " rpc-server" in line:
        _serve(line, env, servers)
        return
    before = saved_costs(scratch_home)
    r = subprocess.run(["bash", "-c", line], env=env, capture_output=True, text=True, timeout=EXAMPLE_TIMEOUT_S)
    assert "Traceback" not in r.stderr
    if line == "edgespec profile":
        # Whether this machine is quiet enough to measure is not the test's to choose; each outcome
        # is the documented one, exactly: a measurement saved, or one line, exit 1, the costs kept.
        if r.returncode == 1:
            assert REFUSAL.fullmatch(r.stderr.strip().splitlines()[-1]), r.stderr[-2000:]
            assert "offload plan" in r.stdout  # what it found before measuring
            assert saved_costs(scratch_home) == before
            return
        assert r.returncode == 0, r.stderr[-2000:]
        assert saved_costs(scratch_home) != before  # the measured costs replaced the fixed ones
    assert r.returncode == EXPECTED_EXIT.get(line, 0), f"{line}\n{r.stderr[-2000:]}"
    check_output(line, r.stdout, r.stderr)


# ---- what each example must print, not only that it exits 0 ----------------------------------
STATS_KEYS = {"mode", "prompt_tokens", "prompt_cached", "tokens", "rounds", "drafted", "accepted", "acceptance_rate",
              "accepted_hist", "mean_accepted_per_pass", "tokens_per_s", "ttft_ms", "latency_p50_ms", "latency_p95_ms",
              "k_history", "tokens_by_source", "finish_reason"}
FOOTER = re.compile(r"(\d+) tokens, [\d.]+ tok/s \| spec (\w+) \| accepted \d+/\d+ .*\| (stop|length)\s*$")


def _argv(line: str) -> list[str]:
    return shlex.split(line.split("edgespec ", 1)[1])


def _option(argv: list[str], *names: str, default=None):
    for i, arg in enumerate(argv[:-1]):
        if arg in names:
            return argv[i + 1]
    return default


def check_output(line: str, out: str, err: str) -> None:
    argv = _argv(line)
    command = argv[0]
    checks = {"prompt": _check_prompt, "bench": _check_bench, "profile": _check_profile, "doctor": _check_doctor,
              "models": _check_models, "chat": _check_chat_help}
    assert command in checks, f"README example {line!r}: no output check for `{command}`; add one to {__file__}"
    checks[command](argv, out, err)


def _check_prompt(argv, out, err):
    limit = int(_option(argv, "-n", "--max-tokens", default=16))  # EDGESPEC_MAX_TOKENS=16 unless -n
    mode = _option(argv, "--spec", default="auto")
    if "--json" in argv:
        data = json.loads(out)
        assert set(data) == {"text", "finish_reason", "stats"}, data.keys()
        assert STATS_KEYS <= set(data["stats"]), STATS_KEYS - set(data["stats"])
        assert data["text"] and data["finish_reason"] in ("stop", "length")
        assert 0 < data["stats"]["tokens"] <= limit and data["stats"]["mode"] == mode
        return
    assert out.strip(), "no answer on stdout"
    footer = FOOTER.search(err.strip().splitlines()[-1])
    assert footer, f"no stats footer on stderr: {err[-500:]!r}"
    assert 0 < int(footer.group(1)) <= limit and footer.group(2) == mode


def _check_bench(argv, out, err):
    assert "edgespec bench" in out  # the results table's title
    modes = _option(argv, "--modes", default="off,draft,ngram,combined,auto").split(",")
    rows = [line for line in out.splitlines() if "│" in line or "|" in line]
    for mode in modes:
        assert any(re.search(rf"\b{mode}\b", row) for row in rows), f"mode {mode} missing from the table"
    assert "speedup" in out and "tok/s" in out
    if "--verify" in argv:
        assert "verify: ok" in out


def _check_profile(argv, out, err):
    if "--show" in argv:
        assert re.search(r"profile created \S+ \(edgespec [\w.]+", out), out[:300]
        for field in ("target ", "hardware", "cpu", "ram", "offload plan"):
            assert field in out, field
        return
    for field in ("hardware", "offload plan", "devices", "measured target batch cost t(k)", "drafters", "saved profile:"):
        assert field in out, field
    cells = [[c.strip() for c in row.split("│")[1:-1]] for row in out.splitlines() if "│" in row]
    # k | ms | spread | v(k): t(1) is its own unit
    assert any(len(c) == 4 and c[0] == "1" and c[2].startswith("+") and c[3] == "1.00" for c in cells), \
        "no t(1) row in the timing table"


def _check_doctor(argv, out, err):
    refs = argv[1:]
    if not refs:
        assert re.search(r"^build: (ok|problem) ", out, flags=re.M), out
        return
    for field in ("architecture", "quantization", "layers", "vocabulary", "chat template"):
        assert out.count(field) >= len(refs), field
    if len(refs) == 2:
        assert re.search(r"^pair: (ok|problem) ", out, flags=re.M), out


def _check_models(argv, out, err):
    from edgespec import models

    reg = models.load_registry()
    if argv[1] == "list":
        for name in reg.models:
            assert name in out, f"{name} missing from `models list`"
        return
    assert argv[1] == "pull"
    names = [m for n in argv[2:] for m in (reg.pairs.get(n) or (n,))]
    for name in names:
        match = re.search(rf"^{re.escape(name)}: (.+\.gguf)$", out, flags=re.M)
        assert match and Path(match.group(1)).is_file(), f"`models pull` did not print {name}: PATH"


def _check_chat_help(argv, out, err):
    assert "Usage:" in out and "chat" in out
