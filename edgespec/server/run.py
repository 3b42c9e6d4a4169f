"""Listening and stopping: the socket is bound before the models load; a signal stops cleanly.

Binding first makes "port in use" a one-line error in a second instead of after a model load,
and lets clients connect (they wait in the backlog) while the models load. Connections are
bounded in time (a request head within HEAD_TIMEOUT_S, idle keep-alive KEEP_ALIVE_S), and the
shutdown contract holds for the responses uvicorn cancels when its grace period runs out.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import signal
import socket
import threading
from typing import Callable

import uvicorn
from starlette.responses import JSONResponse
from uvicorn.protocols.http.h11_impl import H11Protocol

from ..errors import ConfigError
from .schemas import error_body, sse

GRACE_S = 5.0  # after a stop, responses still open this long are cancelled (and answered below)
KEEP_ALIVE_S = 5  # an idle keep-alive connection is closed after this (uvicorn's default, made explicit)
# A client has this long, from connecting or from its previous response, to send a whole request
# head (line + headers). uvicorn has no such limit: a connection that sends nothing, or a header
# a byte at a time, was held open forever.
HEAD_TIMEOUT_S = 10.0
MAX_HEAD_BYTES = 16 * 1024  # h11's limit on a request head (a larger one is a 400), made explicit


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


class StopSignals:
    """SIGINT and SIGTERM while the server holds the models: each asks it to stop; none raises.

    Python's handlers raise KeyboardInterrupt (or the CLI's Terminated) in the main thread. One
    raised after the server had stopped but before the generation thread was joined (a second
    Ctrl-C) unwound to the interpreter's exit while that thread was inside llama.cpp, freeing
    the models under it: exit -11. So `installed()` covers everything from the models' load to
    their release, and every signal in it only calls the listeners (the first one starts the
    shutdown, a second stops waiting for connections, one while the generation thread is joined
    stops waiting for it)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.received: list[int] = []
        self._listeners: list[Callable[[int], None]] = []

    def listen(self, listener: Callable[[int], None]) -> None:
        """Call listener(sig) on each signal from now on, and for each one already received."""
        self._listeners.append(listener)
        for sig in list(self.received):
            listener(sig)

    def _handle(self, sig, frame) -> None:
        self.received.append(sig)
        for listener in list(self._listeners):
            listener(sig)

    @contextlib.contextmanager
    def installed(self):
        if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
            yield self
            return
        previous = {sig: signal.signal(sig, self._handle) for sig in self.SIGNALS
                    if signal.getsignal(sig) is not signal.SIG_IGN}  # started told to ignore one: keep ignoring
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


SHUTTING_DOWN = error_body("the server is shutting down", type="server_error", code="shutting_down")


class AnswerWhenCancelled:
    """ASGI wrapper: a response cancelled at shutdown still ends as the contract says.

    uvicorn cancels every request still running when the grace period after a stop runs out (or
    at once on a second Ctrl-C): a request still waiting for the models, or one whose prompt is
    still being evaluated. It would answer with a plain-text 500 and log the CancelledError's
    traceback; here a request with no answer yet gets the 503 `shutting_down` error, and an event
    stream its error chunk. (uvicorn cancels request tasks only when it stops.)"""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        sent = {"start": None, "end": False}

        async def send_tracked(message):
            if message["type"] == "http.response.start":
                sent["start"] = message
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                sent["end"] = True
            await send(message)

        try:
            await self.app(scope, receive, send_tracked)
        except asyncio.CancelledError:
            if not sent["end"]:
                with contextlib.suppress(Exception):  # the client may be gone too
                    await self._finish(sent["start"], scope, receive, send)

    @staticmethod
    async def _finish(start, scope, receive, send) -> None:
        if start is None:
            await JSONResponse(SHUTTING_DOWN, status_code=503)(scope, receive, send)
            return
        kind = dict(start.get("headers", ())).get(b"content-type", b"")
        chunk = sse(SHUTTING_DOWN).encode() if kind.startswith(b"text/event-stream") else b""
        await send({"type": "http.response.body", "body": chunk, "more_body": False})


class _Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline for each request head (HEAD_TIMEOUT_S)."""

    head_timeout_s = HEAD_TIMEOUT_S

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._head_deadline()

    def on_response_complete(self) -> None:
        self._head_deadline()  # before super(): it may start the next (pipelined) request at once
        super().on_response_complete()

    def _head_deadline(self) -> None:
        self.loop.call_later(self.head_timeout_s, self._head_overdue, self.cycle)

    def _head_overdue(self, cycle) -> None:
        if self.cycle is cycle and not self.transport.is_closing():  # no request began since the deadline was set
            self.transport.close()


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, on_stop: Callable[[], None]):
        super().__init__(config)
        self.on_stop = on_stop

    @contextlib.contextmanager
    def capture_signals(self):
        # uvicorn's own installs its handlers for as long as it serves, then restores the previous
        # ones and raises the signal again (exit 130, or death by SIGTERM). Here StopSignals owns
        # them, for longer than the server runs; and a server asked to stop that did has succeeded.
        yield

    def handle_exit(self, sig, frame) -> None:
        self.on_stop()  # in-flight generations end at their next token with an error chunk
        if self.should_exit:
            self.force_exit = True  # a second Ctrl-C: stop waiting for connections
        else:
            self.should_exit = True


def make_server(app, on_stop: Callable[[], None], *, grace_s: float = GRACE_S,
                head_timeout_s: float = HEAD_TIMEOUT_S, keep_alive_s: float = KEEP_ALIVE_S) -> uvicorn.Server:
    """A uvicorn server whose handle_exit calls on_stop, then stops gracefully; responses still
    open after grace_s are cancelled and answered with the shutting_down error."""
    protocol = type("EdgespecH11Protocol", (_Protocol,), {"head_timeout_s": head_timeout_s})
    config = uvicorn.Config(AnswerWhenCancelled(app), lifespan="off", log_level="warning", access_log=False,
                            timeout_graceful_shutdown=grace_s, timeout_keep_alive=keep_alive_s,
                            http=protocol, h11_max_incomplete_event_size=MAX_HEAD_BYTES)
    return _Server(config, on_stop)


def serve(app, sock: socket.socket, on_stop: Callable[[], None], signals: StopSignals, *,
          grace_s: float = GRACE_S) -> None:
    """Serve on sock until a signal (from `signals`, installed by the caller) stops it."""
    server = make_server(app, on_stop, grace_s=grace_s)
    signals.listen(lambda sig: server.handle_exit(sig, None))
    server.run(sockets=[sock])
