"""Validation of what callers send: every bad field becomes InvalidInput naming that field.

Every string has a cap and must be storable (`sieve.fields`: no U+0000, which PostgreSQL text cannot hold;
identifiers and URLs printable); error messages quote at most a short prefix of a bad value. A keyed task
gets the fingerprint of its request (`intake_svc.idempotency`).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit

from google.protobuf import timestamp_pb2

from intake_svc.idempotency import fingerprint
from sieve.db.tasks import NewTask
from sieve.errors import InvalidInput
from sieve.fields import parse_uuid, shown, text_problem
from sieve.ids import uuid7_at, uuid7_many
from sieve.images import ImageError, check_pixels, inspect_image
from sieve.mac import normalize_mac
from sieve.outbound.policy import DestinationRefused, OutboundPolicy
from sieve.settings import Settings
from sieve.v1 import intake_pb2, types_pb2

MAX_BATCH = 1000
MAX_IDEMPOTENCY_KEY = 200
MAX_URL = 2048
MAX_TTL_S = 7 * 24 * 3600
#: a MAC address in its longest spelling, with blanks around it
MAX_DEVICE_ID = 64
#: TaskSpec.labels: how many, a key's form, a value's length
MAX_LABELS = 16
MAX_LABEL_VALUE = 256
_LABEL_KEY = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_./-]{0,62}")

#: the priorities a task may name (UNSPECIFIED means NORMAL and is replaced before the check)
_PRIORITIES = frozenset(types_pb2.Priority.values()) - {types_pb2.PRIORITY_UNSPECIFIED}
_TASK_TYPES = frozenset((types_pb2.TASK_TYPE_TEXT, types_pb2.TASK_TYPE_OCR_IMAGE, types_pb2.TASK_TYPE_EXTERNAL))
_IMAGE_MAGIC = (b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n", b"BM")


def looks_like_image(data: bytes) -> bool:
    """True for JPEG, PNG, BMP and WebP magic bytes."""
    if data.startswith(_IMAGE_MAGIC):
        return True
    return len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WEBP"


def validate_spec(
    spec: intake_pb2.TaskSpec,
    field: str,
    caller: str,
    settings: Settings,
    now: datetime | None = None,
    trace_context: str | None = None,
    task_id: uuid.UUID | None = None,
) -> NewTask:
    """Turns one TaskSpec into a NewTask, or raises InvalidInput naming `field`.<name>.

    The checks run in a fixed order (device, type, priority, payload, idempotency key, ttl, max_attempts, labels,
    callback_url), so
    that a spec with several problems is always refused for the same one."""
    now = now or datetime.now(UTC)
    device = _device(spec, field)
    if spec.type not in _TASK_TYPES:
        raise InvalidInput(f"{field}.type", f"unknown task type {spec.type}")
    priority = spec.priority or types_pb2.PRIORITY_NORMAL
    if priority not in _PRIORITIES:
        raise InvalidInput(f"{field}.priority", f"unknown priority {spec.priority}")
    payload = _payload(spec, field, settings)
    key = _idempotency_key(spec, field)
    ttl_s, requested_ttl_ms = _ttl(spec, field, settings)
    if spec.max_attempts > settings.max_attempts:  # 0: the setting
        raise InvalidInput(f"{field}.max_attempts", f"must be at most {settings.max_attempts} (the global limit)")
    labels = _labels(spec, field)
    callback_url = _callback_url(spec, field, caller, settings)

    digest = None
    if key is not None:  # only a keyed task is compared with an earlier one
        digest = fingerprint(
            spec.type,
            priority,
            requested_ttl_ms,
            spec.WhichOneof("payload") or "",
            payload.content(),
            spec.max_attempts,
            labels,
            spec.callback_url,
        )

    return NewTask(
        task_id=task_id or uuid7_at(now),
        device=device,
        task_type=spec.type,
        priority=priority,
        caller=caller,
        created_at=now,
        expires_at=now + timedelta(seconds=ttl_s),
        text=payload.text,
        image=payload.image,
        image_url=payload.url,
        idempotency_key=key,
        trace_context=trace_context,
        fingerprint=digest,
        max_attempts=spec.max_attempts or None,
        labels=labels,
        callback_url=callback_url,
    )


def _labels(spec: intake_pb2.TaskSpec, field: str) -> dict[str, str] | None:
    """The spec's labels, sorted by key (None when it has none), or InvalidInput naming the label."""
    return checked_labels(spec.labels, f"{field}.labels")


def checked_labels(labels: Mapping[str, str], field: str) -> dict[str, str] | None:
    """Labels (of a task, a report, a filter) sorted by key, None when there are none; InvalidInput naming `field`
    (or `field[key]` for a bad value) when there are too many or one breaks the rules."""
    if not labels:
        return None
    if len(labels) > MAX_LABELS:
        raise InvalidInput(field, f"has {len(labels)} labels: at most {MAX_LABELS}")
    for key, value in labels.items():
        problem = _label_problem(key, value, field)
        if problem is not None:
            raise InvalidInput(*problem)
    return dict(sorted(labels.items()))


def _label_problem(key: str, value: str, field: str) -> tuple[str, str] | None:
    """What is wrong with one label (the field to name, and why), or None."""
    if not _LABEL_KEY.fullmatch(key):
        why = "must be 1 to 63 letters, digits and _ . - / (starting with a letter, digit or _)"
        return field, f"key {shown(key)} {why}"
    problem = text_problem(value, max_chars=MAX_LABEL_VALUE, printable=True)
    if problem is not None:
        return f"{field}[{key}]", problem
    return None


@dataclass(frozen=True, slots=True)
class _Payload:
    """A spec's payload as it is stored: exactly one of text, image bytes and image URL."""

    text: str | None = None
    image: bytes | None = None
    url: str | None = None

    def content(self) -> bytes:
        """The bytes a request's fingerprint covers."""
        if self.image is not None:
            return self.image
        return (self.text if self.text is not None else self.url or "").encode()


def _device(spec: intake_pb2.TaskSpec, field: str) -> str:
    return parse_device(spec.device_id, f"{field}.device_id")


def parse_device(raw: str, field: str = "device_id") -> str:
    """A device id (a MAC address in any usual spelling) normalised, or InvalidInput naming `field`."""
    if len(raw) > MAX_DEVICE_ID:
        raise InvalidInput(field, f"{shown(raw)} is not a MAC address (too long)")
    try:
        return normalize_mac(raw)
    except ValueError:
        raise InvalidInput(field, f"{shown(raw)} is not a MAC address") from None


def parse_time(stamp: timestamp_pb2.Timestamp, field: str) -> datetime:
    """A request's timestamp as an aware datetime (years 1970 to 9999), or InvalidInput naming `field`."""
    if not 0 <= stamp.seconds < 253_402_300_800 or not 0 <= stamp.nanos < 1_000_000_000:
        raise InvalidInput(field, "is not a valid time")
    return stamp.ToDatetime(tzinfo=UTC)


def _payload(spec: intake_pb2.TaskSpec, field: str, settings: Settings) -> _Payload:
    """The payload the task's type needs: a TEXT task a text, an OCR_IMAGE task image bytes or an image URL, an
    EXTERNAL task its job (stored as the text: `external_payload`)."""
    payload = spec.WhichOneof("payload")
    if spec.type == types_pb2.TASK_TYPE_EXTERNAL:
        return _Payload(text=_external(spec, payload, field, settings))
    if payload == "image_url":  # stored as text and fetched by a worker: one printable line, capped
        problem = text_problem(spec.image_url, max_chars=MAX_URL, printable=True)
        if problem is not None:
            raise InvalidInput(f"{field}.image_url", problem)
    if spec.type == types_pb2.TASK_TYPE_TEXT:
        return _Payload(text=_text(spec, payload, field, settings))
    if payload == "image":
        return _Payload(image=_image(spec, field, settings))
    if payload == "image_url":
        return _Payload(url=_image_url(spec, field, settings))
    raise InvalidInput(f"{field}.image", "an OCR_IMAGE task needs image bytes or an image_url")


def _external(spec: intake_pb2.TaskSpec, payload: str | None, field: str, settings: Settings) -> str:
    """An EXTERNAL task's job: a configured provider and a JSON input within the size limit, as it is stored."""
    if payload != "external":
        raise InvalidInput(f"{field}.external", "an EXTERNAL task needs an external job (provider, input_json)")
    job = spec.external
    if not job.provider:
        raise InvalidInput(f"{field}.external.provider", "is empty")
    if settings.external.get(job.provider) is None:
        known = ", ".join(sorted(settings.external.providers)) or "none"
        why = f"{shown(job.provider)} is not a provider (configured: {known})"
        raise InvalidInput(f"{field}.external.provider", why)
    problem = text_problem(job.input_json, max_bytes=settings.external_max_input_bytes)
    if problem is not None:
        raise InvalidInput(f"{field}.external.input_json", problem)
    try:
        json.loads(job.input_json)
    except ValueError as exc:
        raise InvalidInput(f"{field}.external.input_json", f"is not valid JSON: {exc}") from None
    return external_payload(job.provider, job.input_json)


def external_payload(provider: str, input_json: str) -> str:
    """How an EXTERNAL task's job is stored (tasks.payload_text) and read back by the engine."""
    return json.dumps({"provider": provider, "input_json": input_json}, ensure_ascii=False)


def _text(spec: intake_pb2.TaskSpec, payload: str | None, field: str, settings: Settings) -> str:
    if payload != "text":
        raise InvalidInput(f"{field}.text", "a TEXT task needs a text")
    if not spec.text.strip():
        raise InvalidInput(f"{field}.text", "is empty")
    problem = text_problem(spec.text, max_bytes=settings.max_text_bytes)  # size, and no U+0000
    if problem is not None:
        raise InvalidInput(f"{field}.text", problem)
    return spec.text


def _image(spec: intake_pb2.TaskSpec, field: str, settings: Settings) -> bytes:
    if not spec.image:
        raise InvalidInput(f"{field}.image", "is empty")
    if len(spec.image) > settings.max_image_bytes:
        raise InvalidInput(f"{field}.image", f"is larger than {settings.max_image_bytes} bytes")
    if not looks_like_image(spec.image):
        raise InvalidInput(f"{field}.image", "is not a JPEG, PNG, WebP or BMP image")
    # what the header tells: readable, non-zero dimensions, within the pixel limit (a bomb stops here)
    try:
        check_pixels(inspect_image(spec.image), settings.ocr_max_image_pixels)
    except ImageError as exc:
        raise InvalidInput(f"{field}.image", str(exc)) from None
    return spec.image


def _image_url(spec: intake_pb2.TaskSpec, field: str, settings: Settings) -> str:
    return checked_url(spec.image_url, f"{field}.image_url", settings)


def checked_url(url: str, field: str, settings: Settings) -> str:
    """An outbound http(s) URL (an image to fetch, a callback to POST to) the policy may let through, or
    InvalidInput naming `field`."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
        parts.port  # noqa: B018  (raises for a bad port)
    except ValueError:  # e.g. an unclosed "[" or a bad port
        parts, host = None, None
    if parts is None or parts.scheme not in ("http", "https") or not host or len(url) > MAX_URL:
        raise InvalidInput(field, "must be an http(s) URL of at most 2048 characters")
    # an IP-literal host (any spelling) outside public space, or a host off a names-only allow-list;
    # no DNS here: the fetcher checks every address again when it connects (sieve/outbound/policy.py)
    try:
        OutboundPolicy.from_settings(settings).check_without_dns(host)
    except DestinationRefused as exc:
        raise InvalidInput(field, exc.reason) from None
    return url


def _callback_url(spec: intake_pb2.TaskSpec, field: str, caller: str, settings: Settings) -> str | None:
    """Where the task's completion is POSTed: its own callback_url (one printable line, a URL the outbound policy
    may reach, of a caller that has a signing secret) or the caller's default; None: nowhere."""
    config = settings.callbacks
    if not spec.callback_url:
        return config.default_url(caller)
    problem = text_problem(spec.callback_url, max_chars=MAX_URL, printable=True)
    if problem is not None:
        raise InvalidInput(f"{field}.callback_url", problem)
    if userinfo_in(spec.callback_url):
        raise InvalidInput(f"{field}.callback_url", "must not carry a user name or password")
    url = checked_url(spec.callback_url, f"{field}.callback_url", settings)
    if config.secret(caller) is None:
        raise InvalidInput(
            f"{field}.callback_url",
            f"caller {shown(caller)} has no callback secret to sign with (SIEVE_CALLBACK_SECRETS)",
        )
    return url


def userinfo_in(url: str) -> bool:
    try:
        parts = urlsplit(url)
        return parts.username is not None or parts.password is not None
    except ValueError:
        return False


def _idempotency_key(spec: intake_pb2.TaskSpec, field: str) -> str | None:
    key = spec.idempotency_key or None
    if key is not None and (len(key) > MAX_IDEMPOTENCY_KEY or not key.isprintable()):
        raise InvalidInput(f"{field}.idempotency_key", f"must be printable, at most {MAX_IDEMPOTENCY_KEY} characters")
    return key


def _ttl(spec: intake_pb2.TaskSpec, field: str, settings: Settings) -> tuple[float, int]:
    """(the task's TTL in seconds, the TTL the caller asked for in ms: 0 for none, part of the fingerprint)."""
    if not spec.HasField("ttl"):
        return settings.task_ttl_s, 0
    requested_ttl_ms = spec.ttl.ToMilliseconds()
    ttl_s = requested_ttl_ms / 1000
    if ttl_s == 0:
        return settings.task_ttl_s, requested_ttl_ms
    if not 0 < ttl_s <= MAX_TTL_S:
        raise InvalidInput(f"{field}.ttl", f"must be between 0 and {MAX_TTL_S} seconds")
    return ttl_s, requested_ttl_ms


def validate_batch(
    request: intake_pb2.SubmitBatchRequest, caller: str, settings: Settings, trace_context: str | None = None
) -> list[NewTask]:
    if not request.tasks:
        raise InvalidInput("tasks", "is empty")
    if len(request.tasks) > MAX_BATCH:
        raise InvalidInput("tasks", f"has more than {MAX_BATCH} items")
    now = datetime.now(UTC)
    ids = uuid7_many(now, len(request.tasks))
    return [
        validate_spec(spec, f"tasks[{i}]", caller, settings, now, trace_context, ids[i])
        for i, spec in enumerate(request.tasks)
    ]


def parse_task_id(raw: str, field: str = "task_id") -> uuid.UUID:
    """A task id (any spelling of a UUID, at most 45 characters), or InvalidInput naming `field`."""
    return parse_uuid(raw, field)
