"""Idempotency keys: what makes two Submits "the same", and the answer when a key is reused for another task.

A Submit with an idempotency key (scoped per caller and device) creates one task; repeating it returns that
task with `deduplicated: true`. "Repeating" means the same request: the task row stores a SHA-256
`fingerprint` of what the caller asked for — type, priority, the payload (which of text / image / image_url,
and its content), the requested TTL and attempts, the labels, the callback_url — and a later Submit with the same
key but another fingerprint changes nothing and is answered ALREADY_EXISTS naming the first task (`Conflict`), in
the message and in an ErrorInfo detail (reason IDEMPOTENCY_KEY_REUSED, metadata task_id and field). In a
SubmitBatch that item carries the code ALREADY_EXISTS and the message; the batch itself answers OK.

Only keyed tasks are fingerprinted (a hash of at most the 10 MiB image limit); tasks without a key cost
nothing. Rows written before the fingerprint existed (NULL) match any request, as they did then.
"""

from __future__ import annotations

import hashlib
import struct
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from google.rpc import code_pb2, error_details_pb2, status_pb2

from sieve.fields import shown

#: ErrorInfo reason and domain of an idempotency key reused with another payload
REASON = "IDEMPOTENCY_KEY_REUSED"
DOMAIN = "sieve.v1.IntakeService"


def fingerprint(
    task_type: int,
    priority: int,
    ttl_ms: int,
    kind: str,
    payload: bytes,
    max_attempts: int = 0,
    labels: Mapping[str, str] | None = None,
    callback_url: str = "",
) -> bytes:
    """SHA-256 of a request's task: type, effective priority, requested TTL (0: the default), requested attempts
    (0: the default), payload kind ("text", "image" or "image_url") and payload bytes, then its labels in key
    order when it has any and its callback_url when it names one (a request without them hashes as it did before
    they existed). Every part has a
    fixed size or a length prefix, so no two different requests share an encoding."""
    digest = hashlib.sha256()
    digest.update(b"sieve-task-v1")
    digest.update(struct.pack(">iiqQ", task_type, priority, ttl_ms, max_attempts))
    name = kind.encode()
    digest.update(struct.pack(">I", len(name)) + name)
    digest.update(struct.pack(">Q", len(payload)))
    digest.update(payload)
    if labels:
        digest.update(b"labels" + struct.pack(">I", len(labels)))
        for key in sorted(labels):
            for part in (key.encode(), labels[key].encode()):
                digest.update(struct.pack(">I", len(part)) + part)
    if callback_url:
        url = callback_url.encode()
        digest.update(b"callback" + struct.pack(">I", len(url)) + url)
    return digest.digest()


@dataclass(frozen=True, slots=True)
class Conflict:
    """A Submit's idempotency key names an earlier task whose request was different: nothing was changed."""

    task_id: uuid.UUID
    key: str

    @property
    def message(self) -> str:
        return (
            f"idempotency_key {shown(self.key)} was used for task {self.task_id} with a different request "
            "(type, priority, payload, ttl, max_attempts, labels or callback_url): nothing was changed; send the "
            "same request to get that task, or use a new key"
        )

    def status(self, field: str) -> status_pb2.Status:
        """ALREADY_EXISTS with an ErrorInfo naming the first task and the field."""
        status = status_pb2.Status(code=code_pb2.ALREADY_EXISTS, message=self.message)
        status.details.add().Pack(
            error_details_pb2.ErrorInfo(
                reason=REASON, domain=DOMAIN, metadata={"task_id": str(self.task_id), "field": field}
            )
        )
        return status


__all__ = ["DOMAIN", "REASON", "Conflict", "fingerprint"]
