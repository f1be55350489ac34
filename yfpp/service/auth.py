"""API keys: who may do what (docs/service.md, "Security").

An admin key (from a file or the environment, never argv) creates and revokes
keys of two roles: ``subscriber`` (adds, and then sees, changes, streams and
deletes, its own subscriptions) and ``feed`` (sends events: ``POST /events`` and
the TCP feed ports). The admin may do everything. A key is the text
``yfpp_<id>_<secret>``: only the id and the SHA-256 of the secret are stored
(in the registry), and the secret is compared in constant time. Authentication
is on whenever an admin key is configured; without one the service runs open,
which it allows only on a loopback address.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import ipaddress
import re
import secrets
import threading
import time
from typing import Any, Callable

from yfpp.errors import YfppError
from yfpp.service.registry import Registry

ADMIN = "admin"
ROLES = ("subscriber", "feed")
MIN_ADMIN_KEY = 16  #: characters an admin key has at least
ADMIN_KEY_ENV = "YFPP_ADMIN_KEY"
CLIENT_KEY_ENV = "YFPP_KEY"
_KEY = re.compile(r"yfpp_([0-9a-f]{16})_([A-Za-z0-9_-]{43})\Z")


@dataclasses.dataclass(frozen=True)
class Principal:
    """Who made a request: a key id (``admin`` for the admin key and for an open service) and its role."""

    key_id: str
    role: str

    @property
    def admin(self) -> bool:
        return self.role == ADMIN

    def may(self, role: str) -> bool:
        """Whether this principal may act as ``role`` (the admin may act as any)."""
        return self.role in (ADMIN, role)


OPEN = Principal(ADMIN, ADMIN)  #: every caller of a service without authentication


@dataclasses.dataclass
class Key:
    id: str
    name: str
    role: str
    digest: str  #: SHA-256 (hex) of the secret
    created: float

    def info(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "role": self.role, "created": self.created}


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps the service on this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogateescape")).hexdigest()


class Keys:
    """The keys the service accepts: the admin key and the registry's live keys (held in memory as well, so a
    revocation applies to the very next request)."""

    def __init__(self, registry: Registry, admin_key: str | None):
        self.registry = registry
        self.enabled = admin_key is not None
        self._admin = _digest(admin_key) if admin_key is not None else None
        self._keys = {row[0]: Key(*row) for row in registry.keys()}
        self._lock = threading.Lock()
        self.on_revoke: list[Callable[[str], None]] = []  #: called with the id of each revoked key

    def authenticate(self, given: str | None) -> Principal | None:
        """The principal of ``given`` (a key's text), or None for a missing, wrong or revoked key. An open
        service takes anything as the admin."""
        if not self.enabled:
            return OPEN
        if not given:
            return None
        m = _KEY.match(given)
        if m is not None:
            key = self._keys.get(m[1])
            if key is not None and hmac.compare_digest(_digest(m[2]), key.digest):
                return Principal(key.id, key.role)
            return None
        assert self._admin is not None
        return OPEN if hmac.compare_digest(_digest(given), self._admin) else None

    def active(self, principal: Principal) -> bool:
        """Whether ``principal``'s key still holds (not revoked since it was authenticated)."""
        return principal.admin or principal.key_id in self._keys

    def create(self, name: str, role: str) -> tuple[Key, str]:
        """A new key: its record and its text (shown once: only its digest is kept)."""
        if role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
        kid, secret = secrets.token_hex(8), secrets.token_urlsafe(32)
        key = Key(kid, name, role, _digest(secret), round(time.time(), 3))
        self.registry.add_key(dataclasses.astuple(key))
        with self._lock:
            self._keys[kid] = key
        return key, f"yfpp_{kid}_{secret}"

    def revoke(self, kid: str) -> bool:
        """Revoke key ``kid`` (at once: its next request fails, its feed connections and streams end);
        False if there is no such key."""
        with self._lock:
            if kid not in self._keys:
                return False
            self.registry.remove_key(kid)
            del self._keys[kid]
        for call in self.on_revoke:
            call(kid)
        return True

    def all(self) -> list[Key]:
        return sorted(self._keys.values(), key=lambda k: k.created)


def admin_key(file: str | None, env: dict[str, str]) -> str | None:
    """The admin key from ``file`` (its first line) or else ``$YFPP_ADMIN_KEY``; YfppError if it is too short."""
    if file:
        try:
            with open(file, encoding="utf-8") as f:
                key: str | None = f.readline().strip()
        except OSError as e:
            raise YfppError(f"admin key file {file}: {e.strerror or e}") from e
    else:
        key = env.get(ADMIN_KEY_ENV) or None
    if key is not None and len(key) < MIN_ADMIN_KEY:
        raise YfppError(f"the admin key must have at least {MIN_ADMIN_KEY} characters")
    return key
