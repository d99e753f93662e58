"""Authentication and roles on every RPC of every service, against real servers with real credentials.

The intake, scheduler and registry servers run in this process (`auth_stack.secure_stack`: loopback ports,
`allow_anonymous=False`, credentials a test made). Every method of `METHOD_ROLES` is called with an empty request
of its own type, built from the descriptors, over a plain channel whose metadata the test chooses: without a
credential, with unknown or malformed ones, and as each role. The expected roles of the known methods are written
here, independently of `METHOD_ROLES`, so that a wrong entry fails as well as a missing one.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import grpc
import pytest
from google.protobuf import descriptor_pool, message_factory
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from redis.asyncio import Redis

from intake_svc.server import build as build_intake
from registry_svc.server import build as build_registry
from scheduler_svc.server import build as build_scheduler
from sieve import rpc
from sieve.rpc.auth import METHOD_ROLES, AuthError, hash_token, new_token
from sieve.rpc.readiness import Stores
from sieve.settings import Settings
from sieve.v1 import intake_pb2, intake_pb2_grpc, jobs_pb2, lexicon_pb2, registry_pb2, scheduler_pb2
from tests.security.auth_stack import Credentials, SecureStack, eventually, secure_stack, text

ROOT = Path(__file__).resolve().parents[2]
CLIENT, WORKER, OPERATOR = "client", "worker", "operator"
SERVICES = {
    "sieve.v1.IntakeService": intake_pb2.DESCRIPTOR.services_by_name["IntakeService"],
    "sieve.v1.SchedulerService": scheduler_pb2.DESCRIPTOR.services_by_name["SchedulerService"],
    "sieve.v1.RegistryService": registry_pb2.DESCRIPTOR.services_by_name["RegistryService"],
    # every server serves it (its periodic jobs); the stack's hosts name the scheduler's
    "sieve.v1.JobsService": jobs_pb2.DESCRIPTOR.services_by_name["JobsService"],
    # served by the intake (intake_svc/lexicon.py)
    "sieve.v1.LexiconService": lexicon_pb2.DESCRIPTOR.services_by_name["LexiconService"],
}
#: the roles the issue gives each RPC (client RPCs are open to operators too)
EXPECTED_ROLES = {
    "/sieve.v1.IntakeService/Submit": {CLIENT, OPERATOR},
    "/sieve.v1.IntakeService/SubmitBatch": {CLIENT, OPERATOR},
    "/sieve.v1.IntakeService/GetTask": {CLIENT, OPERATOR},
    "/sieve.v1.IntakeService/CancelTask": {CLIENT, OPERATOR},
    "/sieve.v1.IntakeService/ListTasks": {CLIENT, OPERATOR},
    "/sieve.v1.IntakeService/ReportDetection": {CLIENT, OPERATOR},
    "/sieve.v1.IntakeService/GetStats": {CLIENT, OPERATOR},
    "/sieve.v1.IntakeService/WatchTask": {CLIENT, OPERATOR},
    "/sieve.v1.SchedulerService/Pull": {WORKER},
    "/sieve.v1.SchedulerService/GetWatermark": {OPERATOR},
    "/sieve.v1.SchedulerService/ListDeadLetters": {OPERATOR},
    "/sieve.v1.SchedulerService/RequeueDeadLetters": {OPERATOR},
    "/sieve.v1.SchedulerService/PurgeDeadLetters": {OPERATOR},
    "/sieve.v1.SchedulerService/ListAuditEvents": {OPERATOR},
    "/sieve.v1.RegistryService/Register": {WORKER},
    "/sieve.v1.RegistryService/Heartbeat": {WORKER},
    "/sieve.v1.RegistryService/ListWorkers": {OPERATOR},
    "/sieve.v1.JobsService/ListJobs": {OPERATOR},
    "/sieve.v1.JobsService/RunJob": {OPERATOR},
    "/sieve.v1.LexiconService/ListLexicon": {OPERATOR},
    "/sieve.v1.LexiconService/AddWords": {OPERATOR},
    "/sieve.v1.LexiconService/RemoveWords": {OPERATOR},
    "/sieve.v1.LexiconService/ImportLexicon": {OPERATOR},
    "/sieve.v1.LexiconService/ExportLexicon": {OPERATOR},
}
#: a worker or client holding one of these would reach beyond its own work
OPERATOR_ONLY = [m for m, roles in EXPECTED_ROLES.items() if roles == {OPERATOR}]
CLIENT_RPCS = [m for m, roles in EXPECTED_ROLES.items() if CLIENT in roles]
REFUSED = {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED}
BROKEN = {grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL}
REVOKED, DENIED = grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED


# --- calling any method with an empty request ---------------------------------------------------------
def _method(path: str) -> object:
    return descriptor_pool.Default().FindMethodByName(path.lstrip("/").replace("/", "."))


async def call(address: str, path: str, metadata: tuple[tuple[str, str], ...] = ()) -> grpc.StatusCode:
    """Calls `path` with an empty request of its input type (one message for a stream); returns the status.

    A client-streaming call that the server ends before the client's message is written can read INTERNAL in
    grpc.aio instead of the server's status (grpc/grpc#36066: the failed write overwrites it); such a call is made
    again, up to three times."""
    streaming = _method(path).client_streaming
    for _ in range(3):
        code = await _call_once(address, path, metadata)
        if not (streaming and code == grpc.StatusCode.INTERNAL):
            return code
    return code


async def _call_once(address: str, path: str, metadata: tuple[tuple[str, str], ...]) -> grpc.StatusCode:
    method = _method(path)
    request_type = message_factory.GetMessageClass(method.input_type)
    response_type = message_factory.GetMessageClass(method.output_type)
    args = {"request_serializer": request_type.SerializeToString, "response_deserializer": response_type.FromString}
    async with grpc.aio.insecure_channel(address) as channel:
        try:
            if method.client_streaming:
                factory = (channel.stream_stream if method.server_streaming else channel.stream_unary)(path, **args)
                made = factory(iter([request_type()]), metadata=metadata, timeout=5)
            else:
                factory = (channel.unary_stream if method.server_streaming else channel.unary_unary)(path, **args)
                made = factory(request_type(), metadata=metadata, timeout=5)
            if method.server_streaming:
                async for _ in made:
                    pass
            else:
                await made
        except grpc.aio.AioRpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


@pytest.fixture
def credentials() -> Credentials:
    creds = Credentials()
    for name, role in (("alice", CLIENT), ("bob", CLIENT), ("w1", WORKER), ("ops", OPERATOR)):
        creds.add(name, role)
    return creds


@pytest.fixture
async def stack(
    settings: Settings, redis: Redis, pg: asyncpg.Pool, credentials: Credentials
) -> AsyncIterator[SecureStack]:
    async with secure_stack(settings, redis, pg, credentials, grpc_reflection=False) as s:
        yield s


def hosted(stack: SecureStack) -> list[tuple[str, str]]:
    """(method, address of its server) of every METHOD_ROLES method served here."""
    found = []
    for path in sorted(METHOD_ROLES):
        service = path.lstrip("/").split("/")[0]
        if service in stack.hosts:
            found.append((path, stack.hosts[service]))
    return found


# --- the method table ------------------------------------------------------------------------------------
def test_every_method_of_every_service_has_roles_and_the_known_ones_the_right_ones() -> None:
    for service in SERVICES.values():
        for m in service.methods:
            path = f"/{service.full_name}/{m.name}"
            assert METHOD_ROLES.get(path), f"{path} has no roles: nobody may call it"
    for path, roles in EXPECTED_ROLES.items():
        assert {r.value for r in METHOD_ROLES[path]} == roles, path
    for path in METHOD_ROLES:  # no stale entries: each names a method that exists
        assert _method(path) is not None


def test_the_servers_host_exactly_the_services_of_the_table(stack: SecureStack) -> None:
    assert set(SERVICES) <= set(stack.hosts)
    for name in stack.hosts:
        service = descriptor_pool.Default().FindServiceByName(name)
        for m in service.methods:
            assert f"/{name}/{m.name}" in METHOD_ROLES, f"/{name}/{m.name} is served but has no roles"


# --- no credential, bad credentials ----------------------------------------------------------------------
async def test_every_rpc_refuses_a_call_without_a_credential_or_with_a_bad_one(
    stack: SecureStack, credentials: Credentials
) -> None:
    stored_hash = hash_token(credentials.tokens["ops"])
    bad = {
        "none": (),
        "unknown token": bearer(new_token()),
        "empty bearer": (("authorization", "Bearer "),),
        "other scheme": (("authorization", f"Basic {credentials.tokens['ops']}"),),
        "bare token": (("authorization", credentials.tokens["ops"]),),
        "the stored hash": bearer(stored_hash),
        "a token with a suffix": bearer(credentials.tokens["ops"] + "x"),
        "a token's prefix": bearer(credentials.tokens["ops"][:-1]),
    }
    methods = hosted(stack)
    assert len(methods) >= len(EXPECTED_ROLES)
    for path, address in methods:
        for what, metadata in bad.items():
            code = await call(address, path, metadata)
            assert code == grpc.StatusCode.UNAUTHENTICATED, f"{path} with {what}: {code}"
    # nothing was done: no task, no worker record
    assert await stack.pg.fetchval("SELECT count(*) FROM tasks") == 0


async def test_every_rpc_admits_exactly_its_roles(stack: SecureStack, credentials: Credentials) -> None:
    as_role = {
        CLIENT: credentials.tokens["alice"],
        WORKER: credentials.tokens["w1"],
        OPERATOR: credentials.tokens["ops"],
    }
    for path, address in hosted(stack):
        allowed = {r.value for r in METHOD_ROLES[path]}
        for role, token in as_role.items():
            code = await call(address, path, bearer(token))
            if role in allowed:
                assert code not in REFUSED | BROKEN, f"{path} as {role}: {code}"
            else:
                assert code == grpc.StatusCode.PERMISSION_DENIED, f"{path} as {role}: {code}"


async def test_operator_rpcs_refuse_clients_and_workers_and_client_rpcs_refuse_workers(
    stack: SecureStack, credentials: Credentials
) -> None:
    assert OPERATOR_ONLY and CLIENT_RPCS
    for path in OPERATOR_ONLY:
        address = stack.hosts[path.lstrip("/").split("/")[0]]
        for name in ("alice", "w1"):
            assert await call(address, path, bearer(credentials.tokens[name])) == grpc.StatusCode.PERMISSION_DENIED
    for path in CLIENT_RPCS:
        address = stack.hosts[path.lstrip("/").split("/")[0]]
        assert await call(address, path, bearer(credentials.tokens["w1"])) == grpc.StatusCode.PERMISSION_DENIED
    # and a worker that tries to submit through the sieve client gets nothing into the queue
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stack.intake(credentials.tokens["w1"]).Submit(
            intake_pb2.SubmitRequest(task=text("AA-BB-CC-DD-EE-01", "hello")), timeout=5
        )
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert await stack.pg.fetchval("SELECT count(*) FROM tasks") == 0
    assert await stack.scheduler.queues.pending() == 0


async def test_a_method_without_roles_is_refused_to_everyone_even_operators(
    settings: Settings, redis: Redis, credentials: Credentials
) -> None:
    # Given a server that also serves a method nobody gave roles to
    def probe(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return b"served"

    service = (await build_registry(settings, Stores.of(redis=redis))).service
    register = service.register

    def register_with_probe(server: grpc.aio.Server) -> None:
        register(server)
        server.add_generic_rpc_handlers(
            [
                grpc.method_handlers_generic_handler(
                    "sieve.test.Probe", {"Call": grpc.unary_unary_rpc_method_handler(probe)}
                )
            ]
        )

    service.register = register_with_probe
    server_settings = settings.replace(allow_anonymous=False, auth_tokens=credentials.text)
    server = await rpc.create_server(service, "127.0.0.1:0", server_settings)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            probe_call = channel.unary_unary("/sieve.test.Probe/Call")
            for name in ("alice", "w1", "ops"):
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await probe_call(b"", metadata=bearer(credentials.tokens[name]), timeout=5)
                assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED, name
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await probe_call(b"", timeout=5)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        await server.stop(0)


async def test_with_anonymous_callers_allowed_a_presented_bad_token_is_still_refused(
    settings: Settings, redis: Redis, pg: asyncpg.Pool, credentials: Credentials
) -> None:
    async with secure_stack(settings, redis, pg, credentials, allow_anonymous=True) as s:
        address = s.addresses["registry"]
        assert await call(address, "/sieve.v1.RegistryService/ListWorkers") == grpc.StatusCode.OK  # anonymous
        assert (
            await call(address, "/sieve.v1.RegistryService/ListWorkers", bearer(new_token()))
            == grpc.StatusCode.UNAUTHENTICATED
        )
        assert (
            await call(address, "/sieve.v1.RegistryService/ListWorkers", (("authorization", "Bearer "),))
            == grpc.StatusCode.UNAUTHENTICATED
        )
        # a real credential keeps its own role, not the anonymous one's
        assert (
            await call(address, "/sieve.v1.RegistryService/ListWorkers", bearer(credentials.tokens["alice"]))
            == grpc.StatusCode.PERMISSION_DENIED
        )


# --- open endpoints ------------------------------------------------------------------------------------
async def test_health_is_open_and_reflection_is_absent_when_off(stack: SecureStack, credentials: Credentials) -> None:
    for address in stack.addresses.values():
        async with grpc.aio.insecure_channel(address) as channel:
            reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await _list_services(channel)
            assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
            with pytest.raises(grpc.aio.AioRpcError) as err:  # with a credential it is not there either
                await _list_services(channel, bearer(credentials.tokens["ops"]))
            assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_reflection_is_open_when_on(
    settings: Settings, redis: Redis, pg: asyncpg.Pool, credentials: Credentials
) -> None:
    async with secure_stack(settings, redis, pg, credentials, grpc_reflection=True) as s:
        for service, address in (
            ("sieve.v1.IntakeService", s.addresses["intake"]),
            ("sieve.v1.SchedulerService", s.addresses["scheduler"]),
            ("sieve.v1.RegistryService", s.addresses["registry"]),
        ):
            async with grpc.aio.insecure_channel(address) as channel:
                assert service in await _list_services(channel)
                # the RPCs it describes still need a credential
                path = f"/{service}/{SERVICES[service].methods[0].name}"
                assert await call(address, path) == grpc.StatusCode.UNAUTHENTICATED


async def _list_services(channel: grpc.aio.Channel, metadata: tuple[tuple[str, str], ...] = ()) -> list[str]:
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    stream = stub.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")]), metadata=metadata, timeout=5
    )
    async for reply in stream:
        return [s.name for s in reply.list_services_response.service]
    return []


# --- starting without credentials ----------------------------------------------------------------------
async def test_a_service_without_credentials_refuses_to_start(
    settings: Settings, redis: Redis, pg: asyncpg.Pool, tmp_path: Path
) -> None:
    bare = settings.replace(allow_anonymous=False, auth_tokens="", auth_tokens_file="")
    stores = Stores.of(redis=redis, pool=pg)
    for service in (
        (await build_registry(bare, stores)).service,
        (await build_scheduler(bare, stores)).service,
        (await build_intake(bare, stores)).service,
    ):
        with pytest.raises(AuthError, match="SIEVE_ALLOW_ANONYMOUS"):
            await rpc.create_server(service, "127.0.0.1:0", bare)
    missing = bare.replace(auth_tokens_file=str(tmp_path / "no-such-file"))
    with pytest.raises(AuthError, match="SIEVE_AUTH_TOKENS_FILE"):
        await rpc.create_server((await build_registry(missing, Stores.of(redis=redis))).service, "127.0.0.1:0", missing)


def test_a_service_process_without_credentials_exits_saying_why(settings: Settings) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIEVE_")}
    env.update(
        {
            "SIEVE_REDIS_URL": settings.redis_url,
            "SIEVE_REDIS_PREFIX": settings.redis_prefix,
            "SIEVE_REGISTRY_ADDR": "127.0.0.1:0",
            "SIEVE_REGISTRY_METRICS_ADDR": "",
            "PYTHONPATH": str(ROOT),
        }
    )
    done = subprocess.run(
        [sys.executable, "-m", "registry_svc"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=30
    )
    assert done.returncode != 0
    assert "SIEVE_ALLOW_ANONYMOUS" in done.stdout + done.stderr


def test_a_worker_process_without_its_token_exits_saying_why(settings: Settings) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIEVE_")}
    env.update(
        {
            "SIEVE_DATABASE_URL": settings.database_url,
            "SIEVE_DATABASE_SCHEMA": settings.database_schema,
            "SIEVE_WORKER_METRICS_ADDR": "",
            "PYTHONPATH": str(ROOT),
        }
    )
    done = subprocess.run(
        [sys.executable, "-m", "worker_svc"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=30
    )
    assert done.returncode != 0
    assert "SIEVE_AUTH_TOKEN" in done.stdout + done.stderr and "SIEVE_ALLOW_ANONYMOUS" in done.stdout + done.stderr


# --- rotation and reloading ---------------------------------------------------------------------------
async def test_two_tokens_of_one_name_both_work_as_the_same_caller(
    settings: Settings, redis: Redis, pg: asyncpg.Pool
) -> None:
    creds = Credentials()
    old, new = creds.add("alice", CLIENT), creds.add("alice", CLIENT)
    other = creds.add("bob", CLIENT)
    async with secure_stack(settings, redis, pg, creds) as s:
        task_id = (
            await s.intake(old).Submit(intake_pb2.SubmitRequest(task=text("AA-BB-CC-DD-EE-01", "hello")), timeout=5)
        ).task.task_id
        # the new token is the same caller: it sees the task the old one submitted
        seen = (await s.intake(new).GetTask(intake_pb2.GetTaskRequest(task_id=task_id), timeout=5)).task
        assert seen.task_id == task_id
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await s.intake(other).GetTask(intake_pb2.GetTaskRequest(task_id=task_id), timeout=5)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND


async def test_the_credentials_file_is_reloaded_without_a_restart(
    settings: Settings, redis: Redis, pg: asyncpg.Pool, tmp_path: Path
) -> None:
    path = tmp_path / "credentials"
    creds = Credentials()
    revoked = creds.add("alice", CLIENT)
    creds.add("ops", OPERATOR)
    creds.write(path)
    async with secure_stack(settings, redis, pg, Credentials(), auth_tokens_file=str(path)) as s:
        address = s.addresses["intake"]
        get = "/sieve.v1.IntakeService/GetTask"
        assert await call(address, get, bearer(revoked)) not in REFUSED
        # (a WatchTask stream opened with the token, idle: no change of alice's tasks comes)
        channel = grpc.aio.insecure_channel(address)
        watch = intake_pb2_grpc.IntakeServiceStub(channel).WatchTask(
            intake_pb2.WatchTaskRequest(), metadata=bearer(revoked)
        )
        await asyncio.sleep(0.3)
        # When alice's token is removed and a new one added (the file written in place)
        fresh = Credentials()
        added = fresh.add("alice", CLIENT)
        fresh.lines.append(creds.lines[1])
        fresh.write(path)
        started = time.monotonic()

        # Then within a couple of seconds the old one is refused and the new one works, without a restart
        async def revoked_refused() -> bool:
            return await call(address, get, bearer(revoked)) == grpc.StatusCode.UNAUTHENTICATED

        await eventually(revoked_refused, timeout_s=3, what="a removed token still works")
        assert time.monotonic() - started < 3
        # and the idle stream it opened ends, UNAUTHENTICATED, within the watchers' poll interval
        with pytest.raises(grpc.aio.AioRpcError) as ended:
            await asyncio.wait_for(watch.read(), settings.watch_poll_interval_s + 3)
        assert ended.value.code() == grpc.StatusCode.UNAUTHENTICATED
        await channel.close()
        assert await call(address, get, bearer(added)) not in REFUSED
        # every server of the stack reads the file, not just one
        registry = s.addresses["registry"]
        assert await call(registry, "/sieve.v1.RegistryService/Register", bearer(revoked)) == REVOKED
        assert await call(registry, "/sieve.v1.RegistryService/ListWorkers", bearer(added)) == DENIED
        # A new credential works at its first call (an unknown token makes the server look at the file)
        third = fresh.add("carol", CLIENT)
        fresh.write(path)
        await asyncio.sleep(0.1)
        assert await call(address, get, bearer(third)) not in REFUSED
        # A file that does not parse is not loaded: the last good credentials stay
        path.write_text("this is not a credential\n")
        await asyncio.sleep(1.5)
        assert await call(address, get, bearer(added)) not in REFUSED
        assert await call(address, get, bearer(revoked)) == grpc.StatusCode.UNAUTHENTICATED
