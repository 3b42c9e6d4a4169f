"""Who may call the server: the Host, Origin and Content-Type checks that run before any route.

Binding to loopback keeps the network out, not the user's own browser, which runs code from any
web page it visits:

- **DNS rebinding.** A page on `evil.example` whose name is then made to resolve to 127.0.0.1
  talks to this server as its own origin, and can read the answers. Its requests still say
  `Host: evil.example`, so only the names this server is reached by are accepted: with a loopback
  bind `localhost` and loopback addresses; with a wildcard bind (0.0.0.0, ::) any IP address and
  this machine's name; with any other bind that address or name; plus each `--allowed-host`.
- **Cross-origin requests.** Whatever a page sends carries `Origin` (every fetch() that is not a
  plain GET, every form post): refused unless `--cors ORIGIN` allows it; an allowed origin gets
  CORS answers, preflights included (Starlette's CORSMiddleware, placed after this guard). No web
  page is served from here, so no legitimate request carries an Origin this server has not allowed.
- **"Simple" requests** (a form post, fetch() with a text/plain or typeless body) are sent without
  a CORS preflight, and before the page may read anything: a POST must say
  `Content-Type: application/json`, which a page can send only after a preflight.

Refusals are OpenAI-shaped JSON, like every other error of the server.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Iterable

from starlette.datastructures import Headers
from starlette.responses import JSONResponse

from .schemas import APIError

JSON = "application/json"
ANY = "*"  # --allowed-host '*' / --cors '*': every host / every origin


def host_name(host_header: str) -> str:
    """The name or address in a Host header, without its port: `[::1]:8080` -> `::1`."""
    value = host_header.strip().lower()
    if value.startswith("["):
        return value[1:].partition("]")[0]
    if value.count(":") == 1:
        value = value.partition(":")[0]
    return value.rstrip(".")


def _ip(name: str):
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


def normal_origin(origin: str) -> str:
    """`HTTP://LocalHost:3000/` -> `http://localhost:3000`: how browsers write an Origin header."""
    return origin.strip().rstrip("/").lower()


class HostRule:
    """Which Host header values name this server (see the module's docstring)."""

    def __init__(self, bind_host: str, allowed: Iterable[str] = ()):
        self.any = ANY in allowed
        self.names = {host_name(h) for h in allowed if h != ANY}
        bind = host_name(bind_host)
        ip = _ip(bind)
        self.loopback = bind == "localhost" or (ip is not None and ip.is_loopback)
        self.wildcard = ip is not None and ip.is_unspecified
        if self.loopback or self.wildcard:
            self.names.add("localhost")
        if self.wildcard:
            self.names.add(socket.gethostname().lower())
        elif not self.loopback:
            self.names.add(bind)

    def allows(self, host_header: str | None) -> bool:
        if self.any or host_header is None:  # no Host at all: HTTP/1.0, never a browser
            return True
        name = host_name(host_header)
        if name in self.names:
            return True
        ip = _ip(name)
        if ip is None:
            return False
        return self.wildcard or (self.loopback and ip.is_loopback)


class Guard:
    """ASGI middleware: refuses a request from a foreign Host or Origin, or a non-JSON POST."""

    def __init__(self, app, *, bind_host: str, allowed_hosts: Iterable[str] = (), cors_origins: Iterable[str] = ()):
        self.app = app
        self.hosts = HostRule(bind_host, tuple(allowed_hosts))
        origins = tuple(cors_origins)
        self.any_origin = ANY in origins
        self.origins = {normal_origin(o) for o in origins if o != ANY}

    def refusal(self, method: str, headers: Headers) -> APIError | None:
        host = headers.get("host")
        if not self.hosts.allows(host):
            return APIError(400, f"Host {host!r} is not a name of this server; if it is, start it with "
                                 f"--allowed-host {host_name(host)}", code="invalid_host")
        origin = headers.get("origin")
        if origin is not None and not self.any_origin and normal_origin(origin) not in self.origins:
            return APIError(403, f"requests from web pages (Origin {origin!r}) are refused; to allow this one, "
                                 f"start the server with --cors {origin}", code="origin_not_allowed")
        if method == "POST":
            kind = headers.get("content-type")
            if kind is None or kind.partition(";")[0].strip().lower() != JSON:
                got = "none" if kind is None else repr(kind)
                return APIError(415, f"the request body must be JSON: send Content-Type: {JSON} (got {got})",
                                code="unsupported_media_type")
        return None

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            err = self.refusal(scope["method"], Headers(scope=scope))
            if err is not None:
                await JSONResponse(err.body(), status_code=err.status)(scope, receive, send)
                return
        await self.app(scope, receive, send)
