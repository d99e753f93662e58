"""Property-based fuzzing of every request of the intake, scheduler and registry, against real servers.

Each test starts the servers in this process (`stack`: registry, scheduler and intake servers on loopback
ports, this test's own Redis prefix and PostgreSQL schema, no workers) and throws hypothesis-made
requests at it over a raw channel (`request_serializer` is the identity), so that a request may be any bytes:

- well-formed messages with random, oversized and nasty strings (U+0000, bidi controls, 300 000 characters),
  unknown enum values, extreme numbers (non-finite doubles, int64/uint64 limits, out-of-range durations) and
  huge repeated fields (1 001 batch items, 100 000 task types, 10 000 acks);
- the same messages with a string field set to invalid UTF-8 (a lone surrogate, an overlong NUL, a truncated
  sequence), written on the wire by hand: protobuf refuses them while parsing;
- random bytes.

Every answer must be OK or a clean status (CLEAN_CODES) — never UNKNOWN, INTERNAL or a hang — and nothing may be
half-written: after the run every unfinished task row has exactly one place in Redis (its device queue, a lease,
or the delayed set) and every task Redis holds has a row (`assert_consistent`); the registry still lists its
workers. The Pull stream is fuzzed in its first messages (hello with random ids and task types, credits, acks and
nacks with random task ids and tokens, draining).

Hypothesis runs in a thread (`drive`) while the servers run on the test's event loop; each example hands its
call to that loop. The number of examples run per RPC is printed at the end of each test (`pytest -s`).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import math
import os
import struct
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import asyncpg
import grpc
import pytest
from google.protobuf import descriptor_pool, message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from intake_svc.server import build as build_intake
from registry_svc.server import build as build_registry
from scheduler_svc.server import build as build_scheduler
from sieve import rpc
from sieve.db.tasks import OPEN_STATUSES
from sieve.observe import metrics
from sieve.redis.entry import Entry
from sieve.redis.queue_store import QueueStore
from sieve.rpc.auth import METHOD_ROLES
from sieve.rpc.readiness import Stores
from sieve.settings import Settings
from sieve.v1 import intake_pb2, intake_pb2_grpc, registry_pb2, scheduler_pb2, scheduler_pb2_grpc, types_pb2
from tests.support.redis import keys_matching
from tests.support.tasks import PNG

pytestmark = pytest.mark.timeout(240)

#: what a fuzzed request may be answered with
CLEAN_CODES = frozenset(
    {
        grpc.StatusCode.OK,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.OUT_OF_RANGE,
    }
)
#: examples per RPC (moderate: the whole file runs in well under a minute on two cores)
EXAMPLES = int(os.environ.get("SIEVE_FUZZ_EXAMPLES", "300"))
CALL_TIMEOUT_S = 20.0
FUZZ_TOP = int(os.environ.get("SIEVE_FUZZ_TOP", "4"))
#: examples run, by RPC (printed at the end of each test)
RAN: Counter[str] = Counter()
SECONDS: Counter[str] = Counter()
#: answers, by RPC and status code (printed with RAN)
ANSWERS: Counter[tuple[str, str]] = Counter()
#: refusals by RPC and message (the commonest are printed)
REFUSALS: Counter[tuple[str, str]] = Counter()

INTAKE = "/sieve.v1.IntakeService/"
SCHEDULER = "/sieve.v1.SchedulerService/"
REGISTRY = "/sieve.v1.RegistryService/"


# --- wire bytes written by hand ---------------------------------------------------------------------
def varint(value: int) -> bytes:
    out = bytearray()
    value &= (1 << 64) - 1
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def length_delimited(number: int, payload: bytes) -> bytes:
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def raw_field(path: tuple[int, ...], payload: bytes) -> bytes:
    """Bytes that set the field at `path` (field numbers from the request down) to raw `payload`; appended to a
    serialized message they merge into it (a later occurrence of a field is parsed like the first)."""
    data = length_delimited(path[-1], payload)
    for number in reversed(path[:-1]):
        data = length_delimited(number, data)
    return data


def _invalid_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


BAD_UTF8 = [
    b"\xff",
    b"\xc0\x80",
    b"\xed\xa0\x80",
    b"a\xed\xbf\xbfb",
    b"\xe4\xb8",
    b"ok\x80",
    b"\xf4\x90\x80\x80",
    b"\xfe\xfe\xff\xff",
    b"\xf0\x9f\x98",
]
bad_utf8 = st.one_of(st.sampled_from(BAD_UTF8), st.binary(min_size=1, max_size=24).filter(_invalid_utf8))


# --- values -----------------------------------------------------------------------------------------
NASTY = [
    "",
    " ",
    "\x00",
    "a\x00b",
    "\n",
    "\r\n",
    "\t",
    "\u202e",
    "\ufeff",
    "\uffff",
    "\U0010ffff",
    "😀",
    "%s%n",
    "' OR 1=1 --",
    "${jndi:x}",
    "{x}",
    "../../etc/passwd",
    "|",
    "||||||||||",
    "a|1|2|3",
    ":",
    "*",
    "\\",
    "NaN",
    "-1",
    "0",
    "null",
    "\u0085",
    "\u2028",
]
LONG = [100, 1_000, 70_000, 300_000]
strings = st.one_of(
    st.text(max_size=40),
    st.sampled_from(NASTY),
    st.builds(lambda ch, n: ch * n, st.sampled_from(["x", "\x00", "é", "😀", " ", "-"]), st.sampled_from(LONG)),
)
MACS = ["AA:BB:CC:DD:EE:01", "aa-bb-cc-dd-ee-02", "aabb.ccdd.ee03", "AABBCCDDEE04"]
macs = st.one_of(st.sampled_from(MACS), strings, st.sampled_from(MACS).map(lambda m: " " * 100 + m))
int32 = st.one_of(st.integers(-2, 8), st.sampled_from([-(2**31), 2**31 - 1]), st.integers(-(2**31), 2**31 - 1))
uint32 = st.one_of(st.integers(0, 8), st.sampled_from([2**32 - 1, 2**31]), st.integers(0, 2**32 - 1))
uint64 = st.one_of(st.integers(0, 8), st.sampled_from([2**64 - 1, 2**63, 2**60 + 1]), st.integers(0, 2**64 - 1))
doubles = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, -0.0, 50.0, 100.0]))
durations = st.tuples(
    st.one_of(
        st.integers(-5, 10), st.sampled_from([-(2**63), 2**63 - 1, 315_576_000_001]), st.integers(-(2**63), 2**63 - 1)
    ),
    st.one_of(st.integers(-2, 2), st.integers(-(2**31), 2**31 - 1)),
)
KEYS = ["k1", "k2", "k3"]  # few keys, so that keys are reused with other payloads
URLS = [
    "http://example.com/a.png",
    "https://example.com/x.jpg",
    "http://[::1",
    "http://127.0.0.1/x",
    "https://example.com:99999/",
    "http://a/\x00",
    "ftp://example.com/a.png",
    "http://%zz/",
    "http://exa mple.com/",
    "http://example.com/\n",
    "http://\u0130.com/",
    "http:///x",
    "http://[v1.x]/",
    "http://example.com:-1/",
]
urls = st.one_of(st.sampled_from(URLS), strings, strings.map(lambda s: "http://example.com/" + s))
ihdr = struct.pack(">I4sIIBBBBB", 13, b"IHDR", 40_001, 40_001, 8, 0, 0, 0, 0)
images = st.one_of(
    st.just(PNG),
    st.binary(max_size=64),
    st.binary(max_size=64).map(lambda b: PNG[:16] + b),
    st.just(b"\x89PNG\r\n\x1a\n" + ihdr + b"\x00" * 4),
    st.sampled_from([b"\xff\xd8\xff", b"BM", b"RIFF"]),
)
enum_values = st.one_of(st.integers(0, 6), int32)
task_ids = st.one_of(
    strings,
    st.uuids().map(str),
    st.builds(lambda u: "-" * 100 + u.hex, st.uuids()),
    st.uuids().map(lambda u: "urn:uuid:" + str(u).upper()),
)


# --- intake -----------------------------------------------------------------------------------------
@st.composite
def task_specs(draw: st.DrawFn) -> intake_pb2.TaskSpec:
    spec = intake_pb2.TaskSpec(device_id=draw(macs), type=draw(enum_values), priority=draw(enum_values))
    kind = draw(st.sampled_from(["text", "text", "image", "image_url", "none"]))
    if kind == "text":
        spec.text = draw(st.one_of(strings, st.sampled_from(["hello", "加 微 信", "a\x00b"])))
    elif kind == "image":
        spec.image = draw(images)
    elif kind == "image_url":
        spec.image_url = draw(urls)
    key = draw(st.one_of(st.none(), st.sampled_from(KEYS), strings))
    if key is not None:
        spec.idempotency_key = key
    if draw(st.booleans()):
        seconds, nanos = draw(durations)
        spec.ttl.seconds, spec.ttl.nanos = seconds, nanos
    if draw(st.booleans()):  # labels: plausible keys and nasty ones, any values, sometimes too many
        label_keys = st.one_of(st.sampled_from(["student_id", "a", "x/y.z-1", "k" * 63, "k" * 64]), strings)
        spec.labels.update(draw(st.dictionaries(label_keys, strings, max_size=20)))
    return spec


@st.composite
def plausible_specs(draw: st.DrawFn) -> intake_pb2.TaskSpec:
    """Specs that are mostly valid (so that tasks are accepted, deduplicated and refused for a reused key),
    with one field at a time made random."""
    spec = intake_pb2.TaskSpec(
        device_id=draw(st.sampled_from(MACS)),
        type=types_pb2.TASK_TYPE_TEXT,
        priority=draw(st.integers(0, 5)),
        text=draw(st.sampled_from(["hi", "加 微 信", "x"])),
    )
    if draw(st.booleans()):
        spec.idempotency_key = draw(st.sampled_from(KEYS))
    if draw(st.booleans()):
        spec.labels.update({"student_id": draw(st.sampled_from(["s-1", "s-2"]))})
    wild = draw(st.sampled_from(["none", "none", "text", "device", "key", "ttl", "image", "url", "labels"]))
    if wild == "labels":
        spec.labels.update(draw(st.dictionaries(strings, strings, max_size=4)))
    elif wild == "text":
        spec.text = draw(strings)
    elif wild == "device":
        spec.device_id = draw(macs)
    elif wild == "key":
        spec.idempotency_key = draw(strings)
    elif wild == "ttl":
        spec.ttl.seconds, spec.ttl.nanos = draw(durations)
    elif wild in ("image", "url"):
        spec.type = types_pb2.TASK_TYPE_OCR_IMAGE
        if wild == "image":
            spec.image = draw(images)
        else:
            spec.image_url = draw(urls)
    return spec


specs = st.one_of(plausible_specs(), plausible_specs(), plausible_specs(), task_specs())
SPEC_STRINGS = (1, 4, 6, 7)  # TaskSpec: device_id, text, image_url, idempotency_key


def request_bytes(
    message: st.SearchStrategy[Any], string_paths: tuple[tuple[int, ...], ...]
) -> st.SearchStrategy[bytes]:
    """Serialized messages, the same with a string field set to invalid UTF-8, and random bytes."""
    well_formed = message.map(lambda m: m.SerializeToString())
    choices = [well_formed, well_formed, well_formed, well_formed, st.binary(max_size=120)]
    if string_paths:
        choices.append(
            st.builds(
                lambda data, path, raw: data + raw_field(path, raw),
                well_formed,
                st.sampled_from(string_paths),
                bad_utf8,
            )
        )
    return st.one_of(*choices)


submit_requests = request_bytes(
    st.builds(lambda s: intake_pb2.SubmitRequest(task=s), specs), tuple((1, n) for n in SPEC_STRINGS)
)
batch_requests = request_bytes(
    st.one_of(
        st.lists(specs, max_size=5), plausible_specs().filter(lambda s: s.ByteSize() < 2000).map(lambda s: [s] * 1001)
    ).map(lambda specs: intake_pb2.SubmitBatchRequest(tasks=specs)),
    tuple((1, n) for n in SPEC_STRINGS),
)


def by_id(message_type: Any, known: list[str]) -> st.SearchStrategy[bytes]:
    ids = st.one_of(task_ids, st.sampled_from(known) if known else st.nothing())
    return request_bytes(ids.map(lambda t: message_type(task_id=t)), ((1,),))


# --- scheduler --------------------------------------------------------------------------------------
filters = st.builds(
    scheduler_pb2.DeadLetterFilter,
    task_id=st.one_of(st.just(""), task_ids),
    device_id=st.one_of(st.just(""), macs),
    type=enum_values,
    error_contains=st.one_of(st.just(""), strings),
)
FILTER_STRINGS = tuple((1, n) for n in (1, 2, 4))


WORKER_IDS = ["fuzz-worker", "fuzz/1", "fuzz/2"]


@st.composite
def pull_messages(draw: st.DrawFn, known: list[str]) -> tuple[list[bytes], float]:
    """The first messages of a Pull stream (1 to 3), each well-formed or with invalid UTF-8 in a string, and how
    long the stream stays open after them (mostly not at all; sometimes long enough to be handed tasks, which
    go back when it ends: after two such ends a task is a dead letter)."""
    worker_ids = st.one_of(st.sampled_from(WORKER_IDS), st.sampled_from(WORKER_IDS), strings)
    task_types = st.one_of(
        st.sampled_from([[1], [1, 2], [2]]),
        st.sampled_from([[1], [1, 2]]),
        st.lists(enum_values, max_size=4),
        st.just([1] * 100_000),
        st.just([1, 2, 1]),
    )
    lease_tokens = st.one_of(strings, st.integers(-(2**70), 2**70).map(str), st.uuids().map(str))
    ids = st.one_of(task_ids, st.sampled_from(known)) if known else task_ids
    out = []
    for i in range(draw(st.integers(1, 3))):
        message = scheduler_pb2.PullRequest()
        # mostly a hello first, as a first message must be
        if (i == 0 or draw(st.booleans())) and draw(st.integers(0, 9)) > 0:
            message.hello.worker_id = draw(worker_ids)
            message.hello.task_types.extend(draw(task_types))
            message.hello.gpu = draw(st.booleans())
        message.credits = draw(st.one_of(st.integers(0, 4), uint32))
        for _ in range(draw(st.sampled_from([0, 0, 1, 3]))):
            message.acks.add(task_id=draw(ids) if draw(st.booleans()) else "", lease_token=draw(lease_tokens))
        if draw(st.integers(0, 9)) == 0:  # a huge list: short entries (10 000 drawn strings would be gigabytes)
            short_ids = st.one_of(st.sampled_from(known), st.uuids().map(str)) if known else st.uuids().map(str)
            entry = scheduler_pb2.Ack(task_id=draw(short_ids), lease_token=draw(st.integers(0, 2**63).map(str)))
            message.acks.extend([entry] * 10_000)
        for _ in range(draw(st.integers(0, 2))):
            nack = message.nacks.add(
                task_id=draw(ids),
                lease_token=draw(lease_tokens),
                reason=draw(strings),
                count_attempt=draw(st.booleans()),
            )
            if draw(st.booleans()):
                nack.retry_after.seconds, nack.retry_after.nanos = draw(durations)
        message.draining = draw(st.integers(0, 9)) == 0
        data = message.SerializeToString()
        choice = draw(st.integers(0, 9))
        if choice == 0:
            data = draw(st.binary(max_size=60))
        elif choice == 1:
            path = draw(st.sampled_from([(1, 1), (3, 1), (3, 2), (4, 1), (4, 3)]))
            data += raw_field(path, draw(bad_utf8))
        out.append(data)
    return out, draw(st.sampled_from([0.0] * 8 + [0.05, 0.2]))


# --- registry ---------------------------------------------------------------------------------------
@st.composite
def resources(draw: st.DrawFn) -> registry_pb2.Resources:
    message = registry_pb2.Resources(
        gpu_available=draw(st.booleans()),
        gpu_count=draw(uint32),
        gpu_memory_total_bytes=draw(uint64),
        cpu_count=draw(uint32),
        memory_total_bytes=draw(uint64),
        memory_available_bytes=draw(uint64),
        active_tasks=draw(uint32),
    )
    for name in (
        "gpu_util_percent",
        "gpu_memory_percent",
        "cpu_percent",
        "memory_percent",
        "cpu_own_percent",
        "gpu_memory_own_percent",
        "cpu_platform_percent",
    ):
        if name in registry_pb2.Resources.DESCRIPTOR.fields_by_name:
            setattr(message, name, draw(st.one_of(doubles, st.floats(0, 100))))
    message.gpu_names.extend(draw(st.one_of(st.lists(strings, max_size=3), st.just(["NVIDIA H200"] * 10_000))))
    if "scope" in registry_pb2.Resources.DESCRIPTOR.fields_by_name:
        message.scope = draw(st.one_of(st.just("cpu=host,memory=host"), strings))
    return message


@st.composite
def plausible_resources(draw: st.DrawFn) -> registry_pb2.Resources:
    """Readings a sampler could send, with one field at a time made wild."""
    message = registry_pb2.Resources(
        cpu_count=draw(st.integers(1, 64)),
        cpu_percent=draw(st.floats(0, 100)),
        memory_total_bytes=2**34,
        memory_available_bytes=2**33,
        memory_percent=draw(st.floats(0, 100)),
        active_tasks=draw(st.integers(0, 4)),
    )
    if draw(st.booleans()):
        message.gpu_available, message.gpu_count = True, 1
        message.gpu_names.append("NVIDIA H200")
        message.gpu_memory_total_bytes = 2**37
    wild = draw(st.sampled_from(["none", "none", "all", "percent", "count", "names", "scope"]))
    if wild == "all":
        message.CopyFrom(draw(resources()))
    elif wild == "percent":
        setattr(
            message,
            draw(st.sampled_from(["cpu_percent", "memory_percent", "gpu_memory_percent", "gpu_util_percent"])),
            draw(doubles),
        )
    elif wild == "count":
        setattr(message, draw(st.sampled_from(["gpu_count", "cpu_count", "active_tasks"])), draw(uint32))
    elif wild == "names":
        message.gpu_names.extend(draw(st.lists(strings, max_size=3)))
    elif wild == "scope" and "scope" in registry_pb2.Resources.DESCRIPTOR.fields_by_name:
        message.scope = draw(strings)
    return message


worker_ids = st.one_of(st.sampled_from(WORKER_IDS), st.sampled_from([*WORKER_IDS, "w" * 200]), strings)
any_resources = st.one_of(plausible_resources(), plausible_resources(), resources())
register_requests = request_bytes(
    st.builds(
        lambda wid, host, pid, types, res, conc: registry_pb2.RegisterRequest(
            worker_id=wid, hostname=host, pid=pid, task_types=types, resources=res, concurrency=conc
        ),
        worker_ids,
        st.one_of(st.just("host-1"), st.just("host-1"), strings),
        uint32,
        st.one_of(
            st.sampled_from([[1], [1, 2], [2]]),
            st.sampled_from([[1], [2, 1]]),
            st.lists(enum_values, max_size=4),
            st.just([2] * 100_000),
            st.just([1, 1]),
        ),
        any_resources,
        st.one_of(st.integers(0, 8), uint32),
    ),
    ((1,), (2,), (5, 3), (5, 15)),
)
heartbeat_requests = request_bytes(
    st.builds(
        lambda wid, res, with_res: (
            registry_pb2.HeartbeatRequest(worker_id=wid, resources=res)
            if with_res
            else registry_pb2.HeartbeatRequest(worker_id=wid)
        ),
        worker_ids,
        any_resources,
        st.booleans(),
    ),
    ((1,), (2, 3)),
)
list_workers_requests = request_bytes(
    st.builds(registry_pb2.ListWorkersRequest, task_type=enum_values, available_only=st.booleans()), ()
)


# --- driving ----------------------------------------------------------------------------------------
class Caller:
    """Calls one server with raw request bytes from hypothesis' thread, on the test's event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, channel: grpc.aio.Channel) -> None:
        self.loop = loop
        self.channel = channel

    def run(self, coro: Coroutine[Any, Any, Any]) -> Any:
        began = time.perf_counter()
        try:
            return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=CALL_TIMEOUT_S + 10)
        finally:
            SECONDS["calls"] += time.perf_counter() - began

    def unary(self, method: str, data: bytes) -> tuple[grpc.StatusCode, bytes | None, str]:
        async def call() -> tuple[grpc.StatusCode, bytes | None, str]:
            rpc = self.channel.unary_unary(method, request_serializer=lambda b: b, response_deserializer=lambda b: b)
            try:
                return grpc.StatusCode.OK, await rpc(data, timeout=CALL_TIMEOUT_S), ""
            except grpc.aio.AioRpcError as exc:
                return exc.code(), None, exc.details() or ""

        return self.run(call())

    def server_stream(self, method: str, data: bytes, read_for_s: float) -> tuple[grpc.StatusCode, str]:
        """Reads a server stream for at most `read_for_s`; one still open then (a valid watch) counts as OK."""

        async def call() -> tuple[grpc.StatusCode, str]:
            rpc = self.channel.unary_stream(method, request_serializer=lambda b: b, response_deserializer=lambda b: b)
            stream = rpc(data, timeout=CALL_TIMEOUT_S)

            async def read_all() -> None:
                async for _ in stream:
                    pass

            try:
                await asyncio.wait_for(read_all(), read_for_s)
            except TimeoutError:
                return grpc.StatusCode.OK, ""  # wait_for cancelled the stream: it was still serving
            except grpc.aio.AioRpcError as exc:
                return exc.code(), exc.details() or ""
            return await stream.code(), await stream.details() or ""

        return self.run(call())

    def stream(self, method: str, messages: list[bytes], linger_s: float = 0.0) -> tuple[grpc.StatusCode, str]:
        async def call() -> tuple[grpc.StatusCode, str]:
            rpc = self.channel.stream_stream(method, request_serializer=lambda b: b, response_deserializer=lambda b: b)

            async def requests() -> AsyncIterator[bytes]:
                for message in messages:
                    yield message
                await asyncio.sleep(linger_s)

            # the messages go from an iterator, not write(): a write racing the server's end of the stream
            # fails on this side as INTERNAL (grpc/grpc#36066), while the iterator just stops being read
            stream = rpc(requests(), timeout=CALL_TIMEOUT_S)
            with contextlib.suppress(grpc.aio.AioRpcError):
                async for _ in stream:
                    pass
            return await stream.code(), await stream.details() or ""

        return self.run(call())


#: what grpc.aio's client reports when it was still sending on a stream the server had ended (grpc/grpc#36066):
#: the server's own status is then read from its metrics (`server_codes`)
CLIENT_SIDE_RACE = "Internal error from Core"


def check(method: str, code: grpc.StatusCode, details: str, *, stream: bool = False) -> None:
    name = method.rsplit("/", 1)[-1]
    RAN[name] += 1
    ANSWERS[name, code.name] += 1
    if code is not grpc.StatusCode.OK:
        REFUSALS[name, f"{code.name}: {details[:70]}"] += 1
    if stream and code is grpc.StatusCode.INTERNAL and details == CLIENT_SIDE_RACE:
        return
    assert code in CLEAN_CODES, f"{method} answered {code.name}: {details[:300]}"


def server_codes() -> Counter[tuple[str, str]]:
    """Every status the servers of this process answered so far, by method (their RPC metrics)."""
    counts: Counter[tuple[str, str]] = Counter()
    for metric in metrics.REGISTRY.collect():
        for sample in metric.samples:
            if sample.name == "sieve_grpc_server_handled_total":
                counts[sample.labels["grpc_method"], sample.labels["grpc_code"]] += int(sample.value)
    return counts


def assert_servers_answered_cleanly(before: Counter[tuple[str, str]]) -> None:
    """No server answered UNKNOWN or INTERNAL (nor anything else unclean) since `before`."""
    after = server_codes()
    unclean = {
        key: n - before[key]
        for key, n in after.items()
        if n > before[key] and key[1] not in {c.name for c in CLEAN_CODES} | {"CANCELLED"}
    }
    assert not unclean, f"servers answered: {unclean}"


def fuzz(strategy: st.SearchStrategy[Any], examples: int = EXAMPLES) -> Callable[[Callable[[Any], None]], Any]:
    """`@given(strategy)` with this file's settings: no deadline, no example database, no health checks
    (requests are large on purpose)."""

    def decorate(body: Callable[[Any], None]) -> Any:
        return hypothesis_settings(
            max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck)
        )(given(strategy)(body))

    return decorate


async def drive(*runs: Callable[[], None]) -> None:
    """Runs hypothesis tests one after the other in a thread (the servers keep this loop); then checks what the
    servers themselves answered."""

    def all_runs() -> None:
        for run in runs:
            run()

    for counter in (RAN, ANSWERS, REFUSALS, SECONDS):
        counter.clear()
    before = server_codes()
    await asyncio.to_thread(all_runs)
    assert_servers_answered_cleanly(before)


def report(title: str, names: list[str]) -> None:
    print(f"\n[fuzz] {title}: {sum(SECONDS.values()):.1f} s waiting for answers")
    print(f"[fuzz] {title}: examples " + ", ".join(f"{name} {RAN[name]}" for name in names))
    for name in names:
        codes = sorted((code, n) for (rpc_name, code), n in ANSWERS.items() if rpc_name == name)
        print(f"[fuzz]   {name}: " + ", ".join(f"{code} {n}" for code, n in codes))
        common = sorted(((n, why) for (rpc_name, why), n in REFUSALS.items() if rpc_name == name), reverse=True)
        for n, why in common[:FUZZ_TOP]:
            print(f"[fuzz]     {n:4d} x {why}")


# --- state after the run ------------------------------------------------------------------------------
async def assert_consistent(platform: Stack) -> None:
    """Every unfinished task row has exactly one place in Redis (queue, lease or delayed set); every task in
    Redis has a row."""
    rows = await platform.pg.fetch("SELECT id::text AS id, device, status FROM tasks")
    every = {r["id"] for r in rows}
    unfinished = {r["id"] for r in rows if r["status"] in OPEN_STATUSES}
    keys = platform.queues.keys
    devices = {r["device"] for r in rows}
    for key in await keys_matching(platform.redis, keys.queue_pattern):
        devices.add(key.removeprefix(keys.queue_pattern.rstrip("*")).rsplit(":", 1)[0])
    places: Counter[str] = Counter()
    for mac in devices:
        places.update(e.task_id for e in await platform.queues.queued(mac))
    places.update(await platform.redis.hkeys(keys.lease_data))
    for member in await platform.redis.zrange(keys.delayed, 0, -1):
        places[Entry.decode(member.partition("|")[2]).task_id] += 1
    misplaced = {t: places[t] for t in unfinished if places[t] != 1}
    assert not misplaced, f"unfinished tasks not in exactly one place in Redis: {list(misplaced.items())[:5]}"
    orphans = set(places) - every
    assert not orphans, f"tasks in Redis without a row: {sorted(orphans)[:5]}"
    statuses = Counter(r["status"] for r in rows)
    dead = await platform.redis.llen(keys.dead_letters)
    print(f"[fuzz] state: rows {dict(statuses)}, places in Redis {sum(places.values())}, dead letters {dead}")


@dataclass
class Stack:
    """The three servers of one test and what they stand on."""

    settings: Settings
    addresses: dict[str, str]
    queues: QueueStore
    pg: asyncpg.Pool
    redis: Redis

    def channel(self, service: str) -> grpc.aio.Channel:
        return rpc.channel(self.addresses[service], self.settings)


@pytest.fixture
async def stack(settings: Settings, redis: Redis, pg: asyncpg.Pool) -> AsyncIterator[Stack]:
    """Registry, scheduler and intake servers without workers; dead letters come quickly (two attempts, short
    retry delays)."""
    settings = settings.replace(max_attempts=2, retry_backoff_base_s=0.01, retry_backoff_max_s=0.05)
    registry_app = await build_registry(settings, Stores.of(redis=redis))
    registry = await rpc.create_server(registry_app.service, "127.0.0.1:0", settings)
    settings = settings.replace(registry_addr=f"127.0.0.1:{registry.port}")
    scheduler_service = (await build_scheduler(settings, Stores.of(redis=redis, pool=pg))).service
    scheduler = await rpc.create_server(scheduler_service, "127.0.0.1:0", settings)
    settings = settings.replace(scheduler_addr=f"127.0.0.1:{scheduler.port}")
    intake_app = await build_intake(settings, Stores.of(redis=redis, pool=pg))
    intake = await rpc.create_server(intake_app.service, "127.0.0.1:0", settings)
    addresses = {
        "sieve.v1.IntakeService": f"127.0.0.1:{intake.port}",
        "sieve.v1.SchedulerService": settings.scheduler_addr,
        "sieve.v1.RegistryService": settings.registry_addr,
        "sieve.v1.JobsService": settings.scheduler_addr,  # every server serves it; the scheduler has jobs
        "sieve.v1.LexiconService": f"127.0.0.1:{intake.port}",
    }
    try:
        yield Stack(settings, addresses, QueueStore(redis, settings), pg, redis)
    finally:
        for server in (intake, scheduler, registry):
            await server.stop(1)


# --- the tests ----------------------------------------------------------------------------------------
async def test_intake_answers_every_request_cleanly_and_leaves_nothing_half_written(stack: Stack) -> None:
    channel = stack.channel("sieve.v1.IntakeService")
    caller = Caller(asyncio.get_running_loop(), channel)
    known: list[str] = []

    def remember(data: bytes | None) -> None:
        if data:
            reply = intake_pb2.SubmitResponse.FromString(data)
            if reply.task.task_id and len(known) < 50:
                known.append(reply.task.task_id)

    @fuzz(submit_requests)
    def submit(data: bytes) -> None:
        code, reply, details = caller.unary(INTAKE + "Submit", data)
        check("Submit", code, details)
        remember(reply)

    @fuzz(batch_requests)
    def submit_batch(data: bytes) -> None:
        code, reply, details = caller.unary(INTAKE + "SubmitBatch", data)
        check("SubmitBatch", code, details)
        if reply:
            for item in intake_pb2.SubmitBatchResponse.FromString(reply).items:
                assert item.code in {c.value[0] for c in CLEAN_CODES}, item

    def by_task_id(method: str, message_type: Any) -> Callable[[], None]:
        @fuzz(st.deferred(lambda: by_id(message_type, known)))
        def run(data: bytes) -> None:
            code, _, details = caller.unary(INTAKE + method, data)
            check(method, code, details)

        return run

    try:
        await drive(
            submit,
            submit_batch,
            by_task_id("GetTask", intake_pb2.GetTaskRequest),
            by_task_id("CancelTask", intake_pb2.CancelTaskRequest),
        )
    finally:
        await channel.close()
    report("intake", ["Submit", "SubmitBatch", "GetTask", "CancelTask"])
    assert RAN["Submit"] >= EXAMPLES // 2 and known, "the fuzzer should have had some tasks accepted"
    await asyncio.sleep(0.3)
    await assert_consistent(stack)


async def test_scheduler_answers_every_request_and_stream_cleanly(stack: Stack) -> None:
    # tasks to hand out on fuzzed streams (which take them and end: after two attempts they are dead letters)
    intake = stack.channel("sieve.v1.IntakeService")
    specs = [
        intake_pb2.TaskSpec(device_id=MACS[i % 4], type=types_pb2.TASK_TYPE_TEXT, text=f"task {i}") for i in range(30)
    ]
    reply = await intake_pb2_grpc.IntakeServiceStub(intake).SubmitBatch(intake_pb2.SubmitBatchRequest(tasks=specs))
    known = [item.task.task_id for item in reply.items]
    await intake.close()
    channel = stack.channel("sieve.v1.SchedulerService")
    caller = Caller(asyncio.get_running_loop(), channel)

    @fuzz(request_bytes(st.just(scheduler_pb2.GetWatermarkRequest()), ()), examples=EXAMPLES // 3)
    def get_watermark(data: bytes) -> None:
        code, _, details = caller.unary(SCHEDULER + "GetWatermark", data)
        check("GetWatermark", code, details)

    def dead_letters(method: str, build: Callable[..., Any]) -> Callable[[], None]:
        @fuzz(request_bytes(st.builds(build, filters, st.one_of(uint32, st.booleans())), FILTER_STRINGS))
        def run(data: bytes) -> None:
            code, _, details = caller.unary(SCHEDULER + method, data)
            check(method, code, details)

        return run

    @fuzz(pull_messages(known))
    def pull(case: tuple[list[bytes], float]) -> None:
        code, details = caller.stream(SCHEDULER + "Pull", *case)
        check("Pull", code, details, stream=True)

    try:
        await drive(
            get_watermark,
            pull,
            dead_letters("ListDeadLetters", lambda f, n: scheduler_pb2.ListDeadLettersRequest(filter=f, limit=int(n))),
            dead_letters(
                "RequeueDeadLetters", lambda f, a: scheduler_pb2.RequeueDeadLettersRequest(filter=f, all=bool(a))
            ),
            dead_letters("PurgeDeadLetters", lambda f, a: scheduler_pb2.PurgeDeadLettersRequest(filter=f, all=bool(a))),
        )
    finally:
        await channel.close()
    report("scheduler", ["GetWatermark", "Pull", "ListDeadLetters", "RequeueDeadLetters", "PurgeDeadLetters"])
    await asyncio.sleep(0.5)
    await assert_consistent(stack)


async def test_registry_answers_every_request_cleanly_and_still_lists_its_workers(stack: Stack) -> None:
    channel = stack.channel("sieve.v1.RegistryService")
    caller = Caller(asyncio.get_running_loop(), channel)

    def unary(method: str, strategy: st.SearchStrategy[bytes]) -> Callable[[], None]:
        @fuzz(strategy)
        def run(data: bytes) -> None:
            code, _, details = caller.unary(REGISTRY + method, data)
            check(method, code, details)

        return run

    try:
        await drive(
            unary("Register", register_requests),
            unary("Heartbeat", heartbeat_requests),
            unary("ListWorkers", list_workers_requests),
        )
        # whatever was stored reads back: every record lists
        code, reply, details = await asyncio.to_thread(
            caller.unary, REGISTRY + "ListWorkers", registry_pb2.ListWorkersRequest().SerializeToString()
        )
        assert code == grpc.StatusCode.OK, details
        for worker in registry_pb2.ListWorkersResponse.FromString(reply or b"").workers:
            assert worker.worker_id and len(worker.worker_id) <= 200
            assert all(math.isfinite(v) for v in (worker.resources.cpu_percent, worker.resources.memory_percent))
    finally:
        await channel.close()
    report("registry", ["Register", "Heartbeat", "ListWorkers"])


_SCALARS: dict[int, st.SearchStrategy[Any]] = {
    FieldDescriptor.TYPE_STRING: st.one_of(strings, st.sampled_from(MACS), st.uuids().map(str)),
    FieldDescriptor.TYPE_BYTES: st.binary(max_size=64),
    FieldDescriptor.TYPE_BOOL: st.booleans(),
    FieldDescriptor.TYPE_DOUBLE: doubles,
    FieldDescriptor.TYPE_FLOAT: st.floats(width=32),
    FieldDescriptor.TYPE_INT32: int32,
    FieldDescriptor.TYPE_SINT32: int32,
    FieldDescriptor.TYPE_SFIXED32: int32,
    FieldDescriptor.TYPE_UINT32: uint32,
    FieldDescriptor.TYPE_FIXED32: uint32,
    FieldDescriptor.TYPE_INT64: st.integers(-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: st.integers(-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: st.integers(-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT64: uint64,
    FieldDescriptor.TYPE_FIXED64: uint64,
    FieldDescriptor.TYPE_ENUM: enum_values,
}


@st.composite
def any_message(draw: st.DrawFn, descriptor: Descriptor, depth: int = 0) -> bytes:
    """A well-formed message of any type, from its descriptor: every field set or not, strings nasty, numbers
    extreme, enums unknown, repeated fields short (a request of a later RPC is fuzzed without a strategy of
    its own)."""
    message = message_factory.GetMessageClass(descriptor)()
    for field in descriptor.fields:
        if not draw(st.booleans()):
            continue
        entry = field.message_type if field.type == FieldDescriptor.TYPE_MESSAGE else None
        if entry is not None and entry.GetOptions().map_entry:  # map<scalar, scalar>: a few nasty pairs
            key, value = entry.fields_by_name["key"], entry.fields_by_name["value"]
            if value.type != FieldDescriptor.TYPE_MESSAGE:
                pairs = draw(st.dictionaries(_SCALARS[key.type], _SCALARS[value.type], max_size=3))
                getattr(message, field.name).update(pairs)
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            if depth >= 3:
                continue
            count = draw(st.integers(1, 3)) if field.label == FieldDescriptor.LABEL_REPEATED else 1
            for _ in range(count):
                inner = draw(any_message(field.message_type, depth + 1))
                target = getattr(message, field.name)
                (target.add() if field.label == FieldDescriptor.LABEL_REPEATED else target).MergeFromString(inner)
        elif field.label == FieldDescriptor.LABEL_REPEATED:
            getattr(message, field.name).extend(draw(st.lists(_SCALARS[field.type], max_size=3)))
        else:
            setattr(message, field.name, draw(_SCALARS[field.type]))
    return message.SerializeToString()


async def test_every_unary_method_answers_any_message_and_random_bytes_cleanly(stack: Stack) -> None:
    """Every unary method the roles table names (later RPCs included): messages built from its request's
    descriptor, and random bytes."""
    addresses = stack.addresses
    channels = {name: stack.channel(name) for name in addresses}
    loop = asyncio.get_running_loop()
    methods = sorted(
        m
        for m in METHOD_ROLES
        if m.split("/")[1] in addresses and not m.endswith("/Pull") and not m.endswith("/WatchTask")
    )

    requests = {m: _input_type(m) for m in methods}
    cases = st.sampled_from(methods).flatmap(
        lambda m: st.tuples(
            st.just(m), st.one_of(any_message(requests[m]), any_message(requests[m]), st.binary(max_size=200))
        )
    )

    @fuzz(cases, examples=3 * EXAMPLES)
    def run(case: tuple[str, bytes]) -> None:
        method, data = case
        caller = Caller(loop, channels[method.split("/")[1]])
        code, _, details = caller.unary(method, data)
        check(method, code, details)

    try:
        await drive(run)
    finally:
        for channel in channels.values():
            await channel.close()
    report("any message", sorted({m.rsplit("/", 1)[-1] for m in methods}))
    await asyncio.sleep(0.3)
    await assert_consistent(stack)


async def test_watch_task_answers_any_message_and_random_bytes_cleanly(stack: Stack) -> None:
    """WatchTask (server streaming): messages built from its request's descriptor, made-up cursors, random bytes.
    Each stream ends with a clean status, or is still serving (a valid watch) when the client goes."""
    loop = asyncio.get_running_loop()
    channel = stack.channel("sieve.v1.IntakeService")
    caller = Caller(loop, channel)
    watch = INTAKE + "WatchTask"
    cursors = st.one_of(
        st.text(max_size=40),
        st.builds(
            lambda a, b, c, d: base64.urlsafe_b64encode(f"w3;{a}:{b}:;{a}:{c}:;{d};".encode()).decode(),
            st.integers(-5, 2**64),
            st.integers(-5, 2**64),
            st.integers(-5, 2**64),
            st.integers(-5, 2**64),
        ),
    )
    cases = st.one_of(
        any_message(_input_type(watch)),
        st.builds(lambda c: intake_pb2.WatchTaskRequest(cursor=c).SerializeToString(), cursors),
        st.binary(max_size=200),
    )

    @fuzz(cases, examples=max(20, EXAMPLES // 5))
    def run(data: bytes) -> None:
        code, details = caller.server_stream(watch, data, read_for_s=0.15)
        check("WatchTask", code, details)

    try:
        await drive(run)
    finally:
        await channel.close()
    report("watch", ["WatchTask"])


async def test_a_nack_reason_postgresql_cannot_store_leaves_nothing_half_written(stack: Stack) -> None:
    """A worker's nack reason goes into the task's history and, at its last attempt, its error: one with U+0000
    (which PostgreSQL text cannot hold) must still leave the task in exactly one place."""
    intake = stack.channel("sieve.v1.IntakeService")
    await intake_pb2_grpc.IntakeServiceStub(intake).Submit(
        intake_pb2.SubmitRequest(task=intake_pb2.TaskSpec(device_id=MACS[0], type=types_pb2.TASK_TYPE_TEXT, text="x"))
    )
    await intake.close()
    channel = stack.channel("sieve.v1.SchedulerService")
    stub = scheduler_pb2_grpc.SchedulerServiceStub(channel)
    try:
        for _ in range(2):  # two counted attempts: the second nack dead-letters it
            call = stub.Pull()
            hello = scheduler_pb2.PullRequest(credits=1)
            hello.hello.worker_id, hello.hello.task_types[:] = "fuzz-worker", [types_pb2.TASK_TYPE_TEXT]
            await call.write(hello)
            assignment = (await asyncio.wait_for(call.read(), CALL_TIMEOUT_S)).batch.assignments[0]
            await call.write(
                scheduler_pb2.PullRequest(
                    nacks=[
                        scheduler_pb2.Nack(
                            task_id=assignment.task_id,
                            lease_token=assignment.lease_token,
                            reason="bad\x00reason",
                            count_attempt=True,
                        )
                    ]
                )
            )
            await asyncio.sleep(0.3)
            await call.done_writing()
            with contextlib.suppress(grpc.aio.AioRpcError):
                while await call.read() is not grpc.aio.EOF:
                    pass
            assert await call.code() in CLEAN_CODES
            await asyncio.sleep(0.2)
    finally:
        await channel.close()
    await assert_consistent(stack)


def _input_type(method: str) -> Descriptor:
    service, name = method.strip("/").split("/")
    found: Descriptor = descriptor_pool.Default().FindServiceByName(service).FindMethodByName(name).input_type
    return found


def test_raw_field_builds_the_bytes_protobuf_reads() -> None:
    """The hand-written wire bytes mean what this file says they mean (a check of the fuzzer itself)."""
    spec = intake_pb2.TaskSpec(device_id="AA:BB:CC:DD:EE:01", type=types_pb2.TASK_TYPE_TEXT, text="a")
    data = intake_pb2.SubmitRequest(task=spec).SerializeToString() + raw_field((1, 4), "héllo".encode())
    assert intake_pb2.SubmitRequest.FromString(data).task.text == "héllo"
    with pytest.raises(Exception, match="Error parsing"):
        intake_pb2.SubmitRequest.FromString(data + raw_field((1, 4), b"\xed\xa0\x80"))
    assert uuid.UUID(str(uuid.uuid4()))
