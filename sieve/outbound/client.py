"""Outbound http(s) requests that reach only the destinations `sieve.outbound.policy.OutboundPolicy` allows.

`SafeHttpClient` owns one aiohttp session (one connection pool) whose connector can only connect to vetted
addresses, in three layers:

1. before every request and every redirect hop: the scheme (http/https only), the host against a names-only
   allow-list (so a refused name is not even looked up), and an IP-literal host — in any spelling,
   ``2130706433``, ``0x7f.1``, ``[::ffff:127.0.0.1]`` — read by getaddrinfo(AI_NUMERICHOST) and judged;
2. the connector's resolver (`VettingResolver`): a host name is resolved ONCE per new connection (async
   getaddrinfo), the request is refused if ANY of its addresses may not be contacted, and the connector
   gets exactly those vetted addresses — there is no second lookup a rebinding DNS server could answer
   differently (no DNS cache either: a pooled connection to a host was itself made to vetted addresses);
3. the connector's socket factory checks each address it is about to connect to once more, whatever path
   led there (a net under the two others: it never refuses what they let through).

Redirects are followed by hand (each hop goes through 1–3); proxies from the environment are ignored
(`trust_env=False`), cookies are never kept (one task's server must not set cookies for another's), and the
whole request — connecting, redirects, body — has one time limit, the body a size limit.

Every failure is a `FetchError` whose text is safe to hand to the caller: never an address, a port or a
connector's message — "fetch refused: destination is not a public address", "fetch failed (HTTP 404)",
"fetch failed: timed out", "fetch failed: connection error". `transient` tells whether trying again later
may help (timeouts, connection errors, HTTP 5xx, 408 and 429) or not (refusals, other 4xx, too large, bad
scheme). Details are logged here (logger `sieve.outbound.policy`) with the URL's host only.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.helpers import is_ip_address
from multidict import CIMultiDictProxy
from yarl import URL

from sieve.outbound.policy import (
    NOT_PUBLIC,
    DestinationRefused,
    IPAddress,
    OutboundPolicy,
    literal_address,
    parse_address,
)

log = logging.getLogger("sieve.outbound.policy")

#: loop.getaddrinfo's shape: (host, port, *, family=0, type=0, proto=0, flags=0) -> getaddrinfo tuples.
GetAddrInfo = Callable[..., Awaitable[list[tuple[Any, ...]]]]

ALLOWED_SCHEMES = ("http", "https")
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
#: 4xx answers that may succeed later (everything 5xx may too)
TRANSIENT_STATUSES = frozenset({408, 429})
_CHUNK = 64 * 1024


class FetchError(Exception):
    """An outbound request that gave nothing usable; the message is safe to show to the caller."""

    def __init__(
        self, message: str, *, transient: bool, status: int | None = None, retry_after: str | None = None
    ) -> None:
        super().__init__(message)
        #: trying again later may help (timeouts, connection errors, 5xx, 408, 429)
        self.transient = transient
        #: the HTTP status when the server answered with an error
        self.status = status
        #: that answer's Retry-After header, if it had one
        self.retry_after = retry_after


def refused(reason: str) -> FetchError:
    return FetchError(f"fetch refused: {reason}", transient=False)


def status_failure(status: int, retry_after: str | None = None) -> FetchError:
    return FetchError(
        f"fetch failed (HTTP {status})",
        status=status,
        transient=status >= 500 or status in TRANSIENT_STATUSES,
        retry_after=retry_after,
    )


@dataclass(frozen=True, slots=True)
class Fetched:
    """A 2xx answer, its body read within the limits."""

    status: int
    headers: CIMultiDictProxy[str]
    body: bytes
    #: the URL that answered (after redirects)
    url: str
    elapsed_ms: float


class _GuardRefused(OSError):
    """The socket factory refused an address (layer 3)."""


def _addresses(infos: list[tuple[Any, ...]]) -> list[tuple[IPAddress, int, int]]:
    """(address, family, proto) of getaddrinfo results, in order, without repeats."""
    seen: dict[IPAddress, tuple[IPAddress, int, int]] = {}
    for family, _type, proto, _canon, sockaddr in infos:
        if family not in (socket.AF_INET, socket.AF_INET6):
            continue
        ip = parse_address(str(sockaddr[0]))
        seen.setdefault(ip, (ip, family, proto))
    return list(seen.values())


class VettingResolver(AbstractResolver):  # type: ignore[misc]  # aiohttp is Any to mypy (pyproject [tool.mypy])
    """The connector's resolver: one lookup per connection, every address vetted, exactly those returned."""

    def __init__(self, policy: OutboundPolicy, getaddrinfo: GetAddrInfo | None = None) -> None:
        self._policy = policy
        self._getaddrinfo = getaddrinfo

    async def resolve(
        self,
        host: str,
        port: int = 0,
        family: socket.AddressFamily = socket.AF_INET,
    ) -> list[ResolveResult]:
        lookup = self._getaddrinfo or asyncio.get_running_loop().getaddrinfo
        # every address of the name, whatever family the connector prefers: one bad address refuses the host
        infos = await lookup(host, port, type=socket.SOCK_STREAM)
        found = _addresses(infos)
        self._policy.check(host, [ip for ip, _, _ in found])  # DestinationRefused propagates untouched
        return [
            ResolveResult(
                hostname=host,
                host=str(ip),
                port=port,
                family=fam,
                proto=proto,
                flags=socket.AI_NUMERICHOST | socket.AI_NUMERICSERV,
            )
            for ip, fam, proto in found
            if not family or fam == family or family == socket.AF_UNSPEC
        ]

    async def close(self) -> None:
        return None


class SafeHttpClient:
    """Owns one connection pool for outbound http(s) within `policy`, a time and a size limit; `close` when
    done. `getaddrinfo` replaces the event loop's host-name lookup (tests: a DNS server that lies)."""

    def __init__(
        self,
        policy: OutboundPolicy,
        *,
        timeout_s: float,
        max_bytes: int,
        max_redirects: int,
        headers: Mapping[str, str] | None = None,
        getaddrinfo: GetAddrInfo | None = None,
    ) -> None:
        self.policy = policy
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        self.max_redirects = max_redirects
        self._headers = dict(headers or {})
        self._getaddrinfo = getaddrinfo
        self._session: aiohttp.ClientSession | None = None

    # --- the pool ---------------------------------------------------------------------------------
    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                resolver=VettingResolver(self.policy, self._getaddrinfo),
                use_dns_cache=False,
                socket_factory=self._guarded_socket,
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.timeout_s, sock_read=self.timeout_s),
                headers={"Accept-Encoding": "identity", **self._headers},
                cookie_jar=aiohttp.DummyCookieJar(),
                trust_env=False,
            )
        return self._session

    def _guarded_socket(self, addr_info: tuple[Any, ...]) -> socket.socket:
        family, type_, proto, _canon, sockaddr = addr_info
        reason = self.policy.address_permitted(parse_address(str(sockaddr[0])))
        if reason is not None:
            raise _GuardRefused(f"connection to a {reason} address refused")
        return socket.socket(family=family, type=type_, proto=proto)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    # --- requests ---------------------------------------------------------------------------------
    async def get(self, url: str) -> Fetched:
        """The 2xx answer at `url`, redirects followed; FetchError otherwise."""
        return await self.request("GET", url)

    async def request(
        self,
        method: str,
        url: str,
        *,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        follow_redirects: bool | None = None,
    ) -> Fetched:
        """One request within the policy and the limits; redirects are followed for GET and HEAD (unless
        `follow_redirects` says otherwise), each hop checked again. FetchError for anything but a 2xx."""
        began = time.perf_counter()
        follow = method in ("GET", "HEAD") if follow_redirects is None else follow_redirects
        hosts = ["?"]  # the host of each hop, for the log
        try:
            target = URL(url)
            hosts.append(target.raw_host or "?")
        except (ValueError, TypeError):
            raise _log_refusal(hosts[-1], refused("not a valid URL"), "unparsable URL") from None
        try:
            async with asyncio.timeout(self.timeout_s):
                status, response_headers, data, final = await self._follow(method, target, body, headers, follow, hosts)
        except FetchError:
            raise
        except Exception as exc:
            failure = _failure(exc, hosts[-1])
            if failure is None:
                raise
            raise failure from None
        return Fetched(status, response_headers, data, str(final), (time.perf_counter() - began) * 1000)

    async def _follow(
        self,
        method: str,
        url: URL,
        body: bytes | None,
        headers: Mapping[str, str] | None,
        follow: bool,
        hosts: list[str],
    ) -> tuple[int, CIMultiDictProxy[str], bytes, URL]:
        session = self._client()
        for hop in range(self.max_redirects + 1):
            host = url.raw_host or "?"
            hosts.append(host)
            await self._vet(url, redirected=hop > 0)
            async with session.request(
                method, url, data=body, headers=headers, allow_redirects=False, proxy=None
            ) as response:
                if follow and response.status in REDIRECT_STATUSES:
                    location = response.headers.get("Location")
                    if not location:
                        raise _log_failure(
                            host,
                            FetchError(
                                f"fetch failed: HTTP {response.status} without a Location",
                                transient=False,
                                status=response.status,
                            ),
                        )
                    try:
                        next_url = url.join(URL(location))
                    except (ValueError, TypeError):
                        raise _log_failure(
                            host, FetchError("fetch failed: redirect to an invalid URL", transient=False)
                        ) from None
                    if next_url.scheme.lower() not in ALLOWED_SCHEMES:
                        raise _log_refusal(
                            host, refused("redirect to a non-http(s) URL"), f"redirect to scheme {next_url.scheme!r}"
                        )
                    if hop == self.max_redirects:
                        break
                    if response.status == 303 or (response.status in (301, 302) and method == "POST"):
                        method, body = "GET", None
                    url = next_url
                    continue
                if not 200 <= response.status < 300:
                    raise _log_failure(host, status_failure(response.status, response.headers.get("Retry-After")))
                if response.content_length is not None and response.content_length > self.max_bytes:
                    raise _log_failure(host, refused(f"body is larger than {self.max_bytes} bytes"))
                return response.status, response.headers, await self._read(response, host), url
        raise _log_failure(
            hosts[-1], FetchError(f"fetch failed: more than {self.max_redirects} redirects", transient=False)
        )

    async def _vet(self, url: URL, *, redirected: bool) -> None:
        """Layer 1: what can be refused before anything is looked up or connected."""
        host = url.raw_host or "?"
        if url.scheme.lower() not in ALLOWED_SCHEMES:
            what = "redirect to a non-http(s) URL" if redirected else "not an http(s) URL"
            raise _log_refusal(host, refused(what), f"scheme {url.scheme!r}")
        if not url.raw_host:
            raise _log_refusal(host, refused("the URL has no host"), "no host")
        try:
            self.policy.check_name(url.raw_host)
            if is_ip_address(url.raw_host) or literal_address(url.raw_host) is not None:
                # aiohttp connects to an IP-literal host without asking the resolver: judge it here, as the
                # C library reads it (the socket factory sees it again)
                literal = url.raw_host.replace("%25", "%")
                if ":" not in literal and literal.endswith("."):
                    literal = literal[:-1]  # "127.0.0.1." is read as 127.0.0.1 by a resolver
                try:
                    infos = await asyncio.get_running_loop().getaddrinfo(
                        literal, url.port or 0, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST
                    )
                except (socket.gaierror, UnicodeError):
                    raise DestinationRefused("the host is not a valid address", "unreadable IP literal") from None
                self.policy.check(url.raw_host, [ip for ip, _, _ in _addresses(infos)])
        except DestinationRefused as exc:
            raise _log_refusal(host, refused(exc.reason), exc.detail) from None

    async def _read(self, response: aiohttp.ClientResponse, host: str) -> bytes:
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.content.iter_chunked(_CHUNK):
            size += len(chunk)
            if size > self.max_bytes:
                raise _log_failure(host, refused(f"body is larger than {self.max_bytes} bytes"))
            chunks.append(chunk)
        return b"".join(chunks)


# --- failures -------------------------------------------------------------------------------------
def _log_refusal(host: str, error: FetchError, detail: str) -> FetchError:
    log.warning("outbound request to host %r refused: %s", host, detail)
    return error


def _log_failure(host: str, error: FetchError) -> FetchError:
    log.info("outbound request to host %r: %s", host, error)
    return error


def _failure(exc: Exception, host: str) -> FetchError | None:
    """The caller-safe FetchError of an exception out of aiohttp (None: not a request failure)."""
    if isinstance(exc, DestinationRefused):  # from the resolver (layer 2)
        return _log_refusal(host, refused(exc.reason), exc.detail)
    guard = getattr(exc, "os_error", None) or exc.__cause__
    if isinstance(guard, _GuardRefused):  # from the socket factory (layer 3)
        return _log_refusal(host, refused(NOT_PUBLIC), str(guard))
    if isinstance(exc, asyncio.TimeoutError):
        message, transient = "fetch failed: timed out", True
    elif isinstance(exc, aiohttp.ClientConnectorDNSError):
        errno = getattr(exc.os_error, "errno", None)
        message, transient = "fetch failed: host name not found", errno == socket.EAI_AGAIN
    elif isinstance(exc, aiohttp.ClientSSLError | aiohttp.ServerFingerprintMismatch):
        message, transient = "fetch failed: TLS error", False
    elif isinstance(exc, aiohttp.InvalidURL):
        message, transient = "fetch refused: not a valid URL", False
    elif isinstance(exc, aiohttp.ClientPayloadError):
        message, transient = "fetch failed: incomplete body", True
    elif isinstance(exc, aiohttp.ClientResponseError):
        message, transient = "fetch failed: malformed response", False
    elif isinstance(exc, aiohttp.ClientError | OSError):
        message, transient = "fetch failed: connection error", True
    else:
        return None
    log.info("outbound request to host %r failed: %s (%s: %s)", host, message, type(exc).__name__, exc)
    return FetchError(message, transient=transient)


__all__ = [
    "ALLOWED_SCHEMES",
    "FetchError",
    "Fetched",
    "GetAddrInfo",
    "SafeHttpClient",
    "VettingResolver",
    "refused",
    "status_failure",
]
