"""Where Sieve may send outbound requests: the address classifier and the destination policy (no SSRF).

Every outbound http(s) request of a Sieve service (an OCR worker fetching an `image_url`, later result
callbacks) goes only to *public* addresses. This module owns that rule; `sieve.outbound.client` applies it to
real connections. It needs nothing but the standard library, so the intake can use it without aiohttp.

- `non_public_reason(ip)` classifies one address: None for a public unicast address, else a short label
  ("loopback", "private", "link-local", "shared (CGNAT)", "documentation", "multicast", "reserved", …).
  Python's `is_global` alone is too lax on 3.11 (it calls fec0::/10, 192.0.0.0/24 and 3fff::/20 global), so
  explicit tables come first. IPv6 addresses that carry an IPv4 address — IPv4-mapped ::ffff:0:0/96, NAT64
  64:ff9b::/96, 6to4 2002::/16 — are judged by the IPv4 address they lead to; Teredo (in 2001::/23), the
  deprecated IPv4-compatible ::/96 and local-use NAT64 64:ff9b:1::/48 are refused outright.
- `literal_address(host)` reads a host that is an IP literal in any spelling the C library accepts
  (``2130706433``, ``0x7f.1``, ``0177.0.0.1``, ``127.1``, ``[::ffff:127.0.0.1]``) without any DNS.
- `OutboundPolicy` (from `SIEVE_OUTBOUND_ALLOW_HOSTS` and `SIEVE_OUTBOUND_ALLOW_PRIVATE_NETS`) decides for a
  host and ALL its addresses: every address must be public or inside an allowed private net, and when an
  allow-list is set the host name must match one of its names or suffixes, or every address one of its CIDRs.
  A refusal is a `DestinationRefused` whose `reason` is safe to show to callers (no address, no port) and
  whose `detail` is for the server's log.
"""

from __future__ import annotations

import functools
import ipaddress
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network
from typing import Protocol

from sieve.errors import SettingsError

IPAddress = IPv4Address | IPv6Address
IPNetwork = IPv4Network | IPv6Network

#: What a caller is told when an address is not public (one text for every kind: it tells nothing about
#: what a host name resolved to).
NOT_PUBLIC = "destination is not a public address"
NOT_ALLOWED = "destination is not in the allowed hosts"

_V4 = IPv4Network
_V6 = IPv6Network
# Special-purpose IPv4 blocks (IANA registry, RFC 6890 and successors) that must never be reached.
_V4_TABLE: tuple[tuple[IPv4Network, str], ...] = (
    (_V4("0.0.0.0/8"), "this network"),
    (_V4("10.0.0.0/8"), "private"),
    (_V4("100.64.0.0/10"), "shared (CGNAT)"),
    (_V4("127.0.0.0/8"), "loopback"),
    (_V4("169.254.0.0/16"), "link-local"),
    (_V4("172.16.0.0/12"), "private"),
    (_V4("192.0.0.0/24"), "IETF protocol assignments"),
    (_V4("192.0.2.0/24"), "documentation"),
    (_V4("192.88.99.0/24"), "6to4 relay anycast"),
    (_V4("192.168.0.0/16"), "private"),
    (_V4("198.18.0.0/15"), "benchmarking"),
    (_V4("198.51.100.0/24"), "documentation"),
    (_V4("203.0.113.0/24"), "documentation"),
    (_V4("224.0.0.0/4"), "multicast"),
    (_V4("255.255.255.255/32"), "broadcast"),
    (_V4("240.0.0.0/4"), "reserved"),
)
# Special-purpose IPv6 blocks; the ones that embed an IPv4 address are unwrapped before this table.
_V6_TABLE: tuple[tuple[IPv6Network, str], ...] = (
    (_V6("::/128"), "unspecified"),
    (_V6("::1/128"), "loopback"),
    (_V6("::/96"), "IPv4-compatible (deprecated)"),
    (_V6("::ffff:0:0:0/96"), "IPv4-translated"),
    (_V6("64:ff9b:1::/48"), "NAT64 local-use"),
    (_V6("100::/64"), "discard-only"),
    (_V6("2001:db8::/32"), "documentation"),
    (_V6("2001::/23"), "IETF protocol assignments (Teredo, ORCHID, …)"),
    (_V6("3fff::/20"), "documentation"),
    (_V6("5f00::/16"), "SRv6 SIDs"),
    (_V6("fc00::/7"), "unique local"),
    (_V6("fe80::/10"), "link-local"),
    (_V6("fec0::/10"), "site-local (deprecated)"),
    (_V6("ff00::/8"), "multicast"),
)
_NAT64 = _V6("64:ff9b::/96")
_MAPPED = _V6("::ffff:0:0/96")
_SIXTOFOUR = _V6("2002::/16")


class DestinationRefused(Exception):
    """An outbound destination the policy refuses: `reason` is for the caller, `detail` for the log."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.detail = detail or reason


def _without_scope(ip: IPAddress) -> IPAddress:
    if isinstance(ip, IPv6Address) and ip.scope_id:
        return IPv6Address(int(ip))
    return ip


def embedded_ipv4(ip: IPv6Address) -> IPv4Address | None:
    """The IPv4 address an IPv4-mapped, NAT64 (64:ff9b::/96) or 6to4 address leads to, else None."""
    ip = IPv6Address(int(ip))
    if ip in _MAPPED:
        return ip.ipv4_mapped
    if ip in _NAT64:
        return IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip in _SIXTOFOUR:
        return ip.sixtofour
    return None


def non_public_reason(ip: IPAddress) -> str | None:
    """None when `ip` is a public unicast address that may be reached; else a short label saying why not."""
    ip = _without_scope(ip)
    if isinstance(ip, IPv6Address):
        inner = embedded_ipv4(ip)
        if inner is not None:
            reason = non_public_reason(inner)
            return None if reason is None else f"{reason} (IPv4 inside IPv6)"
    reason = _table_reason(ip)
    return reason if reason is not None else _flag_reason(ip)


def _table_reason(ip: IPAddress) -> str | None:
    """The label of the first net of the address family's table that holds `ip` (IPv6: or site-local), else None."""
    if isinstance(ip, IPv6Address):
        for net, label in _V6_TABLE:
            if ip in net:
                return label
        return "site-local (deprecated)" if ip.is_site_local else None
    for net4, label4 in _V4_TABLE:
        if ip in net4:
            return label4
    return None


def _flag_reason(ip: IPAddress) -> str | None:
    """The flags of `ipaddress`, as a second net under the tables: why `ip` is not public, else None."""
    if ip.is_unspecified:
        return "unspecified"
    if ip.is_loopback:
        return "loopback"
    if ip.is_link_local:
        return "link-local"
    if ip.is_multicast:
        return "multicast"
    if ip.is_private:
        return "private"
    if ip.is_reserved:
        return "reserved"
    if not ip.is_global:
        return "not global"
    return None


def is_public_address(ip: IPAddress) -> bool:
    return non_public_reason(ip) is None


_NUMERIC_V4 = frozenset("0123456789abcdefxABCDEFX.")


def literal_address(host: str) -> IPAddress | None:
    """`host` read as an IP literal, in any spelling the C library accepts (decimal, octal, hex, short
    forms, bracketed IPv6 with or without a zone); None for a host name. Never touches DNS."""
    host = host.strip()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    host = host.replace("%25", "%")
    if host.endswith(".") and ":" not in host:
        host = host[:-1]  # "127.0.0.1." is still the address (a resolver reads it so)
    if not host:
        return None
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    if ":" not in host and set(host) <= _NUMERIC_V4:
        # inet_aton: the BSD forms (one to four parts, each decimal, 0-octal or 0x-hex)
        try:
            return IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    return None


def parse_address(text: str) -> IPAddress:
    """An address as getaddrinfo writes it (an IPv6 one possibly with a %zone)."""
    return ipaddress.ip_address(text)


def _parse_nets(variable: str, raw: str) -> tuple[IPNetwork, ...]:
    nets: list[IPNetwork] = []
    for item in filter(None, (p.strip() for p in raw.split(","))):
        try:
            nets.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise SettingsError(f"{variable}: {item!r} is not an IP network (CIDR)") from None
    return tuple(nets)


def _normal_name(host: str) -> str:
    return host.strip().lower().rstrip(".")


def _in_any(ip: IPAddress, nets: Sequence[IPNetwork]) -> bool:
    ip = _without_scope(ip)
    candidates: list[IPAddress] = [ip]
    if isinstance(ip, IPv6Address):
        inner = embedded_ipv4(ip)
        if inner is not None:
            candidates.append(inner)
    return any(c.version == net.version and c in net for c in candidates for net in nets)


class OutboundSettings(Protocol):
    """The settings a policy is made of (`sieve.settings.Settings` has them). This module is below the settings:
    `Settings` checks SIEVE_OUTBOUND_* with `policy_for` when it loads."""

    @property
    def outbound_allow_hosts(self) -> str: ...
    @property
    def outbound_allow_private_nets(self) -> str: ...


@dataclass(frozen=True, slots=True)
class OutboundPolicy:
    """Owns the decision whether a host and its addresses may be contacted (see the module docstring)."""

    #: allow-list: exact host names (lower case, no trailing dot)
    allow_names: frozenset[str] = frozenset()
    #: allow-list: suffixes, each with its leading dot (".example.com" allows example.com and every name under it)
    allow_suffixes: tuple[str, ...] = ()
    #: allow-list: networks whose addresses are allowed
    allow_nets: tuple[IPNetwork, ...] = ()
    #: non-public networks that may be reached anyway (tests, local runs)
    private_nets: tuple[IPNetwork, ...] = ()

    @classmethod
    def parse(cls, allow_hosts: str = "", allow_private_nets: str = "") -> OutboundPolicy:
        """From the two settings' texts; SettingsError naming the variable for a bad entry."""
        names: set[str] = set()
        suffixes: list[str] = []
        nets: list[IPNetwork] = []
        for item in filter(None, (p.strip() for p in allow_hosts.split(","))):
            try:
                nets.append(ipaddress.ip_network(item.strip("[]"), strict=False))
                continue
            except ValueError:
                pass
            name = _normal_name(item)
            label = name.lstrip(".")
            if not label or any(c in name for c in "/:@ *") or literal_address(label) is not None:
                raise SettingsError(
                    f"SIEVE_OUTBOUND_ALLOW_HOSTS: {item!r} is neither a host name, a suffix "
                    "like .example.com nor a CIDR"
                )
            if name.startswith("."):
                suffixes.append("." + label)
            else:
                names.add(name)
        return cls(
            frozenset(names),
            tuple(suffixes),
            tuple(nets),
            _parse_nets("SIEVE_OUTBOUND_ALLOW_PRIVATE_NETS", allow_private_nets),
        )

    @classmethod
    def from_settings(cls, settings: OutboundSettings) -> OutboundPolicy:
        return policy_for(settings.outbound_allow_hosts, settings.outbound_allow_private_nets)

    @property
    def restricted(self) -> bool:
        """True when an allow-list is set: only its destinations may be reached."""
        return bool(self.allow_names or self.allow_suffixes or self.allow_nets)

    def name_allowed(self, host: str) -> bool:
        """True when the allow-list names `host` (by name or suffix); always False without one."""
        name = _normal_name(host)
        return name in self.allow_names or any(name == s[1:] or name.endswith(s) for s in self.allow_suffixes)

    def address_permitted(self, ip: IPAddress) -> str | None:
        """None when `ip` is public or inside an allowed private net; else why not (for the log)."""
        reason = non_public_reason(ip)
        if reason is None or _in_any(ip, self.private_nets):
            return None
        return reason

    def check_name(self, host: str) -> None:
        """What can be told from the name alone, before any DNS: with an allow-list of names only, a host it
        does not name is refused here (so it is never even looked up)."""
        if self.restricted and not self.allow_nets and not self.name_allowed(host):
            raise DestinationRefused(NOT_ALLOWED, f"host {host!r} is not in SIEVE_OUTBOUND_ALLOW_HOSTS")

    def check(self, host: str, addresses: Iterable[IPAddress]) -> None:
        """Refuses unless EVERY address may be contacted and, with an allow-list, the host or all its
        addresses are on it. No addresses at all is a refusal too."""
        addresses = list(addresses)
        if not addresses:
            raise DestinationRefused(NOT_PUBLIC, f"host {host!r} has no address")
        for ip in addresses:
            reason = self.address_permitted(ip)
            if reason is not None:
                raise DestinationRefused(NOT_PUBLIC, f"host {host!r} has address {ip} ({reason})")
        if self.restricted and not self.name_allowed(host):
            outside = [ip for ip in addresses if not _in_any(ip, self.allow_nets)]
            if outside:
                raise DestinationRefused(
                    NOT_ALLOWED, f"host {host!r} ({outside[0]}) is not in SIEVE_OUTBOUND_ALLOW_HOSTS"
                )

    def check_without_dns(self, host: str) -> None:
        """The intake's early check: an IP-literal host is judged fully; a name only against a names-only
        allow-list. The worker's check at connection time is the real one."""
        ip = literal_address(host)
        if ip is None:
            self.check_name(host)
        else:
            self.check(host, [ip])


@functools.lru_cache(maxsize=16)
def policy_for(allow_hosts: str, allow_private_nets: str) -> OutboundPolicy:
    """The policy of these two settings' values (parsed once)."""
    return OutboundPolicy.parse(allow_hosts, allow_private_nets)


__all__ = [
    "NOT_ALLOWED",
    "NOT_PUBLIC",
    "DestinationRefused",
    "IPAddress",
    "OutboundPolicy",
    "OutboundSettings",
    "embedded_ipv4",
    "is_public_address",
    "literal_address",
    "non_public_reason",
    "parse_address",
    "policy_for",
]
