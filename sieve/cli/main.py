"""The root `sieve` command: the options every command shares (where the services are, the token, TLS) and the
commands, one module per group.

A command group of its own (the lexicon, slot pools, external jobs) is a module with a click command or group,
added to COMMANDS.
"""

from __future__ import annotations

import click

from sieve.cli import cluster, dlq, lexicon, platform_jobs, submit, tasks, top
from sieve.cli.runner import Obj

#: every command of `sieve`, in the order `sieve --help` lists them
COMMANDS: tuple[click.Command, ...] = (
    submit.submit_command,
    tasks.get_command,
    tasks.cancel_command,
    tasks.watch_command,
    tasks.ls_command,
    dlq.dlq_group,
    cluster.workers_command,
    cluster.stats_command,
    lexicon.lexicon_group,
    platform_jobs.slots_command,
    platform_jobs.jobs_group,
    top.top_command,
)


class OrderedGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(self.commands)


@click.group(cls=OrderedGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.option("--intake", metavar="HOST:PORT", help="Intake address [SIEVE_INTAKE_ADDR; 127.0.0.1:50051].")
@click.option("--scheduler", metavar="HOST:PORT", help="Scheduler address [SIEVE_SCHEDULER_ADDR; 127.0.0.1:50052].")
@click.option("--registry", metavar="HOST:PORT", help="Registry address [SIEVE_REGISTRY_ADDR; 127.0.0.1:50053].")
@click.option(
    "--token",
    help="Bearer token [SIEVE_AUTH_TOKEN; else SIEVE_OPERATOR_TOKEN / SIEVE_CLIENT_TOKEN by the command's role].",
)
@click.option("--token-file", metavar="PATH", help="A file whose first word is the token [SIEVE_AUTH_TOKEN_FILE].")
@click.option("--tls-ca", metavar="PATH", help="CA of the servers' certificates; TLS on [SIEVE_TLS_CA_FILE].")
@click.option("--tls-cert", metavar="PATH", help="This client's certificate, for mTLS [SIEVE_TLS_CERT_FILE].")
@click.option("--tls-key", metavar="PATH", help="Its key [SIEVE_TLS_KEY_FILE].")
@click.option("--tls-server-name", metavar="NAME", help="Name in the servers' certificate [SIEVE_TLS_SERVER_NAME].")
@click.option("--timeout", "timeout_s", type=float, help="Seconds per call [SIEVE_CLI_TIMEOUT_S; 10].")
@click.option(
    "--config", "config_path", metavar="PATH", help="Config file [SIEVE_CLI_CONFIG; ~/.config/sieve/cli.toml]."
)
@click.version_option(package_name="sieve", prog_name="sieve")
@click.pass_context
def cli(ctx: click.Context, /, config_path: str | None, **flags: object | None) -> None:
    """Talk to a Sieve platform: submit work, follow it, and look after the platform.

    Settings come from these flags, then SIEVE_* variables, then the config file. Exit status: 0 done, 1 failed,
    2 bad usage or request, 3 not found, 4 not authenticated or not allowed, 5 a service unreachable.
    """
    ctx.obj = Obj(flags=dict(flags), config_path=config_path)


for _command in COMMANDS:
    cli.add_command(_command)


def main() -> None:
    """The console script."""
    cli(prog_name="sieve")


__all__ = ["COMMANDS", "cli", "main"]
