"""Typed, frozen configuration, built once at the entry point.

Library code never reads ``os.environ``: entry points call :func:`Settings.from_env`
and pass the result down. Every variable carries the ``CRONLOG_`` prefix
(design.md section 2).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace

DEFAULT_KAFKA = "localhost:9092"
DEFAULT_TOPIC_PREFIX = "cronlog."
DEFAULT_PARTITIONS = 12
# The native local stack's PostgreSQL (connectors/stack/postgres.py) listens here.
DEFAULT_DATABASE_URL = "postgresql://cronlog:cronlog@127.0.0.1:15432/cronlog"

# Bounds on CRONLOG_PARTITIONS: partitions are fixed at topic creation, so a typo here
# would be permanent. 1024 is far above what one scheduler installation needs.
MAX_PARTITIONS = 1024


class SettingsError(ValueError):
    """A configuration value is malformed. Not retryable: fix the environment."""


@dataclass(frozen=True, slots=True)
class Settings:
    kafka: str = DEFAULT_KAFKA
    database_url: str = DEFAULT_DATABASE_URL
    topic_prefix: str = DEFAULT_TOPIC_PREFIX
    partitions: int = DEFAULT_PARTITIONS

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        raw_partitions = env.get("CRONLOG_PARTITIONS", str(DEFAULT_PARTITIONS))
        try:
            partitions = int(raw_partitions)
        except ValueError:
            raise SettingsError(
                f"CRONLOG_PARTITIONS must be an integer, got {raw_partitions!r}"
            ) from None
        settings = cls(
            kafka=env.get("CRONLOG_KAFKA", DEFAULT_KAFKA).strip() or DEFAULT_KAFKA,
            database_url=env.get("CRONLOG_DATABASE_URL", DEFAULT_DATABASE_URL).strip()
            or DEFAULT_DATABASE_URL,
            topic_prefix=env.get("CRONLOG_TOPIC_PREFIX", DEFAULT_TOPIC_PREFIX),
            partitions=partitions,
        )
        settings.validate()
        return settings

    def validate(self) -> None:
        if not 1 <= self.partitions <= MAX_PARTITIONS:
            raise SettingsError(
                f"CRONLOG_PARTITIONS must be between 1 and {MAX_PARTITIONS}, got {self.partitions}"
            )
        # Kafka topic names allow [a-zA-Z0-9._-] and at most 249 characters.
        allowed = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
        bad = sorted(set(self.topic_prefix) - allowed)
        if bad:
            raise SettingsError(
                f"CRONLOG_TOPIC_PREFIX may only contain letters, digits, '.', '_' and '-'; "
                f"{self.topic_prefix!r} contains {''.join(bad)!r}"
            )
        if len(self.topic_prefix) > 200:
            raise SettingsError("CRONLOG_TOPIC_PREFIX is longer than 200 characters")

    def with_(self, **changes: object) -> Settings:
        """A copy with some fields changed (tests give each module its own prefix)."""
        updated = replace(self, **changes)  # type: ignore[arg-type]
        updated.validate()
        return updated

    def topic(self, name: str) -> str:
        return f"{self.topic_prefix}{name}"

    def group(self, name: str) -> str:
        """Consumer group ids share the prefix so installations never collide."""
        return f"{self.topic_prefix}{name}"
