"""End to end: the `sieve` command as a process of its own (`python -m sieve.cli`, what the console script runs)
against every service as its own process, with authentication on — set up as a user's shell is after
`deploy/run_local.py`: the addresses in SIEVE_*_ADDR, the tokens it prints in SIEVE_CLIENT_TOKEN and
SIEVE_OPERATOR_TOKEN. The scheduler dead-letters OCR tasks while no GPU worker is alive (strategy dead_letter),
so that `sieve dlq` has one to show."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import ROOT, Cluster
from tests.support.tasks import tiny_png

pytestmark = pytest.mark.e2e

DEVICE = "AA-BB-CC-DD-EE-01"


@pytest.fixture
def cluster_env(cluster_env: Cluster) -> Cluster:
    cluster_env.env["SIEVE_NO_GPU_STRATEGY"] = "dead_letter"
    return cluster_env


class Shell:
    """Runs `sieve ...` with the environment of a user's shell."""

    def __init__(self, cluster: Cluster) -> None:
        s = cluster.settings
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("SIEVE_")}
        self.env.update(
            PYTHONPATH=str(ROOT),
            XDG_CONFIG_HOME=str(ROOT / "no-such-dir"),
            SIEVE_INTAKE_ADDR=s.intake_addr,
            SIEVE_SCHEDULER_ADDR=s.scheduler_addr,
            SIEVE_REGISTRY_ADDR=s.registry_addr,
            SIEVE_CLIENT_TOKEN=cluster.tokens["client"],
            SIEVE_OPERATOR_TOKEN=cluster.credential("operator", "operator"),
        )

    async def __call__(self, *args: str) -> tuple[int, str, str]:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "sieve.cli",
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self.env,
        )
        out, err = await asyncio.wait_for(process.communicate(), 120)
        assert process.returncode is not None
        return process.returncode, out.decode(), err.decode()

    async def json(self, *args: str) -> Any:
        code, out, err = await self(*args, "-o", "json")
        assert code == 0, (args, out, err)
        return json.loads(out)


async def test_the_command_against_every_service_as_a_process(cluster: Cluster, tmp_path: Path) -> None:
    sieve = Shell(cluster)
    # submit with --wait: texts as arguments, then an image, which is dead-lettered (no GPU worker)
    code, out, err = await sieve("submit", "-d", DEVICE, "加 微 信 免费领取", "hello", "--wait")
    assert code == 0, (out, err)
    assert "status SUCCEEDED" in out and "verdict PASS" in out and "submitting" in err
    image = tmp_path / "tiny.png"
    image.write_bytes(tiny_png())
    code, out, err = await sieve("submit", "-d", DEVICE, "-i", str(image), "--wait", "-o", "json")
    assert code == 1, (out, err)  # a task that did not succeed
    [dead] = json.loads(out)["results"]
    assert dead["status"] == "DEAD_LETTERED"
    # the reads, as the user and as the operator
    listed = await sieve.json("ls", "-d", DEVICE)
    assert len(listed["tasks"]) == 3
    got = await sieve.json("get", dead["task_id"])
    assert got["status"] == "TASK_STATUS_DEAD_LETTERED"
    letters = await sieve.json("dlq", "ls")
    assert [d["task_id"] for d in letters["dead_letters"]] == [dead["task_id"]]
    workers = await sieve.json("workers")
    assert sorted(w["worker_id"] for w in workers["workers"]) == ["worker-1", "worker-2"]
    frame = await sieve.json("top", "--once")
    assert frame["errors"] == {} and frame["watermark"]["live_workers"] == 2
    stats = await sieve.json("stats", "--hours", "1")
    assert stats["totals"]["succeeded"] == "2" and stats["totals"]["dead_lettered"] == "1"
    purged = await sieve.json("dlq", "purge", "--all", "--yes")
    assert purged == {"purged": 1}
    # a client token where an operator's is needed: refused, exit 4
    sieve.env["SIEVE_AUTH_TOKEN"] = cluster.tokens["client"]
    code, out, err = await sieve("workers")
    assert code == 4 and "permission denied" in err and "Traceback" not in err
