"""Bearer tokens: who a caller is.

Configured by a file (``CRONLOG_API_TOKENS_FILE``, YAML or JSON) or by the environment;
both may be used, the file wins on a clash::

    admin: ["s3cret-admin"]             # CRONLOG_API_ADMIN_TOKENS=tok1,tok2
    owners: {"tok-a": "team-a"}         # CRONLOG_API_TOKENS=tok-a=team-a,tok-b=team-b
    workers: {"tok-w": "w1"}            # CRONLOG_WORKER_TOKENS=tok-w=w1  ("*": any worker)

Tokens are compared in constant time. With no token configured at all the API refuses
to start: an open scheduler that runs argv for anyone is not a default we ship.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from connectors.api.service import ADMIN, Principal


class AuthConfigError(ValueError):
    pass


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
    def from_env(cls, env: Mapping[str, str] | None = None) -> Tokens:
        env = os.environ if env is None else env
        admin = {t for t in env.get("CRONLOG_API_ADMIN_TOKENS", "").split(",") if t.strip()}
        owners = _pairs(env.get("CRONLOG_API_TOKENS", ""), "CRONLOG_API_TOKENS")
        workers = _pairs(env.get("CRONLOG_WORKER_TOKENS", ""), "CRONLOG_WORKER_TOKENS")
        path = env.get("CRONLOG_API_TOKENS_FILE")
        if path:
            try:
                doc = yaml.safe_load(Path(path).read_text()) or {}
            except (OSError, yaml.YAMLError) as exc:
                raise AuthConfigError(f"cannot read {path}: {exc}") from exc
            if not isinstance(doc, dict):
                raise AuthConfigError(f"{path}: expected a mapping with admin/owners/workers")
            admin |= {str(t) for t in doc.get("admin") or []}
            owners |= {str(k): str(v) for k, v in (doc.get("owners") or {}).items()}
            workers |= {str(k): str(v) for k, v in (doc.get("workers") or {}).items()}
        tokens = cls(frozenset(t.strip() for t in admin), owners, workers)
        if not (tokens.admin or tokens.owners or tokens.workers):
            raise AuthConfigError(
                "no API tokens configured: set CRONLOG_API_TOKENS_FILE, CRONLOG_API_TOKENS "
                "or CRONLOG_API_ADMIN_TOKENS"
            )
        return tokens

    def principal(self, token: str) -> Principal | None:
        """The caller a token names, or None. Every table is scanned, in constant time
        per comparison, so timing does not tell which table a near miss was in."""
        found: Principal | None = None
        for known in self.admin:
            if hmac.compare_digest(known, token):
                found = ADMIN
        for known, owner in self.owners.items():
            if hmac.compare_digest(known, token):
                found = Principal("owner", owner)
        for known, worker in self.workers.items():
            if hmac.compare_digest(known, token):
                found = Principal("worker", worker)
        return found
