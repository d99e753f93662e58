"""How every `sieve` command runs: its configuration (sieve.cli.config) from the global flags, its client, its
event loop, and one clean line on stderr with a distinct exit status when it fails (no traceback; set
SIEVE_CLI_DEBUG=1 to see one).
"""

from __future__ import annotations

import asyncio
import os
import sys
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import click

from sieve.cli.client import Client, CliError, ExitCode
from sieve.cli.config import CliConfig, ConfigError, Role, load
from sieve.cli.output import FORMATS

F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class Obj:
    """The root command's flags, for its subcommands (click's context object)."""

    flags: dict[str, object | None] = field(default_factory=dict)
    config_path: str | None = None

    def config(self) -> CliConfig:
        return load(self.flags, config_path=self.config_path)


def fail(message: str, code: int) -> None:
    """`sieve: <message>` on stderr, then exit with `code`."""
    click.echo(f"sieve: {message}", err=True)
    sys.exit(code)


def run(obj: Obj, role: Role, body: Callable[[Client], Awaitable[int | None]]) -> None:
    """Runs `body` with a client of `role` on a fresh event loop and exits with its status (None: 0)."""

    async def main() -> int | None:
        async with Client(obj.config(), role) as client:
            return await body(client)

    try:
        code = asyncio.run(main())
    except CliError as exc:
        fail(exc.message, exc.code)
    except ConfigError as exc:
        fail(str(exc), ExitCode.USAGE)
    except KeyboardInterrupt:
        fail("interrupted", 130)
    except BrokenPipeError:  # `sieve ls | head`: the reader has gone; say nothing more (and let the exit not try)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(ExitCode.ERROR)
    except Exception as exc:  # a bug or an unforeseen failure: one line, unless asked for the traceback
        if os.environ.get("SIEVE_CLI_DEBUG"):
            traceback.print_exc()
        fail(f"unexpected error: {type(exc).__name__}: {exc}", ExitCode.ERROR)
    sys.exit(int(code or 0))


def output_option(fn: F) -> F:
    """`-o table|json` (default table): what a read command prints."""
    return click.option(
        "--output",
        "-o",
        "output_format",
        type=click.Choice(FORMATS),
        default="table",
        show_default=True,
        help="table for people, json for scripts.",
    )(fn)


def labels_option(fn: F) -> F:
    return click.option("--label", "-l", "labels", multiple=True, metavar="KEY=VALUE", help="A label (repeatable).")(fn)


def parse_labels(values: tuple[str, ...]) -> dict[str, str]:
    labels: dict[str, str] = {}
    for value in values:
        key, sep, label = value.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{value!r} is not KEY=VALUE", param_hint="--label")
        labels[key] = label
    return labels


__all__ = ["Obj", "fail", "labels_option", "output_option", "parse_labels", "run"]
