"""The three servers built in a test's own process: each service's `build(settings, stores)` served by
`rpc.create_server` on a free loopback port, in the start order of sieve.launch (registry, scheduler, intake, each
told the addresses of those before it), and stopped the other way round.

Used by the integration platform (tests/integration/conftest.py), the security stack (tests/security/auth_stack.py)
and the least-privilege deploy tests, which give each service stores and settings of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from intake_svc.server import IntakeApp
from intake_svc.server import build as build_intake
from registry_svc.server import RegistryApp
from registry_svc.server import build as build_registry
from scheduler_svc.server import SchedulerApp
from scheduler_svc.server import build as build_scheduler
from sieve import rpc
from sieve.rpc.jobs import JOBS_SERVICE_NAME
from sieve.rpc.readiness import Stores
from sieve.settings import Settings

LOOPBACK = "127.0.0.1:0"


@dataclass
class InProcessServers:
    """Registry, scheduler and intake of one test, built and served in this process. `settings` are the ones
    they were started with, naming the three addresses."""

    settings: Settings
    registry: RegistryApp
    scheduler: SchedulerApp
    intake: IntakeApp
    #: the running servers, in start order
    servers: list[rpc.RunningServer] = field(default_factory=list)

    @property
    def hosts(self) -> dict[str, str]:
        """Full name of every gRPC service a server here hosts -> that server's address (JobsService, which every
        server hosts: the scheduler's, whose jobs there are)."""
        hosts: dict[str, str] = {}
        for server in self.servers:
            hosts.update(dict.fromkeys(server.service.service_names, f"127.0.0.1:{server.port}"))
            if server.service is self.scheduler.service:
                hosts[JOBS_SERVICE_NAME] = f"127.0.0.1:{server.port}"
        return hosts

    async def stop(self) -> None:
        """Intake, scheduler, registry (1 s of grace each)."""
        await stop_servers(self.servers)


async def stop_servers(servers: list[rpc.RunningServer]) -> None:
    for server in reversed(servers):
        await server.stop(1)


async def start_servers(
    settings: Settings,
    stores: Stores | Mapping[str, Stores],
    *,
    overrides: Mapping[str, Mapping[str, object]] | None = None,
    rebuild_first: bool = False,
) -> InProcessServers:
    """Registry, scheduler and intake on free loopback ports. `stores` are every service's, or each one's by
    name ("registry", "scheduler", "intake"); `overrides` change one service's own settings (by name);
    `rebuild_first` runs the scheduler's step before serving (Redis rebuilt from PostgreSQL when it lost its
    memory), as its real server does. What started is stopped again when a later step fails."""

    def own(name: str) -> tuple[Settings, Stores]:
        """Service `name`'s settings (the addresses started so far, its overrides) and stores."""
        return (
            settings.replace(**(overrides or {}).get(name, {})),
            stores if isinstance(stores, Stores) else stores[name],
        )

    servers: list[rpc.RunningServer] = []
    try:
        registry_settings, registry_stores = own("registry")
        registry = await build_registry(registry_settings, registry_stores)
        servers.append(await rpc.create_server(registry.service, LOOPBACK, registry_settings))
        settings = settings.replace(registry_addr=f"127.0.0.1:{servers[-1].port}")
        scheduler_settings, scheduler_stores = own("scheduler")
        scheduler = await build_scheduler(scheduler_settings, scheduler_stores)
        if rebuild_first:
            await scheduler.before_serving()
        servers.append(await rpc.create_server(scheduler.service, LOOPBACK, scheduler_settings))
        settings = settings.replace(scheduler_addr=f"127.0.0.1:{servers[-1].port}")
        intake_settings, intake_stores = own("intake")
        intake = await build_intake(intake_settings, intake_stores)
        servers.append(await rpc.create_server(intake.service, LOOPBACK, intake_settings))
        settings = settings.replace(intake_addr=f"127.0.0.1:{servers[-1].port}")
    except BaseException:
        await stop_servers(servers)
        raise
    return InProcessServers(settings, registry, scheduler, intake, servers)
