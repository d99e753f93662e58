"""Retention of task payloads: image bytes removed once the result that was read from them is stored.

Image bytes are the bulk of the tasks table. With `SIEVE_OCR_PAYLOAD_RETENTION=delete` the worker calls
`PayloadStore.drop_images` right after its results are stored: `payload_bytes` becomes NULL for those
tasks — only when they SUCCEEDED and their result row exists, so a task that may still run again (failed,
requeued from the dead letters) keeps its image. The default, `keep`, leaves everything in place. The task
row, its history and its result stay either way.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import asyncpg

RETENTION_KEEP = "keep"
RETENTION_DELETE = "delete"


class PayloadStore:
    """Payload clean-up through one asyncpg pool."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    async def drop_images(self, task_ids: Sequence[uuid.UUID]) -> int:
        """Removes the image bytes of these tasks where their result is stored; returns how many."""
        if not task_ids:
            return 0
        rows = await self.pool.fetch(
            """
            UPDATE tasks t SET payload_bytes = NULL
            FROM results r
            WHERE t.id = ANY($1::uuid[]) AND r.task_id = t.id
              AND t.status = 'SUCCEEDED' AND t.payload_bytes IS NOT NULL
            RETURNING t.id
            """,
            list(task_ids),
        )
        return len(rows)
