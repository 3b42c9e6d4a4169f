"""What llama.cpp itself sees: build features and the GPU devices its backends registered.

Everything here degrades to empty/False: hardware detection must work on a machine where
llama-cpp-python is missing, half-built or older than the symbols we ask for.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

# enum ggml_backend_dev_type (ggml-backend.h, llama.cpp vendored by llama-cpp-python 0.3.36)
_DEV_TYPE_GPU = 1
_DEV_TYPE_IGPU = 2
_GPU_TYPES = {_DEV_TYPE_GPU: "GPU", _DEV_TYPE_IGPU: "IGPU"}


@dataclass(frozen=True)
class DeviceInfo:
    """One GPU as a ggml backend reports it; `backend` is the registry name (CUDA, Metal, ...)."""

    index: int
    name: str
    description: str
    backend: str
    kind: str  # "GPU" (dedicated memory) or "IGPU" (shares host memory)
    free_bytes: int
    total_bytes: int


def _llama_cpp():
    try:
        import llama_cpp
    except Exception:  # not installed, or its shared library failed to load
        return None
    return llama_cpp


def system_info() -> str:
    lib = _llama_cpp()
    if lib is None:
        return ""
    try:
        raw = lib.llama_print_system_info()
    except Exception:
        return ""
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw or "")


def supports_gpu_offload() -> bool:
    return _call_bool("llama_supports_gpu_offload")


def supports_rpc() -> bool:
    return _call_bool("llama_supports_rpc")


def _call_bool(name: str) -> bool:
    lib = _llama_cpp()
    fn = getattr(lib, name, None) if lib is not None else None
    if fn is None:
        return False
    try:
        return bool(fn())
    except Exception:
        return False


def llama_cpp_version() -> str:
    lib = _llama_cpp()
    if lib is None:
        return ""
    return str(getattr(lib, "__version__", ""))


def gpu_devices() -> list[DeviceInfo]:
    """GPU and integrated-GPU devices, in llama.cpp's device order (the order -ts/main_gpu use)."""
    api = _ggml_api()
    if api is None:
        return []
    try:
        return _enumerate(api)
    except Exception:
        return []


def _candidate_libs() -> list[ctypes.CDLL]:
    # llama-cpp-python 0.3.36 binds no ggml_backend_dev_* function. The symbols live in
    # libggml (exposed as llama_cpp._ggml.libggml); libllama's handle also resolves them
    # through its dependencies, which covers builds where _ggml cannot load its own copy.
    libs: list[ctypes.CDLL] = []
    if _llama_cpp() is None:
        return libs
    for module_name, attr in (("llama_cpp._ggml", "libggml"), ("llama_cpp.llama_cpp", "_lib")):
        try:
            module = __import__(module_name, fromlist=[attr])
            lib = getattr(module, attr, None)
        except Exception:
            continue
        if lib is not None:
            libs.append(lib)
    return libs


def _ggml_api() -> ctypes.CDLL | None:
    for lib in _candidate_libs():
        try:
            _declare(lib)
        except AttributeError:  # symbol missing in this library: try the next one
            continue
        return lib
    return None


def _declare(lib: ctypes.CDLL) -> None:
    vp, sz = ctypes.c_void_p, ctypes.c_size_t
    prototypes = {
        "ggml_backend_reg_count": ([], sz),
        "ggml_backend_load_all": ([], None),
        "ggml_backend_dev_count": ([], sz),
        "ggml_backend_dev_get": ([sz], vp),
        "ggml_backend_dev_name": ([vp], ctypes.c_char_p),
        "ggml_backend_dev_description": ([vp], ctypes.c_char_p),
        "ggml_backend_dev_memory": ([vp, ctypes.POINTER(sz), ctypes.POINTER(sz)], None),
        "ggml_backend_dev_type": ([vp], ctypes.c_int),
        "ggml_backend_dev_backend_reg": ([vp], vp),
        "ggml_backend_reg_name": ([vp], ctypes.c_char_p),
    }
    for name, (argtypes, restype) in prototypes.items():
        fn = getattr(lib, name)
        fn.argtypes = argtypes
        fn.restype = restype


def _enumerate(lib: ctypes.CDLL) -> list[DeviceInfo]:
    # Builds with dynamically loaded backends register nothing until asked, exactly as
    # llama_supports_gpu_offload() does it.
    if lib.ggml_backend_reg_count() == 0:
        lib.ggml_backend_load_all()
    gpus: list[tuple[str, int]] = []
    igpus: list[tuple[str, int]] = []
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        kind = _GPU_TYPES.get(lib.ggml_backend_dev_type(dev)) if dev else None
        if kind is None:
            continue
        reg = lib.ggml_backend_dev_backend_reg(dev)
        backend = _text(lib.ggml_backend_reg_name(reg)) if reg else ""
        if backend == "RPC":  # remote servers are not this machine's memory
            continue
        (gpus if kind == "GPU" else igpus).append((backend, dev))
    # Mirror llama.cpp's default device list so our indices match its main_gpu/tensor_split:
    # integrated GPUs are used only when there is no discrete one, and only of one backend.
    chosen = gpus or [d for d in igpus if d[0] == igpus[0][0]]
    kind = "GPU" if gpus else "IGPU"
    return [_describe(lib, index, dev, backend, kind) for index, (backend, dev) in enumerate(chosen)]


def _describe(lib: ctypes.CDLL, index: int, dev: int, backend: str, kind: str) -> DeviceInfo:
    free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
    lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
    return DeviceInfo(
        index=index,
        name=_text(lib.ggml_backend_dev_name(dev)),
        description=_text(lib.ggml_backend_dev_description(dev)),
        backend=backend,
        kind=kind,
        free_bytes=int(free.value),
        total_bytes=int(total.value),
    )


def _text(raw: bytes | None) -> str:
    return raw.decode("utf-8", "replace") if raw else ""
