"""What this machine has: CPU, memory, GPUs, and what the installed llama.cpp can do with them.

`python -m edgespec.hardware --cmake-args` runs before any dependency is installed (it picks the
flags llama-cpp-python is built with), so that path, and this module's top level, use the
standard library only; psutil and the llama.cpp bindings are imported inside `detect()`.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, replace
from typing import Any, Iterable

GiB = 1024**3
MiB = 1024**2

BACKENDS = ("CUDA", "Metal", "Vulkan", "ROCm", "SYCL", "RPC", "unknown")

# Canonical order of the features we report; anything else the CPU has is irrelevant to llama.cpp.
FEATURES = (
    "AVX", "AVX2", "FMA", "F16C", "BMI2", "AVX_VNNI",
    "AVX512", "AVX512_VBMI", "AVX512_VNNI", "AVX512_BF16", "AMX",
    "NEON", "DOTPROD", "SVE", "I8MM",
)

# /proc/cpuinfo "flags" (x86) and "Features" (arm64) -> our names
_CPUINFO_FLAGS = {
    "avx": "AVX", "avx2": "AVX2", "fma": "FMA", "f16c": "F16C", "bmi2": "BMI2",
    "avx_vnni": "AVX_VNNI", "avx512f": "AVX512", "avx512vbmi": "AVX512_VBMI",
    "avx512_vnni": "AVX512_VNNI", "avx512_bf16": "AVX512_BF16",
    "amx_tile": "AMX", "amx_int8": "AMX", "amx_bf16": "AMX",
    "asimd": "NEON", "asimddp": "DOTPROD", "sve": "SVE", "i8mm": "I8MM",
}

# llama_print_system_info() "NAME = 1" entries -> our names
_LLAMA_FLAGS = {
    "AVX": "AVX", "AVX2": "AVX2", "FMA": "FMA", "F16C": "F16C", "BMI2": "BMI2",
    "AVX_VNNI": "AVX_VNNI", "AVX512": "AVX512", "AVX512_VBMI": "AVX512_VBMI",
    "AVX512_VNNI": "AVX512_VNNI", "AVX512_BF16": "AVX512_BF16", "AMX_INT8": "AMX",
    "NEON": "NEON", "ARM_FMA": "FMA", "DOTPROD": "DOTPROD", "SVE": "SVE", "MATMUL_INT8": "I8MM",
}

_REG_BACKENDS = {"cuda": "CUDA", "metal": "Metal", "mtl": "Metal", "vulkan": "Vulkan",
                 "rocm": "ROCm", "hip": "ROCm", "sycl": "SYCL", "rpc": "RPC"}


@dataclass(frozen=True)
class GPUInfo:
    name: str
    backend: str
    total_bytes: int
    free_bytes: int
    index: int
    # True when the GPU draws on system RAM (Apple Silicon, iGPUs): one pool, counted once.
    unified_memory: bool = False
    # host:port of a llama.cpp RPC server whose device this is (another machine's memory).
    endpoint: str = ""

    def __post_init__(self) -> None:
        if (self.backend == "RPC") != bool(self.endpoint):
            raise ValueError(f"device {self.name!r}: RPC devices, and only they, have an endpoint")
        if self.backend not in BACKENDS:
            raise ValueError(f"GPU backend {self.backend!r} is not one of {', '.join(BACKENDS)}")
        if self.total_bytes < 0 or self.free_bytes < 0:
            raise ValueError(f"GPU {self.name!r}: memory sizes must be >= 0")
        if self.free_bytes > self.total_bytes:
            raise ValueError(f"GPU {self.name!r}: free {self.free_bytes} exceeds total {self.total_bytes}")
        if self.index < 0:
            raise ValueError(f"GPU {self.name!r}: index must be >= 0, got {self.index}")

    @property
    def remote(self) -> bool:
        return bool(self.endpoint)

    @property
    def label(self) -> str:
        """Stable device label used in plans: backend + index (llama.cpp's device position)."""
        if self.remote:
            return f"RPC{self.index}[{self.endpoint}]"
        prefix = "GPU" if self.backend == "unknown" else self.backend
        return f"{prefix}{self.index}"


@dataclass(frozen=True)
class HardwareInfo:
    os: str
    cpu_model: str
    physical_cores: int
    logical_cores: int
    cpu_features: tuple[str, ...]
    ram_total: int
    ram_available: int
    swap_total: int
    gpus: tuple[GPUInfo, ...] = ()
    gpu_offload_supported: bool = False
    rpc_supported: bool = False
    llama_cpp_version: str = ""

    def __post_init__(self) -> None:
        if self.physical_cores < 1 or self.logical_cores < self.physical_cores:
            raise ValueError(
                f"cores: need 1 <= physical ({self.physical_cores}) <= logical ({self.logical_cores})"
            )
        if self.ram_total <= 0 or not 0 <= self.ram_available <= self.ram_total:
            raise ValueError(
                f"RAM: need total > 0 and 0 <= available <= total, got {self.ram_available}/{self.ram_total}"
            )
        if self.swap_total < 0:
            raise ValueError(f"swap_total must be >= 0, got {self.swap_total}")
        unknown = [f for f in self.cpu_features if f not in FEATURES]
        if unknown:
            raise ValueError(f"unknown CPU features {unknown}; known: {', '.join(FEATURES)}")
        indices = [g.index for g in self.gpus]
        if len(set(indices)) != len(indices):
            raise ValueError(f"GPU indices must be unique, got {indices}")

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["cpu_features"] = list(self.cpu_features)
        data["gpus"] = [asdict(g) for g in self.gpus]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HardwareInfo:
        fields = dict(data)
        fields["cpu_features"] = tuple(fields.get("cpu_features", ()))
        fields["gpus"] = tuple(GPUInfo(**g) for g in fields.get("gpus", ()))
        return cls(**fields)

    def fingerprint(self) -> str:
        """Hash of what changes a plan; free memory is excluded so it is stable across runs."""
        key = {
            "cpu": self.cpu_model,
            "cores": [self.physical_cores, self.logical_cores],
            "ram_gib": round(self.ram_total / GiB),
            "gpus": [[g.name, g.backend, round(g.total_bytes / GiB, 1)] for g in self.gpus],
            "offload": self.gpu_offload_supported,
            "llama_cpp": self.llama_cpp_version,
        }
        blob = json.dumps(key, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


# --- CPU features and build flags (stdlib only) ------------------------------------------


def _read_cpuinfo() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def features_from_cpuinfo(text: str) -> tuple[str, ...]:
    """Features from the first CPU's flags/Features line of /proc/cpuinfo text."""
    match = re.search(r"^(?:flags|Features)\s*:\s*(.*)$", text, re.MULTILINE)
    flags = match.group(1).split() if match else []
    return _canonical(_CPUINFO_FLAGS[f] for f in flags if f in _CPUINFO_FLAGS)


def features_from_system_info(text: str) -> tuple[str, ...]:
    """Features llama.cpp reports as enabled (`NAME = 1`) in llama_print_system_info()."""
    found = re.findall(r"([A-Z0-9_]+) = 1\b", text)
    return _canonical(_LLAMA_FLAGS[f] for f in found if f in _LLAMA_FLAGS)


def _canonical(features: Iterable[str]) -> tuple[str, ...]:
    present = set(features)
    return tuple(f for f in FEATURES if f in present)


def _macos_features() -> tuple[str, ...]:
    if platform.machine() == "arm64":
        # Every Apple Silicon core has NEON and dot-product; i8mm arrived with M2.
        extra = ("I8MM",) if _sysctl("hw.optional.arm.FEAT_I8MM") == "1" else ()
        return _canonical(("NEON", "DOTPROD", "FMA") + extra)
    flags = (_sysctl("machdep.cpu.features") + " " + _sysctl("machdep.cpu.leaf7_features")).lower()
    mapped = {"avx1.0": "AVX", "avx2": "AVX2", "fma": "FMA", "f16c": "F16C", "bmi2": "BMI2",
              "avx512f": "AVX512", "avx512vnni": "AVX512_VNNI"}
    return _canonical(v for k, v in mapped.items() if k in flags.split())


def _sysctl(name: str) -> str:
    try:
        out = subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def cpu_features() -> tuple[str, ...]:
    """Features of this CPU as the OS reports them (not what llama.cpp was built with)."""
    if sys.platform == "darwin":
        return _macos_features()
    return features_from_cpuinfo(_read_cpuinfo())


def cpu_build_flags(features: Iterable[str]) -> str:
    """CMAKE_ARGS for a CPU-only llama.cpp build that is fast on, and safe for, this CPU."""
    have = set(features)
    # GGML_NATIVE=ON segfaults in ggml_backend_amx_mul_mat on AMX CPUs, so we name each
    # instruction set explicitly instead, and never enable AMX.
    flags = ["-DGGML_NATIVE=OFF"]
    if "AVX" in have or "AVX2" in have:
        flags.append("-DGGML_AVX=ON")
    if "AVX2" in have:
        flags += ["-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON", "-DGGML_BMI2=ON"]
    if "AVX512" in have:
        flags.append("-DGGML_AVX512=ON")
        for feature in ("AVX512_VBMI", "AVX512_VNNI", "AVX512_BF16"):
            if feature in have:
                flags.append(f"-DGGML_{feature}=ON")
    if "AVX_VNNI" in have:
        flags.append("-DGGML_AVX_VNNI=ON")
    return " ".join(flags)


# --- sizes ---------------------------------------------------------------------------------

_SIZE = re.compile(r"^\s*(?P<num>\d+(?:\.\d+)?|\.\d+)\s*(?P<unit>[KMGT]?)(?:i?B)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "K": 1024, "M": MiB, "G": GiB, "T": 1024 * GiB}


def parse_size(text: str) -> int:
    """Bytes of a memory size as users write it: 1.5G, 800M, 2GiB, 512MB (binary units, as GPU
    tools report memory); a bare number is bytes. Raises ValueError naming the accepted forms."""
    match = _SIZE.match(text or "")
    if match is None:
        raise ValueError(f"not a memory size: {text!r} (examples: 1.5G, 800M, 2GiB)")
    return int(float(match.group("num")) * _SIZE_UNITS[match.group("unit").upper()])


def parse_size_option(text: str | None, flag: str) -> int | None:
    """parse_size for a command-line value: None/empty is unset; a bad size is a ConfigError naming the flag."""
    from edgespec.errors import ConfigError

    if text is None or not str(text).strip():
        return None
    try:
        return parse_size(str(text))
    except ValueError as err:
        raise ConfigError(f"{flag}: {err}") from None


# --- GPUs ----------------------------------------------------------------------------------


def backend_name(registry_name: str) -> str:
    """Map a ggml backend registry name (CUDA, MTL, Vulkan, ...) onto BACKENDS."""
    return _REG_BACKENDS.get(registry_name.strip().lower(), "unknown")


def parse_nvidia_smi(text: str) -> tuple[GPUInfo, ...]:
    """Parse `nvidia-smi --query-gpu=name,memory.total,memory.free --format=csv,noheader,nounits`."""
    gpus: list[GPUInfo] = []
    for line in text.splitlines():
        parts = line.rsplit(",", 2)  # names may contain commas, the numbers never do
        if len(parts) != 3:
            continue
        name, total, free = (p.strip() for p in parts)
        if not (total.isdigit() and free.isdigit()):  # "[N/A]" on some virtual GPUs
            continue
        total_b, free_b = int(total) * MiB, int(free) * MiB
        gpus.append(GPUInfo(name, "CUDA", total_b, min(free_b, total_b), len(gpus)))
    return tuple(gpus)


def _gpus_from_llama() -> tuple[GPUInfo, ...]:
    from edgespec.backend import devices

    return tuple(
        GPUInfo(
            name=d.description or d.name,
            backend=backend_name(d.backend),
            total_bytes=d.total_bytes,
            free_bytes=min(d.free_bytes, d.total_bytes),
            index=d.index,
            unified_memory=d.kind != "RPC" and (d.kind == "IGPU" or _is_apple_silicon()),
            endpoint=d.endpoint,
        )
        for d in devices.gpu_devices()
    )


def _gpus_from_nvml() -> tuple[GPUInfo, ...]:
    try:
        import pynvml
    except Exception:
        return ()
    try:
        pynvml.nvmlInit()
    except Exception:
        return ()
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(handle)
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            name = name.decode() if isinstance(name, bytes) else str(name)
            gpus.append(GPUInfo(name, "CUDA", int(mem.total), min(int(mem.free), int(mem.total)), i))
        return tuple(gpus)
    except Exception:
        return ()
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def _gpus_from_nvidia_smi() -> tuple[GPUInfo, ...]:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return ()
    query = [exe, "--query-gpu=name,memory.total,memory.free", "--format=csv,noheader,nounits"]
    try:
        out = subprocess.run(query, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return ()
    return parse_nvidia_smi(out.stdout) if out.returncode == 0 else ()


def apple_working_set(ram_total: int) -> int:
    """Estimate of Metal's recommendedMaxWorkingSetSize: what the GPU may use of unified RAM.

    macOS lets the GPU wire about 2/3 of RAM on smaller machines and about 3/4 above ~36 GiB.
    """
    return ram_total * 3 // 4 if ram_total > 36 * GiB else ram_total * 2 // 3


def _is_apple_silicon() -> bool:
    return sys.platform == "darwin" and platform.machine() == "arm64"


def _apple_gpu(ram_total: int, ram_available: int) -> tuple[GPUInfo, ...]:
    if not _is_apple_silicon():
        return ()
    usable = min(apple_working_set(ram_total), ram_available)
    name = _sysctl("machdep.cpu.brand_string") or "Apple Silicon"
    return (GPUInfo(f"{name} GPU", "Metal", ram_total, usable, 0, unified_memory=True),)


def _detect_gpus(ram_total: int, ram_available: int) -> tuple[GPUInfo, ...]:
    # llama.cpp's own view comes first: its indices are the ones main_gpu/tensor_split use.
    seen = _gpus_from_llama()
    if any(not g.remote for g in seen):
        return seen
    # RPC devices (if any) head llama.cpp's list; local GPUs it cannot see come after them.
    remote = len(seen)
    for source in (_gpus_from_nvml, _gpus_from_nvidia_smi, lambda: _apple_gpu(ram_total, ram_available)):
        local = source()
        if local:
            return seen + tuple(replace(g, index=g.index + remote) for g in local)
    return seen


# --- whole machine -------------------------------------------------------------------------


def _cpu_model() -> str:
    if sys.platform == "darwin":
        return _sysctl("machdep.cpu.brand_string") or platform.processor() or "unknown"
    match = re.search(r"^(?:model name|Model|Hardware)\s*:\s*(.+)$", _read_cpuinfo(), re.MULTILINE)
    return match.group(1).strip() if match else (platform.processor() or "unknown")


def detect() -> HardwareInfo:
    import psutil

    from edgespec.backend import devices
    from edgespec.backend.model import ensure_backend

    try:
        # Our log handler first: backends announce their devices on first use (ggml-vulkan's
        # banner), which without it lands on stderr ahead of edgespec's own one-line messages.
        ensure_backend()
    except Exception:  # llama-cpp-python missing or broken: detection still reports the rest
        pass
    logical = psutil.cpu_count(logical=True) or os.cpu_count() or 1
    physical = min(psutil.cpu_count(logical=False) or logical, logical)
    vm = psutil.virtual_memory()
    features = set(cpu_features()) | set(features_from_system_info(devices.system_info()))
    return HardwareInfo(
        os=platform.system() or sys.platform,
        cpu_model=_cpu_model(),
        physical_cores=physical,
        logical_cores=logical,
        cpu_features=_canonical(features),
        ram_total=int(vm.total),
        ram_available=min(int(vm.available), int(vm.total)),
        swap_total=int(psutil.swap_memory().total),
        gpus=_detect_gpus(int(vm.total), int(vm.available)),
        gpu_offload_supported=devices.supports_gpu_offload(),
        rpc_supported=devices.supports_rpc(),
        llama_cpp_version=devices.llama_cpp_version(),
    )


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m edgespec.hardware")
    parser.add_argument("--cmake-args", action="store_true",
                        help="print CMAKE_ARGS for a CPU-only llama-cpp-python build on this CPU")
    args = parser.parse_args(argv)
    if args.cmake_args:
        print(cpu_build_flags(cpu_features()))
        return 0
    print(json.dumps(detect().to_json(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
