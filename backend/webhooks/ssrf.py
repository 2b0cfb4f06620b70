"""Refuse webhook URLs that point at the server's own infrastructure.

Checked when a webhook is created and again at every delivery (DNS can change). Loopback is
refused unless `allow_loopback_webhooks` is set (local development, tests).
"""
from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

METADATA_ADDRESSES = {ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254")}


class UnsafeURL(ValueError):
    pass


def check_url(url: str, allow_loopback: bool, resolve: bool = True) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise UnsafeURL("webhook URLs must be http or https")
    if not parts.hostname:
        raise UnsafeURL("webhook URL has no host")
    if parts.username or parts.password:
        raise UnsafeURL("webhook URL must not carry credentials")
    for addr in _addresses(parts.hostname, parts.port, resolve):
        _check_address(addr, allow_loopback)


def _addresses(host: str, port: int | None, resolve: bool) -> list:
    try:
        return [ipaddress.ip_address(host.strip("[]"))]
    except ValueError:
        pass
    if not resolve:
        return []
    try:
        infos = socket.getaddrinfo(host, port or 443, proto=socket.IPPROTO_TCP)
    except socket.gaierror as exc:
        raise UnsafeURL(f"cannot resolve {host}") from exc
    return [ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos]


def _check_address(addr, allow_loopback: bool) -> None:  # noqa: ANN001
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped:
        addr = addr.ipv4_mapped
    if addr in METADATA_ADDRESSES or addr.is_link_local:
        raise UnsafeURL(f"{addr} is a link-local / cloud metadata address")
    if addr.is_multicast or addr.is_unspecified or addr.is_reserved:
        raise UnsafeURL(f"{addr} is not a unicast host address")
    if addr.is_loopback and not allow_loopback:
        raise UnsafeURL(f"{addr} is loopback; set PARITYWATCH_ALLOW_LOOPBACK_WEBHOOKS=1 for local receivers")
