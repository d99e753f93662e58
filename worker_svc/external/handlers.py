"""Provider handlers: one class per kind of provider, registered by name, each with `submit`, `poll` and `finish`.

`http-async` is the reference handler, for a generic provider that speaks this protocol:

- `POST {base_url}/jobs` with JSON `{"input": <input>, "stage": "<stage>", "previous": {<stage>: <result_url>}}`
  and the header `Idempotency-Key` -> `201 {"id": "<job id>"}` (the same key again: the same job); `429` when the
  provider's own cap is reached;
- `GET {base_url}/jobs/{id}` -> `{"status": "queued" | "running" | "succeeded" | "failed", "result_url", "error"}`;
- `GET {result_url}` -> the output.

Every request goes through `SafeHttpClient` (sieve/outbound) under a policy whose allow-list is the configured
providers' hosts: a result_url elsewhere is refused like any outbound request off the list. Failures are
`ProviderError`s that say whether trying again may help (timeouts, connection errors, 5xx, 408, 429).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from sieve.external_config import ProviderConfig
from sieve.outbound.client import FetchError, SafeHttpClient

QUEUED = "queued"
RUNNING = "running"
SUCCEEDED = "succeeded"
FAILED = "failed"
STATUSES = (QUEUED, RUNNING, SUCCEEDED, FAILED)


class ProviderError(Exception):
    """A provider call that gave nothing usable; `transient`: trying again later may help."""

    def __init__(self, message: str, *, transient: bool, status: int | None = None) -> None:
        super().__init__(message)
        self.transient = transient
        self.status = status


@dataclass(frozen=True, slots=True)
class StageJob:
    """What a handler gets to submit one stage: the idempotency key, the input, earlier stages' result URLs."""

    key: str
    stage: str
    input_json: str
    previous: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Polled:
    """A provider job's state: one of STATUSES, the result's URL once it succeeded, the error once it failed."""

    status: str
    result_url: str | None = None
    error: str | None = None

    @property
    def terminal(self) -> bool:
        return self.status in (SUCCEEDED, FAILED)


class Handler(ABC):
    """How the engine talks to one provider (see the module); one instance per configured provider."""

    def __init__(self, config: ProviderConfig, http: SafeHttpClient) -> None:
        self.config = config
        self.http = http

    @abstractmethod
    async def submit(self, job: StageJob) -> str:
        """Starts the stage at the provider; its job id. The same key again must give the same job."""

    @abstractmethod
    async def poll(self, job_id: str) -> Polled:
        """The provider job's state now."""

    @abstractmethod
    async def finish(self, result_url: str) -> bytes:
        """The output of a job that succeeded."""


HANDLERS: dict[str, type[Handler]] = {}


def register(name: str) -> Callable[[type[Handler]], type[Handler]]:
    """Registers a handler class under `name` (the `handler` of a provider's settings)."""

    def decorate(cls: type[Handler]) -> type[Handler]:
        HANDLERS[name] = cls
        return cls

    return decorate


def handler_for(config: ProviderConfig, http: SafeHttpClient) -> Handler:
    return HANDLERS[config.handler](config, http)


def _provider_error(exc: FetchError, what: str) -> ProviderError:
    return ProviderError(f"{what}: {exc}", transient=exc.transient, status=exc.status)


def _json(body: bytes, what: str) -> Any:
    try:
        return json.loads(body)
    except ValueError:
        raise ProviderError(f"{what}: the provider's answer is not JSON", transient=True) from None


@register("http-async")
class HttpAsyncHandler(Handler):
    """The reference handler (see the module)."""

    async def submit(self, job: StageJob) -> str:
        body = json.dumps(
            {"input": json.loads(job.input_json), "stage": job.stage, "previous": dict(job.previous)}
        ).encode()
        try:
            answer = await self.http.request(
                "POST",
                f"{self.config.base_url}/jobs",
                body=body,
                headers={"Content-Type": "application/json", "Idempotency-Key": job.key},
                follow_redirects=False,
            )
        except FetchError as exc:
            raise _provider_error(exc, "submit") from None
        data = _json(answer.body, "submit")
        job_id = data.get("id") if isinstance(data, dict) else None
        if not isinstance(job_id, str | int) or not str(job_id):
            raise ProviderError("submit: the provider's answer has no job id", transient=True)
        return str(job_id)

    async def poll(self, job_id: str) -> Polled:
        try:
            answer = await self.http.get(f"{self.config.base_url}/jobs/{quote(job_id, safe='')}")
        except FetchError as exc:
            raise _provider_error(exc, "poll") from None
        data = _json(answer.body, "poll")
        status = data.get("status") if isinstance(data, dict) else None
        if status not in STATUSES:
            raise ProviderError(f"poll: unknown job status {str(status)[:40]!r}", transient=True)
        assert isinstance(data, dict)
        url, error = data.get("result_url"), data.get("error")
        if status == SUCCEEDED and not isinstance(url, str):
            raise ProviderError("poll: a job that succeeded has no result_url", transient=False)
        return Polled(
            str(status),
            url if isinstance(url, str) else None,
            str(error)[:500] if error is not None else None,
        )

    async def finish(self, result_url: str) -> bytes:
        try:
            return (await self.http.get(result_url)).body
        except FetchError as exc:
            raise _provider_error(exc, "result download") from None
