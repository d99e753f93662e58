"""The external engine's record of its provider jobs (migration 0016): one row per (task, stage).

The order of writes is what makes the engine restart-safe (worker_svc/external/engine.py):

1. `begin` writes the row, state "submitting", with the holder name that is also the Idempotency-Key of the POST,
   BEFORE the provider is called. A row that exists is returned as it is (a restarted engine resumes it) — unless
   it FAILED for an earlier attempt: then this attempt starts it again under its own key.
2. `submitted` records the provider's job id; only then does the submit count as done.
3. `terminal` records succeeded / failed, the result URL, the polls and the cost.
4. `completed` marks the task's rows once its result is stored.

An engine that dies between 1 and 2 finds "submitting" and POSTs again under the same key: the provider answers
with the job it made the first time. Costs are summed per provider and caller by `costs`.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime

import asyncpg

SUBMITTING = "submitting"
SUBMITTED = "submitted"
SUCCEEDED = "succeeded"
FAILED = "failed"
COMPLETED = "completed"


@dataclass(frozen=True, slots=True)
class JobRow:
    """One stage of one task's external job, as recorded."""

    task_id: uuid.UUID
    stage: str
    stage_index: int
    provider: str
    caller: str
    pool: str
    holder: str
    attempt: int
    provider_job_id: str | None
    state: str
    result_url: str | None
    created_at: datetime
    polls: int
    cost: float
    error: str | None

    @classmethod
    def of(cls, r: asyncpg.Record) -> JobRow:
        return cls(
            r["task_id"],
            r["stage"],
            r["stage_index"],
            r["provider"],
            r["caller"],
            r["pool"],
            r["holder"],
            r["attempt"],
            r["provider_job_id"],
            r["state"],
            r["result_url"],
            r["created_at"],
            r["polls"],
            r["cost"],
            r["error"],
        )


_COLUMNS = (
    "task_id, stage, stage_index, provider, caller, pool, holder, attempt, provider_job_id, state, result_url, "
    "created_at, polls, cost, error"
)


class ExternalJobStore:
    """The external_jobs table (see the module)."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    async def of_task(self, task_id: uuid.UUID) -> list[JobRow]:
        """Every stage row of a task, in stage order."""
        rows = await self.pool.fetch(
            f"SELECT {_COLUMNS} FROM external_jobs WHERE task_id = $1 ORDER BY stage_index", task_id
        )
        return [JobRow.of(r) for r in rows]

    async def begin(
        self, task_id: uuid.UUID, stage: str, stage_index: int, provider: str, pool: str, holder: str, attempt: int
    ) -> JobRow:
        """The stage's row: written "submitting" under `holder` when there is none (or when it failed for an earlier
        attempt), else the row as it is (resumed)."""
        row = await self.pool.fetchrow(
            f"""
            INSERT INTO external_jobs AS j (task_id, stage, stage_index, provider, caller, pool, holder, attempt, state)
            SELECT $1, $2, $3, $4, t.caller, $5, $6, $7, 'submitting' FROM tasks t WHERE t.id = $1
            ON CONFLICT (task_id, stage) DO UPDATE SET
                holder = EXCLUDED.holder, attempt = EXCLUDED.attempt, state = 'submitting', provider_job_id = NULL,
                result_url = NULL, error = NULL, created_at = now(), submitted_at = NULL, finished_at = NULL
            WHERE j.state = 'failed' AND j.attempt < EXCLUDED.attempt
            RETURNING {_COLUMNS}
            """,
            task_id,
            stage,
            stage_index,
            provider,
            pool,
            holder,
            attempt,
        )
        if row is None:  # it exists and is not to be started again
            row = await self.pool.fetchrow(
                f"SELECT {_COLUMNS} FROM external_jobs WHERE task_id = $1 AND stage = $2", task_id, stage
            )
        if row is None:
            raise LookupError(f"task {task_id} is not recorded")
        return JobRow.of(row)

    async def submitted(self, task_id: uuid.UUID, stage: str, holder: str, provider_job_id: str) -> None:
        """The provider took the job: its id is recorded (for this holder's submit only)."""
        await self.pool.execute(
            """
            UPDATE external_jobs SET provider_job_id = $4, state = 'submitted', submitted_at = now()
            WHERE task_id = $1 AND stage = $2 AND holder = $3 AND state = 'submitting'
            """,
            task_id,
            stage,
            holder,
            provider_job_id,
        )

    async def terminal(
        self,
        task_id: uuid.UUID,
        stage: str,
        holder: str,
        *,
        state: str,
        polls: int,
        cost: float,
        result_url: str | None = None,
        error: str | None = None,
    ) -> None:
        """The provider job is over: succeeded (with its result URL) or failed (with why); polls are added."""
        await self.pool.execute(
            """
            UPDATE external_jobs SET state = $4, result_url = $5, error = $6, polls = polls + $7, cost = $8,
                   finished_at = now()
            WHERE task_id = $1 AND stage = $2 AND holder = $3 AND state IN ('submitting', 'submitted')
            """,
            task_id,
            stage,
            holder,
            state,
            result_url,
            None if error is None else error[:1000],
            polls,
            cost,
        )

    async def completed(self, task_id: uuid.UUID | None = None) -> int:
        """Succeeded rows of tasks whose result is stored become completed: of one task, or of every task (the
        engine's sweep each tick: a finish that stored the result and died before this write is completed by it)."""
        result = await self.pool.execute(
            """
            UPDATE external_jobs j SET state = 'completed'
            WHERE j.state = 'succeeded' AND ($1::uuid IS NULL OR j.task_id = $1)
              AND EXISTS (SELECT 1 FROM results r WHERE r.task_id = j.task_id)
            """,
            task_id,
        )
        return int(result.split()[-1])

    async def orphans(self) -> dict[str, int]:
        """First-pool slots likely still held by a dead engine: pool -> stages started (submitting or submitted)
        whose task waits in its queue again (PENDING) — each such hand-out takes its own slot back, so the engine
        may take it without a free slot."""
        rows = await self.pool.fetch(
            """
            SELECT j.pool, count(*) AS n FROM external_jobs j JOIN tasks t ON t.id = j.task_id
            WHERE j.state IN ('submitting', 'submitted') AND t.status = 'PENDING' GROUP BY j.pool
            """
        )
        return {r["pool"]: r["n"] for r in rows}

    async def costs(self) -> list[tuple[str, str, int, float]]:
        """(provider, caller, jobs, summed cost) of every stage that ran at a provider."""
        rows = await self.pool.fetch(
            """
            SELECT provider, caller, count(*) AS jobs, sum(cost) AS cost FROM external_jobs
            WHERE provider_job_id IS NOT NULL GROUP BY provider, caller ORDER BY provider, caller
            """
        )
        return [(r["provider"], r["caller"], r["jobs"], float(r["cost"])) for r in rows]
