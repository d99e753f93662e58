"""Unit tests of the task ids (sieve/ids.py): UUIDv7 with the creation millisecond in front, a batch's ids drawn
together as unique and as well formed as one drawn alone."""

from __future__ import annotations

from datetime import UTC, datetime

from sieve.ids import uuid7_at, uuid7_floor, uuid7_many, uuid7_ms


def test_a_batch_of_ids_are_distinct_uuid7s_of_its_millisecond() -> None:
    moment = datetime(2026, 12, 3, 6, 40, 1, 123000, tzinfo=UTC)

    ids = uuid7_many(moment, 1000)

    assert len(set(ids)) == 1000
    assert {i.version for i in ids} == {7}
    assert {i.variant for i in ids} == {uuid7_at(moment).variant}
    assert {uuid7_ms(i) for i in ids} == {uuid7_ms(uuid7_at(moment))}


def test_a_batch_of_ids_sorts_after_the_floor_of_its_millisecond_and_before_the_next() -> None:
    moment = datetime(2026, 12, 3, 6, 40, 1, 123000, tzinfo=UTC)
    ms = uuid7_ms(uuid7_at(moment))
    assert ms is not None

    ids = uuid7_many(moment, 100)

    assert all(uuid7_floor(ms) <= i < uuid7_floor(ms + 1) for i in ids)


def test_no_ids_for_an_empty_batch() -> None:
    assert uuid7_many(datetime.now(UTC), 0) == []
