"""Coalescing a stream's outgoing messages: what queued up while the previous message was being written is
folded into one message, so that a busy stream sends fewer, larger messages (the Pull stream's both ends).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def coalesce(queue: asyncio.Queue[T | None], first: T, merge: Callable[[T, T], None]) -> bool:
    """Folds every message already waiting in `queue` into `first`, in order, with `merge(first, later)`.
    Stops at the closing None, which it consumes: returns True when it met it (send `first`, then close)."""
    while not queue.empty():
        later = queue.get_nowait()
        if later is None:
            return True
        merge(first, later)
    return False
