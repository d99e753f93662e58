"""No SSRF through `image_url`: the OCR worker's fetcher (worker_svc/ocr/fetch.py on sieve/outbound/client.py)
reaches only public destinations unless a setting allows more, and the intake refuses IP literals early.

Against a real aiohttp server on 127.0.0.1. No test may send a packet anywhere but loopback: the
`connections` fixture (autouse) wraps the event loop's `sock_connect` — the call every outbound connection
goes through — records each address it is asked for and fails any non-loopback one itself, without a
syscall. Refusals are asserted to happen with NO connection attempt at all. Host names other than
`localhost` come from a fake DNS (`FakeDns`) handed to the fetcher, which also plays the rebinding server.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest

from intake_svc.validation import validate_spec
from sieve import rpc
from sieve.errors import InvalidInput
from sieve.outbound.policy import NOT_ALLOWED, NOT_PUBLIC, OutboundPolicy, literal_address, non_public_reason
from sieve.settings import Settings, SettingsError
from sieve.v1 import intake_pb2, types_pb2

web = pytest.importorskip("aiohttp.web")
from sieve.outbound.client import FetchError, SafeHttpClient  # noqa: E402  (needs aiohttp)
from worker_svc.ocr.fetch import Fetcher  # noqa: E402

#: a small but real PNG (1x1, RGBA)
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360f8ffff3f0005fe02fea7d6a4f00000000049454e44ae426082"
)
#: a public address nothing here will ever send a packet to (the `connections` fixture fails it)
PUBLIC = "93.184.215.14"
ALLOW_LOOPBACK = "127.0.0.0/8,::1/128"


# --- the loopback server, the connection recorder and the fake DNS ---------------------------------
@dataclass
class Server:
    base: str
    port: int
    requests: list[str] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    """/img: a PNG; /redirect?to=URL[&close=1]: a 302; /status/N; /loop: a 307 to itself; /slow;
    /big (Content-Length); /stream (chunked, 1 MiB); /cookie: a PNG that sets a cookie."""
    state = Server("", 0)

    @web.middleware
    async def record(request: web.Request, handler: Any) -> web.StreamResponse:
        state.requests.append(request.path_qs)
        state.headers.append(dict(request.headers))
        return await handler(request)

    async def img(request: web.Request) -> web.StreamResponse:
        return web.Response(body=PNG, content_type="image/png")

    async def cookie(request: web.Request) -> web.StreamResponse:
        response = web.Response(body=PNG, content_type="image/png")
        response.set_cookie("session", "secret-of-another-task")
        return response

    async def redirect(request: web.Request) -> web.StreamResponse:
        headers = {"Location": request.query["to"]}
        if request.query.get("close"):
            headers["Connection"] = "close"
        return web.Response(status=302, headers=headers)

    async def loop(request: web.Request) -> web.StreamResponse:
        return web.Response(status=307, headers={"Location": "/loop"})

    async def status(request: web.Request) -> web.StreamResponse:
        return web.Response(status=int(request.match_info["code"]), text="internal detail 10.9.8.7:6543")

    async def slow(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(30)
        return web.Response(body=PNG)

    async def big(request: web.Request) -> web.StreamResponse:
        return web.Response(body=PNG + b"\x00" * 200_000, content_type="image/png")

    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.enable_chunked_encoding()
        await response.prepare(request)
        for _ in range(128):
            await response.write(b"\x00" * 8192)
        await response.write_eof()
        return response

    app = web.Application(middlewares=[record])
    app.router.add_get("/img", img)
    app.router.add_get("/cookie", cookie)
    app.router.add_get("/redirect", redirect)
    app.router.add_get("/loop", loop)
    app.router.add_get("/status/{code}", status)
    app.router.add_get("/slow", slow)
    app.router.add_get("/big", big)
    app.router.add_get("/stream", stream)
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    state.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    state.base = f"http://127.0.0.1:{state.port}"
    try:
        yield state
    finally:
        await runner.cleanup()


def is_loopback(host: str) -> bool:
    ip = ipaddress.ip_address(host.split("%")[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback


@pytest.fixture(autouse=True)
async def connections(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[list[tuple[str, int]]]:
    """Every address an outbound connection is attempted to; non-loopback ones fail here, unsent."""
    attempts: list[tuple[str, int]] = []
    loop = asyncio.get_running_loop()
    real = loop.sock_connect

    async def sock_connect(sock: socket.socket, address: Any) -> None:
        if isinstance(address, str | bytes):  # a Unix socket (the embedded PostgreSQL's): on this machine
            await real(sock, address)
            return
        attempts.append((str(address[0]), int(address[1])))
        if not is_loopback(str(address[0])):
            raise ConnectionRefusedError(111, "test: non-loopback connection blocked before sending")
        await real(sock, address)

    monkeypatch.setattr(loop, "sock_connect", sock_connect)
    yield attempts


class FakeDns:
    """A DNS server under the test's control: each name answers the next list of its `answers` (the last
    one again when they run out); localhost is looked up for real; other names do not exist. `queries`
    counts lookups per name."""

    def __init__(self, answers: dict[str, list[list[str]]]) -> None:
        self.answers = answers
        self.queries: dict[str, int] = {}

    async def __call__(
        self, host: str, port: Any, *, family: int = 0, type: int = 0, proto: int = 0, flags: int = 0
    ) -> list[tuple[Any, ...]]:
        name = host.lower().rstrip(".")
        self.queries[name] = self.queries.get(name, 0) + 1
        if name == "localhost":  # the machine's own answer (/etc/hosts)
            return await asyncio.get_running_loop().getaddrinfo(host, port, family=family, type=type, flags=flags)
        if name not in self.answers:
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        rounds = self.answers[name]
        addresses = rounds[min(self.queries[name], len(rounds)) - 1]
        infos = []
        for a in addresses:
            ip = ipaddress.ip_address(a)
            sockaddr: tuple[Any, ...] = (a, int(port or 0)) if ip.version == 4 else (a, int(port or 0), 0, 0)
            infos.append(
                (
                    socket.AF_INET if ip.version == 4 else socket.AF_INET6,
                    socket.SOCK_STREAM,
                    socket.IPPROTO_TCP,
                    "",
                    sockaddr,
                )
            )
        return infos


def fetcher(private: str = "", hosts: str = "", dns: FakeDns | None = None, **changes: Any) -> Fetcher:
    settings = Settings.from_env({}, outbound_allow_private_nets=private, outbound_allow_hosts=hosts, **changes)
    return Fetcher(settings, getaddrinfo=dns)


_ADDRESSY = re.compile(r"\d+\.\d+\.\d+\.\d+|\[|::|localhost|0x|:\d{2,5}")


def assert_safe_text(error: FetchError, *secrets: object) -> None:
    """The task's error names no address, no port, nothing of the connector's text."""
    text = str(error)
    assert text.startswith(("fetch refused: ", "fetch failed")), text
    assert not _ADDRESSY.search(text), text
    for secret in secrets:
        assert str(secret) not in text, (secret, text)
    assert "Cannot connect" not in text and "Errno" not in text and "ssl:" not in text, text


async def refused(f: Fetcher, url: str) -> FetchError:
    with pytest.raises(FetchError) as err:
        await f.fetch(url)
    return err.value


# --- the classifier --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("address", "public"),
    [
        ("8.8.8.8", True),
        ("1.1.1.1", True),
        (PUBLIC, True),
        ("2606:4700:4700::1111", True),
        ("2a00:1450:4001:80b::200e", True),
        ("127.0.0.1", False),
        ("127.255.255.254", False),
        ("0.0.0.0", False),
        ("0.1.2.3", False),
        ("10.0.0.1", False),
        ("172.16.0.1", False),
        ("172.31.255.255", False),
        ("192.168.1.1", False),
        ("169.254.169.254", False),
        ("100.64.0.1", False),
        ("100.127.255.254", False),
        ("192.0.0.8", False),
        ("192.0.2.1", False),
        ("198.51.100.7", False),
        ("203.0.113.9", False),
        ("198.18.0.1", False),
        ("192.88.99.1", False),
        ("224.0.0.1", False),
        ("239.255.255.250", False),
        ("240.0.0.1", False),
        ("255.255.255.255", False),
        ("::", False),
        ("::1", False),
        ("fe80::1", False),
        ("fe80::1%1", False),
        ("fec0::1", False),
        ("fc00::1", False),
        ("fd00::2", False),
        ("ff02::1", False),
        ("2001:db8::1", False),
        ("3fff::1", False),
        ("100::1", False),
        ("2001::1", False),
        ("5f00::1", False),
        ("::ffff:127.0.0.1", False),
        ("::ffff:169.254.169.254", False),
        ("::ffff:10.0.0.1", False),
        ("::ffff:8.8.8.8", True),
        ("::127.0.0.1", False),
        ("::8.8.8.8", False),
        ("::ffff:0:7f00:1", False),
        ("64:ff9b::7f00:1", False),
        ("64:ff9b::a00:1", False),
        ("64:ff9b::808:808", True),
        ("64:ff9b:1::1", False),
        ("2002:7f00:1::1", False),
        ("2002:a9fe:a9fe::", False),
        ("2002:808:808::1", True),
    ],
)
def test_addresses_are_classified_public_or_not(address: str, public: bool) -> None:
    reason = non_public_reason(ipaddress.ip_address(address))
    assert (reason is None) == public, (address, reason)


@pytest.mark.parametrize(
    ("host", "address"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("2130706433", "127.0.0.1"),
        ("0x7f.1", "127.0.0.1"),
        ("0x7F000001", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"),
        ("127.1", "127.0.0.1"),
        ("127.0.0.1.", "127.0.0.1"),
        ("[::1]", "::1"),
        ("[::ffff:127.0.0.1]", "::ffff:7f00:1"),
        ("::ffff:7f00:1", "::ffff:7f00:1"),
        ("fe80::1%25eth0", "fe80::1%eth0"),
        ("example.com", None),
        ("cafe", None),
        ("1e100.net", None),
        ("localhost", None),
        ("0x7g.1", None),
    ],
)
def test_ip_literals_are_read_in_every_spelling_without_dns(host: str, address: str | None) -> None:
    got = literal_address(host)
    assert (None if got is None else str(got)) == address


def test_the_settings_are_parsed_and_a_bad_entry_names_its_variable() -> None:
    s = Settings.from_env(
        {
            "SIEVE_OUTBOUND_ALLOW_HOSTS": "img.example.com, .cdn.example.net,198.51.100.0/24",
            "SIEVE_OUTBOUND_ALLOW_PRIVATE_NETS": "127.0.0.0/8, ::1",
        }
    )
    policy = OutboundPolicy.from_settings(s)
    assert policy.allow_names == {"img.example.com"} and policy.allow_suffixes == (".cdn.example.net",)
    assert [str(n) for n in policy.allow_nets] == ["198.51.100.0/24"]
    assert [str(n) for n in policy.private_nets] == ["127.0.0.0/8", "::1/128"]
    assert policy.name_allowed("IMG.example.com.") and policy.name_allowed("a.b.cdn.example.net")
    assert policy.name_allowed("cdn.example.net") and not policy.name_allowed("evilcdn.example.net")
    assert not policy.name_allowed("img.example.com.evil.org")
    assert not OutboundPolicy.from_settings(Settings.from_env({})).restricted
    for variable, value in [
        ("SIEVE_OUTBOUND_ALLOW_PRIVATE_NETS", "loopback"),
        ("SIEVE_OUTBOUND_ALLOW_PRIVATE_NETS", "10.0.0.0/33"),
        ("SIEVE_OUTBOUND_ALLOW_HOSTS", "http://img.example.com/"),
        ("SIEVE_OUTBOUND_ALLOW_HOSTS", "*.example.com"),
        ("SIEVE_OUTBOUND_ALLOW_HOSTS", "0x7f.1"),
    ]:
        with pytest.raises(SettingsError, match=variable):
            Settings.from_env({variable: value})


# --- refusals: before any connection -----------------------------------------------------------------
@pytest.mark.parametrize(
    "template",
    [
        "{base}/img",
        "http://localhost:{port}/img",
        "http://169.254.169.254/latest/meta-data",
        "http://10.0.0.1/",
        "http://192.168.0.1:8080/admin",
        "http://100.64.0.1/",
        "http://[::1]:{port}/img",
        "http://[::ffff:127.0.0.1]:{port}/img",
        "http://[::ffff:a9fe:a9fe]/latest/meta-data",
        "http://[64:ff9b::7f00:1]:{port}/img",
        "http://[fd00::2]/",
        "http://[fe80::1%25lo]:{port}/",
        "http://2130706433:{port}/img",
        "http://0x7f.1:{port}/img",
        "http://0x7f000001:{port}/img",
        "http://0177.0.0.1:{port}/img",
        "http://127.1:{port}/img",
        "http://127.0.0.1.:{port}/img",
        "http://0.0.0.0:{port}/img",
        "http://0:{port}/img",
        "http://[::]:{port}/img",
        "http://0x7f.0x0.0x0.0x1:{port}/img",
        "http://[0:0:0:0:0:ffff:7f00:1]:{port}/img",
        "https://127.0.0.1:{port}/img",
        "http://user:pw@127.0.0.1:{port}/img",
        "http://internal.test:{port}/img",
        "http://mixed.test:{port}/img",
    ],
)
async def test_non_public_destinations_are_refused_before_connecting_and_the_error_names_none(
    server: Server, connections: list[tuple[str, int]], template: str
) -> None:
    dns = FakeDns({"internal.test": [["127.0.0.1"]], "mixed.test": [[PUBLIC, "10.1.2.3"]]})
    f = fetcher(dns=dns)
    try:
        error = await refused(f, template.format(base=server.base, port=server.port))
    finally:
        await f.close()
    assert str(error) == f"fetch refused: {NOT_PUBLIC}"
    assert error.transient is False
    assert_safe_text(error, server.port)
    assert connections == [] and server.requests == []


async def test_a_permitted_url_redirecting_to_a_private_one_is_refused_at_that_hop(
    server: Server, connections: list[tuple[str, int]]
) -> None:
    # Given only 127.0.0.1 itself allowed, and a name that resolves to it
    dns = FakeDns({"images.example.test": [["127.0.0.1"]], "internal.test": [["10.1.2.3"]]})
    f = fetcher(private="127.0.0.1/32", dns=dns)
    targets = [
        "http://169.254.169.254/latest/meta-data",
        "http://10.0.0.1/",
        f"http://[::1]:{server.port}/img",
        f"http://127.0.0.2:{server.port}/img",
        f"http://2130706434:{server.port}/img",
        f"http://internal.test:{server.port}/img",
        "http://[::ffff:a9fe:a9fe]/",
    ]
    try:
        for target in targets:
            connections.clear()
            server.requests.clear()
            for start in (server.base, f"http://images.example.test:{server.port}"):
                # When a permitted URL answers with a redirect to the target
                error = await refused(f, f"{start}/redirect?to={target}")
                # Then the hop is refused: the first server was asked, nothing else was even connected to
                assert str(error) == f"fetch refused: {NOT_PUBLIC}", (target, error)
                assert_safe_text(error, server.port)
                assert {c[0] for c in connections} <= {"127.0.0.1"}, (target, connections)
            assert len(server.requests) == 2, (target, server.requests)
        # while a redirect to the permitted address itself is followed
        body, _ = await f.fetch(f"{server.base}/redirect?to=http://images.example.test:{server.port}/img")
        assert body == PNG
    finally:
        await f.close()


async def test_dns_rebinding_cannot_move_the_connection_off_the_checked_address(
    server: Server, connections: list[tuple[str, int]]
) -> None:
    # Given a DNS server answering a public address first and loopback afterwards
    dns = FakeDns({"rebind.test": [[PUBLIC], ["127.0.0.1"]]})
    f = fetcher(dns=dns)
    try:
        # When the host is fetched
        error = await refused(f, f"http://rebind.test:{server.port}/img")
    finally:
        await f.close()
    # Then the name was looked up once and the connection went to that checked address, never to loopback
    assert dns.queries == {"rebind.test": 1}
    assert connections == [(PUBLIC, server.port)]
    assert server.requests == []
    assert str(error) == "fetch failed: connection error" and error.transient
    assert_safe_text(error, server.port, PUBLIC)


async def test_a_rebinding_answer_on_a_later_connection_is_checked_again(
    server: Server, connections: list[tuple[str, int]]
) -> None:
    # Given a name that is an allowed loopback address first and a private one afterwards
    dns = FakeDns({"rebind.test": [["127.0.0.1"], ["10.0.0.1"]]})
    f = fetcher(private="127.0.0.1/32", dns=dns)
    try:
        # When it redirects to itself over a new connection (the first one is closed)
        url = f"http://rebind.test:{server.port}"
        error = await refused(f, f"{url}/redirect?close=1&to={url}/img")
    finally:
        await f.close()
    # Then the second lookup is vetted too: refused, no connection to the new address
    assert dns.queries == {"rebind.test": 2}
    assert str(error) == f"fetch refused: {NOT_PUBLIC}"
    assert connections == [("127.0.0.1", server.port)]
    assert server.requests == [f"/redirect?close=1&to={url}/img"]


def test_the_socket_factory_refuses_what_got_past_the_other_checks() -> None:
    client = SafeHttpClient(OutboundPolicy.parse("", "127.0.0.1/32"), timeout_s=1, max_bytes=1, max_redirects=0)
    for sockaddr in [("127.0.0.2", 80), ("169.254.169.254", 80), ("::1", 80, 0, 0), ("::ffff:10.0.0.1", 80, 0, 0)]:
        family = socket.AF_INET6 if ":" in sockaddr[0] else socket.AF_INET
        with pytest.raises(OSError, match="refused"):
            client._guarded_socket((family, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", sockaddr))
    for sockaddr in [("127.0.0.1", 80), (PUBLIC, 80)]:
        client._guarded_socket((socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", sockaddr)).close()


# --- allowed destinations ----------------------------------------------------------------------------
async def test_with_loopback_allowed_by_the_setting_a_real_image_is_fetched(
    server: Server, connections: list[tuple[str, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given SIEVE_OUTBOUND_ALLOW_PRIVATE_NETS naming loopback, and a proxy in the environment (ignored)
    monkeypatch.setenv("HTTP_PROXY", "http://10.0.0.1:3128")
    monkeypatch.setenv("http_proxy", "http://10.0.0.1:3128")
    f = Fetcher(Settings.from_env({"SIEVE_OUTBOUND_ALLOW_PRIVATE_NETS": ALLOW_LOOPBACK}))
    try:
        for url in (
            f"{server.base}/img",
            f"http://localhost:{server.port}/img",
            f"{server.base}/redirect?to=/img",
            f"http://[::ffff:127.0.0.1]:{server.port}/img",
        ):
            body, elapsed_ms = await f.fetch(url)
            assert body == PNG and elapsed_ms >= 0, url
        # a cookie set for one task is not sent with another's request
        await f.fetch(f"{server.base}/cookie")
        await f.fetch(f"{server.base}/img")
    finally:
        await f.close()
    assert connections and all(is_loopback(host) for host, _ in connections), connections
    assert {port for _, port in connections} == {server.port}
    assert "Cookie" not in server.headers[-1]


async def test_an_allow_list_lets_only_its_hosts_through(server: Server, connections: list[tuple[str, int]]) -> None:
    names = ["images.example.com", "a.cdn.example.net", "cdn.example.net", "other.example.org", "evilcdn.example.net"]
    dns = FakeDns({name: [["127.0.0.1"]] for name in names})
    f = fetcher(private=ALLOW_LOOPBACK, hosts="images.example.com,.cdn.example.net", dns=dns)
    try:
        # names on the list (exactly, or under a suffix) are fetched
        for name in ("images.example.com", "a.cdn.example.net", "cdn.example.net"):
            assert (await f.fetch(f"http://{name}:{server.port}/img"))[0] == PNG
        # other destinations are refused without a lookup or a connection, even on loopback
        connections.clear()
        for url in (
            f"http://other.example.org:{server.port}/img",
            f"http://evilcdn.example.net:{server.port}/img",
            f"{server.base}/img",
            f"http://localhost:{server.port}/img",
        ):
            error = await refused(f, url)
            assert str(error) == f"fetch refused: {NOT_ALLOWED}" and not error.transient, url
            assert_safe_text(error, server.port)
        assert connections == []
        assert "other.example.org" not in dns.queries and "evilcdn.example.net" not in dns.queries
        # and a listed host redirecting elsewhere is refused at that hop
        error = await refused(f, f"http://images.example.com:{server.port}/redirect?to={server.base}/img")
        assert str(error) == f"fetch refused: {NOT_ALLOWED}"
    finally:
        await f.close()


async def test_an_allow_list_of_networks_judges_the_resolved_addresses(
    server: Server, connections: list[tuple[str, int]]
) -> None:
    dns = FakeDns({"here.test": [["127.0.0.1"]], "there.test": [["127.0.0.2"]]})
    f = fetcher(private=ALLOW_LOOPBACK, hosts="127.0.0.1/32", dns=dns)
    try:
        assert (await f.fetch(f"{server.base}/img"))[0] == PNG
        assert (await f.fetch(f"http://here.test:{server.port}/img"))[0] == PNG
        connections.clear()
        for url in (f"http://there.test:{server.port}/img", f"http://127.0.0.2:{server.port}/img"):
            assert str(await refused(f, url)) == f"fetch refused: {NOT_ALLOWED}"
        assert connections == []
    finally:
        await f.close()


# --- failures: safe texts, classified for retries --------------------------------------------------
async def test_failures_have_safe_texts_and_say_whether_a_retry_may_help(
    server: Server, connections: list[tuple[str, int]]
) -> None:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]
    closed.close()  # a port nothing listens on
    dns = FakeDns({"img.test": [["127.0.0.1"]]})
    f = fetcher(
        private=ALLOW_LOOPBACK, dns=dns, max_image_bytes=64 * 1024, ocr_fetch_timeout_s=1.0, ocr_fetch_max_redirects=2
    )
    cases = {
        f"{server.base}/status/404": ("fetch failed (HTTP 404)", False),
        f"{server.base}/status/400": ("fetch failed (HTTP 400)", False),
        f"{server.base}/status/403": ("fetch failed (HTTP 403)", False),
        f"{server.base}/status/408": ("fetch failed (HTTP 408)", True),
        f"{server.base}/status/429": ("fetch failed (HTTP 429)", True),
        f"{server.base}/status/500": ("fetch failed (HTTP 500)", True),
        f"{server.base}/status/503": ("fetch failed (HTTP 503)", True),
        f"{server.base}/status/204": ("fetch failed (HTTP 204)", False),
        f"{server.base}/slow": ("fetch failed: timed out", True),
        f"http://127.0.0.1:{closed_port}/img": ("fetch failed: connection error", True),
        f"http://img.test:{closed_port}/img": ("fetch failed: connection error", True),
        f"http://nowhere.test:{server.port}/img": ("fetch failed: host name not found", False),
        f"{server.base}/big": ("fetch refused: body is larger than 65536 bytes", False),
        f"{server.base}/stream": ("fetch refused: body is larger than 65536 bytes", False),
        f"{server.base}/redirect?to=file:///etc/passwd": ("fetch refused: redirect to a non-http(s) URL", False),
        f"{server.base}/redirect?to=gopher://127.0.0.1:6379/_INFO": (
            "fetch refused: redirect to a non-http(s) URL",
            False,
        ),
        f"{server.base}/loop": ("fetch failed: more than 2 redirects", False),
        "ftp://127.0.0.1/img.png": ("fetch refused: not an http(s) URL", False),
        "file:///etc/passwd": ("fetch refused: not an http(s) URL", False),
        "http:///img": ("fetch refused: the URL has no host", False),
    }
    try:
        for url, (message, transient) in cases.items():
            error = await refused(f, url)
            assert (str(error), error.transient) == (message, transient), url
            assert_safe_text(error, server.port, closed_port, "10.9.8.7", "6543")
    finally:
        await f.close()
    assert {host for host, _ in connections} <= {"127.0.0.1"}


# --- the intake's early check ------------------------------------------------------------------------
def url_spec(url: str) -> intake_pb2.TaskSpec:
    return intake_pb2.TaskSpec(device_id="0A:00:00:00:00:01", type=types_pb2.TASK_TYPE_OCR_IMAGE, image_url=url)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/img",
        "http://169.254.169.254/latest/meta-data",
        "http://10.0.0.1/",
        "http://[::1]/",
        "http://[::ffff:127.0.0.1]/",
        "http://2130706433/",
        "http://0x7f.1/",
        "http://0177.0.0.1/",
        "http://127.1/",
        "http://0.0.0.0/",
        "https://100.64.0.1/",
        "http://[fe80::1%25eth0]/",
        "http://[64:ff9b::a9fe:a9fe]/",
        "http://[::1/",
        "http://host:99999/",
        "http://:80/",
    ],
)
def test_the_intake_refuses_unsafe_ip_literals_naming_the_field(url: str) -> None:
    with pytest.raises(InvalidInput) as err:
        validate_spec(url_spec(url), "task", "anonymous", Settings.from_env({}))
    assert err.value.field == "task.image_url"
    assert not _ADDRESSY.search(err.value.description), err.value.description


def test_the_intake_accepts_public_literals_and_names_and_honours_the_settings() -> None:
    default = Settings.from_env({})
    for url in (
        "http://8.8.8.8/img.png",
        "https://images.example.com/a.png",
        "http://internal.corp/x.png",
        "http://[2606:4700::1111]/x",
    ):
        assert validate_spec(url_spec(url), "task", "anonymous", default).image_url == url
    local = Settings.from_env({}, outbound_allow_private_nets="127.0.0.0/8")
    assert validate_spec(url_spec("http://127.0.0.1:8080/x"), "task", "anonymous", local).image_url
    listed = Settings.from_env({}, outbound_allow_hosts=".example.com")
    assert validate_spec(url_spec("https://img.example.com/x"), "task", "anonymous", listed).image_url
    with pytest.raises(InvalidInput, match="allowed hosts"):
        validate_spec(url_spec("https://example.org/x"), "task", "anonymous", listed)


async def test_submit_with_an_unsafe_image_url_is_invalid_argument_and_stores_nothing(
    settings: Settings, redis: Any, pg: Any
) -> None:
    from tests.support.platform import platform_with

    async with platform_with(settings, redis, pg) as platform:
        for url in ("http://169.254.169.254/latest/meta-data", "http://2130706433/"):
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await platform.intake.Submit(intake_pb2.SubmitRequest(task=url_spec(url)))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert rpc.bad_fields_of(err.value) == ["task.image_url"]
        assert await pg.fetchval("SELECT count(*) FROM tasks") == 0
