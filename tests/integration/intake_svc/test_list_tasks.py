"""ListTasks against real intake servers with credentials (alice and bob are clients, ops an operator) and the real
PostgreSQL: 10 000 tasks paged through with and without filters, no duplicates and no gaps, newest first; a client
sees only its own tasks; bad filters and tokens are refused naming the field; each page is an index range scan."""

from __future__ import annotations

import itertools
import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import asyncpg
import grpc
import pytest
from redis.asyncio import Redis

from intake_svc import listing
from sieve.db import task_listing
from sieve.db.task_listing import TaskQuery, statement
from sieve.settings import Settings
from sieve.v1 import intake_pb2, types_pb2
from tests.security.test_tenants import Intake, as_, intake
from tests.support.tasks import text_spec

TASKS = 10_000
DEVICES = [f"AA:BB:CC:10:00:{d:02X}" for d in range(50)]
#: limits out of the way of TASKS queued at once (no worker runs them), and of their submit rate
ROOMY = {"max_total_pending": 20_000, "max_per_device_pending": 1000, "caller_submit_rate_per_s": 0.0}


async def everything(i: Intake, who: str, **filters: object) -> list[intake_pb2.Task]:
    """Every page of a query, in order."""
    out: list[intake_pb2.Task] = []
    token = ""
    while True:
        request = intake_pb2.ListTasksRequest(page_token=token, **filters)  # type: ignore[arg-type]
        reply = await i.stub.ListTasks(request, metadata=as_(who))
        out += reply.tasks
        if not reply.next_page_token:
            return out
        token = reply.next_page_token


async def refused(i: Intake, who: str, request: intake_pb2.ListTasksRequest) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await i.stub.ListTasks(request, metadata=as_(who))
    return err.value


async def seed(i: Intake) -> dict[str, dict[str, object]]:
    """alice submits TASKS tasks over 50 devices (every third labelled), bob 20; then some of alice's finish (their
    statuses and results written as a worker would). Returns each of alice's tasks' facts by id."""
    facts: dict[str, dict[str, object]] = {}
    for start in range(0, TASKS, 1000):
        specs = []
        for n in range(start, start + 1000):
            spec = text_spec(DEVICES[n % 50], f"task {n}")
            if n % 3 == 0:
                spec.labels.update({"batch": str(n % 4), "student_id": f"s-{n % 7}"})
            specs.append(spec)
        for n, item in zip(range(start, start + 1000), await i.batch("alice", specs), strict=True):
            assert item.code == 0, item.message
            facts[item.task.task_id] = {
                "n": n,
                "device": DEVICES[n % 50],
                "labels": dict(specs[n - start].labels),
                "status": "PENDING",
                "verdict": None,
            }
    for n in range(20):
        assert (await i.batch("bob", [text_spec(f"BB:BB:CC:10:00:{n:02X}", f"bob {n}")]))[0].code == 0
    done = [t for t, f in facts.items() if int(f["n"]) % 5 == 0]  # type: ignore[call-overload]
    verdicts = ["PASS", "BLOCK", "REVIEW"]
    await i.pg.execute("UPDATE tasks SET status = 'SUCCEEDED' WHERE id = ANY($1::uuid[])", done)
    await i.pg.executemany(
        "INSERT INTO results (task_id, verdict, hits, text, details, worker_id, attempt) "
        "VALUES ($1::uuid, $2, '[]'::jsonb, 'x', '{}'::jsonb, 'w', 1)",
        [(t, verdicts[int(facts[t]["n"]) % 3]) for t in done],  # type: ignore[call-overload]
    )
    for t in done:
        facts[t]["status"] = "SUCCEEDED"
        facts[t]["verdict"] = verdicts[int(facts[t]["n"]) % 3]  # type: ignore[call-overload]
    return facts


def ids_of(tasks: list[intake_pb2.Task]) -> list[str]:
    return [t.task_id for t in tasks]


def newest_first(ids: list[str]) -> bool:
    return all(uuid.UUID(a) > uuid.UUID(b) for a, b in itertools.pairwise(ids))


async def test_ten_thousand_tasks_page_through_with_filters_without_duplicates_or_gaps(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    async with intake(settings, redis, pg, **ROOMY) as i:
        facts = await seed(i)

        # Every one of alice's tasks, a page of 1 000 at a time: each once, newest first, none of bob's
        listed = await everything(i, "alice", page_size=1000)
        assert len(listed) == TASKS and set(ids_of(listed)) == set(facts) and newest_first(ids_of(listed))
        first = listed[0]
        assert (
            first.device_id == facts[first.task_id]["device"] and dict(first.labels) == facts[first.task_id]["labels"]
        )
        assert types_pb2.TaskStatus.Name(first.status) == "TASK_STATUS_" + str(facts[first.task_id]["status"])
        assert not first.history and not first.attempt_log  # (GetTask has them)

        # Filters, alone and together, in pages of an odd size
        def expect(check: object) -> set[str]:
            return {t for t, f in facts.items() if check(f)}  # type: ignore[operator]

        cases: list[tuple[dict[str, object], set[str]]] = [
            ({"device_id": "aa-bb-cc-10-00-07"}, expect(lambda f: f["device"] == DEVICES[7])),
            ({"labels": {"batch": "1"}}, expect(lambda f: f["labels"].get("batch") == "1")),
            (
                {"labels": {"batch": "2", "student_id": "s-3"}},
                expect(lambda f: f["labels"].get("batch") == "2" and f["labels"].get("student_id") == "s-3"),
            ),
            ({"statuses": [types_pb2.TASK_STATUS_SUCCEEDED]}, expect(lambda f: f["status"] == "SUCCEEDED")),
            (
                {"statuses": [types_pb2.TASK_STATUS_PENDING, types_pb2.TASK_STATUS_FAILED]},
                expect(lambda f: f["status"] == "PENDING"),
            ),
            ({"verdict": types_pb2.VERDICT_BLOCK}, expect(lambda f: f["verdict"] == "BLOCK")),
            (
                {"verdict": types_pb2.VERDICT_PASS, "device_id": DEVICES[0], "type": types_pb2.TASK_TYPE_TEXT},
                expect(lambda f: f["verdict"] == "PASS" and f["device"] == DEVICES[0]),
            ),
            ({"type": types_pb2.TASK_TYPE_OCR_IMAGE}, set()),
        ]
        for filters, expected in cases:
            got = ids_of(await everything(i, "alice", page_size=333, **filters))
            assert len(got) == len(set(got)) and set(got) == expected and newest_first(got), filters
            assert expected or filters.get("type"), filters  # (the sample holds tasks of every other case)

        # A created-at range: the tasks created in it, by their own records
        rows = await pg.fetch("SELECT id::text, created_at FROM tasks WHERE caller = 'alice' ORDER BY created_at")
        after, before = rows[2500]["created_at"], rows[7500]["created_at"]
        expected = {r["id"] for r in rows if after <= r["created_at"] < before}
        got = ids_of(
            await everything(i, "alice", page_size=700, created_after=_stamp(after), created_before=_stamp(before))
        )
        assert set(got) == expected and len(got) == len(expected) and expected

        # A verdict with the results shown
        blocked = await i.stub.ListTasks(
            intake_pb2.ListTasksRequest(verdict=types_pb2.VERDICT_BLOCK, page_size=5), metadata=as_("alice")
        )
        assert [t.result.verdict for t in blocked.tasks] == [types_pb2.VERDICT_BLOCK] * 5

        # Labels come back with the tasks
        labelled = await i.stub.ListTasks(
            intake_pb2.ListTasksRequest(labels={"batch": "3"}, page_size=3), metadata=as_("alice")
        )
        assert all(t.labels["batch"] == "3" and "student_id" in t.labels for t in labelled.tasks)


def _scans(node: object) -> Iterator[tuple[str, str, str]]:
    """(node type, index or relation, relation) of every scan of tasks in an EXPLAIN (FORMAT JSON) plan."""
    if isinstance(node, list):
        for item in node:
            yield from _scans(item)
    elif isinstance(node, dict):
        if "Scan" in str(node.get("Node Type", "")) and str(node.get("Relation Name", "")).startswith("tasks"):
            relation = str(node["Relation Name"])
            yield node["Node Type"], str(node.get("Index Name", relation)), relation
        for value in node.values():
            yield from _scans(value)


def _indexes(node: object) -> Iterator[str]:
    """Every index an EXPLAIN (FORMAT JSON) plan reads."""
    if isinstance(node, list):
        for item in node:
            yield from _indexes(item)
    elif isinstance(node, dict):
        if "Index Name" in node:
            yield str(node["Index Name"])
        for value in node.values():
            yield from _indexes(value)


def _stamp(moment: datetime) -> object:
    from google.protobuf import timestamp_pb2

    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(moment)
    return ts


async def test_a_client_sees_only_its_own_tasks_and_an_operator_sees_whose_it_asks(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    async with intake(settings, redis, pg, **ROOMY) as i:
        alice = [(await i.submit("alice", text_spec(DEVICES[n], f"a {n}"))).task.task_id for n in range(30)]
        bob = [(await i.submit("bob", text_spec(f"BB:BB:CC:10:01:{n:02X}", f"b {n}"))).task.task_id for n in range(7)]
        # a client lists its own, with or without naming itself, never another's, whatever the filters
        assert set(ids_of(await everything(i, "bob", page_size=2))) == set(bob)
        assert set(ids_of(await everything(i, "bob", caller="bob"))) == set(bob)
        assert ids_of(await everything(i, "bob", device_id=DEVICES[0])) == []
        err = await refused(i, "bob", intake_pb2.ListTasksRequest(caller="alice"))
        assert err.code() == grpc.StatusCode.PERMISSION_DENIED and "operators" in (err.details() or "")
        # an operator sees every caller's, or the caller it names
        assert set(ids_of(await everything(i, "ops", page_size=10))) == set(alice) | set(bob)
        assert set(ids_of(await everything(i, "ops", caller="alice"))) == set(alice)
        # and a token is good for its own query only: not for another caller's, not with other filters
        page = await i.stub.ListTasks(intake_pb2.ListTasksRequest(page_size=5), metadata=as_("alice"))
        assert page.next_page_token
        for who, request in (
            ("bob", intake_pb2.ListTasksRequest(page_token=page.next_page_token)),
            ("alice", intake_pb2.ListTasksRequest(page_token=page.next_page_token, device_id=DEVICES[1])),
            ("alice", intake_pb2.ListTasksRequest(page_token="bm90IGEgdG9rZW4")),
            ("alice", intake_pb2.ListTasksRequest(page_token="%%%")),
            ("alice", intake_pb2.ListTasksRequest(page_token="x" * 5000)),
        ):
            err = await refused(i, who, request)
            assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "page_token" in (err.details() or ""), request


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (intake_pb2.ListTasksRequest(page_size=1001), "page_size"),
        (intake_pb2.ListTasksRequest(device_id="not-a-mac"), "device_id"),
        (intake_pb2.ListTasksRequest(device_id="A" * 100_000), "device_id"),
        (intake_pb2.ListTasksRequest(statuses=[types_pb2.TASK_STATUS_UNSPECIFIED]), "statuses[0]"),
        (intake_pb2.ListTasksRequest(statuses=[types_pb2.TASK_STATUS_PENDING, 99]), "statuses[1]"),
        (intake_pb2.ListTasksRequest(type=7), "type"),  # type: ignore[arg-type]
        (intake_pb2.ListTasksRequest(verdict=9), "verdict"),  # type: ignore[arg-type]
        (intake_pb2.ListTasksRequest(labels={"bad key": "v"}), "labels"),
        (intake_pb2.ListTasksRequest(labels={"k": "v\x00"}), "labels[k]"),
        (intake_pb2.ListTasksRequest(labels={f"k{n}": "v" for n in range(17)}), "labels"),
        (intake_pb2.ListTasksRequest(caller="x" * 201), "caller"),
    ],
    ids=[
        "page-size",
        "device",
        "huge-device",
        "unspecified-status",
        "unknown-status",
        "type",
        "verdict",
        "label-key",
        "label-value",
        "too-many-labels",
        "caller",
    ],
)
async def test_bad_filters_are_refused_naming_the_field(
    settings: Settings, redis: Redis, pg: asyncpg.Pool, request_: intake_pb2.ListTasksRequest, field: str
) -> None:
    from sieve import rpc

    async with intake(settings, redis, pg, **ROOMY) as i:
        err = await refused(i, "ops", request_)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and rpc.bad_fields_of(err) == [field]


async def test_a_time_range_the_wrong_way_round_is_refused(settings: Settings, redis: Redis, pg: asyncpg.Pool) -> None:
    from sieve import rpc

    now = datetime.now(UTC)
    async with intake(settings, redis, pg, **ROOMY) as i:
        err = await refused(
            i,
            "alice",
            intake_pb2.ListTasksRequest(created_after=_stamp(now), created_before=_stamp(now - timedelta(hours=1))),  # type: ignore[arg-type]
        )
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and rpc.bad_fields_of(err) == ["created_before"]


async def test_very_selective_filters_read_a_bounded_window_per_page_and_still_find_everything(
    settings: Settings, redis: Redis, pg: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(task_listing, "MAX_EXAMINED", 100)
    async with intake(settings, redis, pg, **ROOMY) as i:
        specs = [text_spec(DEVICES[n % 5], f"t {n}") for n in range(450)]
        for n in (3, 222, 440):
            specs[n].labels["rare"] = "yes"
        items = await i.batch("alice", specs)
        wanted = {items[n].task.task_id for n in (3, 222, 440)}
        pages = []
        token = ""
        while True:
            reply = await i.stub.ListTasks(
                intake_pb2.ListTasksRequest(labels={"rare": "yes"}, page_size=10, page_token=token),
                metadata=as_("alice"),
            )
            pages.append(len(reply.tasks))
            token = reply.next_page_token
            if not token:
                break
        # a page reads at most 100 tasks: 450 take five windows, whose pages hold what each window had
        assert len(pages) == 5 and sum(pages) == 3
        assert set(ids_of(await everything(i, "alice", labels={"rare": "yes"}))) == wanted


async def test_each_page_is_an_index_range_scan_not_a_scan_of_the_table(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    async with intake(settings, redis, pg, **ROOMY) as i:
        # Given alice's 3 000 tasks among 30 000 of other callers
        for start in range(0, 3000, 1000):
            await i.batch("alice", [text_spec(DEVICES[n % 50], f"t {n}") for n in range(start, start + 1000)])
        await pg.execute(
            """
            INSERT INTO tasks (id, device, type, priority, status, caller, created_at, updated_at, expires_at,
                               enqueued_at, payload_text)
            SELECT (lpad(to_hex((extract(epoch FROM now()) * 1000)::bigint), 12, '0') || '7'
                    || substr(md5(i::text), 1, 3) || '8' || substr(md5(i::text), 4, 15))::uuid,
                   'CC:BB:CC:DD:' || lpad(to_hex(i % 256), 2, '0') || ':' || lpad(to_hex(i % 7), 2, '0'),
                   'TEXT', 3, 'SUCCEEDED', 'caller-' || (i % 10), now(), now(), now() + interval '1 hour', now(), 'x'
            FROM generate_series(1, 30000) AS i
            """
        )
        await pg.execute("ANALYZE tasks")
        # (the day partitions that hold rows: an empty one is scanned for nothing)
        holding = {r["part"] for r in await pg.fetch("SELECT DISTINCT tableoid::regclass::text AS part FROM tasks")}
        assert len(holding) == 1, holding  # every task of today, in today's partition
        shapes = {
            "tasks_caller_id": TaskQuery(caller="alice"),
            "tasks_device_id": TaskQuery(caller="alice", device=DEVICES[3], statuses=("PENDING",)),
            "labels": TaskQuery(caller="alice", labels={"batch": "1"}, verdict="BLOCK"),
        }
        for index, query in shapes.items():
            sql, args = statement(query, 100, uuid.UUID(int=(1 << 127)))
            plan = json.loads(await pg.fetchval("EXPLAIN (FORMAT JSON) " + sql, *args))
            scans = [(kind, on) for kind, on, relation in _scans(plan) if relation in holding]
            indexes = set(_indexes(plan))
            assert scans and all("Index" in kind or "Bitmap" in kind for kind, _ in scans), (index, scans)
            if index.startswith("tasks_"):  # the partition's own index of that name
                assert any(name.endswith(index.removeprefix("tasks_") + "_idx") for name in indexes), (index, indexes)
    assert listing.MAX_PAGE_SIZE == 1000
