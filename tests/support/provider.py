"""A real external provider on loopback (aiohttp), speaking the `http-async` protocol (worker_svc/external/handlers.py)
and enforcing its own concurrency cap the way a real one does: a POST over the cap is answered 429, and counted.

A job's input says how it behaves: `duration_s` (how long it runs, default 0.5), `fail` (true: it ends failed).
A job counts against the cap from its POST until it is succeeded or failed (its end time), whether or not anyone
polls it. The same Idempotency-Key again returns the job made for it (counted as a duplicate, not a new job).
`flaky_every` answers every n-th request 503; `slow_every` makes every n-th request hang `slow_s` (a timeout).
Everything the tests check is recorded: the most jobs running at once, 429s, submits per (task, stage), polls per
job, each job's start and end (busy slot-seconds).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.support.receiver import serving


@dataclass
class ProviderJob:
    id: str
    key: str
    stage: str
    input: Any
    started: float
    duration_s: float
    fail: bool
    polls: int = 0
    previous: dict[str, str] = field(default_factory=dict)

    @property
    def ends(self) -> float:
        return self.started + self.duration_s

    def status(self, now: float) -> str:
        if now < self.ends:
            return "running"
        return "failed" if self.fail else "succeeded"


@dataclass
class Provider:
    """The provider's state and what it saw (see the module)."""

    cap: int
    flaky_every: int = 0
    slow_every: int = 0
    slow_s: float = 0.0
    #: every result download hangs this long (a finish in progress)
    result_delay_s: float = 0.0
    url: str = ""
    jobs: dict[str, ProviderJob] = field(default_factory=dict)
    by_key: dict[str, str] = field(default_factory=dict)
    rejected_429: int = 0
    duplicates: int = 0
    answered_503: int = 0
    slowed: int = 0
    max_running: int = 0
    #: stage -> the most jobs of that stage running at once
    max_by_stage: Counter[str] = field(default_factory=Counter)
    results_served: int = 0
    #: result downloads in progress now (a finish under way)
    downloading: int = 0
    requests: int = 0
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def running(self, now: float | None = None) -> list[ProviderJob]:
        now = time.monotonic() if now is None else now
        return [j for j in self.jobs.values() if j.started <= now < j.ends]

    def submits_per_stage(self) -> Counter[str]:
        """(task:stage) -> jobs made for it (1 each when nothing was submitted twice)."""
        return Counter(j.key.rsplit(":", 1)[0] for j in self.jobs.values())

    def busy_slot_seconds(self, since: float, until: float) -> float:
        return sum(max(0.0, min(j.ends, until) - max(j.started, since)) for j in self.jobs.values())

    async def _hiccup(self) -> web.Response | None:
        self.requests += 1
        if self.slow_every and self.requests % self.slow_every == 0:
            self.slowed += 1
            await asyncio.sleep(self.slow_s)
        if self.flaky_every and self.requests % self.flaky_every == 0:
            self.answered_503 += 1
            return web.json_response({"error": "try later"}, status=503)
        return None

    async def submit(self, request: web.Request) -> web.Response:
        hiccup = await self._hiccup()
        if hiccup is not None:
            return hiccup
        key = request.headers.get("Idempotency-Key", "")
        body = await request.json()
        if key and key in self.by_key:
            self.duplicates += 1
            return web.json_response({"id": self.by_key[key]}, status=201)
        now = time.monotonic()
        if len(self.running(now)) >= self.cap:
            self.rejected_429 += 1
            return web.json_response({"error": "concurrency cap reached"}, status=429)
        data = body.get("input") if isinstance(body.get("input"), dict) else {}
        durations = data.get("durations") or {}
        duration = float(durations.get(body.get("stage"), data.get("duration_s", 0.5)))
        job = ProviderJob(
            f"j{next(self._ids)}",
            key,
            str(body.get("stage")),
            data,
            now,
            duration,
            bool(data.get("fail")),
            previous=dict(body.get("previous") or {}),
        )
        self.jobs[job.id] = job
        self.by_key[key] = job.id
        running = self.running(now)
        self.max_running = max(self.max_running, len(running))
        same = sum(1 for j in running if j.stage == job.stage)
        self.max_by_stage[job.stage] = max(self.max_by_stage[job.stage], same)
        return web.json_response({"id": job.id}, status=201)

    async def poll(self, request: web.Request) -> web.Response:
        hiccup = await self._hiccup()
        if hiccup is not None:
            return hiccup
        job = self.jobs.get(request.match_info["id"])
        if job is None:
            return web.json_response({"error": "no such job"}, status=404)
        job.polls += 1
        status = job.status(time.monotonic())
        answer: dict[str, Any] = {"status": status}
        if status == "succeeded":
            answer["result_url"] = f"{self.url}/results/{job.id}"
        if status == "failed":
            answer["error"] = "the provider could not process it"
        return web.json_response(answer)

    async def result(self, request: web.Request) -> web.Response:
        job = self.jobs.get(request.match_info["id"])
        if job is None:
            return web.json_response({"error": "no such job"}, status=404)
        if self.result_delay_s:
            self.downloading += 1
            try:
                await asyncio.sleep(self.result_delay_s)
            finally:
                self.downloading -= 1
        self.results_served += 1
        flagged = bool(job.input.get("flag"))
        return web.json_response(
            {
                "verdict": "BLOCK" if flagged else "PASS",
                "hits": [{"word": "violence", "category": "video", "severity": 3}] if flagged else [],
                "job": job.id,
            }
        )


@asynccontextmanager
async def provider_server(cap: int, **kw: Any) -> AsyncIterator[Provider]:
    state = Provider(cap, **kw)
    app = web.Application()
    app.router.add_post("/jobs", state.submit)
    app.router.add_get("/jobs/{id}", state.poll)
    app.router.add_get("/results/{id}", state.result)
    async with serving(app) as base:
        state.url = base
        yield state
