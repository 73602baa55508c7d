"""One server per port: ``voxgate serve`` refuses a port that anyone already serves.

The gateway processes of ``serve --workers N`` share their ports through SO_REUSEPORT, and the
kernel lets any process of the same user join such a group: a second ``voxgate serve`` on the
port would silently take about half the connections, with its own keys and models. So before any
process listens, each port is bound once without SO_REUSEPORT (which fails if anyone listens or
holds it), and the supervisor then holds a bound, non-listening socket with SO_REUSEPORT and
without SO_REUSEADDR for as long as it serves: its own workers may join it, a later server's check
cannot. ``share_port`` skips all of this for those who mean to share. docs/deploy.md, "One server
per port".
"""

from __future__ import annotations

import errno
import socket
from typing import Any

from gateway.runtime.settings import Settings, SettingsError


class PortInUse(SettingsError):
    """A port this server would listen on is already served (a one-line reason)."""


def in_use(port: int, what: str) -> PortInUse:
    return PortInUse(
        f"port {port} ({what}): address in use; another server listens there (stop it, pick "
        "another port, or set share_port = true to share it on purpose)"
    )


def _address(host: str, port: int) -> tuple[socket.AddressFamily, Any]:
    family, _, _, _, addr = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM)[0]
    return family, addr


def check_port(host: str, port: int, what: str) -> None:
    """Raise :class:`PortInUse` if ``port`` on ``host`` is bound by any listener or holder.

    SO_REUSEADDR, as every server sets it: sockets in TIME_WAIT from an earlier run do not count.
    """
    family, addr = _address(host, port)
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(addr)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise in_use(port, what) from None
            raise


def hold_port(host: str, port: int, what: str) -> socket.socket | None:
    """Check ``port`` (:func:`check_port`), then a socket bound to it that only SO_REUSEPORT
    sockets of this user may join (this server's workers): kept open while serving. None where
    the kernel will not make one (connections of an earlier run in TIME_WAIT that lack
    SO_REUSEPORT); the check alone then stands."""
    check_port(host, port, what)
    family, addr = _address(host, port)
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind(addr)
    except OSError:
        sock.close()
        return None
    return sock


def listened_ports(settings: Settings) -> list[tuple[str, int, str]]:
    """(host, port, what) of each fixed port ``serve`` listens on (port 0: chosen by the OS)."""
    ports = []
    if settings.port:
        ports.append((settings.host, settings.port, "HTTP"))
    if settings.ops_port:
        ports.append((settings.ops_host or settings.host, settings.ops_port, "ops"))
    if settings.wyoming_port:
        ports.append((settings.wyoming_host or settings.host, settings.wyoming_port, "Wyoming"))
    return ports
