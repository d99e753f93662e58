"""Slot pools: a hard, installation-wide concurrency cap per named resource (design 004's Slot Manager).

A pool (`video` 18, `avatar` 2, one per external provider stage) is a sorted set in Redis of holder -> lease
deadline (`Keys.slot_pool`). `acquireSlot-1.lua` reclaims expired leases and takes a slot in one atomic call, so
any number of engine replicas share a pool and can never over-commit it; `releaseSlot-1.lua` gives a slot back;
`renewSlots-1.lua` extends the leases a live holder still uses. A holder that dies without releasing stops
renewing and its slot comes back by itself once its lease runs out. A holder's name is its job's
"task_id:stage:attempt", so a restarted engine that finds its job still holding a slot re-acquires the same one
(an acquire by a current holder renews its lease) instead of taking a second.
"""

from __future__ import annotations

from sieve.slots._pools import PoolState, SlotPools

__all__ = ["PoolState", "SlotPools"]
