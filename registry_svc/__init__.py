"""Sieve registry service: which workers are alive, what resources they have, which can take work.

`Register`, `Heartbeat` and `ListWorkers` over the worker records of `sieve.redis.worker_records` (Redis hashes with a
TTL, listed with SCAN). Run it with `python -m registry_svc`.
"""
