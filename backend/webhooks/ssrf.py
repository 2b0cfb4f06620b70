"""Webhook targets may only be public internet hosts, unless an operator allows more.

Checked when a webhook is created (every address its host resolves to) and again at every
delivery, at connection time: `PinnedBackend` resolves the host once, checks every address, and
connects to a checked address itself (no second resolution a DNS rebinding could change; TLS SNI
and the Host header still name the host). Refused by default: loopback, private (10/8, 172.16/12,
192.168/16), CGNAT 100.64/10, link-local, cloud metadata, 0.0.0.0/8, multicast, reserved and
documentation ranges; IPv6 ULA fc00::/7, site-local fec0::/10, and the forms that embed an IPv4
address (mapped, compatible, NAT64, 6to4, Teredo). `webhook_allowed_networks` opens chosen
networks (e.g. an internal chat relay); `allow_loopback_webhooks` opens loopback (development,
tests). Metadata addresses stay refused whatever the settings.
"""
from __future__ import annotations

import ipaddress
import re
import socket
from dataclasses import dataclass
from typing import Callable, Iterable
from urllib.parse import urlsplit

import httpcore
import httpx

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
# host, port -> every address it resolves to (a stub in tests: nothing is ever sent to them)
Resolver = Callable[[str, int], list[str]]

METADATA_ADDRESSES = frozenset(ipaddress.ip_address(a) for a in (
    "169.254.169.254",  # AWS, GCP, Azure, OpenStack...
    "fd00:ec2::254",  # AWS over IPv6
    "100.100.100.200",  # Alibaba Cloud
    "168.63.129.16",  # Azure wire server (a public address)
    "169.254.170.2",  # AWS ECS task credentials
))
# Each with the reason given to the user. `is_global` below catches the rest of IANA's
# special-purpose registries; these are listed because Python counts some of them as global.
DENIED_NETWORKS: tuple[tuple[Network, str], ...] = tuple((ipaddress.ip_network(n), why) for n, why in (
    ("0.0.0.0/8", "'this network'"),
    ("10.0.0.0/8", "private"),
    ("100.64.0.0/10", "carrier-grade NAT (shared address space)"),
    ("127.0.0.0/8", "loopback"),
    ("169.254.0.0/16", "link-local"),
    ("172.16.0.0/12", "private"),
    ("192.0.0.0/24", "IETF protocol assignments"),
    ("192.0.2.0/24", "documentation"),
    ("192.88.99.0/24", "6to4 relay anycast"),
    ("192.168.0.0/16", "private"),
    ("198.18.0.0/15", "benchmarking"),
    ("198.51.100.0/24", "documentation"),
    ("203.0.113.0/24", "documentation"),
    ("224.0.0.0/4", "multicast"),
    ("240.0.0.0/4", "reserved"),
    ("::/128", "unspecified"),
    ("::1/128", "loopback"),
    ("::/96", "IPv4-compatible (deprecated)"),
    ("64:ff9b::/96", "NAT64"),
    ("64:ff9b:1::/48", "local NAT64"),
    ("100::/64", "discard-only"),
    ("2001::/32", "Teredo"),
    ("2001:db8::/32", "documentation"),
    ("2002::/16", "6to4"),
    ("fc00::/7", "unique local (ULA)"),
    ("fe80::/10", "link-local"),
    ("fec0::/10", "site-local"),
    ("ff00::/8", "multicast"),
))
LOOPBACK = (ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128"))
# What legacy resolvers read as IPv4 but ipaddress does not: 2130706433, 0x7f.1, 0177.0.0.1, 10.1
_NUMERIC_HOST = re.compile(r"^(0x[0-9a-f]*|[0-9]+)(\.(0x[0-9a-f]*|[0-9]+)){0,3}\.?$", re.I)


class UnsafeURL(ValueError):
    pass


class UnresolvableHost(UnsafeURL):
    """DNS gave no answer: worth retrying at delivery time (unlike a refused address)."""


@dataclass(frozen=True)
class AddressPolicy:
    allowed: tuple[Network, ...] = ()
    allow_loopback: bool = False

    @classmethod
    def from_settings(cls, settings) -> "AddressPolicy":
        return cls(parse_networks(settings.webhook_allowed_networks), settings.allow_loopback_webhooks)

    def check(self, addr: Address) -> None:
        """Raise UnsafeURL unless a webhook may connect to `addr`."""
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            addr = addr.ipv4_mapped  # ::ffff:a.b.c.d is a.b.c.d on the wire
        if addr in METADATA_ADDRESSES:
            raise UnsafeURL(f"{addr} is a cloud metadata address")
        if self.allow_loopback and any(addr in net for net in LOOPBACK):
            return
        if any(addr in net for net in self.allowed):
            return
        for net, why in DENIED_NETWORKS:
            if addr in net:
                hint = ("; set PARITYWATCH_ALLOW_LOOPBACK_WEBHOOKS=1 for local receivers" if why == "loopback"
                        else "; allow it with PARITYWATCH_WEBHOOK_ALLOWED_NETWORKS")
                raise UnsafeURL(f"{addr} is a {why} address{hint}")
        if not addr.is_global:
            raise UnsafeURL(f"{addr} is not a public internet address; allow it with PARITYWATCH_WEBHOOK_ALLOWED_NETWORKS")


def parse_networks(text: str) -> tuple[Network, ...]:
    try:
        return tuple(ipaddress.ip_network(part.strip(), strict=False) for part in text.split(",") if part.strip())
    except ValueError as exc:
        raise ValueError(f"PARITYWATCH_WEBHOOK_ALLOWED_NETWORKS: {exc}") from exc


def system_resolver(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [info[4][0] for info in infos]


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str  # as in the URL, brackets stripped
    port: int


def parse_target(url: str) -> Target:
    """The URL's scheme, host and port, refusing what is no plain http(s) URL to a named host."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise UnsafeURL("webhook URLs must be http or https")
    if not parts.hostname:
        raise UnsafeURL("webhook URL has no host")
    if parts.username or parts.password:
        raise UnsafeURL("webhook URL must not carry credentials")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError as exc:
        raise UnsafeURL(f"webhook URL has a bad port: {exc}") from exc
    host = parts.hostname
    if "%" in host:
        raise UnsafeURL("webhook URL must not name an interface (IPv6 zone id)")
    if _NUMERIC_HOST.match(host) and _literal(host) is None:
        raise UnsafeURL(f"{host!r} is a numeric host in a non-standard form: write the address as a.b.c.d")
    return Target(parts.scheme, host, port)


def _literal(host: str) -> Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def resolve_checked(host: str, port: int, policy: AddressPolicy, resolver: Resolver) -> list[Address]:
    """Every address `host` stands for, each allowed by `policy`, or UnsafeURL.

    All must pass: a name that resolves to one public and one private address is refused."""
    literal = _literal(host)
    if literal is not None:
        addresses: Iterable[Address] = [literal]
    else:
        try:
            answers = resolver(host, port)
        except (OSError, UnicodeError) as exc:
            raise UnresolvableHost(f"cannot resolve {host}: {exc}") from exc
        addresses = [ipaddress.ip_address(a.split("%")[0]) for a in answers]
    addresses = list(addresses)
    if not addresses:
        raise UnresolvableHost(f"{host} resolves to no address")
    for addr in addresses:
        policy.check(addr)
    return addresses


def check_url(url: str, policy: AddressPolicy, resolver: Resolver = system_resolver) -> list[Address]:
    target = parse_target(url)
    return resolve_checked(target.host, target.port, policy, resolver)


class PinnedBackend(httpcore.AsyncNetworkBackend):
    """httpcore network backend that resolves once, checks, and connects to the checked address.

    httpcore asks it for a TCP connection to the URL's host; TLS (SNI, certificate check) and the
    Host header are layered on top by httpcore with the URL's host name, as usual."""

    def __init__(self, policy: AddressPolicy, resolver: Resolver = system_resolver,
                 inner: httpcore.AsyncNetworkBackend | None = None):
        from httpcore._backends.auto import AutoBackend

        self.policy = policy
        self.resolver = resolver
        self.inner = inner or AutoBackend()

    async def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        import anyio

        host = host.strip("[]")
        try:
            addresses = await anyio.to_thread.run_sync(resolve_checked, host, port, self.policy, self.resolver)
        except UnresolvableHost as exc:
            raise httpcore.ConnectError(str(exc)) from exc
        except UnsafeURL as exc:
            raise RefusedAddress(str(exc)) from exc
        last: Exception | None = None
        for addr in addresses:
            try:
                return await self.inner.connect_tcp(str(addr), port, timeout=timeout, local_address=local_address,
                                                    socket_options=socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                last = exc
        raise last  # type: ignore[misc]

    async def connect_unix_socket(self, *args, **kwargs):
        raise RefusedAddress("webhooks never connect to unix sockets")

    async def sleep(self, seconds: float) -> None:
        await self.inner.sleep(seconds)


class RefusedAddress(httpcore.ConnectError):
    """Raised inside httpcore so the request fails before any connection, with our reason
    (httpx re-raises it as ConnectError whose __cause__ is this)."""


class PinnedTransport(httpx.AsyncHTTPTransport):
    """httpx's transport over PinnedBackend: no proxy, no keep-alive (each delivery resolves and
    checks afresh), TLS verified against the URL's host name."""

    def __init__(self, backend: PinnedBackend, max_connections: int = 32):
        super().__init__(trust_env=False)
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=httpx.create_ssl_context(trust_env=False),
            max_connections=max_connections,
            max_keepalive_connections=0,
            network_backend=backend,
        )


def is_refusal(exc: BaseException) -> str | None:
    """The refusal reason when an httpx error came from PinnedBackend refusing an address."""
    for _ in range(10):  # a short chain: httpx error <- httpcore error <- ours
        if exc is None:
            break
        if isinstance(exc, RefusedAddress):
            return str(exc)
        exc = exc.__cause__ or exc.__context__
    return None
