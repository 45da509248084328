"""Bearer tokens: who a caller is.

Configured by a file (``CRONLOG_API_TOKENS_FILE``, YAML or JSON) or by the environment;
both may be used, the file wins on a clash::

    admin: ["s3cret-admin"]             # CRONLOG_API_ADMIN_TOKENS=tok1,tok2
    owners: {"tok-a": "team-a"}         # CRONLOG_API_TOKENS=tok-a=team-a,tok-b=team-b
    workers: {"tok-w": "w1"}            # CRONLOG_WORKER_TOKENS=tok-w=w1  (one worker each)

Every token has at least 16 characters (a short one is refused at start-up, by table,
never printed), and a worker token acts as the one worker it names: there is no
wildcard. Tokens are compared in constant time. With no token configured at all the API refuses
to start: an open scheduler that runs argv for anyone is not a default we ship.

A token in the file may be kept as its hash, `sha256:<hex>` (what `cronlog tokens
create` writes: connectors/cli/tokens.py), so the file never holds the secret. The API
reads the file again when it changes (`TokenSource`, checked at most once a second):
a token added or revoked counts without a restart; a file that no longer reads keeps the
tokens read before, and says why in the log.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import yaml

from connectors.api.service import ADMIN, Principal
from connectors.safe_yaml import safe_load

log = logging.getLogger("cronlog.api")


class AuthConfigError(ValueError):
    pass


MIN_TOKEN_CHARS = 16
HASHED = "sha256:"  # a file's key of this form is a token's hash, not the token
RELOAD_EVERY_S = 1.0


def token_hash(token: str) -> str:
    """The form a token is kept in the file (`HASHED` and the hex SHA-256 of its UTF-8)."""
    return HASHED + hashlib.sha256(token.encode("utf-8", "surrogateescape")).hexdigest()


class Principals(Protocol):
    def principal(self, token: str) -> Principal | None: ...


MAKE_ONE = "python3 -c 'import secrets; print(secrets.token_urlsafe(24))'"


def _check(tokens: Tokens) -> None:
    """Every token long enough, every worker token bound to one worker."""
    tables = (
        ("admin", tokens.admin),
        ("owners", tokens.owners.keys()),
        ("workers", tokens.workers.keys()),
    )
    for table, found in tables:
        short = sum(len(t) < MIN_TOKEN_CHARS and not t.startswith(HASHED) for t in found)
        if short:
            raise AuthConfigError(
                f"{table}: {short} token(s) shorter than {MIN_TOKEN_CHARS} characters; "
                f"make each one with {MAKE_ONE}"
            )
    if "*" in tokens.workers.values():
        raise AuthConfigError(
            "workers: '*' (any worker) is not accepted: give each HTTP worker a token of its "
            "own naming its worker id (an admin token may act as any worker)"
        )


def _pairs(text: str, what: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        token, sep, name = item.partition("=")
        if not sep or not token or not name:
            raise AuthConfigError(f"{what}: expected token=name, got {item!r}")
        found[token] = name
    return found


@dataclass(frozen=True)
class Tokens:
    admin: frozenset[str] = frozenset()
    owners: Mapping[str, str] = field(default_factory=dict)
    workers: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Tokens:
        """From the variables of `env` (the entry point's environment, passed in by
        `cronlog api`) and the file CRONLOG_API_TOKENS_FILE names."""
        admin = {t for t in env.get("CRONLOG_API_ADMIN_TOKENS", "").split(",") if t.strip()}
        owners = _pairs(env.get("CRONLOG_API_TOKENS", ""), "CRONLOG_API_TOKENS")
        workers = _pairs(env.get("CRONLOG_WORKER_TOKENS", ""), "CRONLOG_WORKER_TOKENS")
        path = env.get("CRONLOG_API_TOKENS_FILE")
        if path:
            try:
                doc = safe_load(Path(path).read_text()) or {}
            except (OSError, ValueError, yaml.YAMLError) as exc:  # not UTF-8 too
                raise AuthConfigError(f"cannot read {path}: {exc}") from exc
            found = Tokens.of_document(doc, path)
            admin |= found.admin
            owners |= found.owners
            workers |= found.workers
        tokens = cls(frozenset(t.strip() for t in admin), owners, workers)
        _check(tokens)
        if not (tokens.admin or tokens.owners or tokens.workers):
            raise AuthConfigError(
                "no API tokens configured: set CRONLOG_API_TOKENS_FILE, CRONLOG_API_TOKENS "
                "or CRONLOG_API_ADMIN_TOKENS"
            )
        return tokens

    @classmethod
    def of_document(cls, doc: object, where: str) -> Tokens:
        """The tokens of a tokens file's content (AuthConfigError saying what is wrong):
        what the API reads, and what `cronlog tokens` checks before it writes."""
        if not isinstance(doc, dict):
            raise AuthConfigError(f"{where}: expected a mapping with admin/owners/workers")
        tokens = cls(
            frozenset(_token_list(doc.get("admin"), f"{where}: admin")),
            _token_map(doc.get("owners"), f"{where}: owners"),
            _token_map(doc.get("workers"), f"{where}: workers"),
        )
        _check(tokens)
        return tokens

    def principal(self, token: str) -> Principal | None:
        """The caller a token names, or None. Every table is scanned, in constant time
        per comparison, so timing does not tell which table a near miss was in. Compared
        as UTF-8 bytes: a header with non-ASCII characters is an unknown token, not an
        error."""
        given = token.encode("utf-8", "surrogateescape")
        hashed = token_hash(token).encode()
        found: Principal | None = None

        def matches(known: str) -> bool:
            held = known.encode("utf-8", "surrogateescape")
            return hmac.compare_digest(held, hashed if known.startswith(HASHED) else given)

        for known in self.admin:
            if matches(known):
                found = ADMIN
        for known, owner in self.owners.items():
            if matches(known):
                found = Principal("owner", owner)
        for known, worker in self.workers.items():
            if matches(known):
                found = Principal("worker", worker)
        return found


class TokenSource:
    """The tokens of the environment and the file, read again when the file changes (its
    size or modification time; looked at most once every RELOAD_EVERY_S)."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.env = dict(env)
        self.path = env.get("CRONLOG_API_TOKENS_FILE") or None
        self.tokens = Tokens.from_env(self.env)  # AuthConfigError at start-up
        self._seen = self._stamp()
        self._failed: tuple[int, int] | None = None  # the version last said unreadable
        self._looked = time.monotonic()
        self._lock = threading.Lock()

    def _stamp(self) -> tuple[int, int] | None:
        if self.path is None:
            return None
        try:
            info = os.stat(self.path)
        except OSError:
            return None
        return info.st_mtime_ns, info.st_size

    def principal(self, token: str) -> Principal | None:
        self.refresh()
        return self.tokens.principal(token)

    def refresh(self) -> None:
        now = time.monotonic()
        if self.path is None or now - self._looked < RELOAD_EVERY_S:
            return
        with self._lock:
            self._looked = now
            stamp = self._stamp()
            if stamp == self._seen:
                return
            try:
                self.tokens = Tokens.from_env(self.env)
            except AuthConfigError as exc:
                # Read again every second until it reads (a file being replaced, its
                # owner changed back): said once for each version of the file.
                if stamp != self._failed:
                    self._failed = stamp
                    log.error("API tokens not reloaded, the ones read before count: %s", exc)
                return
            self._seen = stamp
            log.info("API tokens reloaded from %s", self.path)


def _token_list(value: object, where: str) -> list[str]:
    """A list of tokens. A lone string is refused: iterated, each of its characters
    would become a token."""
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(t, str) and t for t in value):
        raise AuthConfigError(
            f"{where}: expected a list of token strings, got {type(value).__name__}"
        )
    return [t.strip() for t in value]


def _token_map(value: object, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and k and isinstance(v, str) and v for k, v in value.items()
    ):
        raise AuthConfigError(f"{where}: expected a mapping of token: name strings")
    return dict(value)
