"""How the `sieve` command reaches the services and authenticates, against real servers with authentication on
(tests/security/auth_stack.py): tokens from flags, variables and the config file, in that order; a wrong token,
a role without the right, an unreachable address and TLS each end in one clean line with their exit code."""

from __future__ import annotations

import uuid
from pathlib import Path

import asyncpg
from redis.asyncio import Redis

from sieve.launch import free_port
from sieve.rpc.devcerts import write_dev_certs
from sieve.settings import Settings
from tests.integration.sieve.cli.conftest import Sieve, json_of
from tests.security.auth_stack import Credentials, secure_stack

DEVICE = "AA-BB-CC-DD-EE-01"


def credentials() -> Credentials:
    made = Credentials()
    made.add("alice", "client")
    made.add("ops", "operator")
    made.add("worker-1", "worker")
    return made


async def test_a_wrong_token_or_a_missing_right_is_exit_4_in_one_clean_line(
    settings: Settings, redis: Redis, pg: asyncpg.Pool, sieve: Sieve
) -> None:
    creds = credentials()
    async with secure_stack(settings, redis, pg, creds) as stack:
        s = stack.settings
        commands = (
            ["submit", "-d", DEVICE, "x"],
            ["workers"],
            ["dlq", "ls"],
            ["top", "--once"],
            ["ls"],
            ["lexicon", "ls"],
            ["lexicon", "add", "w", "-c", "spam", "-s", "1"],
            ["slots"],
            ["jobs"],
        )
        for command in commands:
            wrong = await sieve(s, "--token", "sv_not-a-token", *command)
            assert wrong.exit_code == 4, (command, wrong.output)
            assert "authentication failed" in wrong.stderr and "Traceback" not in wrong.output
            # one line of error (after submit's progress bar), nothing on stdout
            assert [line for line in wrong.stderr.splitlines() if line.startswith("sieve:")] == [
                wrong.stderr.splitlines()[-1]
            ]
            assert wrong.stdout == ""
        nothing = await sieve(s, "workers")
        assert nothing.exit_code == 4 and "--token" in nothing.stderr
        # a client's token on an operator's command: permission denied, exit 4
        for command in (["dlq", "ls"], ["lexicon", "add", "w", "-c", "spam", "-s", "1"], ["slots"], ["jobs"]):
            denied = await sieve(s, "--token", creds.tokens["alice"], *command)
            assert denied.exit_code == 4 and "permission denied" in denied.stderr, (command, denied.output)
        # each command takes the token of its role from the variables run_local prints
        env = {"SIEVE_CLIENT_TOKEN": creds.tokens["alice"], "SIEVE_OPERATOR_TOKEN": creds.tokens["ops"]}
        submitted = json_of(await sieve(s, "submit", "-d", DEVICE, "hello", "-o", "json", env=env))
        assert submitted["accepted"] == 1
        assert json_of(await sieve(s, "dlq", "ls", "-o", "json", env=env))["total"] == 0
        assert json_of(await sieve(s, "lexicon", "add", "w", "-c", "spam", "-s", "1", "-o", "json", env=env))["added"]
        listed = json_of(await sieve(s, "ls", "-o", "json", env=env))  # as alice: her task
        assert [t["task_id"] for t in listed["tasks"]] == [submitted["results"][0]["task_id"]]


async def test_addresses_and_tokens_from_the_config_file_yield_to_variables_and_flags(
    settings: Settings, redis: Redis, pg: asyncpg.Pool, sieve: Sieve, tmp_path: Path
) -> None:
    creds = credentials()
    async with secure_stack(settings, redis, pg, creds) as stack:
        s = stack.settings
        token_file = tmp_path / "token"
        token_file.write_text(creds.tokens["ops"] + "\n")
        config = sieve.home / "sieve" / "cli.toml"
        config.parent.mkdir()
        config.write_text(
            f'intake = "{s.intake_addr}"\nscheduler = "{s.scheduler_addr}"\nregistry = "{s.registry_addr}"\n'
            f'token_file = "{token_file}"\ntimeout_s = 5\n'
        )
        # Given only the config file (no flags, no variables): it is used
        assert json_of(await sieve(None, "workers", "-o", "json")) == {"workers": []}
        # a variable wins over the file, a flag over the variable
        bad = {"SIEVE_AUTH_TOKEN": "sv_wrong"}
        assert (await sieve(None, "workers", env=bad)).exit_code == 4
        assert (await sieve(None, "--token", creds.tokens["ops"], "workers", env=bad)).exit_code == 0
        moved = {"SIEVE_REGISTRY_ADDR": f"127.0.0.1:{free_port()}"}
        unreachable = await sieve(None, "workers", env=moved)
        assert unreachable.exit_code == 5 and moved["SIEVE_REGISTRY_ADDR"] in unreachable.stderr
        # --config names another file, which must exist and be valid
        other = tmp_path / "other.toml"
        other.write_text('registry = "127.0.0.1:1"\nnonsense = 1\n')
        wrong_key = await sieve(None, "--config", str(other), "workers")
        assert wrong_key.exit_code == 2 and "unknown key 'nonsense'" in wrong_key.stderr
        missing = await sieve(None, "--config", str(tmp_path / "none.toml"), "workers")
        assert missing.exit_code == 2 and "no such file" in missing.stderr


async def test_tls_and_mtls(settings: Settings, redis: Redis, pg: asyncpg.Pool, sieve: Sieve, tmp_path: Path) -> None:
    certs = write_dev_certs(tmp_path / "certs")
    creds = credentials()
    tls = {
        "tls_cert_file": str(certs.server_cert),
        "tls_key_file": str(certs.server_key),
        "tls_ca_file": str(certs.ca),
        "tls_client_auth": True,
    }
    async with secure_stack(settings, redis, pg, creds, **tls) as stack:
        s = stack.settings
        token = ["--token", creds.tokens["ops"]]
        mine = ["--tls-ca", str(certs.ca), "--tls-cert", str(certs.client_cert), "--tls-key", str(certs.client_key)]
        ok = await sieve(s, *token, *mine, "workers", "-o", "json")
        assert json_of(ok) == {"workers": []}
        env = {"SIEVE_TLS_CA_FILE": str(certs.ca), "SIEVE_TLS_CERT_FILE": str(certs.client_cert)}
        env["SIEVE_TLS_KEY_FILE"] = str(certs.client_key)
        assert (await sieve(s, *token, "dlq", "ls", env=env)).exit_code == 0
        # plaintext to a TLS server, and TLS without the client certificate mTLS requires: unavailable, exit 5
        plain = await sieve(s, *token, "workers")
        assert plain.exit_code == 5 and "unavailable" in plain.stderr and "Traceback" not in plain.output
        no_cert = await sieve(s, *token, "--tls-ca", str(certs.ca), "workers")
        assert no_cert.exit_code == 5
        half = await sieve(s, *token, "--tls-ca", str(certs.ca), "--tls-cert", str(certs.client_cert), "workers")
        assert half.exit_code == 2 and "--tls-key" in half.stderr
        unreadable = await sieve(s, *token, "--tls-ca", str(tmp_path / "nope.pem"), "workers")
        assert unreadable.exit_code == 2 and "cannot read it" in unreadable.stderr


async def test_an_unreachable_endpoint_is_exit_5_and_bad_usage_exit_2(sieve: Sieve) -> None:
    port = free_port()
    unreachable = await sieve(None, "--intake", f"127.0.0.1:{port}", "get", str(uuid.uuid4()))
    assert unreachable.exit_code == 5, unreachable
    assert unreachable.stderr.startswith(f"sieve: intake at 127.0.0.1:{port}: unavailable")
    assert "Traceback" not in unreachable.stderr and unreachable.stdout == ""
    everything = await sieve(
        None, "--scheduler", f"127.0.0.1:{port}", "--registry", f"127.0.0.1:{port}", "top", "--once"
    )
    assert everything.exit_code == 5  # every part of the frame unavailable
    usage = await sieve(None, "get")
    assert usage.exit_code == 2 and "Missing argument" in usage.stderr
    helped = await sieve(None, "--help")
    assert helped.exit_code == 0
    for command in ("submit", "get", "cancel", "watch", "ls", "dlq", "workers", "stats", "top"):
        assert f"  {command} " in helped.stdout
