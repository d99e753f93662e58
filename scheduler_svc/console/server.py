"""The console's HTTP server (aiohttp, in the scheduler process, on SIEVE_CONSOLE_ADDR): the page and the JSON API.

Routes:

- `GET /` — the page (`static/index.html`); `GET /static/console.js`, `/static/console.css` — its script and style.
  They are package data, served as they are: no build step, no CDN; the page draws its charts on <canvas>.
  They need no credential (they hold no data); a Content-Security-Policy keeps the page to its own files.
- `GET /api/overview` — everything the page shows, as JSON (scheduler_svc/console/views.py), once a second at
  most per replica whatever the number of pages open.
- `GET /api/health` — "ok" (no credential), for probes.

Every `/api/...` route but health needs an operator's bearer token (`Authorization: Bearer <token>`), checked
by the same credentials and the same rules as the gRPC services (sieve/rpc/auth.py): 401 without a known token,
403 for a token without the operator role; with SIEVE_ALLOW_ANONYMOUS=true a request without a token is the
anonymous principal, as a gRPC call is. The page takes the token once from `?token=` (or a prompt), keeps it in
sessionStorage and sends it in that header; it never puts it back in the address.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from importlib import resources

from aiohttp import web

from scheduler_svc.console.history import History
from scheduler_svc.console.views import Views
from sieve.observe.metrics import parse_address
from sieve.rpc.auth import Authenticator, Principal, Role, bearer_of

log = logging.getLogger("sieve.scheduler.console")

#: the page's files (package data) and their content types
STATIC = {
    "index.html": "text/html",
    "console.js": "text/javascript",
    "console.css": "text/css",
}
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def static_text(name: str) -> str:
    return resources.files("scheduler_svc.console").joinpath("static", name).read_text(encoding="utf-8")


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=SECURITY_HEADERS)


class Console:
    """The console of one scheduler replica: `serve` runs it (a background loop of the scheduler's service)."""

    def __init__(
        self, views: Views, history: History, authenticator: Authenticator, *, allow_anonymous: bool, address: str
    ) -> None:
        self.views = views
        self.history = history
        self.authenticator = authenticator
        self.allow_anonymous = allow_anonymous
        self.address = address
        #: the port it listens on, once it does
        self.port: int | None = None
        self.listening = asyncio.Event()
        self._files = {name: static_text(name) for name in STATIC}

    def principal(self, request: web.Request) -> Principal | web.Response:
        """The caller of an API request, or the refusal to send (401 / 403)."""
        token = bearer_of((k.lower(), v) for k, v in request.headers.items())
        if token is None:
            if self.allow_anonymous:
                return Principal("anonymous", frozenset(Role), anonymous=True)
            return _error(401, "missing 'Authorization: Bearer <token>' header")
        principal = self.authenticator.principal(token) if token else None
        if principal is None:
            return _error(401, "unknown or malformed token")
        if not principal.is_operator:
            return _error(403, "the console needs the operator role")
        return principal

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/", self._page)
        app.router.add_get("/static/{name}", self._static)
        app.router.add_get("/api/health", self._health)
        app.router.add_get("/api/overview", self._overview)
        return app

    async def _page(self, request: web.Request) -> web.Response:
        return web.Response(text=self._files["index.html"], content_type="text/html", headers=SECURITY_HEADERS)

    async def _static(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in STATIC or name == "index.html":
            return _error(404, "no such file")
        return web.Response(text=self._files[name], content_type=STATIC[name], headers=SECURITY_HEADERS)

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok", headers=SECURITY_HEADERS)

    async def _overview(self, request: web.Request) -> web.Response:
        refused = self.principal(request)
        if isinstance(refused, web.Response):
            return refused
        try:
            answer = await self.views.overview()
        except Exception as exc:  # Redis or PostgreSQL away: the page says so and keeps polling
            log.warning("console: overview not read: %s", exc)
            return _error(503, f"stores unavailable: {type(exc).__name__}")
        return web.json_response(answer, headers=SECURITY_HEADERS)

    async def serve(self) -> None:
        """Listens on the address and samples the history until cancelled. An address that cannot be bound is
        logged and the console stays off (the scheduler serves on without it)."""
        runner = web.AppRunner(self.app(), access_log=None)
        await runner.setup()
        try:
            try:
                host, port = parse_address(self.address)
                site = web.TCPSite(runner, host, port)
                await site.start()
            except (OSError, ValueError) as exc:
                log.error("console: cannot serve on %s: %s", self.address, exc)
                return
            server = site._server  # the bound socket's port ("host:0" picks one)
            sockets = getattr(server, "sockets", None) or []
            self.port = int(sockets[0].getsockname()[1]) if sockets else port
            self.listening.set()
            log.info("console on http://%s:%d/", host, self.port, extra={"console_port": self.port})
            await self.history.run()
        finally:
            with contextlib.suppress(Exception):
                await runner.cleanup()


__all__ = ["Console", "static_text"]
