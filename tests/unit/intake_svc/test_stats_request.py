"""GetStats requests checked and scoped (intake_svc/stats.py): whole periods, bounded ranges, whose statistics."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from google.protobuf import timestamp_pb2

from intake_svc.listing import NotPermitted
from intake_svc.stats import query_of
from sieve.credentials import Role
from sieve.errors import InvalidInput
from sieve.rpc.auth import Principal
from sieve.v1 import intake_pb2, types_pb2

ALICE = Principal("alice", frozenset({Role.CLIENT}))
OPS = Principal("ops", frozenset({Role.OPERATOR}))
NOW = datetime(2024, 5, 10, 13, 25, tzinfo=UTC)


def stamp(moment: datetime) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(moment)
    return ts


def test_the_range_is_rounded_out_to_whole_periods_and_defaults_to_the_last_day_or_week() -> None:
    hourly = query_of(intake_pb2.GetStatsRequest(granularity=intake_pb2.STATS_GRANULARITY_HOUR), ALICE, NOW)
    assert (hourly.start, hourly.end) == (datetime(2024, 5, 9, 14, tzinfo=UTC), datetime(2024, 5, 10, 14, tzinfo=UTC))
    daily = query_of(intake_pb2.GetStatsRequest(), ALICE, NOW)
    assert daily.daily and (daily.start, daily.end) == (
        datetime(2024, 5, 4, tzinfo=UTC),
        datetime(2024, 5, 11, tzinfo=UTC),
    )
    given = query_of(
        intake_pb2.GetStatsRequest(start_time=stamp(datetime(2024, 5, 1, 8, 30, tzinfo=UTC)), end_time=stamp(NOW)),
        ALICE,
    )
    assert (given.start, given.end) == (datetime(2024, 5, 1, tzinfo=UTC), datetime(2024, 5, 11, tzinfo=UTC))


def test_a_client_gets_its_own_stats_and_an_operator_everyones_or_one_callers() -> None:
    assert query_of(intake_pb2.GetStatsRequest(), ALICE, NOW).caller == "alice"
    assert query_of(intake_pb2.GetStatsRequest(caller="alice"), ALICE, NOW).caller == "alice"
    with pytest.raises(NotPermitted):
        query_of(intake_pb2.GetStatsRequest(caller="bob"), ALICE, NOW)
    assert query_of(intake_pb2.GetStatsRequest(), OPS, NOW).caller is None
    assert query_of(intake_pb2.GetStatsRequest(caller="bob"), OPS, NOW).caller == "bob"


def test_filters_are_normalised() -> None:
    query = query_of(
        intake_pb2.GetStatsRequest(device_id="aa-bb-cc-dd-ee-01", type=types_pb2.TASK_TYPE_OCR_IMAGE, top=3), OPS, NOW
    )
    assert (query.device, query.task_type, query.top) == ("AA:BB:CC:DD:EE:01", "OCR_IMAGE", 3)
    assert query_of(intake_pb2.GetStatsRequest(), OPS, NOW).top == 10


@pytest.mark.parametrize(
    ("request_fields", "field"),
    [
        ({"granularity": 3}, "granularity"),
        ({"type": 5}, "type"),
        ({"top": 1000}, "top"),
        (
            {
                "end_time": stamp(datetime(2024, 5, 1, tzinfo=UTC)),
                "start_time": stamp(datetime(2024, 5, 1, tzinfo=UTC)),
            },
            "end_time",
        ),
        ({"start_time": stamp(datetime(2022, 1, 1, tzinfo=UTC))}, "start_time"),
        ({"device_id": "x"}, "device_id"),
    ],
)
def test_bad_fields_are_named(request_fields: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidInput) as err:
        query_of(intake_pb2.GetStatsRequest(**request_fields), OPS, NOW)  # type: ignore[arg-type]
    assert err.value.field == field
