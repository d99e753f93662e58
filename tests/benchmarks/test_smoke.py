"""CI smoke of the fairness benchmarks (`python -m tests.benchmarks --smoke` sizes): it asserts only what does not
depend on timing — shares of hand-outs, Jain's index over windows of consecutive hand-outs, counts of tasks done,
nothing lost or left open — never a rate or a latency (those are the benchmarks' business, on a quiet machine).

Two clusters, each shared by the benchmarks run on it (every benchmark drains what it queued): one with the
in-process timed worker (equal share, weights, callers), one with two real worker processes (noisy neighbour,
device scale with both shapes). The cost benchmark is left out: its shares are of measured worker time, and its
OCR engine takes longer to load than the whole smoke may run.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from redis.asyncio import Redis

from tests.benchmarks import bench_fairness, bench_scale
from tests.benchmarks.cluster import running_cluster
from tests.benchmarks.common import FINAL
from tests.benchmarks.sizes import SMOKE
from tests.support.cluster import Cluster
from tests.support.stores import DATABASE_URL, REDIS_URL

pytestmark = pytest.mark.e2e

#: the smoke's sizes leave the shares of weights a few per cent from exact; a broken rule is off by tens of per cent
SMOKE_WEIGHT_TOLERANCE = 0.10


async def _stores_answer() -> str | None:
    try:
        redis = Redis.from_url(REDIS_URL)
        try:
            await redis.ping()
        finally:
            await redis.aclose()
        conn = await asyncpg.connect(DATABASE_URL, timeout=5)
        await conn.close()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def _require_stores() -> None:
    problem = asyncio.run(_stores_answer())
    if problem is not None:
        if os.environ.get("CI"):
            pytest.fail(f"Redis and PostgreSQL are required in CI: {problem}")
        pytest.skip(f"Redis or PostgreSQL not available: {problem}")


async def statuses(cluster: Cluster, device_prefix: str) -> dict[str, int]:
    """Tasks of the devices starting with `device_prefix`, by status, as the record has them."""
    s = cluster.settings
    pg = await asyncpg.connect(s.database_url, server_settings={"search_path": s.database_schema})
    try:
        rows = await pg.fetch(
            "SELECT status, count(*) AS n FROM tasks WHERE device LIKE $1 GROUP BY status", device_prefix + "%"
        )
    finally:
        await pg.close()
    return {r["status"]: r["n"] for r in rows}


async def _timed(log_dir: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with running_cluster(
        workers=0, log_dir=log_dir, credentials=bench_fairness.CREDENTIALS, **bench_fairness.fairness_env(20000)
    ) as cluster:
        out["equal"] = await bench_fairness.equal_share(*SMOKE.equal, cluster=cluster, timeout_s=120)
        out["equal_statuses"] = await statuses(cluster, "CC:")
        out["weights"] = await bench_fairness.weights(*SMOKE.weights, cluster=cluster, timeout_s=120)
        out["weights_statuses"] = await statuses(cluster, "DD:")
        out["callers"] = await bench_fairness.callers(*SMOKE.callers, cluster=cluster, timeout_s=120)
        out["callers_statuses"] = await statuses(cluster, "C1:")
        out["caller_b_statuses"] = await statuses(cluster, "C2:")
    return out


async def _real(log_dir: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with running_cluster(
        workers=2, log_dir=log_dir, credentials=bench_fairness.CREDENTIALS, **bench_fairness.fairness_env(20000)
    ) as cluster:
        out["noisy"] = await bench_fairness.noisy_neighbour(*SMOKE.noisy, cluster=cluster, timeout_s=120)
        few = SMOKE.scale_few
        out["few"] = await bench_scale.run_case(few, SMOKE.scale_tasks // few, cluster=cluster, timeout_s=120)
        out["many"] = await bench_scale.run_case(SMOKE.scale_tasks, 1, cluster=cluster, timeout_s=120)
        out["open"] = {k: v for k, v in (await statuses(cluster, "")).items() if k not in FINAL}
    return out


@pytest.fixture(scope="module")
def timed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    _require_stores()
    return asyncio.run(_timed(tmp_path_factory.mktemp("timed-cluster")))


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    _require_stores()
    return asyncio.run(_real(tmp_path_factory.mktemp("real-cluster")))


def test_equal_devices_get_equal_shares_of_every_window_of_hand_outs(timed: dict[str, Any]) -> None:
    r: bench_fairness.EqualResult = timed["equal"]
    assert r.windows >= 1, r
    assert r.jain_min >= bench_fairness.JAIN_MIN, r
    assert timed["equal_statuses"] == {"SUCCEEDED": r.devices * r.per_device}


def test_weighted_devices_get_shares_in_proportion_to_their_weights(timed: dict[str, Any]) -> None:
    r: bench_fairness.WeightsResult = timed["weights"]
    for share, target in zip(r.shares, bench_fairness.weight_targets(), strict=True):
        assert abs(share - target) <= SMOKE_WEIGHT_TOLERANCE * target, r.shares
    assert timed["weights_statuses"] == {"SUCCEEDED": 3 * r.per_device}


def test_both_callers_have_every_task_done(timed: dict[str, Any]) -> None:
    r: bench_fairness.CallersResult = timed["callers"]
    assert timed["callers_statuses"] == {"SUCCEEDED": r.many_devices * r.per_device}
    assert timed["caller_b_statuses"] == {"SUCCEEDED": r.one_device_tasks}


def test_a_caller_with_one_device_gets_half_against_a_caller_with_a_thousand(timed: dict[str, Any]) -> None:
    r: bench_fairness.CallersResult = timed["callers"]
    assert abs(r.share_one - bench_fairness.CALLER_SHARE) <= bench_fairness.CALLER_TOLERANCE, r
    assert abs(r.share_many - bench_fairness.CALLER_SHARE) <= bench_fairness.CALLER_TOLERANCE, r


def test_small_devices_behind_a_noisy_one_have_every_task_done(real: dict[str, Any]) -> None:
    r: bench_fairness.NoisyResult = real["noisy"]
    assert r.lost == 0
    assert r.small_done == r.small_devices * r.small_per_device
    assert r.noisy_done == r.noisy_tasks


def test_many_small_devices_and_few_big_ones_have_every_task_done(real: dict[str, Any]) -> None:
    few: bench_scale.Case = real["few"]
    many: bench_scale.Case = real["many"]
    assert few.tasks == many.tasks  # equal work
    assert few.succeeded == few.tasks
    assert many.succeeded == many.tasks
    assert real["open"] == {}  # nothing left queued, assigned or running
