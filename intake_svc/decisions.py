"""What the intake decided about one submitted task: `Accepted`, `Refused`, or a `Conflict` of idempotency keys.

`submission.Submitter` makes these decisions, `tracing.count_decisions` counts them, `servicer` turns them into
answers (a Submit's status, a SubmitBatch item).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import grpc

from intake_svc.idempotency import Conflict


@dataclass(frozen=True, slots=True)
class Accepted:
    """The task is recorded and queued (or, `deduplicated`, an earlier task with the same request was found)."""

    task_id: uuid.UUID
    deduplicated: bool


@dataclass(frozen=True, slots=True)
class Refused:
    """The task was not accepted; nothing of it was written. `reason` labels the refusal in the metrics."""

    reason: str
    message: str
    retry_after_s: float
    #: RESOURCE_EXHAUSTED (a limit: retry after retry_after_s) or PERMISSION_DENIED (not this caller's to do)
    code: grpc.StatusCode = grpc.StatusCode.RESOURCE_EXHAUSTED
    #: ErrorInfo of a PERMISSION_DENIED: its reason and metadata (the field, or the device)
    error_reason: str = ""
    error_metadata: tuple[tuple[str, str], ...] = ()


Decision = Accepted | Refused | Conflict

__all__ = ["Accepted", "Conflict", "Decision", "Refused"]
