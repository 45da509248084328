"""Which owners may use which secret (pure): the grants, shared by the ledger, the API
and the worker.

A job's env may name a secret by reference (`{"secret": NAME}`, resolved on the worker:
connectors/worker/secrets.py). A secret is an owner's: the grants file names, for each
secret, the owners that may use it, as fnmatch-style patterns (`payments`, `team-*`,
`*`), matched case-sensitively against the whole owner id:

    db-pass: [payments]
    api-token: [team-*, ops]
    shared-ca: ["*"]

A secret the grants do not name may be used by no owner (the secure default, and what
a deployment without a grants file gets). The ledger refuses (dead-letters) a job spec
naming a secret its owner may not use, the API answers 422, and the worker, which holds
the values, refuses again when it resolves them (a grant revoked after the job was
registered). The file is read at the edges (streams/settings.py, CRONLOG_SECRETS_GRANTS)
and its parsed document given here: a bad one is a clear error at start.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Final

# What a secret's name may be (streams/core/command_spec.py reads it from a job's env
# with the same rule; the worker's file names too), and an owner pattern: an owner id's
# characters and fnmatch's `*`, `?`, `[`, `]`, `!`.
SECRET_NAME: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*", re.ASCII)
OWNER_PATTERN: Final = re.compile(r"[A-Za-z0-9._*?!\[\]-]+", re.ASCII)
MAX_NAME_CHARS: Final = 128
MAX_PATTERN_CHARS: Final = 256
ENV_VAR: Final = "CRONLOG_SECRETS_GRANTS"
# Where a worker may hold a secret's value in its own environment: CRONLOG_SECRET_ and the
# name upper case, `.` and `-` as `_` (connectors/worker/secrets.py). Several names map
# to one variable (`db-pass`, `DB.PASS`, `db_pass`), so the grants refuse two such names:
# an owner granted one would read the other's value.
SECRET_ENV_PREFIX: Final = "CRONLOG_SECRET_"


def secret_env_name(secret: str) -> str:
    """The worker's environment variable that may hold `secret`'s value."""
    return SECRET_ENV_PREFIX + re.sub(r"[.-]", "_", secret).upper()


class GrantsError(ValueError):
    """The grants document is malformed (where, and what is wrong)."""


@dataclass(frozen=True, slots=True)
class SecretGrants:
    """Sorted (secret name, owner patterns) pairs; a secret not named is no one's."""

    grants: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def patterns(self, secret: str) -> tuple[str, ...]:
        for name, patterns in self.grants:
            if name == secret:
                return patterns
        return ()

    def allows(self, secret: str, owner: str) -> bool:
        """Whether `owner` may use `secret`: some pattern of its grant matches the whole
        owner id (an empty owner, a placeholder's, matches none)."""
        return bool(owner) and any(fnmatchcase(owner, p) for p in self.patterns(secret))

    def refused(self, owner: str, refs: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
        """The (env name, secret name) references `owner` may not use, in order."""
        return tuple((env, secret) for env, secret in refs if not self.allows(secret, owner))

    def sharing_env(self, secret: str) -> tuple[str, ...]:
        """The granted names other than `secret` whose environment variable is
        `secret`'s (none in grants read by `from_document`, which refuses them)."""
        env = secret_env_name(secret)
        return tuple(n for n, _ in self.grants if n != secret and secret_env_name(n) == env)

    def usable(self, owner: str) -> tuple[str, ...]:
        """The names of the secrets `owner` may use, sorted."""
        return tuple(name for name, _ in self.grants if self.allows(name, owner))

    @classmethod
    def from_document(cls, doc: object, where: str = ENV_VAR) -> SecretGrants:
        """The grants of a parsed YAML or JSON document: a mapping of secret names to a
        list of owner patterns (or one pattern as a string); an empty document grants
        nothing."""
        if doc is None:
            return cls()
        if not isinstance(doc, Mapping):
            raise GrantsError(
                f"{where}: must map secret names to lists of owner patterns "
                f"(`NAME: [owner, team-*]`), got {type(doc).__name__}"
            )
        grants: list[tuple[str, tuple[str, ...]]] = []
        envs: dict[str, str] = {}
        for name, value in doc.items():
            if (
                not isinstance(name, str)
                or len(name) > MAX_NAME_CHARS
                or not SECRET_NAME.fullmatch(name)
            ):
                raise GrantsError(
                    f"{where}: {name!r} is not a secret name (1 to {MAX_NAME_CHARS} letters, "
                    "digits, '.', '_' or '-', starting with a letter or digit)" + _quote(name)
                )
            other = envs.setdefault(secret_env_name(name), name)
            if other != name:
                raise GrantsError(
                    f"{where}: secrets {other!r} and {name!r} share the worker's environment "
                    f"variable {secret_env_name(name)} (upper case, '.' and '-' as '_'): "
                    "rename one, or an owner granted one could read the other's value"
                )
            patterns = [value] if isinstance(value, str) else value
            if not isinstance(patterns, list):
                raise GrantsError(
                    f"{where}: secret {name!r}: give a list of owner patterns "
                    f"([] for no one), got {_kind(value)}"
                )
            for pattern in patterns:
                if (
                    not isinstance(pattern, str)
                    or len(pattern) > MAX_PATTERN_CHARS
                    or not OWNER_PATTERN.fullmatch(pattern)
                ):
                    raise GrantsError(
                        f"{where}: secret {name!r}: {pattern!r} is not an owner pattern "
                        "(an owner id, or one with fnmatch's *, ? and [...])" + _quote(pattern)
                    )
            grants.append((name, tuple(sorted(set(patterns)))))
        return cls(tuple(sorted(grants)))


# No grants: no owner may use any secret (the default of the ledger and of Settings).
NO_GRANTS: Final = SecretGrants()


def refusal(owner: str, env: str, secret: str) -> str:
    """Why a job of `owner` may not name `secret` (its name only: never a value)."""
    return (
        f"env.{env} names secret {secret!r}, which owner {owner!r} may not use "
        f"(no grant of it matches the owner: see {ENV_VAR})"
    )


def _quote(value: object) -> str:
    """A hint for what YAML read as a number or a boolean (`123`, `yes`): quote it."""
    return "" if isinstance(value, str) else f" (YAML read {value!r}, not text: quote it)"


def _kind(value: object) -> str:
    return "nothing" if value is None else type(value).__name__
