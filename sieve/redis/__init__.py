"""Sieve's Redis layer: the only code that names a key or sends a command.

`keys` (the key schema), `entry` (queue entries), `queue_store` (device queues, leases, backoff: one Lua script
per state change, in `lua/`), `scheduler_state` (the scheduler's gauges, watermark record, replicas' signs of
life, wake-ups, rebuild lock), `dead_letter_store` (the dead-letter list), `worker_records` (registry records),
`leases` (lease-token signing key), `connection` (one client per process and its checks), `reply` (typing of
the asyncio client's replies).
"""
