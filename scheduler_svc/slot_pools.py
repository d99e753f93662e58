"""ListSlotPools: the operators' view of the external providers' slot pools (sieve/redis/slot_pools.py) — each
pool's maximum, its holders and their lease deadlines, read in one round trip by Redis's own clock — and the cost
of the external jobs per provider and caller (sieve/db/external_jobs.py)."""

from __future__ import annotations

from google.protobuf import timestamp_pb2

from sieve.db.external_jobs import ExternalJobStore
from sieve.redis.slot_pools import SlotPools
from sieve.v1 import scheduler_pb2


def _stamp(ms: int) -> timestamp_pb2.Timestamp:
    stamp = timestamp_pb2.Timestamp()
    stamp.FromMilliseconds(ms)
    return stamp


class SlotPoolView:
    """Reads the pools and the costs for ListSlotPools."""

    def __init__(self, pools: SlotPools, jobs: ExternalJobStore) -> None:
        self.pools = pools
        self.jobs = jobs

    async def list(self) -> scheduler_pb2.ListSlotPoolsResponse:
        reply = scheduler_pb2.ListSlotPoolsResponse()
        for state in await self.pools.states():
            pool = reply.pools.add(name=state.name, max_slots=state.max_slots, in_use=state.in_use)
            for holder, deadline_ms in sorted(state.holders.items(), key=lambda h: h[1]):
                pool.holders.add(holder=holder, lease_deadline=_stamp(deadline_ms))
        if self.pools.maxima:
            for provider, caller, jobs, cost in await self.jobs.costs():
                reply.costs.add(provider=provider, caller=caller, jobs=jobs, cost=cost)
        return reply
