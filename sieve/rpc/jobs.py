"""JobsService: a server's periodic jobs (sieve/jobs.py) for operators, ListJobs and RunJob.

Every server of the shared shape serves it (sieve/rpc/server.py) over its service's `Jobs`; both RPCs are
operator-only (sieve/rpc/auth.py) and so audited. RunJob runs the job now (or waits for its run in progress) and
answers its status after that run: a run that failed is still an OK answer, with `succeeded` false and the error
in `job.last_error`. An empty name is INVALID_ARGUMENT naming `name`; a name no job has is NOT_FOUND.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

import grpc
from google.protobuf import duration_pb2, timestamp_pb2

from sieve.fields import text_problem
from sieve.jobs import Jobs, JobStatus, UnknownJob
from sieve.rpc.status import abort, invalid_argument, plain_status
from sieve.v1 import jobs_pb2, jobs_pb2_grpc

JOBS_SERVICE_NAME: str = jobs_pb2.DESCRIPTOR.services_by_name["JobsService"].full_name

#: longest job name RunJob looks up (every job's name is far shorter)
MAX_NAME_CHARS = 100


def _timestamp(moment: datetime | None) -> timestamp_pb2.Timestamp | None:
    if moment is None:
        return None
    out = timestamp_pb2.Timestamp()
    out.FromDatetime(moment)
    return out


def _duration(seconds: float | None) -> duration_pb2.Duration | None:
    if seconds is None:
        return None
    out = duration_pb2.Duration()
    out.FromNanoseconds(int(seconds * 1e9))
    return out


def job_message(status: JobStatus, service: str, replica: str) -> jobs_pb2.Job:
    """The wire form of one job's status."""
    return jobs_pb2.Job(
        name=status.name,
        description=status.description,
        interval=_duration(status.interval_s),
        last_started_at=_timestamp(status.last_started_at),
        last_finished_at=_timestamp(status.last_finished_at),
        last_duration=_duration(status.last_duration_s),
        last_error=status.last_error,
        last_result=status.last_result,
        runs=status.runs,
        errors=status.errors,
        consecutive_errors=status.consecutive_errors,
        next_run_at=_timestamp(status.next_run_at),
        running=status.running,
        service=service,
        replica=replica,
    )


class JobsServicer(jobs_pb2_grpc.JobsServiceServicer):
    """ListJobs and RunJob over the jobs `jobs()` names now (a server started before its service was built
    serves the built service's jobs once there are any: sieve/rpc/readiness.py)."""

    def __init__(self, service: str, jobs: Callable[[], Jobs]) -> None:
        self.service = service
        self.jobs = jobs

    async def ListJobs(
        self, request: jobs_pb2.ListJobsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> jobs_pb2.ListJobsResponse:
        jobs = self.jobs()
        return jobs_pb2.ListJobsResponse(
            jobs=[job_message(status, self.service, jobs.replica) for status in jobs.statuses()]
        )

    async def RunJob(
        self, request: jobs_pb2.RunJobRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> jobs_pb2.RunJobResponse:
        name = request.name
        if not name:
            await abort(context, invalid_argument("name", "is required: a job's name, as ListJobs shows it"))
        problem = text_problem(name, max_chars=MAX_NAME_CHARS, printable=True)
        if problem is not None:
            await abort(context, invalid_argument("name", problem))
        jobs = self.jobs()
        try:
            outcome = await jobs.run_now(name)
        except UnknownJob:
            known = ", ".join(jobs.names) or "none"
            await abort(context, plain_status(grpc.StatusCode.NOT_FOUND, f"no job {name!r} here (jobs: {known})"))
            raise
        return jobs_pb2.RunJobResponse(
            job=job_message(jobs.status(name), self.service, jobs.replica), succeeded=outcome.succeeded
        )


__all__ = ["JOBS_SERVICE_NAME", "JobsServicer", "job_message"]
