"""edgespec on llama.cpp's Vulkan backend (lavapipe in CI): detection, the joint plan applied for real,
llama.cpp's own placement checked against the plan, exactness on the device, and the refusal paths.

The pair for the joint plan is smollm2-135m as target AND as draft (same file: a valid draft, the
smallest model there is), so the draft fully on the device plus a target split by --gpu-memory fits
lavapipe's 2 GiB and runs in seconds. Only a few tokens are generated: lavapipe is the CPU pretending.
"""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from edgespec.gguf import read_gguf
from edgespec.plan import ModelShape, kv_layer_bytes

from .conftest import EDGESPEC, SMALL
from .llama_log import MiB, parse_llama_log

DEVICE = "Vulkan0"
CTX = 1024
# llama.cpp's "Vulkan0 model buffer size" vs the plan's weights for the layers it put there (tensor
# bytes from the GGUF header). Measured on lavapipe, smollm2-135m q4_1, 11 blocks + output on the
# device: 51.94 MiB logged vs 51.939 planned (+0.002%); all 30 + output: 92.10 vs 92.101 (-0.001%),
# i.e. equal within the log's 0.01 MiB print resolution. 0.1% leaves room for per-tensor alignment.
# KV buffers matched exactly; the compute buffer (98.25 MiB) is far under the plan's allowance.
WEIGHT_TOLERANCE = 0.001


def _mib(n: int) -> str:
    return f"{n / MiB:.2f} MiB"


@pytest.fixture(scope="session")
def small(model_path):
    return model_path(SMALL)


@pytest.fixture(scope="session")
def shape(small):
    return ModelShape.from_gguf(read_gguf(small))


@pytest.fixture(scope="session")
def cap(cli, small, shape):
    """A --gpu-memory that holds the whole draft and about half of the target, from the plan itself."""
    full = cli("profile", "--no-measure", "--json", "-m", small, "-md", small, "-c", CTX)
    assert full.code == 0, full.err
    plan = full.json()["plan"]
    assert plan["draft"]["n_gpu_layers"] == shape.n_layers + 1, "lavapipe should hold this tiny pair fully"
    draft_bytes = plan["draft"]["gpu_bytes"][DEVICE]
    target_bytes = plan["target"]["gpu_bytes"][DEVICE]
    return draft_bytes + target_bytes - sum(shape.layer_bytes) // 2


@pytest.fixture(scope="session")
def joint(cli, small, cap):
    """The joint plan under the cap, then the same run for real with llama.cpp's log."""
    args = ["-m", small, "-md", small, "-c", CTX, "--gpu-memory", f"{cap // 1024}K"]
    planned = cli("profile", "--no-measure", "--json", *args)
    assert planned.code == 0, planned.err
    run = cli("--verbose", "prompt", "--raw", "--json", "-n", 4, "--spec", "draft", *args, "def add(a, b):")
    assert run.code == 0, run.err[-3000:]
    loaded = parse_llama_log(run.err)
    assert len(loaded) == 2, f"expected the target then the draft loaded, llama.cpp's log shows {len(loaded)} loads"
    return planned.json()["plan"], loaded, run.json()


def test_profile_lists_the_vulkan_device_with_its_memory(cli, small, vulkan_device):
    shown = cli("profile", "--no-measure", "-m", small, "--spec", "off")
    assert shown.code == 0, shown.err
    assert re.search(rf"{DEVICE} .*{re.escape(vulkan_device.description)} [0-9.]+ \w+ free / [0-9.]+ \w+", shown.out), shown.out
    hw = cli("profile", "--no-measure", "--json", "-m", small, "--spec", "off").json()["hardware"]
    assert hw["gpu_offload_supported"] is True
    gpu = hw["gpus"][0]
    assert (gpu["backend"], gpu["index"]) == ("Vulkan", 0)
    assert gpu["total_bytes"] == vulkan_device.total_bytes > 0
    assert 0 < gpu["free_bytes"] <= gpu["total_bytes"]


def test_doctor_sees_the_vulkan_build_and_plans_onto_the_device(cli, small, shape):
    r = cli("doctor", small)
    assert r.code == 0, r.err
    # the tiny model fits the device whole: every layer plus the output layer
    assert f"target {shape.n_layers + 1} GPU layers" in r.out, r.out
    build = cli("doctor")
    assert "GPU offload supported" in build.out, build.out


def test_gpu_memory_env_var_is_the_option(cli, small, cap):
    args = ["profile", "--no-measure", "--json", "-m", small, "-md", small, "-c", str(CTX)]
    by_flag = cli(*args, "--gpu-memory", f"{cap // 1024}K").json()["plan"]
    proc = subprocess.run([str(EDGESPEC), *args], env={**cli.env, "EDGESPEC_GPU_MEMORY": f"{cap // 1024}K"},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    by_env = json.loads(proc.stdout)["plan"]
    # the same placement (the CPU's headroom moves with what else runs on the machine)
    same = ("target", "draft", "n_ctx")
    assert {k: by_env[k] for k in same} == {k: by_flag[k] for k in same}
    assert by_env["devices"][0] == by_flag["devices"][0]
    bad = cli(*args, "--gpu-memory", "lots")
    assert bad.code == 2 and bad.err.strip().count("\n") == 0 and "--gpu-memory" in bad.err, bad.err


def test_joint_plan_draft_whole_on_the_device_target_split_by_the_cap(joint, shape, cap):
    plan, _, _ = joint
    n_units = shape.n_layers + 1
    assert plan["draft"]["n_gpu_layers"] == n_units
    assert 0 < plan["target"]["n_gpu_layers"] < n_units, "the cap should split the target"
    used = next(d["used"] for d in plan["devices"] if d["label"] == DEVICE)
    assert used <= cap
    assert plan["target"]["cpu_bytes"] > 0


def test_llama_cpp_places_layers_and_buffers_as_planned(joint, shape, cap):
    plan, (target, draft), out = joint
    assert out["text"], "no text generated on the device"
    n_units = shape.n_layers + 1
    for loaded, placed in ((target, plan["target"]), (draft, plan["draft"])):
        k = placed["n_gpu_layers"]
        # llama.cpp's own count and its layer-by-layer assignment: the last k units on the device
        assert (loaded.offloaded, loaded.n_units) == (k, n_units)
        expected = {i: (DEVICE if i >= n_units - k else "CPU") for i in range(shape.n_layers)}
        assert {i: loaded.layers[i] for i in range(shape.n_layers)} == expected
        # weights on the device: the offloaded blocks plus the output layer, from the GGUF header
        weights = sum(shape.layer_bytes[n_units - k:]) + shape.output_bytes
        actual = loaded.model[DEVICE]
        assert abs(actual - weights) <= WEIGHT_TOLERANCE * weights, (
            f"{DEVICE} model buffer {_mib(actual)} vs planned weights {_mib(weights)}")
        # everything llama.cpp put on the device stays within what the plan reserved for it
        assert loaded.on(DEVICE) <= placed["gpu_bytes"][DEVICE], (
            f"llama.cpp used {_mib(loaded.on(DEVICE))} on {DEVICE}, the plan reserved {_mib(placed['gpu_bytes'][DEVICE])}")
    assert target.on(DEVICE) + draft.on(DEVICE) <= cap


def test_kv_cache_on_the_device_follows_the_layers(joint, shape):
    plan, (target, draft), _ = joint
    per_layer = kv_layer_bytes(shape, plan["n_ctx"], plan["type_k"], plan["type_v"])
    for loaded, placed in ((target, plan["target"]), (draft, plan["draft"])):
        on_device = placed["n_gpu_layers"] - 1  # the output layer holds no KV
        assert loaded.kv.get(DEVICE, 0) == pytest.approx(on_device * per_layer, abs=0.01 * MiB)
        assert loaded.kv.get("CPU", 0) == pytest.approx((shape.n_layers - on_device) * per_layer, abs=0.01 * MiB)
    assert draft.kv.get("CPU", 0) == 0 and target.kv.get("CPU", 0) > 0


def test_speculative_greedy_equals_plain_on_the_device(cli, small, cap, tmp_path):
    # One short prompt, a few tokens: lavapipe is slow, and --verify replays plain decoding too.
    prompts = tmp_path / "one.jsonl"
    prompts.write_text(json.dumps({"id": "add", "category": "code", "max_tokens": 6, "prompt": "def add(a, b):"}) + "\n")
    r = cli("bench", "--verify", "--exact", "--json", "-q", "--no-warmup", "--repeats", 1, "-n", 6, "--prompts", prompts,
            "--modes", "off,draft", "-m", small, "-md", small, "-c", 512, "--gpu-memory", f"{cap // 1024}K")
    assert r.code == 0, r.err[-2000:]
    result = r.json()
    assert result["verify"] == {**result["verify"], "checked": True, "ok": True, "exact": True}
    drafted = result["overall"]["draft"]
    assert drafted["acceptance_rate"] and drafted["acceptance_rate"] > 0.5  # the draft is the target itself


def test_a_plan_that_cannot_fit_is_refused_before_loading(cli, small):
    # f32 KV for a million tokens: ~45 GB for this model, more than RAM and the device together
    args = ["prompt", "-m", small, "--spec", "off", "-c", 1 << 20, "-ctk", "f32", "-ctv", "f32", "hi"]
    r = cli(*args)
    assert r.code == 9, r.err
    lines = r.err.strip().splitlines()
    assert len(lines) == 1 and "GPU memory" in lines[0], r.err  # no backend banner ahead of it either
    verbose = cli("--verbose", *args)
    assert verbose.code == 9 and "loaded meta data" not in verbose.err  # llama.cpp never opened the model


def test_explicit_layers_over_the_cap_are_refused_before_loading(cli, small):
    r = cli("--verbose", "prompt", "-m", small, "--spec", "off", "-ngl", 99, "--gpu-memory", "64M", "hi")
    assert r.code == 9, r.err[-2000:]
    assert "loaded meta data" not in r.err
    assert re.search(rf"need ~\d+ MiB on {DEVICE} but --gpu-memory allows 64 MiB", r.err.strip().splitlines()[-1])


def test_a_llama_cpp_allocation_failure_is_one_line_not_an_abort(cli, small):
    # ggml-vulkan's own knob makes every device buffer over 8 MiB fail to allocate, the path a full
    # device takes (vk::OutOfDeviceMemoryError -> NULL buffer -> llama.cpp's load fails).
    env = {**cli.env, "GGML_VK_FORCE_MAX_BUFFER_SIZE": str(8 * MiB)}
    proc = subprocess.run([str(EDGESPEC), "prompt", "--raw", "-n", "2", "--spec", "off", "-m", str(small), "-c", "256", "hi"],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode > 0 and proc.returncode not in (134, 139), (proc.returncode, proc.stderr)  # no abort/segfault
    assert "Traceback" not in proc.stderr and "terminate called" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    ours = [line for line in lines if not line.startswith("ggml_vulkan: ")]  # ggml-vulkan writes to std::cerr itself
    assert len(ours) == 1 and ours[0].startswith("error: ") and lines[-1] == ours[0], proc.stderr
    # llama.cpp's own log says why the load failed: an allocation, not a bad file (exit 8, not 4)
    assert proc.returncode == 8 and "could not allocate" in ours[0], (proc.returncode, ours[0])
