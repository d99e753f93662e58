"""The web console (scheduler_svc/console/) on a running cluster: its API refuses callers without the operator
role, and in a real headless Chromium (the Debian package, driven by Selenium through the system chromedriver) the
page shows the cluster's workers and devices, follows the tasks as they complete, and logs no console errors.

The workload: one worker held back by its readings (memory over its watermark, through SIEVE_FIXED_RESOURCES=
file:...), so that 30 texts over three devices wait in their queues while the page looks at them; then the readings
drop and the worker runs them all.

With CONSOLE_SCREENSHOT=path the test also saves its last screenshot there (docs/console.png is made so).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from redis.asyncio import Redis

from sieve import rpc
from sieve.launch import free_port
from sieve.redis.keys import Keys
from sieve.redis.slot_pools import SlotPools
from sieve.settings import Settings
from sieve.v1 import intake_pb2, intake_pb2_grpc, types_pb2
from tests.support.browser import chrome
from tests.support.cluster import Cluster, on_free_ports, service_env

pytestmark = pytest.mark.e2e

FAST = {"SIEVE_HEARTBEAT_INTERVAL_S": "1", "SIEVE_WORKER_TTL_S": "3", "SIEVE_PRESSURE_RETRY_S": "1"}
DEVICES = ["0C:00:00:00:C0:01", "0C:00:00:00:C0:02", "0C:00:00:00:C0:03"]


@dataclass
class Console:
    cluster: Cluster
    url: str
    readings: Path


async def wait_console(c: Cluster, url: str) -> None:
    """Waits until the scheduler's console answers its health route."""
    deadline = time.monotonic() + 20
    async with aiohttp.ClientSession() as http:
        while True:
            try:
                async with http.get(f"{url}/api/health") as reply:
                    if reply.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            assert time.monotonic() < deadline, c.log_of("scheduler")
            await asyncio.sleep(0.1)


@pytest.fixture
async def console(cluster_env: Cluster, pg: object, redis: object, tmp_path: Path) -> AsyncIterator[Console]:
    """The servers, the scheduler with its console on a free port, and one worker held back by its readings."""
    c = cluster_env
    c.env.update(FAST)
    address = f"127.0.0.1:{free_port()}"
    await c.start_in_order(env_of={"scheduler": {"SIEVE_CONSOLE_ADDR": address}})
    url = f"http://{address}"
    await wait_console(c, url)
    readings = tmp_path / "worker.readings"
    readings.write_text("cpu=10,memory=95,gpu_memory=0")
    await c.add_worker(
        "worker-console", metrics=True, SIEVE_FIXED_RESOURCES=f"file:{readings}", SIEVE_TEST_HOOKS="true"
    )
    yield Console(c, url, readings)


async def submit(c: Cluster, per_device: int) -> list[str]:
    specs = [
        intake_pb2.TaskSpec(device_id=mac, type=types_pb2.TASK_TYPE_TEXT, text=f"console {mac} {i}")
        for mac in DEVICES
        for i in range(per_device)
    ]
    async with rpc.channel(c.settings.intake_addr, c.settings) as channel:
        reply = await intake_pb2_grpc.IntakeServiceStub(channel).SubmitBatch(intake_pb2.SubmitBatchRequest(tasks=specs))
    assert all(item.code == 0 for item in reply.items)
    return [item.task.task_id for item in reply.items]


async def get(url: str, token: str | None) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    async with aiohttp.ClientSession() as http, http.get(url, headers=headers) as reply:
        body = await reply.json() if reply.content_type == "application/json" else await reply.text()
        return reply.status, body


async def test_the_console_api_needs_an_operator_token_and_reports_the_cluster(console: Console) -> None:
    c, url = console.cluster, console.url
    await submit(c, 4)
    # no token, an unknown one, a client's: refused
    assert (await get(f"{url}/api/overview", None))[0] == 401
    assert (await get(f"{url}/api/overview", "sv_not-a-token"))[0] == 401
    status, body = await get(f"{url}/api/overview", c.credential("client", "client"))
    assert status == 403 and "operator" in body["error"]
    # an operator's: the workers and the waiting devices of this cluster
    deadline = time.monotonic() + 20
    while True:
        status, body = await get(f"{url}/api/overview", c.credential("operator", "operator"))
        assert status == 200
        devices = {d["device"]: d for d in body["devices"]}
        if set(DEVICES) <= set(devices) and body["workers"]:
            break
        assert time.monotonic() < deadline, body
        await asyncio.sleep(0.3)
    assert [w["worker_id"] for w in body["workers"]] == ["worker-console"]
    assert not body["workers"][0]["available"]  # held back by its memory reading
    assert all(devices[mac]["queued_total"] == 4 and devices[mac]["oldest_task_s"] > 0 for mac in DEVICES)
    # ready and waiting (no worker takes them): listed by the wait the fair order reads
    assert all(devices[mac]["wait_s"] is not None and devices[mac]["wait_s"] > 0 for mac in DEVICES)
    assert sum(d["entitlement"] for d in body["devices"]) == pytest.approx(1.0, abs=0.01)
    assert body["totals"]["pending"] == 12
    assert {q["priority"] for q in body["queues"]} >= {"NORMAL", "HIGH", "CRITICAL"}
    assert body["slot_pools"] == {"configured": False, "pools": []}
    # the page and its files need no token, and keep to themselves
    async with aiohttp.ClientSession() as http:
        for path, kind in (("/", "text/html"), ("/static/console.js", "text/javascript")):
            async with http.get(url + path) as reply:
                assert reply.status == 200 and reply.content_type == kind
                assert "default-src 'self'" in reply.headers["Content-Security-Policy"]
        async with http.get(url + "/static/../server.py") as reply:
            assert reply.status == 404


# --- the browser -----------------------------------------------------------------------------------------------
@pytest.fixture
def driver() -> Iterator[Any]:
    d = chrome()
    try:
        yield d
    finally:
        d.quit()


def page_state(driver: Any) -> dict[str, Any]:
    """What the page shows: the tiles, the first cell of each devices and workers row, the update count."""
    return dict(
        driver.execute_script(
            """
            const cells = (id) => Array.from(document.querySelectorAll('#' + id + ' tbody tr'))
                .map((tr) => Array.from(tr.cells).map((td) => td.textContent));
            const tiles = {};
            for (const t of document.querySelectorAll('#tiles .tile')) {
                tiles[t.dataset.tile] = t.querySelector('b').textContent;
            }
            return {updates: Number(document.body.dataset.updates || 0), tiles: tiles,
                    devices: cells('devices'), workers: cells('workers'), url: window.location.href,
                    points: Number(document.getElementById('chart-throughput').dataset.points || 0),
                    status: document.getElementById('status').textContent};
            """
        )
    )


async def until(
    driver: Any, check: Callable[[dict[str, Any]], bool], what: str, timeout_s: float = 30
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        state = await asyncio.to_thread(page_state, driver)
        if check(state):
            return state
        assert time.monotonic() < deadline, f"{what}: {state}"
        await asyncio.sleep(0.25)


def number(text: str) -> int:
    return int(text.replace(",", "").replace("\u202f", "").replace("\xa0", ""))


async def test_the_page_shows_the_cluster_and_follows_tasks_to_completion_without_console_errors(
    console: Console, driver: Any, tmp_path: Path
) -> None:
    c = console.cluster
    await submit(c, 10)
    token = c.credential("operator", "operator")
    # the token is taken once from the address, then kept out of it
    await asyncio.to_thread(driver.get, f"{console.url}/?token={urllib.parse.quote(token)}")
    first = await until(
        driver,
        lambda s: {row[0] for row in s["devices"]} >= set(DEVICES) and s["workers"] and s["workers"][0][0] != "none",
        "the waiting devices and the worker shown",
    )
    assert "token" not in first["url"]
    assert [row[0] for row in first["workers"]] == ["worker-console"]
    assert "held back" in first["workers"][0][-1]
    assert all(row[3] == "10" for row in first["devices"] if row[0] in DEVICES)
    assert number(first["tiles"]["queued"]) == 30
    # when the worker's memory drops, it runs them: the page follows until every task is acked
    console.readings.write_text("cpu=10,memory=20,gpu_memory=0")
    done = await until(
        driver,
        lambda s: s["tiles"].get("acked here") == "30" and s["tiles"].get("queued") == "0",
        "every task acked",
        timeout_s=40,
    )
    assert done["updates"] > first["updates"] and done["points"] >= 2
    assert "available" in done["workers"][0][-1]
    await until(driver, lambda s: s["updates"] >= done["updates"] + 2, "it keeps polling")
    # a reload keeps the token (sessionStorage) and shows the page again
    await asyncio.to_thread(driver.get, f"{console.url}/")
    again = await until(driver, lambda s: s["updates"] >= 1 and s["workers"][0][0] == "worker-console", "reloaded")
    assert "live" in again["status"]
    await asyncio.to_thread(driver.save_screenshot, str(tmp_path / "console.png"))
    if os.environ.get("CONSOLE_SCREENSHOT"):
        shutil.copy(tmp_path / "console.png", os.environ["CONSOLE_SCREENSHOT"])
    errors = [e for e in driver.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
    assert errors == []


async def test_the_page_asks_for_a_token_when_it_has_none_and_refuses_a_client_token(
    console: Console, driver: Any
) -> None:
    await asyncio.to_thread(driver.get, f"{console.url}/")
    login_shown = "return !document.getElementById('login').hidden && document.getElementById('main').hidden"
    deadline = time.monotonic() + 15
    while not driver.execute_script(login_shown):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.2)
    client = console.cluster.credential("client", "client")
    await asyncio.to_thread(driver.get, f"{console.url}/?token={urllib.parse.quote(client)}")
    while "operator role" not in driver.execute_script("return document.getElementById('login-error').textContent"):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.2)


async def test_with_anonymous_callers_allowed_the_api_answers_without_a_token_but_checks_one_given(
    settings: Settings, tmp_path: Path, pg: object, redis: object
) -> None:
    settings = on_free_ports(settings)
    c = Cluster.create(settings, service_env(settings), tmp_path, security="anonymous")
    try:
        address = f"127.0.0.1:{free_port()}"
        await c.start_in_order(env_of={"scheduler": {"SIEVE_CONSOLE_ADDR": address}})
        await wait_console(c, f"http://{address}")
        status, body = await get(f"http://{address}/api/overview", None)
        assert status == 200 and body["workers"] == [] and body["totals"]["pending"] == 0
        assert (await get(f"http://{address}/api/overview", "sv_not-a-token"))[0] == 401
    finally:
        c.kill_all()


async def test_the_console_shows_each_slot_pool_with_its_holders_and_their_leases(
    settings: Settings, tmp_path: Path, pg: object, redis: Redis
) -> None:
    # Given a scheduler whose installation configures a provider of 3 slots, two of them held
    providers = '{"vmod": {"base_url": "http://127.0.0.1:9/v1", "max_slots": 3}}'
    settings = on_free_ports(settings)
    c = Cluster.create(settings, service_env(settings), tmp_path, security="anonymous")
    try:
        address = f"127.0.0.1:{free_port()}"
        await c.start_in_order(
            env_of={"scheduler": {"SIEVE_CONSOLE_ADDR": address, "SIEVE_EXTERNAL_PROVIDERS": providers}}
        )
        await wait_console(c, f"http://{address}")
        pools = SlotPools(redis, Keys(settings.redis_prefix), {"vmod": 3}, lease_ms=60_000)
        assert await pools.acquire("vmod", "t1:main:1") and await pools.acquire("vmod", "t2:main:1")
        # When an operator reads the overview
        status, body = await get(f"http://{address}/api/overview", None)
        # Then the pool is there: its maximum, the two holders and leases about a minute ahead
        assert status == 200
        [pool] = body["slot_pools"]["pools"]
        assert body["slot_pools"]["configured"] and (pool["name"], pool["in_use"], pool["max_slots"]) == ("vmod", 2, 3)
        assert [h["holder"] for h in pool["holders"]] == ["t1:main:1", "t2:main:1"]
        for h in pool["holders"]:
            assert 50_000 < h["lease_until_ms"] - body["at_ms"] <= 61_000
    finally:
        c.kill_all()
