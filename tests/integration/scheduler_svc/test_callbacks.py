"""Completion callbacks through the real intake, scheduler and worker, into a real HTTP receiver on loopback: each
final task is POSTed once accepted, signed (HMAC-SHA256 over timestamp and body) with the caller's secret, with its
status, verdict, hits and labels; failed attempts are retried with backoff and shown by GetTask; 410 and the end of
the retry period give up; a caller's default URL applies to tasks that name none; bad callback URLs are refused
naming the field and change nothing."""

from __future__ import annotations

import asyncio
import contextlib
import time
from datetime import UTC, datetime, timedelta

import asyncpg
import grpc
import pytest
from aiohttp import web
from redis.asyncio import Redis

from scheduler_svc.callbacks import CallbackNotifier
from sieve.db.callbacks import CallbackStore
from sieve.db.tasks import NewTask, TaskStore
from sieve.ids import uuid7
from sieve.settings import Settings
from sieve.v1 import intake_pb2, types_pb2
from tests.support.platform import Platform, platform_with, wait_final
from tests.support.receiver import callback_receiver, serving
from tests.support.tasks import text_spec

SECRET = "s3cret-of-anonymous"
LOOPBACK = {"outbound_allow_private_nets": "127.0.0.0/8", "callback_secrets": f"anonymous={SECRET}"}
QUICK = {"callback_backoff_base_s": 0.05, "callback_backoff_max_s": 0.2}
DELIVERED = types_pb2.CallbackDelivery.STATE_DELIVERED
GAVE_UP = types_pb2.CallbackDelivery.STATE_GAVE_UP


async def wait_deliveries(p: Platform, task_id: str, state: int, timeout_s: float = 15) -> types_pb2.Task:
    deadline = time.monotonic() + timeout_s
    while True:
        task = (await p.intake.GetTask(intake_pb2.GetTaskRequest(task_id=task_id))).task
        if task.deliveries and all(d.state == state for d in task.deliveries):
            return task
        assert time.monotonic() < deadline, f"deliveries of {task_id}: {task.deliveries}"
        await asyncio.sleep(0.05)


async def cancelled_with_callback(pg: asyncpg.Pool, device: str, url: str) -> None:
    """A text task with a callback to `url`, recorded and then CANCELLED: one delivery due now."""
    store = TaskStore(pg)
    now = datetime.now(UTC)
    task = NewTask(
        uuid7(),
        device,
        types_pb2.TASK_TYPE_TEXT,
        3,
        "anonymous",
        now,
        now + timedelta(hours=1),
        text="x",
        callback_url=url,
    )
    await store.insert([task])
    await store.transition([task.task_id], "CANCELLED", "cancelled")


async def test_each_final_task_is_posted_once_accepted_signed_and_retried_after_failures(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    async with (
        callback_receiver(SECRET.encode(), fail_first=3) as receiver,
        platform_with(settings, redis, pg, workers=1, **LOOPBACK, **QUICK) as p,
    ):
        ids = []
        for n in range(20):
            spec = text_spec(f"AA:BB:CC:30:00:{n % 4:02X}", "赌博 here" if n % 2 else "clean", labels={"n": str(n)})
            spec.callback_url = receiver.url
            ids.append((await p.intake.Submit(intake_pb2.SubmitRequest(task=spec))).task.task_id)
        tasks = [await wait_deliveries(p, t, DELIVERED) for t in ids]

        assert receiver.accepted_per_task() == dict.fromkeys(ids, 1)  # exactly one accepted each
        assert len(receiver.received) == 4 * len(ids)  # three 503s, then the 200
        assert receiver.all_signed()
        for task in tasks:
            (delivery,) = task.deliveries
            assert (delivery.attempts, delivery.last_http_status, delivery.url) == (4, 200, receiver.url)
            assert delivery.status == types_pb2.TASK_STATUS_SUCCEEDED and delivery.HasField("delivered_at")
            assert delivery.delivery_id == f"{task.task_id}/{len(task.history)}"
        # every attempt of a delivery sent the same body; the body tells the outcome
        for delivery_id in {r.delivery_id for r in receiver.received}:
            bodies = {r.body for r in receiver.received if r.delivery_id == delivery_id}
            assert len(bodies) == 1
        for r in receiver.accepted():
            body = r.payload
            n = int(body["labels"]["n"])
            assert body["status"] == "SUCCEEDED" and body["delivery_id"] == r.delivery_id
            assert body["verdict"] == ("BLOCK" if n % 2 else "PASS"), body
            assert [h["word"] for h in body["hits"]] == (["赌博"] if n % 2 else [])
            assert body["device_id"] == f"AA:BB:CC:30:00:{n % 4:02X}" and body["attempt"] == 1
        # attempts are spaced by the backoff (base 0.05 s doubling), not sent back to back
        one = sorted(r.at for r in receiver.received if r.delivery_id == receiver.received[0].delivery_id)
        assert one[-1] - one[0] >= 0.05 + 0.1 + 0.2 - 0.1


async def test_a_receiver_answering_410_is_given_up_at_once(settings: Settings, redis: Redis, pg: asyncpg.Pool) -> None:
    async with (
        callback_receiver(SECRET.encode()) as receiver,
        platform_with(settings, redis, pg, workers=1, **LOOPBACK, **QUICK) as p,
    ):
        spec = text_spec("AA:BB:CC:31:00:01", "x", callback_url=receiver.url)
        task_id = (await p.intake.Submit(intake_pb2.SubmitRequest(task=spec))).task.task_id
        receiver.always[task_id] = 410
        task = await wait_deliveries(p, task_id, GAVE_UP)
        assert (task.deliveries[0].attempts, task.deliveries[0].last_http_status) == (1, 410)
        assert "410" in task.deliveries[0].last_error


async def test_a_delivery_is_given_up_when_the_retry_period_has_passed(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    async with (
        callback_receiver(SECRET.encode(), fail_first=1000) as receiver,
        platform_with(settings, redis, pg, workers=1, callback_retry_period_s=0.5, **LOOPBACK, **QUICK) as p,
    ):
        spec = text_spec("AA:BB:CC:32:00:01", "x", callback_url=receiver.url)
        task_id = (await p.intake.Submit(intake_pb2.SubmitRequest(task=spec))).task.task_id
        task = await wait_deliveries(p, task_id, GAVE_UP)
        (delivery,) = task.deliveries
        assert delivery.attempts >= 2 and delivery.last_http_status == 503
        assert not delivery.HasField("delivered_at") and receiver.accepted() == []


async def test_a_cancelled_task_is_posted_too_and_a_callers_default_url_applies(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    async with callback_receiver(SECRET.encode()) as receiver:
        defaults = {"callback_default_urls": f"anonymous={receiver.url}"}
        async with platform_with(settings, redis, pg, workers=0, **LOOPBACK, **QUICK, **defaults) as p:
            task = (await p.intake.Submit(intake_pb2.SubmitRequest(task=text_spec("AA:BB:CC:33:00:01", "x")))).task
            assert task.callback_url == receiver.url
            await p.intake.CancelTask(intake_pb2.CancelTaskRequest(task_id=task.task_id))
            done = await wait_deliveries(p, task.task_id, DELIVERED)
            assert done.deliveries[0].status == types_pb2.TASK_STATUS_CANCELLED
            (posted,) = receiver.accepted()
            assert posted.payload["status"] == "CANCELLED" and "verdict" not in posted.payload


async def test_a_task_without_a_callback_url_is_posted_nowhere(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    async with (
        callback_receiver(SECRET.encode()) as receiver,
        platform_with(settings, redis, pg, workers=1, **LOOPBACK, **QUICK) as p,
    ):
        task_id = (await p.intake.Submit(intake_pb2.SubmitRequest(task=text_spec("AA:BB:CC:34:00:01", "x")))).task
        final = await wait_final(p.intake, task_id.task_id)
        assert final.status == types_pb2.TASK_STATUS_SUCCEEDED and not final.deliveries
        assert await pg.fetchval("SELECT count(*) FROM callback_deliveries") == 0
        assert receiver.received == []


@pytest.mark.parametrize(
    ("url", "secrets", "problem"),
    [
        ("ftp://example.com/hook", f"anonymous={SECRET}", "http(s) URL"),
        ("http://127.0.0.1:1/hook", f"anonymous={SECRET}", "public"),
        ("http://10.0.0.1/hook", f"anonymous={SECRET}", "public"),
        ("https://user:pw@example.com/hook", f"anonymous={SECRET}", "user name"),
        ("https://example.com/\nhook", f"anonymous={SECRET}", ""),
        ("https://example.com/" + "a" * 2100, f"anonymous={SECRET}", ""),
        ("https://example.com/hook", "", "no callback secret"),
        ("https://example.com/hook", "someone-else=x", "no callback secret"),
    ],
)
async def test_a_bad_callback_url_is_refused_naming_the_field_and_records_nothing(
    settings: Settings, redis: Redis, pg: asyncpg.Pool, url: str, secrets: str, problem: str
) -> None:
    async with platform_with(settings, redis, pg, workers=0, callback_secrets=secrets) as p:
        spec = text_spec("AA:BB:CC:35:00:01", "x", callback_url=url)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await p.intake.Submit(intake_pb2.SubmitRequest(task=spec))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.value.details().startswith("task.callback_url: ") and problem in err.value.details()
        assert await pg.fetchval("SELECT count(*) FROM tasks") == 0


async def test_the_same_idempotent_submit_with_another_callback_url_is_a_conflict(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    async with platform_with(settings, redis, pg, workers=0, callback_secrets=f"anonymous={SECRET}") as p:
        first = text_spec("AA:BB:CC:36:00:01", "x", idempotency_key="k", callback_url="https://example.com/a")
        again = text_spec("AA:BB:CC:36:00:01", "x", idempotency_key="k", callback_url="https://example.com/a")
        other = text_spec("AA:BB:CC:36:00:01", "x", idempotency_key="k", callback_url="https://example.com/b")
        created = await p.intake.Submit(intake_pb2.SubmitRequest(task=first))
        repeated = await p.intake.Submit(intake_pb2.SubmitRequest(task=again))
        assert repeated.deduplicated and repeated.task.task_id == created.task.task_id
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await p.intake.Submit(intake_pb2.SubmitRequest(task=other))
        assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS


async def test_a_scheduler_stopping_mid_post_makes_the_delivery_due_again_at_once(
    settings: Settings, pg: asyncpg.Pool
) -> None:
    # Given a receiver that never answers, and a final task whose delivery a notifier is POSTing to it
    hanging = asyncio.Event()

    async def hook(request: web.Request) -> web.Response:
        hanging.set()
        await asyncio.sleep(60)
        return web.Response(status=200)

    app = web.Application()
    app.router.add_post("/hook", hook)
    async with serving(app) as base:
        url = f"{base}/hook"
        await cancelled_with_callback(pg, "AA:BB:CC:37:00:01", url)
        notifier = CallbackNotifier(CallbackStore(pg), settings.replace(**LOOPBACK, callback_timeout_s=30))
        running = asyncio.create_task(notifier.run())
        await asyncio.wait_for(hanging.wait(), 10)
        leased = await pg.fetchval("SELECT next_at - now() FROM callback_deliveries")
        assert leased.total_seconds() > 30  # claimed: leased for the POST's limit and the margin
        # When the notifier stops (the scheduler shutting down)
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
        # Then the delivery is due again now, its attempt said to be interrupted
        row = await pg.fetchrow("SELECT state, attempts, last_error, next_at - now() AS due FROM callback_deliveries")
        assert row["state"] == "PENDING" and row["attempts"] == 1
        assert row["due"].total_seconds() <= 0 and "interrupted" in row["last_error"]


async def test_an_idle_notifier_with_an_empty_outbox_looks_once_per_poll_interval(
    settings: Settings, pg: asyncpg.Pool
) -> None:
    # Given an outbox with nothing in it
    store = CallbackStore(pg)
    assert await store.next_due_in_s() is None
    # When a notifier runs idle for a second with a poll interval of 0.5 s
    looks = 0
    claim = store.claim

    async def counted(limit: int, lease_s: float) -> list[object]:
        nonlocal looks
        looks += 1
        return await claim(limit, lease_s)

    store.claim = counted  # type: ignore[method-assign,assignment]
    notifier = CallbackNotifier(store, settings.replace(callback_poll_interval_s=0.5))
    running = asyncio.create_task(notifier.run())
    await asyncio.sleep(1.0)
    running.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await running
    # Then it looked a few times (at start, when its listener connected, once per interval), not
    # hundreds of times: an empty outbox is not a delivery due now
    assert 1 <= looks <= 5, looks


async def test_the_next_delivery_due_is_told_in_seconds_and_never_below_zero(
    settings: Settings, pg: asyncpg.Pool
) -> None:
    await cancelled_with_callback(pg, "AA:BB:CC:38:00:01", "http://127.0.0.1:9/hook")
    callbacks = CallbackStore(pg)
    assert await callbacks.next_due_in_s() == 0.0  # due now
    await pg.execute("UPDATE callback_deliveries SET next_at = now() + interval '1 hour'")
    due_in = await callbacks.next_due_in_s()
    assert due_in is not None and 3590 < due_in <= 3600
    await pg.execute("UPDATE callback_deliveries SET next_at = now() - interval '1 hour'")
    assert await callbacks.next_due_in_s() == 0.0  # overdue is due now, not an hour ago
