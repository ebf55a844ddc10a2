"""Addresses and sockets (docs/protocol.md, "Transport").

An address is ``unix://`` and an absolute socket path of at most 107 bytes
(``unix:///handoff-run/app.sock``), or a loopback TCP address given as an IP
(``http://127.0.0.1:7452`` or ``127.0.0.1:7452``; not ``localhost``).
"""

from __future__ import annotations

import errno
import ipaddress
import os
import posixpath
import socket
import stat
from dataclasses import dataclass
from typing import Optional, Union
from urllib.parse import urlsplit

__all__ = ["Endpoint", "EndpointError", "parse_endpoint", "listen", "dial", "SOCKET_MODE", "APP_URL_ENV", "APP_SOCKET"]

#: The environment variable with the app API's address, set by the injector.
APP_URL_ENV = "HANDOFF_APP_URL"
#: The app socket in an injected pod.
APP_SOCKET = "/handoff-run/app.sock"
#: The mode of a socket the server makes: the volume, not the mode, keeps others out.
SOCKET_MODE = 0o666
_MAX_SOCKET_PATH = 107
FORMS = "unix:// and an absolute socket path, like unix:///handoff-run/app.sock, or a loopback address, like http://127.0.0.1:7452 or 127.0.0.1:7450"


class EndpointError(ValueError):
    """An address :func:`parse_endpoint` refused, or a socket that cannot be served or reached."""


@dataclass(frozen=True)
class Endpoint:
    """One side's address: ``network`` is ``"unix"`` (``address`` a path) or ``"tcp"`` (``host`` and ``port``)."""

    network: str
    address: str
    host: str = ""
    port: int = 0

    def __str__(self) -> str:
        if self.network == "unix":
            return "unix://" + self.address
        return "http://" + self.address


def parse_endpoint(s: str) -> Endpoint:
    """Read an address in the protocol's one form; raise :class:`EndpointError` saying what is wrong."""

    def bad(reason: str) -> EndpointError:
        return EndpointError("%r: %s; want %s" % (s, reason, FORMS))

    if s.startswith("unix://"):
        p = s[len("unix://") :]
        if not p.startswith("/"):
            raise bad("the socket path is not absolute")
        clean = posixpath.normpath(p)
        if clean.startswith("//"):
            clean = "/" + clean.lstrip("/")
        if clean != p:
            raise bad("the socket path is not clean (%s)" % clean)
        if len(p.encode()) > _MAX_SOCKET_PATH:
            raise bad("the socket path has %d bytes, more than the %d a Unix socket address holds" % (len(p.encode()), _MAX_SOCKET_PATH))
        return Endpoint("unix", p)
    hostport = s
    if s.startswith("http://"):
        rest = s[len("http://") :]
        u = urlsplit(s)
        if "@" in u.netloc or u.query or u.fragment or "?" in rest or "#" in rest or u.path.rstrip("/") != "":
            raise bad("an http address has a host and port only (no user, path, query or fragment)")
        hostport = u.netloc
    if hostport.startswith("["):
        end = hostport.find("]")
        if end < 0 or hostport[end + 1 : end + 2] != ":":
            raise bad("not a host:port")
        host, port = hostport[1:end], hostport[end + 2 :]
    else:
        host, sep, port = hostport.rpartition(":")
        if not sep or ":" in host:
            raise bad("not a host:port")
    if not port.isdigit() or not port.isascii() or int(port) > 65535:
        raise bad("port %r is not a number from 0 to 65535" % port)
    if host == "localhost":
        raise bad(
            "localhost names both 127.0.0.1 and ::1, and a neighbour could serve the one the server does not bind: "
            "give the loopback address itself, like 127.0.0.1"
        )
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        raise bad("%r is not a loopback address: the protocol is never spoken beyond the pod's loopback" % host)
    return Endpoint("tcp", hostport, host, int(port))


def listen(e: Endpoint, backlog: int = 128) -> socket.socket:
    """A listening socket on ``e``.

    A TCP endpoint binds its loopback address. A Unix socket is made at the
    path itself with mode 0666: a path that exists and is not a socket (a
    file, a directory, a symbolic link) is refused, never replaced; so is a
    socket another process still serves; a stale one (a connect is refused)
    is removed first. Remove the socket when done (:func:`unlink_socket`).
    """
    if e.network == "tcp":
        family = socket.AF_INET6 if ":" in e.host else socket.AF_INET
        s = socket.socket(family, socket.SOCK_STREAM)
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((e.host, e.port))
            s.listen(backlog)
        except BaseException:
            s.close()
            raise
        return s
    path = e.address
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None:
        if not stat.S_ISSOCK(st.st_mode):
            raise EndpointError("socket %s: the path exists and is not a socket; refusing to replace it" % path)
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        probe.settimeout(1.0)
        try:
            probe.connect(path)
        except ConnectionRefusedError:
            os.remove(path)
        except OSError as err:
            raise EndpointError("socket %s: checking whether it is stale: %s" % (path, err)) from err
        else:
            raise EndpointError("socket %s: another process serves it" % path)
        finally:
            probe.close()
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.bind(path)
        os.chmod(path, SOCKET_MODE)
        s.listen(backlog)
    except BaseException:
        s.close()
        raise
    return s


def unlink_socket(e: Endpoint, sock: Optional[socket.socket] = None) -> None:
    """Remove ``e``'s socket file if it is still the one ``sock`` made (a socket at the path)."""
    if e.network != "unix":
        return
    try:
        st = os.lstat(e.address)
    except OSError:
        return
    if stat.S_ISSOCK(st.st_mode):
        try:
            os.remove(e.address)
        except OSError:
            pass


def dial(e: Endpoint, timeout: Optional[float] = None) -> socket.socket:
    """A connection to ``e``. A socket's path must be a socket itself, never followed through a link.

    A path with no socket yet raises :class:`ConnectionRefusedError` (the
    server is still starting); anything else at the path
    :class:`EndpointError`.
    """
    if e.network == "tcp":
        return socket.create_connection((e.host, e.port), timeout=timeout)
    try:
        st = os.lstat(e.address)
    except FileNotFoundError:
        raise ConnectionRefusedError(errno.ECONNREFUSED, "dial unix %s: no socket there (its server has not made it yet, or is gone)" % e.address) from None
    if not stat.S_ISSOCK(st.st_mode):
        raise EndpointError("socket %s: not a socket; refusing to connect" % e.address)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(e.address)
    except BaseException:
        s.close()
        raise
    return s


Address = Union[str, Endpoint]
