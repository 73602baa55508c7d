"""API keys: the keys file, read into a :class:`KeyRing` that finds a key by its secret.

The file holds SHA-256 hashes, never secrets (its format: docs/security.md, "API keys").

A presented secret is hashed and looked up in a dict by its digest; the stored digest is then
compared with :func:`hmac.compare_digest`. The lookup's timing depends on the digest only, which an
attacker cannot steer towards a stored one without knowing a secret, so nothing about a stored
secret leaks through it. Nothing here logs or keeps a secret.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import os
import re
import secrets
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

log = logging.getLogger("voxgate.auth")

SCOPES = ("speak", "read", "admin", "metrics")
Scope = Literal["speak", "read", "admin", "metrics"]

# Names appear in metric labels and log lines: a short, plain alphabet keeps both safe.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


class KeysFileError(ValueError):
    """The keys file cannot be used; the message names the file and the problem (never a secret:
    the file holds none)."""


class _KeyEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    name: Annotated[str, StringConstraints(pattern=NAME_PATTERN)]
    sha256: Annotated[str, StringConstraints(pattern=r"^[0-9a-fA-F]{64}$")]
    scopes: list[Scope] = Field(min_length=1)
    requests_per_minute: int = Field(0, ge=0)
    chars_per_minute: int = Field(0, ge=0)


class _KeysFile(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    key: list[_KeyEntry] = Field(default_factory=list)


@dataclass(frozen=True, slots=True)
class APIKey:
    """A key as the gateway knows it: its name, scopes and per-minute limits (0: unlimited)."""

    name: str
    digest: bytes
    scopes: frozenset[str]
    requests_per_minute: int = 0
    chars_per_minute: int = 0


def digest_of(secret: str) -> bytes:
    """The SHA-256 digest of a presented secret."""
    return hashlib.sha256(secret.encode("utf-8", "surrogateescape")).digest()


class KeyRing:
    """The keys of one keys file, found by secret."""

    def __init__(self, keys: list[APIKey]) -> None:
        self.keys = tuple(keys)
        self._by_digest = {k.digest: k for k in keys}
        self._by_name = {k.name: k for k in keys}

    def identify(self, secret: str) -> APIKey | None:
        """The key whose secret is ``secret``, or None."""
        digest = digest_of(secret)
        key = self._by_digest.get(digest)
        if key is None or not hmac.compare_digest(key.digest, digest):
            return None
        return key

    def named(self, name: str) -> APIKey | None:
        """The key called ``name``, or None (what a signed URL names its signer by)."""
        return self._by_name.get(name)

    def names(self) -> list[str]:
        """The key names, in file order."""
        return [k.name for k in self.keys]

    @classmethod
    def load(cls, path: str | Path) -> KeyRing:
        """Read and check the keys file (blocking: call it off the event loop)."""
        try:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except OSError as exc:
            raise KeysFileError(f"API keys file {path}: {exc.strerror or exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise KeysFileError(f"API keys file {path}: {exc}") from None
        try:
            parsed = _KeysFile.model_validate(data)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}"
                for err in exc.errors(include_url=False, include_input=False)
            )
            raise KeysFileError(f"API keys file {path}: {problems}") from None
        keys: dict[str, APIKey] = {}
        digests: set[bytes] = set()
        for e in parsed.key:
            key = APIKey(
                e.name,
                bytes.fromhex(e.sha256),
                frozenset(e.scopes),
                e.requests_per_minute,
                e.chars_per_minute,
            )
            if key.name in keys:
                raise KeysFileError(f"API keys file {path}: key name {key.name!r} used twice")
            if key.digest in digests:
                raise KeysFileError(
                    f"API keys file {path}: key {key.name!r} has the hash of another key"
                )
            keys[key.name] = key
            digests.add(key.digest)
        return cls(list(keys.values()))


def new_secret() -> str:
    """A new API key secret: 32 random bytes, URL-safe base64 (43 characters)."""
    return secrets.token_urlsafe(32)


def key_table(
    name: str,
    secret: str,
    scopes: list[str],
    requests_per_minute: int = 0,
    chars_per_minute: int = 0,
) -> str:
    """The ``[[key]]`` TOML table for a key (its hash, never ``secret``)."""
    if re.fullmatch(NAME_PATTERN, name) is None:
        raise KeysFileError(
            f"key name {name!r}: use 1-64 letters, digits, '.', '_' or '-' (it appears in "
            "logs and metrics)"
        )
    bad = [s for s in scopes if s not in SCOPES]
    if bad or not scopes:
        raise KeysFileError(f"scopes {scopes!r}: choose from {', '.join(SCOPES)}")
    if requests_per_minute < 0 or chars_per_minute < 0:
        raise KeysFileError("limits are 0 (unlimited) or more")
    quoted = ", ".join(f'"{s}"' for s in scopes)
    return (
        "[[key]]\n"
        f'name = "{name}"\n'
        f'sha256 = "{digest_of(secret).hex()}"\n'
        f"scopes = [{quoted}]\n"
        f"requests_per_minute = {requests_per_minute}\n"
        f"chars_per_minute = {chars_per_minute}\n"
    )


# The key a keys file made at first start holds (create_keys_file).
INIT_ADMIN = "admin"


def create_keys_file(path: str | Path, metrics_secret: str = "") -> str | None:
    """Make the keys file at ``path`` unless one is there (a container's first start): a key
    named ``admin`` (scopes admin, speak, read) with a new secret, plus, given
    ``metrics_secret``, a key named ``prometheus`` (scope metrics) for that secret. Returns the
    admin secret, which is kept nowhere (the file holds hashes): the caller shows it once. None
    when the file exists (it is then left as it is).

    The file is created 0600 with O_EXCL, so two processes starting at once cannot both make
    one (the second finds it and leaves it be); it is made before any gateway process starts
    (``voxgate serve`` does it first), so none reads it half written.
    """
    target = Path(path)
    if target.exists():
        return None
    secret = new_secret()
    text = key_table(INIT_ADMIN, secret, ["admin", "speak", "read"])
    if metrics_secret:
        # The key Prometheus scrapes with: /metrics and nothing else.
        text += "\n" + key_table("prometheus", metrics_secret, ["metrics"])
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return None
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    return secret


class Authenticator:
    """The gateway's current key ring (None: no keys file, every route open), reloadable.

    A reload reads the file off the event loop and swaps the ring in one assignment, so a request
    sees either the old keys or the new ones; a file that fails to load leaves the old ring in
    place (and says why in the log).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.ring: KeyRing | None = None
        # Called with the new ring after each successful reload (what holds a key open, such as a
        # WebSocket, checks it is still valid).
        self.on_reload: list[Callable[[KeyRing], object]] = []

    async def load(self) -> KeyRing | None:
        """Read the keys file (at start): raises :class:`KeysFileError` when it cannot be used."""
        if not self.path:
            return None
        self.ring = await asyncio.to_thread(KeyRing.load, self.path)
        return self.ring

    async def reload(self) -> bool:
        """Read the keys file again (on SIGHUP); False, with the old keys kept, if it fails."""
        if not self.path:
            return False
        try:
            ring = await asyncio.to_thread(KeyRing.load, self.path)
        except KeysFileError as exc:
            log.error("API keys not reloaded, the previous keys stay in use: %s", exc)
            return False
        self.ring = ring
        log.info("API keys reloaded: %d keys from %s", len(ring.keys), self.path)
        for listener in self.on_reload:
            listener(ring)
        return True


# WebSocket close code 1008 (RFC 6455: policy violation): what a revoked key's socket is told.
POLICY_VIOLATION = 1008


class Closable(Protocol):
    """A connection that can be closed with a WebSocket close code and reason."""

    async def close(self, *, code: int = ..., message: bytes = ...) -> bool: ...


class KeyedSockets:
    """Long-lived connections (WebSockets) by the API key that opened them, so a key removed
    from the keys file stops speaking at the reload, not when its client hangs up."""

    def __init__(self) -> None:
        self._open: dict[Closable, APIKey] = {}
        self._closing: set[asyncio.Task[bool]] = set()

    def add(self, ws: Closable, key: APIKey) -> None:
        """Follow ``ws``, opened by ``key``."""
        self._open[ws] = key

    def discard(self, ws: Closable) -> None:
        """``ws`` has closed."""
        self._open.pop(ws, None)

    def key_of(self, ws: Closable) -> APIKey | None:
        """The key ``ws`` speaks for now (its new limits after a reload)."""
        return self._open.get(ws)

    def rekey(self, ring: KeyRing | None) -> None:
        """After a reload: each socket speaks for its key as the new ring has it; a socket whose
        key is gone (or lost every scope it was opened with) is closed with 1008."""
        for ws, key in list(self._open.items()):
            now = ring.named(key.name) if ring is not None else None
            if now is not None and now.digest == key.digest and now.scopes & key.scopes:
                self._open[ws] = now
                continue
            del self._open[ws]
            task = asyncio.ensure_future(
                ws.close(code=POLICY_VIOLATION, message=b"API key revoked")
            )
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)
