"""Real HTTP servers on loopback for tests (aiohttp): `serving` any app; `callback_receiver`, a receiver of completion
callbacks: it records every POST — headers, raw body,
when it came — answers the first `fail_first` attempts of each delivery with `fail_status`, then 200, and checks
each signature with the secret it was given."""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from sieve.callback_config import verify


@dataclass
class Received:
    delivery_id: str
    attempt: int
    timestamp: str
    signature: str
    body: bytes
    status_answered: int
    at: float

    @property
    def payload(self) -> dict[str, Any]:
        return json.loads(self.body)  # type: ignore[no-any-return]


@dataclass
class Receiver:
    secret: bytes
    fail_first: int = 0
    fail_status: int = 503
    #: answer every attempt of these task ids with this status
    always: dict[str, int] = field(default_factory=dict)
    url: str = ""
    received: list[Received] = field(default_factory=list)
    attempts_of: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def accepted(self) -> list[Received]:
        return [r for r in self.received if r.status_answered == 200]

    def accepted_per_task(self) -> dict[str, int]:
        counts: dict[str, int] = defaultdict(int)
        for r in self.accepted():
            counts[r.payload["task_id"]] += 1
        return counts

    def all_signed(self) -> bool:
        return all(verify(self.secret, r.timestamp, r.body, r.signature) for r in self.received)


@asynccontextmanager
async def callback_receiver(secret: bytes, **kw: Any) -> AsyncIterator[Receiver]:
    state = Receiver(secret, **kw)

    async def hook(request: web.Request) -> web.Response:
        body = await request.read()
        delivery = request.headers.get("X-Sieve-Delivery", "")
        state.attempts_of[delivery] += 1
        task_id = delivery.split("/")[0]
        if task_id in state.always:
            status = state.always[task_id]
        else:
            status = state.fail_status if state.attempts_of[delivery] <= state.fail_first else 200
        state.received.append(
            Received(
                delivery,
                int(request.headers.get("X-Sieve-Attempt", "0")),
                request.headers.get("X-Sieve-Timestamp", ""),
                request.headers.get("X-Sieve-Signature", ""),
                body,
                status,
                time.time(),
            )
        )
        return web.Response(status=status, text="ok" if status == 200 else "not now")

    app = web.Application()
    app.router.add_post("/hook", hook)
    async with serving(app) as base:
        state.url = f"{base}/hook"
        yield state


@asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[str]:
    """Serves `app` on a free loopback port while the block runs; yields its base URL (http://127.0.0.1:port)."""
    runner = web.AppRunner(app, shutdown_timeout=0.2)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()
