import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from edgespec import hardware
from edgespec.backend import devices
from edgespec.hardware import FEATURES, GiB, MiB, GPUInfo, HardwareInfo

REPO = Path(__file__).resolve().parents[2]


def _scripted(**overrides) -> HardwareInfo:
    base = dict(
        os="Linux", cpu_model="Test CPU", physical_cores=8, logical_cores=16,
        cpu_features=("AVX2", "FMA"), ram_total=32 * GiB, ram_available=20 * GiB, swap_total=0,
        gpus=(GPUInfo("RTX 4090", "CUDA", 24 * GiB, 20 * GiB, 0),),
        gpu_offload_supported=True, rpc_supported=False, llama_cpp_version="0.3.36",
    )
    return HardwareInfo(**{**base, **overrides})


def _cpuinfo_flags() -> set[str]:
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    for line in text.splitlines():
        if line.startswith(("flags", "Features")):
            return set(line.split(":", 1)[1].split())
    return set()


# --- real detection on this machine --------------------------------------------------------


def test_detect_runs_and_returns_consistent_types():
    hw = hardware.detect()
    assert isinstance(hw.os, str) and hw.os
    assert isinstance(hw.cpu_model, str) and hw.cpu_model
    assert 1 <= hw.physical_cores <= hw.logical_cores
    assert 0 < hw.ram_available <= hw.ram_total
    assert hw.swap_total >= 0
    assert isinstance(hw.cpu_features, tuple)
    assert all(f in FEATURES for f in hw.cpu_features)
    assert all(isinstance(g, GPUInfo) for g in hw.gpus)
    assert isinstance(hw.gpu_offload_supported, bool) and isinstance(hw.rpc_supported, bool)
    assert isinstance(hw.llama_cpp_version, str)


def test_detect_sees_avx2_when_cpuinfo_has_it():
    if "avx2" not in _cpuinfo_flags():
        pytest.skip("CPU without avx2")
    assert "AVX2" in hardware.detect().cpu_features


def test_detect_round_trips_through_json():
    hw = hardware.detect()
    assert HardwareInfo.from_json(json.loads(json.dumps(hw.to_json()))) == hw


# --- features and build flags --------------------------------------------------------------


def test_features_from_cpuinfo_maps_flags():
    text = "processor : 0\nflags : fpu avx avx2 fma f16c bmi2 avx512f avx512_vnni amx_tile amx_int8\n"
    assert hardware.features_from_cpuinfo(text) == (
        "AVX", "AVX2", "FMA", "F16C", "BMI2", "AVX512", "AVX512_VNNI", "AMX",
    )
    assert hardware.features_from_cpuinfo("Features : fp asimd asimddp sve i8mm\n") == (
        "NEON", "DOTPROD", "SVE", "I8MM",
    )
    assert hardware.features_from_cpuinfo("") == ()


def test_features_from_llama_system_info():
    info = "CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | AVX512 = 0 | AMX_INT8 = 1 | "
    assert hardware.features_from_system_info(info) == ("AVX", "AVX2", "FMA", "F16C", "AMX")


def test_build_flags_never_native_never_amx():
    for features in [(), FEATURES, hardware.cpu_features(), hardware.detect().cpu_features]:
        flags = hardware.cpu_build_flags(features)
        assert flags.startswith("-DGGML_NATIVE=OFF")
        assert "NATIVE=ON" not in flags
        assert "AMX" not in flags


def test_build_flags_for_avx512_cpu():
    flags = hardware.cpu_build_flags(("AVX", "AVX2", "FMA", "F16C", "AVX512", "AVX512_VNNI", "AVX_VNNI", "AMX"))
    assert flags.split() == [
        "-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON",
        "-DGGML_BMI2=ON", "-DGGML_AVX512=ON", "-DGGML_AVX512_VNNI=ON", "-DGGML_AVX_VNNI=ON",
    ]


def test_cmake_args_entry_point_needs_no_dependencies():
    # Simulate a fresh interpreter before `pip install`: psutil, click, llama_cpp absent.
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('psutil', 'click', 'llama_cpp', 'pynvml'):\n"
        "            raise ImportError(name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "from edgespec.hardware import main\n"
        "sys.exit(main(['--cmake-args']))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == hardware.cpu_build_flags(hardware.cpu_features())


# --- GPUs ----------------------------------------------------------------------------------


def test_parse_nvidia_smi():
    text = (
        "NVIDIA GeForce RTX 4090, 24564, 23012\n"
        "NVIDIA A100-SXM4-80GB, 81920, 80000\n"
        "GRID T4-2Q, [N/A], [N/A]\n"
        "\n"
    )
    gpus = hardware.parse_nvidia_smi(text)
    assert [g.name for g in gpus] == ["NVIDIA GeForce RTX 4090", "NVIDIA A100-SXM4-80GB"]
    assert gpus[0].total_bytes == 24564 * MiB and gpus[0].free_bytes == 23012 * MiB
    assert [g.index for g in gpus] == [0, 1]
    assert all(g.backend == "CUDA" and not g.unified_memory for g in gpus)


def test_backend_names_map_from_ggml_registry():
    assert hardware.backend_name("CUDA") == "CUDA"
    assert hardware.backend_name("MTL") == "Metal"
    assert hardware.backend_name("Vulkan") == "Vulkan"
    assert hardware.backend_name("ROCm") == "ROCm"
    assert hardware.backend_name("MUSA") == "unknown"


def test_apple_working_set_heuristic():
    assert hardware.apple_working_set(16 * GiB) == 16 * GiB * 2 // 3
    assert hardware.apple_working_set(64 * GiB) == 48 * GiB


def test_gpu_info_validation():
    with pytest.raises(ValueError, match="backend"):
        GPUInfo("X", "OpenCL", GiB, GiB, 0)
    with pytest.raises(ValueError, match="exceeds total"):
        GPUInfo("X", "CUDA", GiB, 2 * GiB, 0)
    assert GPUInfo("X", "CUDA", GiB, GiB, 1).label == "CUDA1"


def test_hardware_info_validation():
    with pytest.raises(ValueError, match="cores"):
        _scripted(physical_cores=4, logical_cores=2)
    with pytest.raises(ValueError, match="RAM"):
        _scripted(ram_available=64 * GiB)
    with pytest.raises(ValueError, match="unique"):
        _scripted(gpus=(GPUInfo("A", "CUDA", GiB, GiB, 0), GPUInfo("B", "CUDA", GiB, GiB, 0)))


def test_scripted_json_round_trip_with_gpus():
    hw = _scripted(gpus=(GPUInfo("M2", "Metal", 16 * GiB, 10 * GiB, 0, unified_memory=True),))
    assert HardwareInfo.from_json(json.loads(json.dumps(hw.to_json()))) == hw


def test_fingerprint_ignores_free_memory():
    hw = _scripted()
    busier = dataclasses.replace(
        hw, ram_available=3 * GiB, gpus=(dataclasses.replace(hw.gpus[0], free_bytes=1 * GiB),)
    )
    assert busier.fingerprint() == hw.fingerprint()
    assert hardware.detect().fingerprint() == hardware.detect().fingerprint()


def test_fingerprint_tracks_what_changes_the_plan():
    hw = _scripted()
    assert dataclasses.replace(hw, ram_total=64 * GiB).fingerprint() != hw.fingerprint()
    assert dataclasses.replace(hw, llama_cpp_version="0.3.37").fingerprint() != hw.fingerprint()
    assert dataclasses.replace(hw, gpus=()).fingerprint() != hw.fingerprint()
    assert dataclasses.replace(hw, gpu_offload_supported=False).fingerprint() != hw.fingerprint()


# --- backend.devices degrades ---------------------------------------------------------------


def test_devices_degrade_without_llama_cpp(monkeypatch):
    for name in [m for m in sys.modules if m == "llama_cpp" or m.startswith("llama_cpp.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # makes `import llama_cpp` fail
    assert devices.system_info() == ""
    assert devices.supports_gpu_offload() is False
    assert devices.supports_rpc() is False
    assert devices.llama_cpp_version() == ""
    assert devices.gpu_devices() == []


def test_devices_report_plain_types():
    assert isinstance(devices.system_info(), str)
    assert isinstance(devices.supports_gpu_offload(), bool)
    gpus = devices.gpu_devices()
    assert all(d.kind in ("GPU", "IGPU") and d.total_bytes >= 0 for d in gpus)
