"""Locating the field that makes request bytes unparsable (sieve.rpc.malformed), and the string rules of sieve.fields.

Each case is checked against protobuf itself: the bytes must really fail to parse (or parse) as the test says.
"""

from __future__ import annotations

import uuid

import pytest
from google.protobuf.message import DecodeError

from sieve.errors import InvalidInput
from sieve.fields import parse_uuid, shown, text_problem
from sieve.rpc.malformed import WHOLE_REQUEST, Malformed, lenient, locate
from sieve.v1 import intake_pb2, registry_pb2, scheduler_pb2


def field(number: int, payload: bytes) -> bytes:
    assert len(payload) < 128
    return bytes([number << 3 | 2, len(payload)]) + payload


def spec(**kw: object) -> bytes:
    return intake_pb2.TaskSpec(**kw).SerializeToString()  # type: ignore[arg-type]


def blame(message_type: type, data: bytes) -> tuple[str, str]:
    with pytest.raises(DecodeError):
        message_type.FromString(data)  # type: ignore[attr-defined]
    found = locate(data, message_type.DESCRIPTOR)  # type: ignore[attr-defined]
    return found.field, found.description


@pytest.mark.parametrize(
    ("message_type", "data", "where"),
    [
        (intake_pb2.SubmitRequest, field(1, spec(device_id="x") + field(4, b"\xff")), "task.text"),
        (intake_pb2.SubmitRequest, field(1, field(7, b"\xed\xa0\x80")), "task.idempotency_key"),
        (
            intake_pb2.SubmitBatchRequest,
            field(1, spec(text="a")) * 3 + field(1, field(1, b"\xc0\x80")),
            "tasks[3].device_id",
        ),
        (intake_pb2.GetTaskRequest, field(1, b"\xe4\xb8"), "task_id"),
        (scheduler_pb2.PullRequest, field(3, field(2, b"ok")) + field(3, field(2, b"\x80")), "acks[1].lease_token"),
        (scheduler_pb2.PullRequest, field(1, field(1, b"w\xff")), "hello.worker_id"),
        (registry_pb2.RegisterRequest, field(5, field(3, b"a") + field(3, b"\xfe")), "resources.gpu_names[1]"),
    ],
)
def test_invalid_utf8_is_blamed_on_its_field(message_type: type, data: bytes, where: str) -> None:
    assert blame(message_type, data) == (where, "is not valid UTF-8")


def test_bytes_that_are_not_wire_format_blame_the_request_or_the_field_they_break() -> None:
    assert blame(intake_pb2.GetTaskRequest, b"\xff\xff\xff")[0] == WHOLE_REQUEST
    # a length running past the end: the field whose bytes are cut
    assert blame(intake_pb2.SubmitRequest, field(1, field(4, b"abc"))[:-1]) == (
        "task",
        "is not protobuf wire format (truncated)",
    )
    # a packed repeated enum with a cut varint
    assert blame(registry_pb2.RegisterRequest, bytes([4 << 3 | 2, 1, 0x80]))[0] == "task_types"
    # wire type 7 does not exist
    assert blame(intake_pb2.GetTaskRequest, bytes([2 << 3 | 7]))[1].startswith("is not protobuf wire format")


def test_valid_utf8_and_unknown_fields_are_not_blamed() -> None:
    data = field(1, spec(text="héllo 😀") + field(15, b"\xff"))  # unknown field 15 of TaskSpec: bytes, kept
    assert intake_pb2.SubmitRequest.FromString(data).task.text == "héllo 😀"
    assert locate(data, intake_pb2.SubmitRequest.DESCRIPTOR).field == WHOLE_REQUEST  # nothing to blame


def test_lenient_returns_a_marker_instead_of_raising() -> None:
    deserialize = lenient(intake_pb2.GetTaskRequest.FromString, intake_pb2.GetTaskRequest.DESCRIPTOR)
    assert deserialize(field(1, b"abc")).task_id == "abc"
    bad = deserialize(field(1, b"\xff"))
    assert isinstance(bad, Malformed) and bad.field == "task_id"
    status = bad.status()
    assert status.code == 3 and status.message == "task_id: is not valid UTF-8"


@pytest.mark.parametrize(
    ("value", "kwargs", "problem"),
    [
        ("a\x00b", {}, "must not contain U+0000"),
        ("ok\n", {"printable": True}, "must be printable"),
        ("\x00", {"printable": True}, "must be printable"),
        ("x" * 11, {"max_chars": 10}, "at most 10 characters"),
        ("é" * 6, {"max_bytes": 10}, "larger than 10 bytes"),
        ("\ud800", {"max_bytes": 3}, "lone surrogate"),
    ],
)
def test_text_problems(value: str, kwargs: dict[str, object], problem: str) -> None:
    found = text_problem(value, **kwargs)  # type: ignore[arg-type]
    assert found is not None and problem in found


@pytest.mark.parametrize("value", ["", "plain", "line\nbreaks\tand tabs", "加 微 信", "é" * 5])
def test_free_text_without_nul_is_fine(value: str) -> None:
    assert text_problem(value, max_bytes=10_000) is None


def test_shown_cuts_long_values() -> None:
    assert shown("short") == "'short'"
    assert shown("x" * 1_000_000) == repr("x" * 40) + "... (1000000 characters)"


def test_parse_uuid_reads_any_spelling_and_refuses_long_text_quoting_a_prefix() -> None:
    value = uuid.uuid4()
    for spelling in (str(value), str(value).upper(), "{" + str(value) + "}", "urn:uuid:" + str(value), value.hex):
        assert parse_uuid(spelling, "task_id") == value
    with pytest.raises(InvalidInput) as err:
        parse_uuid("-" * 10_000 + value.hex, "filter.task_id")
    assert err.value.field == "filter.task_id" and len(err.value.description) < 120
