"""Typing help for the asyncio Redis client's replies."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TypeVar, cast

_T = TypeVar("_T")


def reply(result: Awaitable[_T] | _T) -> Awaitable[_T]:
    """A command's reply, to await: redis-py types it `Awaitable[T] | T` (one signature for its sync and asyncio
    clients), and from the asyncio client it is always the awaitable."""
    return cast(Awaitable[_T], result)
