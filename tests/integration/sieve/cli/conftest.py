"""Running the `sieve` command against the real services of a test: as a process of its own (`python -m
sieve.cli`, what the console script runs), with the addresses of the test's servers as flags and nothing from the
environment or a config file of the machine.

A process, not click's test runner in a thread: the command runs its own event loop, and grpc.aio does not
reliably serve two event loops in two threads of one process (grpc/grpc#25364) — runs hung now and then.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sieve.settings import Settings

ROOT = Path(__file__).resolve().parents[4]
#: how long one command may take before the test fails (and the process is killed)
COMMAND_TIMEOUT_S = 120


def addresses(settings: Settings) -> list[str]:
    return [
        "--intake",
        settings.intake_addr,
        "--scheduler",
        settings.scheduler_addr,
        "--registry",
        settings.registry_addr,
    ]


@dataclass(frozen=True)
class Result:
    """How one run of the command ended."""

    exit_code: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


class Sieve:
    """`await sieve(settings, "ls", "-o", "json")`: the command's result (exit code, stdout, stderr)."""

    def __init__(self, home: Path) -> None:
        self.home = home

    def environment(self, env: Mapping[str, str | None] | None = None) -> dict[str, str]:
        """This process's variables without any SIEVE_* one, the repository on the path, the test's own config
        directory, and `env` (None: removed)."""
        environment = {k: v for k, v in os.environ.items() if not k.startswith("SIEVE_")}
        environment.update(PYTHONPATH=str(ROOT), XDG_CONFIG_HOME=str(self.home))
        for key, value in (env or {}).items():
            if value is None:
                environment.pop(key, None)
            else:
                environment[key] = value
        return environment

    async def __call__(
        self,
        settings: Settings | None,
        *args: str,
        env: Mapping[str, str | None] | None = None,
        stdin: str | None = None,
    ) -> Result:
        argv = [*(addresses(settings) if settings else []), *args]
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "sieve.cli",
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=self.environment(env),
        )
        try:
            out, err = await asyncio.wait_for(
                process.communicate(stdin.encode() if stdin is not None else b""), COMMAND_TIMEOUT_S
            )
        except TimeoutError:
            process.kill()
            await process.wait()
            pytest.fail(f"sieve {' '.join(args)}: still running after {COMMAND_TIMEOUT_S} s")
        assert process.returncode is not None
        return Result(process.returncode, out.decode(), err.decode())


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """The workers' CPU watermark off: every process of the machine shares its cores, and a busy machine would hold
    the test's workers back for many seconds (what the watermark does is tested in tests/integration/worker_svc)."""
    return settings.replace(cpu_watermark_pct=101.0)


@pytest.fixture
def sieve(tmp_path: Path) -> Sieve:
    home = tmp_path / "config"
    home.mkdir()
    return Sieve(home)


def json_of(result: Result) -> Any:
    assert result.exit_code == 0, (result.exit_code, result.stdout, result.stderr)
    return json.loads(result.stdout)
