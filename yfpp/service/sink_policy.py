"""Where subscriptions may send results (docs/service.md, "Security").

* A file sink writes only under the configured ``file_sink_dir``: its path
  (relative to that directory, or absolute inside it) holds no ``..``, and it is
  opened one component at a time from the directory with ``O_NOFOLLOW``
  (``openat``), so a symbolic link placed anywhere on the way, before or after
  the subscription, cannot lead out of it.
* A network sink (TCP or webhook) connects only to addresses inside
  ``sink_networks`` (default: loopback). Its host is resolved and checked when
  the subscription is made and again at every connection, which then goes to
  the very address checked (a name that resolves elsewhere later is not
  followed there).
* What a failed connection tells the subscriber is one text for refused,
  unreachable and timed out alike (the service is no port scanner).
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import socket
from typing import Any
from urllib.parse import unquote, urlsplit

CONNECT_FAILED = "Connection failed (refused, unreachable or timed out)"  #: every failed connect, in last_error
NOT_ALLOWED = "destination not allowed by the server's sink policy"


class SinkRefused(Exception):
    """A sink the policy does not allow; the message says why (and names no address it resolved to)."""


class SinkPolicy:
    """The operator's limits on sinks: ``file_dir`` (None: no file sinks) and the networks sinks may reach."""

    def __init__(self, file_dir: str | None, networks: list[str]):
        self.file_dir = os.path.realpath(file_dir) if file_dir else None
        self._bases = {os.path.realpath(file_dir), os.path.abspath(file_dir)} if file_dir else set()
        try:
            self.networks = [ipaddress.ip_network(n, strict=False) for n in networks]
        except ValueError as e:
            raise ValueError(f"sink_networks: {e}") from None

    # --- files --------------------------------------------------------------------------

    def file_parts(self, url: str) -> list[str]:
        """The path components of a file sink, relative to ``file_dir``; SinkRefused if it is not inside it."""
        if self.file_dir is None:
            raise SinkRefused("file sinks are off on this server (it has no file_sink_dir)")
        path = url[len("file://"):] if url.startswith("file://") else url[len("file:"):]
        if ".." in path.split(os.sep):
            raise SinkRefused(f"a file sink names a file under {self.file_dir}, without '..'")
        if os.path.isabs(path):
            given = os.path.normpath(path)
            base = next((b for b in self._bases if given.startswith(b.rstrip(os.sep) + os.sep)), None)
            if base is None:
                raise SinkRefused(f"file sinks must be under {self.file_dir}")
            path = given[len(base.rstrip(os.sep)) + 1:]
        parts = [p for p in path.split(os.sep) if p not in ("", ".")]
        if not parts:
            raise SinkRefused(f"a file sink names a file under {self.file_dir}")
        return parts

    def check_file(self, url: str) -> None:
        """SinkRefused unless the file sink's path stays inside ``file_dir`` (no symbolic link on the way)."""
        parts = self.file_parts(url)
        assert self.file_dir is not None
        here = self.file_dir
        for i, part in enumerate(parts):
            here = os.path.join(here, part)
            try:
                mode = os.lstat(here).st_mode
            except FileNotFoundError:
                if i < len(parts) - 1:
                    raise SinkRefused(f"a file sink's directory must exist under {self.file_dir}") from None
                return
            except OSError:
                raise SinkRefused(f"a file sink's path under {self.file_dir} cannot be checked") from None
            if os.path.stat.S_ISLNK(mode):
                raise SinkRefused("a file sink's path must not go through a symbolic link")

    def opener(self, url: str) -> Any:
        """An ``open(…, opener=)`` that opens the file sink ``url`` component by component from ``file_dir``,
        following no symbolic link (OSError ELOOP / ENOTDIR if one is there now)."""
        parts = self.file_parts(url)
        base = self.file_dir
        assert base is not None

        def open_confined(_path: str, flags: int) -> int:
            fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY)
            try:
                for part in parts[:-1]:
                    inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                    os.close(fd)
                    fd = inner
                return os.open(parts[-1], flags | os.O_NOFOLLOW, 0o600, dir_fd=fd)
            finally:
                os.close(fd)

        return open_confined

    # --- networks -----------------------------------------------------------------------

    def allowed(self, address: str) -> bool:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
        if ip.version == 6 and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        return any(ip in net for net in self.networks)

    def _pick(self, infos: list[tuple]) -> str:
        for *_, sockaddr in infos:
            if self.allowed(sockaddr[0]):
                return sockaddr[0]
        raise SinkRefused(NOT_ALLOWED)

    @staticmethod
    def lookup(host: str, port: int) -> list[tuple]:
        """The resolver's addresses of ``host`` (blocking)."""
        return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)

    def check_host(self, host: str, port: int) -> str:
        """The first allowed address of ``host`` (blocking: resolves names); SinkRefused if it has none."""
        try:
            return self._pick(self.lookup(host, port))
        except (OSError, UnicodeError):
            raise SinkRefused(NOT_ALLOWED + " (or its host does not resolve)") from None

    async def resolve(self, host: str, port: int) -> str:
        """At connect time: the allowed address to connect to (resolved again now); SinkRefused if the host has
        none now."""
        try:
            infos = await asyncio.to_thread(self.lookup, host, port)
        except (OSError, UnicodeError):
            raise SinkRefused(CONNECT_FAILED) from None
        return self._pick(infos)

    def check(self, url: str) -> None:
        """Subscribe time: SinkRefused (saying why) for a sink the policy does not allow (blocking)."""
        parts = urlsplit(url)
        if parts.scheme == "file":
            self.check_file(url)
        else:
            self.check_host(unquote(parts.hostname or ""), parts.port or (443 if parts.scheme == "https" else 80))


def shown(url: str | None) -> str | None:
    """A sink URL as shown back to its owner: a password and the query string's values hidden."""
    if url is None:
        return None
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not (parts.password or parts.query):
        return url
    netloc = parts.netloc
    if parts.password:
        netloc = f"{parts.username}:***@" + netloc.rsplit("@", 1)[1]
    query = "&".join(q.split("=", 1)[0] + "=***" for q in parts.query.split("&")) if parts.query else ""
    return parts._replace(netloc=netloc, query=query).geturl()
