"""llama.cpp RPC: reach other machines' devices (`--rpc`) and serve this one's (`rpc-server`).

llama.cpp aborts the whole process when an RPC server cannot be reached or speaks another
protocol version, so every server is first probed here with plain sockets (the HELLO and
DEVICE_COUNT messages of ggml-rpc's wire format); only servers that answered are handed to
ggml. A server serves one client at a time, so the probe closes before ggml connects.
"""

from __future__ import annotations

import ctypes
import socket
import struct
import threading
from dataclasses import dataclass

from ..errors import BackendError, InputError
from . import devices
from .model import default_threads, ensure_backend

# ggml-rpc.h / ggml-rpc.cpp as vendored by llama-cpp-python 0.3.36
PROTO_MAJOR, PROTO_MINOR = 7, 0
CMD_HELLO, CMD_DEVICE_COUNT = 14, 15
CONN_CAPS_SIZE = 24
PROBE_TIMEOUT_S = 5.0

_registered: set[str] = set()


@dataclass(frozen=True)
class ServerInfo:
    endpoint: str
    version: tuple[int, int, int]
    n_devices: int


def _split(endpoint: str) -> tuple[str, int]:
    host, _, port = endpoint.rpartition(":")
    return host, int(port)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed the connection")
        data += chunk
    return data


def _request(sock: socket.socket, cmd: int, payload: bytes, reply_size: int) -> bytes:
    # request: | cmd (1 byte) | size (u64) | payload |   reply: | size (u64) | payload |
    sock.sendall(struct.pack("<BQ", cmd, len(payload)) + payload)
    (size,) = struct.unpack("<Q", _recv_exact(sock, 8))
    if size != reply_size:
        raise ConnectionError(f"answered {size} bytes where {reply_size} were expected")
    return _recv_exact(sock, size)


def probe(endpoint: str, timeout: float = PROBE_TIMEOUT_S) -> ServerInfo:
    """Handshake with one server; raise a one-line, actionable error if it cannot be used."""
    host, port = _split(endpoint)
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            hello = _request(sock, CMD_HELLO, bytes(CONN_CAPS_SIZE), 4 + CONN_CAPS_SIZE)
            major, minor, patch = hello[0], hello[1], hello[2]
            if major != PROTO_MAJOR or minor > PROTO_MINOR:
                raise InputError(
                    f"RPC server {endpoint} speaks protocol {major}.{minor}.{patch}, this build "
                    f"{PROTO_MAJOR}.{PROTO_MINOR}: run the same llama.cpp version on both (`edgespec rpc-server` there)"
                )
            (n_devices,) = struct.unpack("<I", _request(sock, CMD_DEVICE_COUNT, b"", 4))
    except socket.timeout:
        raise InputError(
            f"RPC server {endpoint} did not answer within {timeout:g} s "
            "(it serves one client at a time: is another one connected?)"
        ) from None
    except socket.gaierror as err:
        raise InputError(f"RPC server {endpoint}: unknown host {host!r} ({err.strerror})") from None
    except (ConnectionError, OSError) as err:
        reason = getattr(err, "strerror", None) or str(err)
        raise InputError(
            f"cannot use RPC server {endpoint} ({reason}); start one there with "
            f"`edgespec rpc-server --host 0.0.0.0 --port {port}`"
        ) from None
    if n_devices == 0:
        raise InputError(f"RPC server {endpoint} offers no devices")
    return ServerInfo(endpoint, (major, minor, patch), n_devices)


def connect(endpoints: tuple[str, ...]) -> list[ServerInfo]:
    """Make the servers' devices visible to llama.cpp (idempotent per endpoint, process-wide).

    They then head llama.cpp's default device list, before local GPUs: the order the plan's
    tensor_split indices follow."""
    if not endpoints:
        return []
    if not devices.supports_rpc():
        raise InputError(
            "this llama.cpp build has no RPC support; rerun scripts/setup (it builds with "
            "-DGGML_RPC=ON) or rebuild llama-cpp-python with CMAKE_ARGS=-DGGML_RPC=ON"
        )
    infos = [probe(e) for e in endpoints]
    ensure_backend()  # its abort handler turns a server lost mid-run into one line
    api = _api()
    for info in infos:
        if info.endpoint in _registered:
            continue
        reg = api.add_server(info.endpoint.encode())
        if not reg:
            raise BackendError(f"llama.cpp could not add RPC server {info.endpoint}")
        api.lib.ggml_backend_register(reg)
        _registered.add(info.endpoint)
    return infos


@dataclass
class _Api:
    lib: ctypes.CDLL
    add_server: ctypes._CFuncPtr
    start_server: ctypes._CFuncPtr


def _api() -> _Api:
    lib = devices.ggml_lib()
    if lib is None:
        raise BackendError("cannot reach ggml's backend registry in this llama-cpp-python build")
    vp = ctypes.c_void_p
    lib.ggml_backend_reg_by_name.argtypes, lib.ggml_backend_reg_by_name.restype = [ctypes.c_char_p], vp
    lib.ggml_backend_reg_get_proc_address.argtypes = [vp, ctypes.c_char_p]
    lib.ggml_backend_reg_get_proc_address.restype = vp
    lib.ggml_backend_register.argtypes, lib.ggml_backend_register.restype = [vp], None
    reg = lib.ggml_backend_reg_by_name(b"RPC")
    if not reg:
        raise BackendError("this llama.cpp build registered no RPC backend")

    def proc(name: bytes, prototype):
        address = lib.ggml_backend_reg_get_proc_address(reg, name)
        if not address:
            raise BackendError(f"the RPC backend does not export {name.decode()}")
        return prototype(address)

    add = proc(b"ggml_backend_rpc_add_server", ctypes.CFUNCTYPE(vp, ctypes.c_char_p))
    start = proc(b"ggml_backend_rpc_start_server",
                 ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t,
                                  ctypes.c_size_t, ctypes.POINTER(vp)))
    return _Api(lib, add, start)


def check_port_free(host: str, port: int) -> None:
    """ggml only prints 'Failed to create server socket'; say which and why first."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
    except socket.gaierror as err:
        raise InputError(f"rpc-server: unknown host {host!r} ({err.strerror})") from None
    except OSError as err:
        raise InputError(f"rpc-server: cannot listen on {host}:{port} ({err.strerror})") from None


def serve(host: str, port: int, threads: int | None, cache_dir: str | None, use_cpu: bool) -> None:
    """Serve this machine's devices until the process ends (blocks; ggml prints its banner).

    The C call never returns while serving, so it runs on a daemon thread and the main thread
    stays free to take Ctrl-C."""
    if not devices.supports_rpc():
        raise InputError("this llama.cpp build has no RPC support; rerun scripts/setup (it builds with -DGGML_RPC=ON)")
    check_port_free(host, port)
    ensure_backend()
    api = _api()
    chosen = devices.serving_devices(use_cpu)
    if not chosen:
        raise BackendError("rpc-server: llama.cpp lists no device to serve in this build")
    array = (ctypes.c_void_p * len(chosen))(*chosen)
    endpoint = f"{host}:{port}".encode()
    cache = cache_dir.encode() if cache_dir else None
    thread = threading.Thread(
        target=api.start_server, args=(endpoint, cache, threads or default_threads(), len(chosen), array), daemon=True
    )
    thread.start()
    while thread.is_alive():
        thread.join(0.5)
    raise BackendError(f"rpc-server on {host}:{port} stopped (see the messages above)")
