"""What llama.cpp itself sees: build features and the GPU devices its backends registered.

Everything here degrades to empty/False: hardware detection must work on a machine where
llama-cpp-python is missing, half-built or older than the symbols we ask for.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

# enum ggml_backend_dev_type (ggml-backend.h, llama.cpp vendored by llama-cpp-python 0.3.36)
_DEV_TYPE_CPU = 0
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
    kind: str  # "GPU" (dedicated memory), "IGPU" (shares host memory) or "RPC" (another machine's)
    free_bytes: int
    total_bytes: int
    endpoint: str = ""  # host:port of an RPC device


def _llama_cpp():
    try:
        from .model import ensure_backend

        # initialised with edgespec's log handler, so backends' banners stay out of the user's way
        return ensure_backend()
    except Exception:  # not installed, or its shared library failed to load
        return None


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
    """Whether this build can offload to a device of *this* machine.

    llama_supports_gpu_offload() also says yes for any RPC-enabled build, GPU or not."""
    if not _call_bool("llama_supports_gpu_offload"):
        return False
    api = _ggml_api()
    if api is None:  # cannot list devices: trust llama.cpp unless RPC alone explains its yes
        return not supports_rpc()
    try:
        return any(kind != "RPC" for _, _, kind in _listed(api))  # no memory query: no network
    except Exception:
        return False


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
    """RPC, GPU and integrated-GPU devices in llama.cpp's default device order (the order
    tensor_split/main_gpu index): RPC servers' devices first, then GPUs."""
    api = _ggml_api()
    if api is None:
        return []
    try:
        return _enumerate(api)
    except Exception:
        return []


def _candidate_libs() -> list[ctypes.CDLL]:
    # llama-cpp-python 0.3.36 binds no ggml_backend_dev_* function. libllama's handle resolves
    # them through its own dependencies: the registry llama.cpp loads models with. That comes
    # first, because llama_cpp._ggml.libggml can be a second copy of libggml with a registry of
    # its own (wheels store libggml.so and libggml.so.0 as two files), where RPC servers
    # registered would be invisible to llama.cpp.
    libs: list[ctypes.CDLL] = []
    if _llama_cpp() is None:
        return libs
    for module_name, attr in (("llama_cpp.llama_cpp", "_lib"), ("llama_cpp._ggml", "libggml")):
        try:
            module = __import__(module_name, fromlist=[attr])
            lib = getattr(module, attr, None)
        except Exception:
            continue
        if lib is not None:
            libs.append(lib)
    return libs


def ggml_lib() -> ctypes.CDLL | None:
    """The library holding ggml's backend registry, its device functions declared."""
    return _ggml_api()


def serving_devices(use_cpu: bool) -> list[int]:
    """What `rpc-server` offers, as llama.cpp's rpc-server picks: local GPUs, else the CPU."""
    api = _ggml_api()
    if api is None:
        return []
    gpus = [] if use_cpu else [dev for _, dev, kind in _listed(api) if kind != "RPC"]
    if gpus:
        return gpus
    cpu = api.ggml_backend_dev_by_type(_DEV_TYPE_CPU)
    return [cpu] if cpu else []


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
        "ggml_backend_dev_by_type": ([ctypes.c_int], vp),
    }
    for name, (argtypes, restype) in prototypes.items():
        fn = getattr(lib, name)
        fn.argtypes = argtypes
        fn.restype = restype


def _enumerate(lib: ctypes.CDLL) -> list[DeviceInfo]:
    return [_describe(lib, index, dev, backend, kind) for index, (backend, dev, kind) in enumerate(_listed(lib))]


def _listed(lib: ctypes.CDLL) -> list[tuple[str, int, str]]:
    """(backend, handle, kind) of each device in llama.cpp's default order, not yet queried.

    Builds with dynamically loaded backends register nothing until asked, exactly as
    llama_supports_gpu_offload() does it."""
    if lib.ggml_backend_reg_count() == 0:
        lib.ggml_backend_load_all()
    rpc: list[tuple[str, int, str]] = []
    gpus: list[tuple[str, int, str]] = []
    igpus: list[tuple[str, int, str]] = []
    for i in range(lib.ggml_backend_dev_count()):
        dev = lib.ggml_backend_dev_get(i)
        kind = _GPU_TYPES.get(lib.ggml_backend_dev_type(dev)) if dev else None
        if kind is None:
            continue
        reg = lib.ggml_backend_dev_backend_reg(dev)
        backend = _text(lib.ggml_backend_reg_name(reg)) if reg else ""
        if backend.startswith("RPC"):
            rpc.append((backend, dev, "RPC"))
        else:
            (gpus if kind == "GPU" else igpus).append((backend, dev, kind))
    # Mirror llama.cpp's default device list so our indices match its main_gpu/tensor_split:
    # RPC devices first; integrated GPUs only when there is no discrete one, of one backend.
    return rpc + (gpus or [d for d in igpus if d[0] == igpus[0][0]])


def _describe(lib: ctypes.CDLL, index: int, dev: int, backend: str, kind: str) -> DeviceInfo:
    free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
    lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
    description = _text(lib.ggml_backend_dev_description(dev))
    return DeviceInfo(
        index=index,
        name=_text(lib.ggml_backend_dev_name(dev)),
        description=description,
        backend="RPC" if kind == "RPC" else backend,
        kind=kind,
        free_bytes=int(free.value),
        total_bytes=int(total.value),
        endpoint=description if kind == "RPC" else "",  # ggml describes an RPC device by its endpoint
    )


def _text(raw: bytes | None) -> str:
    return raw.decode("utf-8", "replace") if raw else ""
