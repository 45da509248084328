"""Typed, frozen configuration, built once at the entry point.

Entry points call :func:`Settings.from_env` and pass the result down. Every variable
carries the ``CRONLOG_`` prefix (README, "Configuration"). The environment is read at
the edges only: here, and by the command line (connectors/cli/), which reads the rest (log
format, metrics port, stop bound, malloc trimming, retention, API tokens and limits, the
API mode's URL and token, the stack's ports and folders) and passes the values to the
modules that use them; those read no environment (tests/unit/test_config_edges.py, which
also lists the few reads that are process plumbing, not configuration).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from streams.core.placement import UNBOUNDED, WorkerLimits
from streams.core.secret_grants import ENV_VAR as GRANTS_ENV
from streams.core.secret_grants import NO_GRANTS, GrantsError, SecretGrants

DEFAULT_KAFKA = "localhost:9092"
DEFAULT_TOPIC_PREFIX = "cronlog."
DEFAULT_PARTITIONS = 12
# The native local stack's PostgreSQL (connectors/stack/postgres.py) listens here.
DEFAULT_DATABASE_URL = "postgresql://cronlog:cronlog@127.0.0.1:15432/cronlog"

# Bounds on CRONLOG_PARTITIONS: partitions are fixed at topic creation, so a typo here
# would be permanent. 1024 is far above what one scheduler installation needs.
MAX_PARTITIONS = 1024


# Kafka allows more, but no cronlog installation needs more copies than this.
MAX_REPLICATION = 16


class SettingsError(ValueError):
    """A configuration value is malformed. Not retryable: fix the environment."""


@dataclass(frozen=True, slots=True)
class Settings:
    kafka: str = DEFAULT_KAFKA
    database_url: str = DEFAULT_DATABASE_URL
    topic_prefix: str = DEFAULT_TOPIC_PREFIX
    partitions: int = DEFAULT_PARTITIONS
    # Copies of each topic partition and how many must have a write before it is
    # acknowledged (CRONLOG_REPLICATION, CRONLOG_MIN_ISR). None: chosen from the cluster
    # at topic creation (streams/topics.py): 3 and 2 on three or more brokers, 1 and 1 on one.
    replication: int | None = None
    min_isr: int | None = None
    # librdkafka client properties for every client (security.protocol, sasl.*, ssl.*),
    # from the file CRONLOG_KAFKA_CONFIG names; sorted (key, value) pairs.
    kafka_config: tuple[tuple[str, str], ...] = ()
    # The most the dispatcher believes of any worker's heartbeat (CRONLOG_WORKER_MAX_*,
    # CRONLOG_WORKER_LABELS): a worker's word does not bound itself.
    worker_limits: WorkerLimits = UNBOUNDED
    # Which owners may use which secret (CRONLOG_SECRETS_GRANTS, a YAML file: secret
    # name -> owner patterns; streams/core/secret_grants.py): the ledger, the API and the
    # worker check a job's secrets against it. Unset: no owner may use any secret.
    secret_grants: SecretGrants = NO_GRANTS

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
            replication=_optional_count(env, "CRONLOG_REPLICATION"),
            min_isr=_optional_count(env, "CRONLOG_MIN_ISR"),
            kafka=env.get("CRONLOG_KAFKA", DEFAULT_KAFKA).strip() or DEFAULT_KAFKA,
            database_url=env.get("CRONLOG_DATABASE_URL", DEFAULT_DATABASE_URL).strip()
            or DEFAULT_DATABASE_URL,
            topic_prefix=env.get("CRONLOG_TOPIC_PREFIX", DEFAULT_TOPIC_PREFIX),
            partitions=partitions,
            kafka_config=read_client_properties(env.get("CRONLOG_KAFKA_CONFIG") or None),
            worker_limits=worker_limits_from_env(env),
            secret_grants=read_secret_grants(env.get(GRANTS_ENV) or None),
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
        for name, value in (
            ("CRONLOG_REPLICATION", self.replication),
            ("CRONLOG_MIN_ISR", self.min_isr),
        ):
            if value is not None and not 1 <= value <= MAX_REPLICATION:
                raise SettingsError(f"{name} must be between 1 and {MAX_REPLICATION}, got {value}")
        if (
            self.replication is not None
            and self.min_isr is not None
            and self.min_isr > self.replication
        ):
            raise SettingsError(
                f"CRONLOG_MIN_ISR ({self.min_isr}) cannot exceed CRONLOG_REPLICATION "
                f"({self.replication}): no write could ever be acknowledged"
            )

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


# What a properties file may not set: cronlog sets these itself, per client.
OWN_CLIENT_KEYS = frozenset({"bootstrap.servers", "group.id", "transactional.id"})


def read_client_properties(path: str | None) -> tuple[tuple[str, str], ...]:
    """A librdkafka-style properties file (``key=value`` lines; ``#`` and ``!`` start a
    comment), e.g. ``security.protocol=SASL_SSL``, ``sasl.mechanism=SCRAM-SHA-512``,
    ``sasl.username``, ``sasl.password``, ``ssl.ca.location``."""
    if path is None:
        return ()
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise SettingsError(f"CRONLOG_KAFKA_CONFIG: cannot read {path}: {exc}") from None
    found: dict[str, str] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", "!")):
            continue
        key, sep, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key:
            raise SettingsError(f"CRONLOG_KAFKA_CONFIG {path}:{n}: expected key=value")
        if key in OWN_CLIENT_KEYS:
            raise SettingsError(
                f"CRONLOG_KAFKA_CONFIG {path}:{n}: {key} is set by cronlog "
                "(CRONLOG_KAFKA for the servers; groups and transactional ids per client)"
            )
        found[key] = value
    return tuple(sorted(found.items()))


def read_secret_grants(path: str | None) -> SecretGrants:
    """The grants file CRONLOG_SECRETS_GRANTS names (YAML: `secret NAME: [owner
    patterns]`); unset, no grants: no owner may use any secret."""
    if path is None:
        return SecretGrants()
    import yaml  # the one YAML file a process reads at start

    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise SettingsError(f"{GRANTS_ENV}: cannot read {path}: {exc}") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SettingsError(f"{GRANTS_ENV} {path}: not YAML: {exc}") from None
    try:
        return SecretGrants.from_document(doc, f"{GRANTS_ENV} {path}")
    except GrantsError as exc:
        raise SettingsError(str(exc)) from None


def worker_limits_from_env(env: Mapping[str, str]) -> WorkerLimits:
    """CRONLOG_WORKER_MAX_CPU (a number), CRONLOG_WORKER_MAX_MEMORY_MB and
    CRONLOG_WORKER_MAX_GPU (integers), CRONLOG_WORKER_LABELS (comma-separated ``key=value``
    or ``key=*``); unset: unbounded."""
    raw_cpu = env.get("CRONLOG_WORKER_MAX_CPU", "").strip()
    cpu: float | None = None
    if raw_cpu:
        try:
            cpu = float(raw_cpu)
        except ValueError:
            raise SettingsError(
                f"CRONLOG_WORKER_MAX_CPU must be a number, got {raw_cpu!r}"
            ) from None
        if not cpu >= 0 or cpu == float("inf"):
            raise SettingsError(
                f"CRONLOG_WORKER_MAX_CPU must be a finite number >= 0, got {raw_cpu!r}"
            )
    counts: dict[str, int | None] = {}
    for name in ("CRONLOG_WORKER_MAX_MEMORY_MB", "CRONLOG_WORKER_MAX_GPU"):
        count = _optional_count(env, name)
        if count is not None and count < 0:
            raise SettingsError(f"{name} must be >= 0, got {count}")
        counts[name] = count
    raw_labels = env.get("CRONLOG_WORKER_LABELS", "").strip()
    labels: frozenset[str] | None = None
    if raw_labels:
        entries = [entry.strip() for entry in raw_labels.split(",") if entry.strip()]
        for entry in entries:
            key, sep, value = entry.partition("=")
            if not sep or not key.strip() or not value.strip():
                raise SettingsError(
                    f"CRONLOG_WORKER_LABELS: expected key=value or key=*, got {entry!r}"
                )
        labels = frozenset(entries)
    return WorkerLimits(
        cpu=cpu,
        memory_mb=counts["CRONLOG_WORKER_MAX_MEMORY_MB"],
        gpu=counts["CRONLOG_WORKER_MAX_GPU"],
        labels=labels,
    )


def _optional_count(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name, "").strip()
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        raise SettingsError(f"{name} must be an integer, got {raw!r}") from None
