"""The GPU suite: edgespec on a real ggml GPU backend, llama.cpp's Vulkan backend.

In CI (no GPU) the device is Mesa's lavapipe, a Vulkan device implemented on the CPU: slow, so the
models are tiny and only a few tokens are generated. Run it with scripts/test-vulkan (scripts/test
does), which builds the Vulkan llama.cpp into .venv-vulkan and sets GGML_VK_VISIBLE_DEVICES=0
(without it ggml skips CPU-type Vulkan devices). In an interpreter without that build every test
here FAILS with a line saying how to run it: a missing backend is never a skip.

The CLI runs in subprocesses under a private EDGESPEC_HOME (profiles measured on the Vulkan device
must not become the CPU venv's defaults); models are passed as paths from the real cache.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from edgespec import models

from ..conftest import DRAFT, SMALL, TARGET  # noqa: F401  (shared with tests/real)

EDGESPEC = Path(sys.executable).parent / "edgespec"
HOW = "run the GPU suite with scripts/test-vulkan (it builds the Vulkan llama.cpp into .venv-vulkan)"


@pytest.fixture(scope="session")
def vulkan_device():
    """llama.cpp's first Vulkan device; fails (not skips) without the Vulkan build or device."""
    if os.environ.get("GGML_VK_VISIBLE_DEVICES") is None:
        pytest.fail(f"GGML_VK_VISIBLE_DEVICES is not set, so ggml ignores lavapipe: {HOW}")
    from edgespec.backend import devices

    if "Vulkan" not in devices.system_info() and not devices.supports_gpu_offload():
        pytest.fail(f"this interpreter's llama.cpp ({sys.executable}) has no Vulkan backend: {HOW}")
    found = [d for d in devices.gpu_devices() if d.backend.lower() == "vulkan"]
    if not found:
        pytest.fail(f"llama.cpp's Vulkan backend lists no device (is mesa-vulkan-drivers installed?): {HOW}")
    return found[0]


@pytest.fixture(scope="session")
def model_path():
    cache: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in cache:
            cache[name] = models.resolve(name)
        return cache[name]

    return get


@dataclass
class Result:
    code: int
    out: str
    err: str

    def json(self):
        return json.loads(self.out)


@pytest.fixture(scope="session")
def cli(tmp_path_factory, vulkan_device):
    """Run `edgespec ARGS` on the Vulkan build with a private EDGESPEC_HOME."""
    home = tmp_path_factory.mktemp("edgespec-home")
    env = {**os.environ, "EDGESPEC_HOME": str(home), "NO_COLOR": "1", "COLUMNS": "200"}
    for var in ("EDGESPEC_GPU_MEMORY", "EDGESPEC_NGL", "EDGESPEC_NGLD", "EDGESPEC_CTX_SIZE", "EDGESPEC_EXACT"):
        env.pop(var, None)

    def run(*args: str, timeout: float = 900) -> Result:
        proc = subprocess.run([str(EDGESPEC), *map(str, args)], env=env, capture_output=True, text=True,
                              errors="replace", timeout=timeout)
        return Result(proc.returncode, proc.stdout, proc.stderr)

    run.env = env
    return run
