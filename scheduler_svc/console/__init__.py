"""The operators' web console, served by the scheduler process (SIEVE_CONSOLE_ADDR; README "Web console").

`tally` counts what this replica's dispatch loop claims (per device, and each task's queue wait), `history` turns
those counts into one sample a second (throughput, queue-wait percentiles, per-device shares, Jain's index),
`views` reads the rest at request time through the scheduler's stores, and `server` is the aiohttp app: the page
and its files (package data under `static/`, no build step) and the JSON API (`/api/...`, operator token).
"""
