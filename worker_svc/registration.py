"""The worker's side of the registry: register, heartbeat, register again when forgotten.

The registry's record is how the fleet knows this worker: it exists only while heartbeats keep refreshing its TTL
(a worker that dies simply stops being listed) and it carries the task types, slots and resource readings the
registry judges availability from.

`RegistryClient.run` keeps this worker's record alive until `stop` is set: Register once, then a
Heartbeat with fresh readings every `heartbeat_interval_s` (or more often, when the registry asks for a
shorter period). NOT_FOUND means the record expired (the worker was silent longer than the TTL, or Redis
lost it) and the worker registers again at once. Any other failure (registry down, Redis down, a timeout)
is logged and retried with jittered exponential backoff, 0.2 s doubling up to 5 s; the loop never ends
on an error. There is no Deregister RPC: a stopped worker's record simply expires.

`gpu_available`, when given, says whether this worker runs on a GPU (an OCR worker: its engine's mode)
instead of NVML's "a GPU is present"; `register_again` makes the next beat, at once, a Register with fresh
readings (after the OCR engine fell back from GPU to CPU mode).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Callable

import grpc

from sieve import rpc
from sieve.backoff import Backoff
from sieve.enums import enum_value
from sieve.settings import Settings
from sieve.v1 import registry_pb2, registry_pb2_grpc, types_pb2
from worker_svc.resources import ResourceSampler

log = logging.getLogger("sieve.worker.registration")

BACKOFF_INITIAL_S = 0.2
BACKOFF_MAX_S = 5.0
#: Deadline of one Register or Heartbeat call.
RPC_TIMEOUT_S = 5.0


class RegistryClient:
    """Keeps one worker registered with the registry service.

    Owns the registry channel, the heartbeat period (ours, or the registry's when shorter) and what the last
    answers said: whether the record exists (`registered`), whether the registry finds the worker available,
    the readings sent last."""

    def __init__(
        self,
        settings: Settings,
        sampler: ResourceSampler,
        task_types: list[int],
        active_tasks: Callable[[], int],
        gpu_available: Callable[[], bool] | None = None,
        concurrency: Callable[[], int] | None = None,
    ) -> None:
        self._settings = settings
        #: the slots this worker registers (the scheduler caps what it hands out by them)
        self._concurrency = concurrency or (lambda: settings.worker_concurrency)
        self._gpu_available = gpu_available
        self._wake = asyncio.Event()
        self._sampler = sampler
        self._task_types = list(task_types)
        self._active_tasks = active_tasks
        self.worker_id = settings.effective_worker_id
        self.hostname = socket.gethostname()
        self.pid = os.getpid()
        #: The readings sent last (None before the first call).
        self.last_resources: registry_pb2.Resources | None = None
        #: Whether the registry holds this worker's record, as far as the last answer tells.
        self.registered = False
        #: The registry's verdict at the last heartbeat (None before the first one).
        self.available: bool | None = None
        #: How many times this worker registered (the first time included).
        self.registrations = 0
        self._interval_s = settings.heartbeat_interval_s

    def _channel(self) -> grpc.aio.Channel:
        # Reconnect attempts follow our own cap, not gRPC's default of up to 120 s, so that a registry
        # that comes back is reached well within the worker TTL.
        return rpc.channel(
            self._settings.registry_addr,
            self._settings,
            extra_options=[
                ("grpc.initial_reconnect_backoff_ms", int(BACKOFF_INITIAL_S * 1000)),
                ("grpc.min_reconnect_backoff_ms", int(BACKOFF_INITIAL_S * 1000)),
                ("grpc.max_reconnect_backoff_ms", int(BACKOFF_MAX_S * 1000)),
            ],
        )

    async def run(self, stop: asyncio.Event) -> None:
        """Registers and heartbeats until `stop` is set; never raises for a failed call."""
        backoff = Backoff(BACKOFF_INITIAL_S, BACKOFF_MAX_S)
        channel = self._channel()
        stub = registry_pb2_grpc.RegistryServiceStub(channel)
        try:
            while not stop.is_set():
                try:
                    await self._beat(stub)
                    backoff.reset()
                    delay = self._interval_s
                except grpc.aio.AioRpcError as err:
                    if err.code() == grpc.StatusCode.NOT_FOUND:
                        log.warning(
                            "registry forgot worker %s; registering again",
                            self.worker_id,
                            extra={"worker_id": self.worker_id},
                        )
                        self.registered = False
                        delay = 0.0
                    else:
                        delay = backoff.next()
                        log.warning(
                            "registry call failed: %s %s; retrying in %.2fs",
                            err.code().name,
                            err.details(),
                            delay,
                            extra={"worker_id": self.worker_id},
                        )
                except Exception:  # e.g. a bad fixed-resources file: keep the worker alive
                    delay = backoff.next()
                    log.exception("heartbeat failed; retrying in %.2fs", delay, extra={"worker_id": self.worker_id})
                if delay > 0:
                    await self._sleep(stop, delay)
        finally:
            await channel.close()

    def register_again(self) -> None:
        """Register (not just heartbeat) with fresh readings now, e.g. after the worker's mode changed."""
        self.registered = False
        self._wake.set()

    async def _sleep(self, stop: asyncio.Event, delay: float) -> None:
        """Waits `delay` seconds, or less when stopping or asked to register again."""
        if self._wake.is_set():
            self._wake.clear()
            return
        waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self._wake.wait())]
        try:
            await asyncio.wait(waits, timeout=delay, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waits:
                waiter.cancel()
        self._wake.clear()

    async def _beat(self, stub: registry_pb2_grpc.RegistryServiceStub) -> None:
        resources = self._sampler.sample(self._active_tasks())
        if self._gpu_available is not None:
            resources.gpu_available = self._gpu_available()
        self.last_resources = resources
        if not self.registered:
            answer = await stub.Register(
                registry_pb2.RegisterRequest(
                    worker_id=self.worker_id,
                    hostname=self.hostname,
                    pid=self.pid,
                    task_types=[enum_value(types_pb2.TaskType, t) for t in self._task_types],
                    resources=resources,
                    concurrency=self._concurrency(),
                ),
                timeout=RPC_TIMEOUT_S,
            )
            self.registered = True
            self.registrations += 1
            # Beat at our own period, or the registry's if it wants to hear from us more often.
            self._interval_s = self._settings.heartbeat_interval_s
            if answer.heartbeat_interval_s:
                self._interval_s = min(self._interval_s, float(answer.heartbeat_interval_s))
            log.info("registered worker %s with the registry", self.worker_id, extra={"worker_id": self.worker_id})
            return
        reply = await stub.Heartbeat(
            registry_pb2.HeartbeatRequest(worker_id=self.worker_id, resources=resources),
            timeout=RPC_TIMEOUT_S,
        )
        self.available = reply.available


__all__ = ["RegistryClient"]
