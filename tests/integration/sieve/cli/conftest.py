"""Running the `sieve` command against the real services of a test: click's test runner in a thread of its own
(the command runs its own event loop, while the test's loop serves the servers), with the addresses of the
test's servers as flags and nothing from the environment or a config file of the machine."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from sieve.cli.main import cli
from sieve.settings import Settings

#: variables the command reads, cleared for every run (a test sets the ones it means)
CLEARED = (
    "SIEVE_INTAKE_ADDR",
    "SIEVE_SCHEDULER_ADDR",
    "SIEVE_REGISTRY_ADDR",
    "SIEVE_AUTH_TOKEN",
    "SIEVE_AUTH_TOKEN_FILE",
    "SIEVE_OPERATOR_TOKEN",
    "SIEVE_CLIENT_TOKEN",
    "SIEVE_TLS_CA_FILE",
    "SIEVE_TLS_CERT_FILE",
    "SIEVE_TLS_KEY_FILE",
    "SIEVE_TLS_SERVER_NAME",
    "SIEVE_CLI_TIMEOUT_S",
    "SIEVE_CLI_CONFIG",
)


def addresses(settings: Settings) -> list[str]:
    return [
        "--intake",
        settings.intake_addr,
        "--scheduler",
        settings.scheduler_addr,
        "--registry",
        settings.registry_addr,
    ]


class Sieve:
    """`await sieve(settings, "ls", "-o", "json")`: the command's result (exit code, stdout, stderr)."""

    def __init__(self, home: Path) -> None:
        self.home = home

    async def __call__(
        self, settings: Settings | None, *args: str, env: Mapping[str, str] | None = None, stdin: str | None = None
    ) -> Result:
        environment: dict[str, str | None] = dict.fromkeys(CLEARED)
        environment["XDG_CONFIG_HOME"] = str(self.home)
        environment.update(env or {})
        argv = [*(addresses(settings) if settings else []), *args]
        return await asyncio.to_thread(CliRunner().invoke, cli, argv, env=environment, input=stdin)


@pytest.fixture
def sieve(tmp_path: Path) -> Sieve:
    home = tmp_path / "config"
    home.mkdir()
    return Sieve(home)


def json_of(result: Result) -> Any:
    assert result.exit_code == 0, (result.exit_code, result.stdout, result.stderr)
    return json.loads(result.stdout)
