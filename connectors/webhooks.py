"""Where the notifier may post: public addresses only, unless the operator allows more.

A job's owner chooses its webhook's URL, so without a rule the notifier (inside the
cluster's network) would post wherever an owner points it: loopback services, the cloud
metadata endpoint (169.254.169.254), private networks. So every connection is checked
where it is made: the host name is resolved once, each address is judged, and the
connection is made to the address that passed, never resolved again (a name that
resolves elsewhere the second time, DNS rebinding, cannot move it). TLS still verifies
the certificate against the URL's host name.

Refused unless allowed: loopback, link-local, private (RFC 1918, unique local),
shared (100.64/10), multicast, unspecified, reserved and documentation ranges: every
address that is not globally routable (`ipaddress`'s `is_global`). An IPv6 address that
embeds an IPv4 address is judged by it too, since a host, NAT64 gateway or relay on the
way may deliver it there: IPv4-mapped `::ffff:a.b.c.d` and IPv4-compatible `::a.b.c.d`
(judged as the IPv4 address alone), NAT64 `64:ff9b::/96`, IPv4-translated
`::ffff:0:a.b.c.d`, 6to4 `2002::/16` and Teredo `2001::/32` (its server and its client,
un-XOR-ed) must be public in both forms; the local-use NAT64 prefix `64:ff9b:1::/48`
(RFC 8215) and the deprecated site-local `fec0::/10` are never public. The operator's
allow-list (`cronlog notifier --allow-destination`, CRONLOG_NOTIFY_ALLOW) names
networks (`10.20.0.0/16`) or host names (`hooks.internal`) that may be reached anyway.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import httpcore
import httpx

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str, int], Sequence[str]]


class DestinationRefused(Exception):
    """A webhook's host is not a destination the notifier may reach (not retried)."""


@dataclass(frozen=True, slots=True)
class Destinations:
    """The operator's allow-list (empty: public addresses only)."""

    networks: tuple[Network, ...] = ()
    hosts: frozenset[str] = frozenset()

    @staticmethod
    def parse(items: Iterable[str]) -> Destinations:
        """From `--allow-destination` values: a network or address, or a host name."""
        networks: list[Network] = []
        hosts: set[str] = set()
        for raw in items:
            item = raw.strip()
            if not item:
                continue
            try:
                networks.append(ipaddress.ip_network(item, strict=False))
            except ValueError:
                if "/" in item or any(c.isspace() for c in item):
                    raise ValueError(
                        f"--allow-destination {raw!r}: not a network (10.0.0.0/8), "
                        "an address or a host name"
                    ) from None
                hosts.add(item.lower().rstrip("."))
        return Destinations(tuple(networks), frozenset(hosts))

    def refusal(self, host: str, address: str) -> str:
        """Why `host` may not be reached at `address` ('' if it may)."""
        if host.lower().rstrip(".") in self.hosts:
            return ""
        ip: Address = ipaddress.ip_address(address.split("%", 1)[0])
        for one in judged_addresses(ip):
            why = self._why_not(one)
            if why:
                embeds = "" if one == ip else f" (embeds {one})"
                return (
                    f"{host} resolves to {ip}{embeds} ({why}): webhooks may reach public "
                    "addresses only unless the operator allows more "
                    "(cronlog notifier --allow-destination)"
                )
        return ""

    def _why_not(self, ip: Address) -> str:
        """Why `ip` alone may not be reached ('' if it may)."""
        if any(ip in network for network in self.networks):
            return ""
        if ip in LOCAL_NAT64:
            return "local-use NAT64"
        if ip in SITE_LOCAL:
            return "site-local"
        if ip.is_global and not ip.is_multicast:
            return ""
        return next(
            (
                name
                for name, flag in (
                    ("loopback", ip.is_loopback),
                    ("link-local", ip.is_link_local),
                    ("multicast", ip.is_multicast),
                    ("unspecified", ip.is_unspecified),
                    ("private", ip.is_private),
                )
                if flag
            ),
            "not globally routable",
        )


NAT64 = ipaddress.IPv6Network("64:ff9b::/96")  # RFC 6052: the IPv4 address is the last 32 bits
LOCAL_NAT64 = ipaddress.IPv6Network("64:ff9b:1::/48")  # RFC 8215: local use, never public
IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")  # deprecated ::a.b.c.d (:: and ::1 too)
IPV4_TRANSLATED = ipaddress.IPv6Network("::ffff:0:0:0/96")  # SIIT, RFC 6145: last 32 bits
SITE_LOCAL = ipaddress.IPv6Network("fec0::/10")  # deprecated, but routed inside some sites


def judged_addresses(ip: Address) -> tuple[Address, ...]:
    """The addresses a connection to `ip` may reach, each judged: `ip` and the IPv4
    addresses it embeds. Mapped and compatible forms are only their IPv4 address (the
    host's stack delivers them over IPv4); NAT64, 6to4 and Teredo both forms."""
    if isinstance(ip, ipaddress.IPv4Address):
        return (ip,)
    if ip.ipv4_mapped is not None:
        return (ip.ipv4_mapped,)
    last32 = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip in IPV4_COMPATIBLE:
        return (last32,)
    if ip in NAT64 or ip in IPV4_TRANSLATED:
        return (ip, last32)
    if ip.sixtofour is not None:
        return (ip, ip.sixtofour)
    if ip.teredo is not None:
        server, client = ip.teredo
        return (ip, server, client)
    return (ip,)


def system_resolver(host: str, port: int) -> list[str]:
    """Every address `host` resolves to, in the resolver's order."""
    found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in found))


class GuardedBackend(httpcore.SyncBackend):
    """httpcore's network backend, with every TCP connection checked and pinned."""

    def __init__(self, destinations: Destinations, resolve: Resolver = system_resolver):
        self.destinations = destinations
        self.resolve = resolve

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        try:
            addresses = self.resolve(host, port)
        except OSError as exc:
            raise httpcore.ConnectError(f"cannot resolve {host}: {exc}") from exc
        reasons = []
        for address in addresses:
            reason = self.destinations.refusal(host, address)
            if not reason:
                return super().connect_tcp(address, port, timeout, local_address, socket_options)
            reasons.append(reason)
        raise DestinationRefused(reasons[0] if reasons else f"{host} resolves to nothing")


def guarded_client(
    destinations: Destinations, timeout_s: float, resolve: Resolver = system_resolver
) -> httpx.Client:
    """An httpx client whose connections go only where `destinations` allow; no
    redirects followed, no proxy from the environment (a proxy would connect for us)."""
    transport = httpx.HTTPTransport(trust_env=False)
    # httpx has no parameter for the network backend: the transport's pool is rebuilt
    # with the guarded one (the same pool httpx builds, for direct connections).
    transport._pool = httpcore.ConnectionPool(  # noqa: SLF001 (httpx: no public way, above)
        ssl_context=httpx.create_ssl_context(),
        network_backend=GuardedBackend(destinations, resolve),
    )
    return httpx.Client(
        transport=transport, timeout=timeout_s, follow_redirects=False, trust_env=False
    )
