"""Lease tokens: what a worker must echo to settle a hand-out.

A token is `<lease number>.<random>`: the number is the fencing token that never repeats for a task (Redis
leases and the result write check it); the random part makes a token unguessable, so that only the stream a
task was handed to can ack or nack it.
"""

from __future__ import annotations

import secrets


def new_token(lease: int) -> str:
    return f"{lease}.{secrets.token_hex(8)}"


def lease_number(token: str) -> int:
    """The fencing number of a token (ValueError when it has none)."""
    return int(token.partition(".")[0])
