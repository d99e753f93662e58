"""Makes docs/console.png: a cluster under load, its web console in headless Chromium, one screenshot.

    python -m tests.support.console_screenshot docs/console.png [--seconds 45]

Needs Redis and PostgreSQL on the test defaults (tests/support/stores.py) and the Debian chromium. The cluster is a
test's (own Redis prefix and schema, dropped afterwards): registry, scheduler (console on), intake, two text
workers and one held back by its memory reading; twelve devices (one of weight 4, one of weight 2), one of them a
noisy neighbour with a third of the load, texts submitted faster than the workers take them, some of them HIGH.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import time
import urllib.parse
import uuid
from pathlib import Path

from redis.asyncio import Redis

from sieve import rpc
from sieve.db import create_pool
from sieve.launch import free_port
from sieve.settings import Settings
from sieve.v1 import intake_pb2, intake_pb2_grpc, types_pb2
from tests.support.browser import chrome
from tests.support.cluster import Cluster, on_free_ports, service_env
from tests.support.redis import delete_prefix
from tests.support.stores import DATABASE_URL, REDIS_URL, drop_schema

DEVICES = [f"0C:00:00:00:D0:{i:02X}" for i in range(12)]
WEIGHTS = {DEVICES[1]: 4, DEVICES[2]: 2}
TEXTS = ["今天天气很好", "欢迎加 微 信领取优惠", "hello world", "这里有 赌.博 网站", "nothing to see here"]


async def load(c: Cluster, seconds: float, rng: random.Random) -> None:
    """Submits texts for `seconds`: a third to the noisy neighbour DEVICES[0], the rest over the others."""
    async with rpc.channel(c.settings.intake_addr, c.settings) as channel:
        stub = intake_pb2_grpc.IntakeServiceStub(channel)
        deadline = time.monotonic() + seconds
        n = 0
        while time.monotonic() < deadline:
            specs = []
            for _ in range(300):
                device = DEVICES[0] if rng.random() < 0.33 else rng.choice(DEVICES[1:])
                high = rng.random() < 0.05
                specs.append(
                    intake_pb2.TaskSpec(
                        device_id=device,
                        type=types_pb2.TASK_TYPE_TEXT,
                        text=f"{rng.choice(TEXTS)} #{n}",
                        priority=types_pb2.PRIORITY_HIGH if high else types_pb2.PRIORITY_NORMAL,
                    )
                )
                n += 1
            await stub.SubmitBatch(intake_pb2.SubmitBatchRequest(tasks=specs))
            await asyncio.sleep(0.25)


async def shoot(out: Path, seconds: float) -> None:
    unique = uuid.uuid4().hex[:10]
    settings = Settings.from_env(
        {},
        redis_url=REDIS_URL,
        redis_prefix=f"shot-{unique}",
        database_url=DATABASE_URL,
        database_schema=f"shot_{unique}",
        allow_anonymous=False,
    )
    settings = on_free_ports(settings)
    pool = await create_pool(settings, attempts=1)
    await pool.close()
    redis = Redis.from_url(settings.redis_url, decode_responses=True)
    with tempfile.TemporaryDirectory() as tmp:
        env = service_env(
            settings,
            SIEVE_CALLER_POLICIES="client:priorities=HIGH|CRITICAL,max_pending=1000000,rate_per_s=100000,burst=100000",
            SIEVE_DEVICE_WEIGHTS=",".join(f"{d}={w}" for d, w in WEIGHTS.items()),
            SIEVE_MAX_PER_DEVICE_PENDING="100000",
            SIEVE_HEARTBEAT_INTERVAL_S="1",
            SIEVE_INTAKE_METRICS_ADDR="127.0.0.1:0",
            SIEVE_SCHEDULER_METRICS_ADDR="127.0.0.1:0",
            SIEVE_REGISTRY_METRICS_ADDR="127.0.0.1:0",
            SIEVE_WORKER_METRICS_ADDR="127.0.0.1:0",
        )
        c = Cluster.create(settings, env, Path(tmp))
        address = f"127.0.0.1:{free_port()}"
        driver = None
        try:
            await c.start_in_order(env_of={"scheduler": {"SIEVE_CONSOLE_ADDR": address}})
            for name in ("worker-a", "worker-b"):
                await c.add_worker(name, SIEVE_WORKER_CONCURRENCY="4")
            readings = Path(tmp) / "hot.readings"
            readings.write_text("cpu=35,memory=93,gpu_memory=0")
            await c.add_worker("worker-hot", SIEVE_FIXED_RESOURCES=f"file:{readings}", SIEVE_TEST_HOOKS="true")
            loading = asyncio.create_task(load(c, seconds, random.Random(7)))
            driver = chrome(1400, 1500)
            token = urllib.parse.quote(c.credential("operator", "operator"))
            await asyncio.to_thread(driver.get, f"http://{address}/?token={token}")
            await asyncio.sleep(seconds - 2)
            height = driver.execute_script("return document.documentElement.scrollHeight")
            driver.set_window_size(1400, int(height) + 20)
            await asyncio.sleep(2)
            await asyncio.to_thread(driver.save_screenshot, str(out))
            errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
            print(f"wrote {out}; console errors: {errors}")
            await loading
        finally:
            if driver is not None:
                driver.quit()
            c.kill_all()
            await delete_prefix(redis, settings.redis_prefix)
            await redis.aclose()
            await drop_schema(settings.database_url, settings.database_schema)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--seconds", type=float, default=45.0)
    args = parser.parse_args()
    asyncio.run(shoot(args.out, args.seconds))


if __name__ == "__main__":
    main()
