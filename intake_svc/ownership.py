"""Device ownership: a device belongs to the caller that first submitted for it; nobody else may submit for it.

PostgreSQL is the record (`device_owners`, migration 0006). A first submit claims a device atomically
(`INSERT ... ON CONFLICT DO NOTHING`, then the row is read back: whoever got there first owns it). An operator
re-assigns a device with AssignDevice; operators submit for any device without claiming it.

Each intake replica keeps the owners it has seen in memory, so a batch for known devices costs no round trip.
A re-assignment takes a new `version` from a sequence while holding a transaction-scoped advisory lock, so that
versions become visible in the order they were taken; every replica reads the rows above the last version it
saw whenever its view is older than `device_owner_refresh_s` (one small indexed query per interval, made by the
first request that needs it while the others wait for the same answer). A re-assignment therefore takes effect
on every replica within that interval; a replica that was idle longer reads before it decides anything. Cached
entries carry their version, and the higher version always wins, so a lookup that raced with a re-assignment
cannot put an older owner back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

import asyncpg

#: the advisory lock that orders re-assignments (one per schema: the key hashes the schema's name)
_ASSIGN_LOCK = "SELECT pg_advisory_xact_lock(hashtext(current_schema() || ':device_owners'))"


@dataclass(frozen=True, slots=True)
class Owner:
    """One row of device_owners."""

    device: str
    caller: str
    version: int
    since: datetime | None = None
    assigned_by: str | None = None


def _owner(row: asyncpg.Record) -> Owner:
    return Owner(row["device"], row["caller"], row["version"], row["since"], row["assigned_by"])


class DeviceOwners:
    """The device_owners table: every SQL statement about who owns a device."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    async def claim(self, devices: list[str], caller: str) -> dict[str, Owner]:
        """Gives every device that has no owner yet to `caller`; returns the owner of each device (one round
        trip, two when another claim of the same device raced with this one)."""
        rows = await self.pool.fetch(
            """
            WITH wanted AS (SELECT DISTINCT unnest($1::text[]) AS device),
            claimed AS (
                INSERT INTO device_owners (device, caller)
                SELECT device, $2 FROM wanted ORDER BY device
                ON CONFLICT (device) DO NOTHING
                RETURNING device, caller, version, since, assigned_by
            )
            SELECT * FROM claimed
            UNION ALL
            SELECT o.device, o.caller, o.version, o.since, o.assigned_by FROM device_owners o JOIN wanted USING (device)
            """,
            devices,
            caller,
        )
        found = {r["device"]: _owner(r) for r in rows}
        # a claim that committed after this statement began is neither inserted nor seen: read it now
        late = [d for d in devices if d not in found]
        if late:
            found.update(await self.lookup(late))
        return found

    async def lookup(self, devices: list[str]) -> dict[str, Owner]:
        rows = await self.pool.fetch(
            "SELECT device, caller, version, since, assigned_by FROM device_owners WHERE device = ANY($1::text[])",
            devices,
        )
        return {r["device"]: _owner(r) for r in rows}

    async def assign(self, device: str, caller: str, assigned_by: str) -> tuple[Owner, str | None]:
        """Gives `device` to `caller`: (the new row, the previous owner or None)."""
        async with self.pool.acquire() as conn, conn.transaction():
            await conn.execute(_ASSIGN_LOCK)
            previous = await conn.fetchval("SELECT caller FROM device_owners WHERE device = $1 FOR UPDATE", device)
            row = await conn.fetchrow(
                """
                INSERT INTO device_owners (device, caller, since, assigned_by, version)
                VALUES ($1, $2, now(), $3, nextval('device_owner_version'))
                ON CONFLICT (device) DO UPDATE SET caller = EXCLUDED.caller, since = EXCLUDED.since,
                    assigned_by = EXCLUDED.assigned_by, version = EXCLUDED.version
                RETURNING device, caller, version, since, assigned_by
                """,
                device,
                caller,
                assigned_by,
            )
        assert row is not None
        return _owner(row), previous

    async def latest_version(self) -> int:
        return int(await self.pool.fetchval("SELECT coalesce(max(version), 0) FROM device_owners WHERE version > 0"))

    async def changed_since(self, version: int, limit: int = 10000) -> list[Owner]:
        """Re-assignments with a version above `version`, oldest first."""
        rows = await self.pool.fetch(
            "SELECT device, caller, version, since, assigned_by FROM device_owners WHERE version > $1 "
            "ORDER BY version LIMIT $2",
            version,
            limit,
        )
        return [_owner(r) for r in rows]


class Ownership:
    """One intake replica's view of who owns which device: the cache in front of DeviceOwners."""

    def __init__(self, store: DeviceOwners, refresh_s: float, max_cached: int = 200_000) -> None:
        self.store = store
        self.refresh_s = refresh_s
        self.max_cached = max_cached
        #: device -> (owner, version): the versions decide between a lookup and a re-assignment that raced
        self._owners: dict[str, tuple[str, int]] = {}
        self._version: int | None = None
        self._fresh_until = 0.0
        self._refreshing: asyncio.Future[None] | None = None
        #: PostgreSQL round trips made for lookups and claims (not the periodic refresh), for tests
        self.lookups = 0

    def _remember(self, owners: Iterable[Owner]) -> None:
        for o in owners:
            known = self._owners.get(o.device)
            if known is None or o.version >= known[1]:
                self._owners[o.device] = (o.caller, o.version)
        if len(self._owners) > self.max_cached:  # forget the oldest half; they are read again when needed
            for device in list(self._owners)[: len(self._owners) // 2]:
                del self._owners[device]

    async def _refresh(self) -> None:
        if self._version is None:
            self._version = await self.store.latest_version()
        else:
            while True:
                changed = await self.store.changed_since(self._version)
                self._remember(changed)
                if changed:
                    self._version = changed[-1].version
                if len(changed) < 10000:
                    break
        self._fresh_until = time.monotonic() + self.refresh_s

    async def _ensure_fresh(self) -> None:
        if time.monotonic() < self._fresh_until:
            return
        if self._refreshing is None:
            self._refreshing = asyncio.ensure_future(self._refresh())
            self._refreshing.add_done_callback(self._refreshed)
        await asyncio.shield(self._refreshing)

    def _refreshed(self, future: asyncio.Future[None]) -> None:
        self._refreshing = None
        if not future.cancelled():
            future.exception()  # retrieved here; the waiters see it raised

    async def owners(self, devices: list[str], claim_for: str | None) -> dict[str, str | None]:
        """The owner of each device (None: nobody yet); with `claim_for`, unowned devices are claimed for that
        caller first. Known devices cost no round trip."""
        await self._ensure_fresh()
        missing = [d for d in dict.fromkeys(devices) if d not in self._owners]
        if missing:
            self.lookups += 1
            found = await (self.store.claim(missing, claim_for) if claim_for else self.store.lookup(missing))
            self._remember(found.values())
        return {d: (self._owners[d][0] if d in self._owners else None) for d in devices}

    async def assign(self, device: str, caller: str, assigned_by: str) -> tuple[Owner, str | None]:
        owner, previous = await self.store.assign(device, caller, assigned_by)
        self._remember([owner])
        return owner, previous

    async def owner(self, device: str) -> Owner | None:
        """The record of one device, read from PostgreSQL (for operators)."""
        found = (await self.store.lookup([device])).get(device)
        if found is not None:
            self._remember([found])
        return found


__all__ = ["DeviceOwners", "Owner", "Ownership"]
