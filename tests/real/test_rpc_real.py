"""llama.cpp RPC on loopback: `edgespec rpc-server` lends this machine's CPU, `--rpc` puts the
target's layers on it. Same kernels on both ends, so greedy output must equal local plain
decoding token for token, in every speculation mode."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from edgespec.backend import rpc
from edgespec.errors import InputError

from .conftest import DRAFT, TARGET
from .test_cli_real import run_cli

ENTRY = [sys.executable, "-c", "from edgespec.commands import main; main()"]
EDIT = (
    "Rename the variable `total` to `acc` everywhere and return the whole code.\n\n```python\n"
    "def summarize(values):\n    total = 0\n    for v in values:\n        total += v\n"
    "    if total > 100:\n        total = 100\n    return total\n```"
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_server(port: int) -> subprocess.Popen:
    proc = subprocess.Popen([*ENTRY, "rpc-server", "--port", str(port), "-t", "2"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"rpc-server exited: {proc.stderr.read().decode()}")
        try:
            rpc.probe(f"127.0.0.1:{port}", timeout=2)
            return proc
        except InputError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("rpc-server did not come up in 60 s")


@pytest.fixture(scope="module")
def server(model_path):
    for name in (TARGET, DRAFT):
        model_path(name)
    port = _free_port()
    proc = _start_server(port)
    yield f"127.0.0.1:{port}"
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=20)


def _prompt(*args):
    r = run_cli("prompt", EDIT, "-n", "70", "-t", "2", "--temperature", "0", "--exact", *args)
    assert r.returncode == 0, r.stderr.decode()
    return r.stdout.decode(), r.stderr.decode()


def test_greedy_with_target_on_rpc_equals_local_plain(server):
    plain, _ = _prompt("--spec", "off")
    for mode in ("ngram", "auto", "off"):
        text, footer = _prompt("--spec", mode, "--rpc", server)
        assert text == plain, mode
        assert f"spec {mode}" in footer
    assert "acc" in plain


def test_ngram_rounds_verify_several_rows_over_rpc(server):
    r = run_cli("prompt", EDIT, "-n", "70", "-t", "2", "--spec", "ngram", "--rpc", server, "--json")
    assert r.returncode == 0, r.stderr.decode()
    stats = json.loads(r.stdout)["stats"]
    # multi-row verification batches went through the remote device and were accepted
    assert stats["drafted"] > 0 and stats["accepted"] > 0
    assert stats["tokens_by_source"].get("target", 0) < stats["tokens"]


def test_profile_plans_the_target_on_the_rpc_device(server, tmp_path, model_path):
    env = dict(os.environ, EDGESPEC_HOME=str(tmp_path))
    r = subprocess.run(
        [*ENTRY, "profile", "--no-measure", "--json", "--rpc", server,
         "-m", str(model_path(TARGET)), "-md", str(model_path(DRAFT)), "-t", "2"],
        capture_output=True, env=env, timeout=300,
    )
    assert r.returncode == 0, r.stderr.decode()
    data = json.loads(r.stdout)
    label = f"RPC0[{server}]"
    assert data["rpc"] == [server]
    assert [g["backend"] for g in data["hardware"]["gpus"]] == ["RPC"]
    target, draft = data["plan"]["target"], data["plan"]["draft"]
    assert target["n_gpu_layers"] == 29 and list(target["gpu_bytes"]) == [label]  # 28 layers + output
    assert draft["n_gpu_layers"] == 0 and draft["gpu_bytes"] == {}  # the draft stays local
    assert [d["label"] for d in data["plan"]["devices"]] == [label, "CPU"]


def test_rpc_server_refuses_a_port_in_use_and_stops_on_ctrl_c(server):
    port = server.rsplit(":", 1)[1]
    busy = subprocess.run([*ENTRY, "rpc-server", "--port", port], capture_output=True, timeout=60)
    assert busy.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in busy.stderr.decode()
    assert "Traceback" not in busy.stderr.decode()

    other = _free_port()
    proc = _start_server(other)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err.decode()
    assert "rpc-server stopped" in err.decode() and "Traceback" not in err.decode()


def test_server_lost_mid_run_is_one_line_and_exit_8():
    port = _free_port()
    proc = _start_server(port)
    client = subprocess.Popen(
        [*ENTRY, "prompt", "Write a long story about a dragon.", "-n", "400", "-t", "2",
         "--spec", "off", "--rpc", f"127.0.0.1:{port}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    first = client.stdout.read(40)  # generation has started on the remote device
    proc.kill()
    proc.wait(timeout=20)
    out, err = client.communicate(timeout=120)
    err = err.decode()
    assert client.returncode == 8, err
    assert first and "error: an RPC server went away" in err and "restart `edgespec rpc-server`" in err
    assert "Traceback" not in err and "#0" not in err  # no Python or native backtrace
