"""Listening and stopping: the socket is bound before the models load; a signal stops cleanly.

Binding first makes "port in use" a one-line error in a second instead of after a model load,
and lets clients connect (they wait in the backlog) while the models load.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import signal
import socket
import threading
from typing import Callable

import uvicorn

from ..errors import ConfigError


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind(host: str, port: int) -> socket.socket:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as err:
        raise ConfigError(f"--host {host}: cannot resolve it ({err.strerror})") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # rebinding after a restart; never shares a live port
        sock.bind(address)
        sock.listen(128)
    except OSError as err:
        sock.close()
        where = f"{host}:{port}"
        if err.errno == errno.EADDRINUSE:
            raise ConfigError(f"{where} is already in use: stop what holds it or pick another --port") from None
        if err.errno == errno.EACCES:
            raise ConfigError(f"{where}: permission denied (ports below 1024 need privileges); pick another --port") from None
        if err.errno == errno.EADDRNOTAVAIL:
            raise ConfigError(f"--host {host} is not an address of this machine") from None
        raise ConfigError(f"cannot listen on {where}: {err.strerror or err}") from None
    return sock


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, on_stop: Callable[[], None]):
        super().__init__(config)
        self.on_stop = on_stop

    @contextlib.contextmanager
    def capture_signals(self):
        # uvicorn's own version re-raises the signal after shutting down (exit 130, or death by
        # SIGTERM); a server that was asked to stop and did has succeeded: exit 0.
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig, frame) -> None:
        self.on_stop()  # in-flight generations end at their next token with an error chunk
        if self.should_exit:
            self.force_exit = True  # a second Ctrl-C: stop waiting for connections
        else:
            self.should_exit = True


def make_server(app, on_stop: Callable[[], None], *, grace_s: float = 5.0) -> uvicorn.Server:
    """A uvicorn server whose SIGINT/SIGTERM (or handle_exit) calls on_stop, then stops gracefully;
    responses still open after grace_s are cancelled."""
    config = uvicorn.Config(app, lifespan="off", log_level="warning", access_log=False,
                            timeout_graceful_shutdown=grace_s)
    return _Server(config, on_stop)


def serve(app, sock: socket.socket, on_stop: Callable[[], None], *, grace_s: float = 5.0) -> None:
    """Serve on sock until SIGINT/SIGTERM."""
    make_server(app, on_stop, grace_s=grace_s).run(sockets=[sock])
