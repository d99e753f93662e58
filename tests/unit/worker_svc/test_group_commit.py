"""The group commit: calls that wait together are written together, whole and in order, up to max_items rows a
statement; each caller gets its own results; a call larger than max_items is written in pieces; a write that keeps
failing fails every caller of its group with GroupWriteError, and the loop goes on with the next group."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from worker_svc.group_commit import GroupCommit, GroupWriteError


class Writes:
    """The statement a group commit runs: records each group, answers each row with its double; rows listed in
    `failing` make the statement fail."""

    def __init__(self) -> None:
        self.groups: list[list[int]] = []
        self.failing: set[int] = set()

    async def __call__(self, rows: Sequence[int]) -> list[int]:
        await asyncio.sleep(0.01)
        self.groups.append(list(rows))
        if self.failing & set(rows):
            raise ConnectionError("PostgreSQL is away")
        return [2 * r for r in rows]


async def test_waiting_calls_share_statements_of_whole_calls_and_each_gets_its_own_results() -> None:
    writes = Writes()
    group = GroupCommit("test", writes, max_items=10)
    loop = asyncio.create_task(group.run())
    try:
        first = asyncio.create_task(group.submit([1, 2, 3]))
        await asyncio.sleep(0)  # the first call is written alone; the others gather meanwhile
        calls = [[10, 11, 12, 13], [20, 21, 22, 23], [30, 31, 32], [40]]
        later = [asyncio.create_task(group.submit(c)) for c in calls]
        assert await first == [2, 4, 6]
        assert [await t for t in later] == [[2 * r for r in c] for c in calls]
    finally:
        loop.cancel()
    # whole calls, in order, never more than 10 rows a statement
    assert writes.groups == [[1, 2, 3], [10, 11, 12, 13, 20, 21, 22, 23], [30, 31, 32, 40]]
    assert (group.groups, group.rows) == (3, 15)


async def test_a_call_larger_than_a_statement_is_written_in_pieces() -> None:
    writes = Writes()
    group = GroupCommit("test", writes, max_items=4)
    loop = asyncio.create_task(group.run())
    try:
        assert await group.submit(list(range(10))) == [2 * r for r in range(10)]
    finally:
        loop.cancel()
    assert writes.groups == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


async def test_a_write_that_keeps_failing_fails_its_callers_and_the_next_group_is_written() -> None:
    writes = Writes()
    writes.failing = {7}
    group = GroupCommit("test", writes, max_items=10, max_attempts=2)
    loop = asyncio.create_task(group.run())
    try:
        doomed = [asyncio.create_task(group.submit(c)) for c in ([6], [7])]
        for call in doomed:
            with pytest.raises(GroupWriteError):
                await call
        assert await group.submit([8]) == [16]
    finally:
        loop.cancel()
    # the two calls waited together: one group, tried twice, then the next group on its own
    assert writes.groups == [[6, 7], [6, 7], [8]]
