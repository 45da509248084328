"""What a caller of cronlog can do, independent of HTTP: the REST API and the human CLI
are both thin layers over this.

Writes are commands: validated by exactly the ingress rules (streams.core.commands),
produced to `commands` keyed by job id, and applied by the ledger. Reads come from the
PostgreSQL projections. Every call carries a Principal: an owner sees and changes only
its own jobs and runs (another owner's object is "not found", so ids do not leak), an
admin everything.
"""

from __future__ import annotations

import base64
import ipaddress
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal
from urllib.parse import urlsplit

import orjson
import psycopg
from confluent_kafka import KafkaError, KafkaException, Producer
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from connectors.api import quotas
from connectors.api.dead_letters import DeadLetterView, recent_dead_letters
from connectors.api.quotas import OwnerQuotas
from connectors.webhooks import Destinations
from projections import queries
from schemas.json import from_plain, to_plain
from schemas.spec import JobSpec
from streams.core.commands import (
    MAX_BACKFILL_RUNS,
    MAX_COMMAND_BYTES,
    Backfill,
    Command,
    Rejection,
    RunNow,
    UpsertJob,
    command_job_id,
    upsert_document,
    validate_command,
)
from streams.core.dag import cycle_through
from streams.core.ids import iso_utc, manual_run_id, parse_run_id
from streams.core.params import ParamError, ParamValues, required, resolve, written
from streams.core.schedule import fire_window
from streams.core.secret_grants import refusal
from streams.kafka import producer_config
from streams.settings import Settings

log = logging.getLogger("cronlog.api")
MAX_PAGE = 1000  # the largest `limit` of a listing (the routes' Query bound)
# How long a write waits for the broker's acknowledgement before answering 503.
PRODUCE_TIMEOUT_S = 5.0
LOG_TAIL_CHUNKS = 20


@dataclass(frozen=True, slots=True)
class Principal:
    kind: Literal["admin", "owner", "worker"]
    name: str  # the owner, the worker id, or "admin"

    def may_see(self, owner: str) -> bool:
        return self.kind == "admin" or (self.kind == "owner" and self.name == owner)


ADMIN = Principal("admin", "admin")


class ServiceError(Exception):
    """A refusal with an HTTP-like status: 400 malformed, 403 forbidden, 404 not found,
    409 conflict, 413 too large, 422 invalid, 503 a backing service is unavailable."""

    def __init__(
        self,
        status: int,
        message: str,
        field: str | None = None,
        retry_after_s: int | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field
        self.retry_after_s = retry_after_s  # a 429's Retry-After (a quota)


@dataclass(frozen=True, slots=True)
class Accepted:
    """A command produced; `applied` says whether the projection showed its effect
    before the call returned (otherwise it is on its way)."""

    body: dict[str, Any]
    applied: bool


def _scope(who: Principal) -> str | None:
    """The owner a caller's reads are limited to; None for an admin (everything)."""
    return None if who.kind == "admin" else who.name


def _jsonable(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v.isoformat() if isinstance(v, datetime) else v for k, v in row.items()}


def _cursor(*parts: object) -> str:
    return base64.urlsafe_b64encode(orjson.dumps([str(p) for p in parts])).decode()


def _uncursor(token: str, n: int) -> list[str]:
    try:
        parts = orjson.loads(base64.urlsafe_b64decode(token.encode()))
    except (ValueError, orjson.JSONDecodeError) as exc:
        raise ServiceError(400, "malformed cursor", "cursor") from exc
    if not isinstance(parts, list) or len(parts) != n:
        raise ServiceError(400, "malformed cursor", "cursor")
    return [str(p) for p in parts]


def _validated(doc: dict[str, Any]) -> Command:
    """The command, validated by the ingress rules; a refusal is a 422."""
    command = validate_command(doc)
    if isinstance(command, Rejection):
        raise ServiceError(422, command.reason, command.field)
    return command


def _upsert_command(doc: dict[str, Any]) -> UpsertJob:
    command = _validated(doc)
    assert isinstance(command, UpsertJob)  # the caller set type job.upsert
    return command  # defaults too large as written are refused by the ingress rules


def patched_document(stored: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """The job.upsert command of a PATCH: the job's stored spec (the projection's JSON
    view, ``{"every_ms": ...}`` schedules and all) turned back into the command that makes
    it, with the patch's top-level fields over it; null removes a field (its default
    applies). Not validated yet."""
    try:
        merged = upsert_document(from_plain(stored, JobSpec))
    except (ValueError, TypeError) as exc:
        raise ServiceError(
            409, f"the job's stored spec cannot be read back ({exc}); replace the job instead"
        ) from exc
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    return merged


def _check_values(row: dict[str, Any], given: ParamValues) -> None:
    """422 for values the job's declaration refuses, or that make the command too large
    as dispatched, with the defaults (`written`): the ledger would dead-letter them.
    Without values, a parameter without a default is the ledger's to refuse or skip."""
    spec = from_plain(row["spec"], JobSpec)
    try:
        values = resolve(spec.params, given)
    except ParamError as exc:
        if not given:
            return
        raise ServiceError(422, str(exc), exc.field) from None
    try:
        written(spec, values)
    except ParamError as exc:
        raise ServiceError(422, str(exc), exc.field) from None


def _backfill_size(row: dict[str, Any], command: Backfill) -> int:
    """The fire times in a backfill's range up to the job's registration (the most it
    can create: times decided already are skipped); a range holding more than one
    backfill may create is refused with its size, to be split."""
    try:
        spec = from_plain(row["spec"], JobSpec)
    except (ValueError, TypeError) as exc:
        raise ServiceError(409, f"the job's stored spec cannot be read back ({exc})") from exc
    registered = int(datetime.fromisoformat(row["created_at"]).timestamp() * 1000)
    upper = min(command.to_ms, registered)
    window = fire_window(spec.schedule, command.from_ms - 1, upper, spec.dst, MAX_BACKFILL_RUNS)
    if window.truncated:
        raise ServiceError(
            422,
            f"the range holds more than {MAX_BACKFILL_RUNS} fire times before the job's "
            f"registration (the last within the limit: {iso_utc(window.times[-1])}); "
            "backfill it in parts",
            "to",
        )
    return len(window.times)


def parse_body(raw: bytes) -> dict[str, Any]:
    if len(raw) > MAX_COMMAND_BYTES:
        raise ServiceError(413, f"body is {len(raw)} bytes; at most {MAX_COMMAND_BYTES} allowed")
    try:
        doc = orjson.loads(raw) if raw.strip() else {}
    except orjson.JSONDecodeError as exc:
        raise ServiceError(400, f"body is not valid JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise ServiceError(400, "body must be a JSON object")
    return doc


class Service:
    def __init__(
        self,
        settings: Settings,
        wait_s: float = 5.0,
        quotas: OwnerQuotas | None = None,
        destinations: Destinations | None = None,
    ):
        self.settings = settings
        self.wait_s = wait_s
        # Where the notifier may post (connectors/webhooks.py): a webhook it would refuse
        # at every delivery is refused at registration instead. The CLI passes the
        # notifier's allow-list (CRONLOG_NOTIFY_ALLOW); none: public addresses only.
        self.destinations = destinations or Destinations()
        # Per-owner quotas (connectors/api/quotas.py): `cronlog api` passes those of
        # CRONLOG_OWNER_QUOTAS; without them, the defaults.
        self.quotas = OwnerQuotas.parse("") if quotas is None else quotas
        self.pool = ConnectionPool(
            settings.database_url,
            min_size=1,
            max_size=8,
            kwargs={"autocommit": True, "row_factory": dict_row},
            open=False,
        )
        self.producer = self._new_producer()
        self._producer_lock = threading.Lock()
        self._kafka_down_logged = 0.0

    def _new_producer(self) -> Producer:
        return Producer(
            producer_config(
                self.settings,
                **{
                    "linger.ms": 1,
                    # A command not acknowledged within this fails for good (delivery
                    # report _MSG_TIMED_OUT) rather than stay queued: a write answered
                    # 503 must not be applied later, when the broker is back.
                    "message.timeout.ms": int(PRODUCE_TIMEOUT_S * 1000),
                    # Retry a broker that is down every second, not up to every 10 s
                    # (librdkafka's default backoff): writes resume soon after it is back.
                    "reconnect.backoff.max.ms": 1000,
                    "error_cb": self._kafka_error,
                },
            )
        )

    def _kafka_error(self, err: KafkaError) -> None:
        """librdkafka's client-level errors: the broker down, or a fatal producer error
        (after which the producer is replaced at the next write)."""
        if err.fatal():
            log.error("Kafka producer failed for good (%s): replacing it", err)
            self._fatal = True
        elif time.monotonic() - self._kafka_down_logged > 10:
            self._kafka_down_logged = time.monotonic()
            log.warning("Kafka unreachable (%s); writes answer 503 until it is back", err)

    _fatal = False

    def open(self) -> None:
        self.pool.open(wait=False)

    def close(self) -> None:
        self.producer.flush(PRODUCE_TIMEOUT_S)
        self.pool.close()

    # -- plumbing ---------------------------------------------------------------------------
    def _query(self, query: queries.Query) -> list[dict[str, Any]]:
        sql, params = query
        try:
            with self.pool.connection(timeout=5) as conn:
                rows: list[dict[str, Any]] = conn.execute(sql, params).fetchall()  # type: ignore[assignment]
                return rows
        except (psycopg.OperationalError, TimeoutError) as exc:
            raise ServiceError(503, f"the projection database is unavailable: {exc}") from exc
        except psycopg.DataError as exc:  # a NUL in an id, say: the request, not the server
            raise ServiceError(
                400, f"invalid value in the request: {exc.diag.message_primary}"
            ) from exc

    def send(self, doc: dict[str, Any]) -> str:
        """Validate a command as ingress would and produce it; the job id it is keyed by."""
        return self._produce_command(doc, _validated(doc))

    def _produce_command(self, doc: dict[str, Any], command: Command) -> str:
        value = orjson.dumps(doc)
        if len(value) > MAX_COMMAND_BYTES:
            raise ServiceError(413, f"command is {len(value)} bytes; at most {MAX_COMMAND_BYTES}")
        key = command_job_id(command)
        self.produce("commands", key, value)
        return key

    def produce(self, topic: str, key: str, value: bytes) -> None:
        """Produce one record and wait for the broker's acknowledgement, at most
        PRODUCE_TIMEOUT_S (and a little): a broker that is down is a prompt 503, and the
        record is then never delivered. Requests wait in parallel, each for its own
        record (no lock around the wait: one slow write must not queue the others)."""
        done = threading.Event()
        errors: list[KafkaError] = []

        def delivered(err: KafkaError | None, _msg: object) -> None:
            if err is not None:
                errors.append(err)
            done.set()

        with self._producer_lock:
            if self._fatal:
                self._fatal = False
                self.producer = self._new_producer()
            producer = self.producer
        try:
            producer.produce(
                self.settings.topic(topic), key=key.encode(), value=value, on_delivery=delivered
            )
        except (KafkaException, BufferError) as exc:
            raise ServiceError(503, f"Kafka is unavailable, nothing was written: {exc}") from exc
        deadline = time.monotonic() + PRODUCE_TIMEOUT_S + 2
        while not done.is_set() and time.monotonic() < deadline:
            producer.poll(0.1)  # serves every pending delivery report, this one's too
        if errors and errors[0].code() == KafkaError._MSG_TIMED_OUT:
            raise ServiceError(
                503,
                f"Kafka is unavailable: the broker did not acknowledge the command within "
                f"{PRODUCE_TIMEOUT_S:.0f} s; retry later (a command sent again is "
                "harmless: commands are idempotent)",
            )
        if errors or not done.is_set():
            raise ServiceError(
                503,
                f"Kafka did not acknowledge the command ({errors[0] if errors else 'timeout'});"
                " it may or may not be applied: retry later (a command sent again is harmless)",
            )

    def _wait(self, check: Callable[[], dict[str, Any] | None]) -> dict[str, Any] | None:
        deadline = time.monotonic() + self.wait_s
        while True:
            found = check()
            if found is not None or time.monotonic() > deadline:
                return found
            time.sleep(0.1)

    # -- jobs --------------------------------------------------------------------------------
    def _job_row(self, job_id: str) -> dict[str, Any] | None:
        rows = self._query(queries.job(job_id))
        return _jsonable(rows[0]) if rows else None

    def job(self, who: Principal, job_id: str) -> dict[str, Any]:
        row = self._job_row(job_id)
        if row is None or row["deleted"] or not who.may_see(row["owner"]):
            raise ServiceError(404, f"job {job_id!r} not found", "job_id")
        return row

    def jobs(
        self,
        who: Principal,
        *,
        owner: str | None = None,
        paused: bool | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> dict[str, Any]:
        after = _uncursor(cursor, 1)[0] if cursor else None
        rows = self._query(queries.jobs_page(_scope(who), owner, paused, after, limit))
        items = [_jsonable(r) for r in rows[:limit]]
        more = len(rows) > limit
        return {"items": items, "next": _cursor(items[-1]["job_id"]) if more else None}

    def _owned_upsert(self, who: Principal, doc: dict[str, Any]) -> dict[str, Any]:
        doc = {**doc, "type": "job.upsert"}
        if who.kind == "owner":
            if doc.setdefault("owner", who.name) != who.name:
                raise ServiceError(
                    403, f"you may only register jobs of owner {who.name!r}", "owner"
                )
        elif who.kind != "admin":
            raise ServiceError(403, "workers cannot register jobs")
        return doc

    def _check_upstreams(self, owner: str, upstreams: tuple[str, ...]) -> None:
        """A prompt answer for what the ledger refuses anyway: an upstream registered by
        another owner (an id not registered yet may be named; it must then be registered
        by the same owner to drive this job)."""
        if not upstreams:
            return
        rows = self._query(queries.foreign_jobs(list(upstreams), owner))
        if rows:
            raise ServiceError(
                422,
                f"depends_on names {rows[0]['job_id']!r}, a job of another owner: a job may "
                "depend only on jobs of its own owner",
                "depends_on",
            )

    def _until_spec(self, job_id: str, spec: dict[str, Any]) -> Callable[[], dict[str, Any] | None]:
        def check() -> dict[str, Any] | None:
            row = self._job_row(job_id)
            return row if row and not row["deleted"] and row["spec"] == spec else None

        return check

    def create_job(
        self, who: Principal, body: dict[str, Any], allow_missing_upstreams: bool = False
    ) -> Accepted:
        doc = self._owned_upsert(who, body)
        command = _upsert_command(doc)
        existing = self._job_row(command.spec.job_id)
        if existing is not None and not existing["deleted"]:
            raise ServiceError(
                409, f"job {command.spec.job_id!r} exists; change it with PATCH", "job_id"
            )
        self._within_quota(command.spec.owner, quotas.check_job)
        return self._upsert(doc, command, None, allow_missing_upstreams)

    def put_job(
        self, who: Principal, body: dict[str, Any], allow_missing_upstreams: bool = False
    ) -> Accepted:
        """Create or replace a job (the CLI's `jobs add`): no conflict on an existing one,
        but another owner's job stays theirs."""
        doc = self._owned_upsert(who, body)
        command = _upsert_command(doc)
        existing = self._job_row(command.spec.job_id)
        if existing and not existing["deleted"] and not who.may_see(existing["owner"]):
            raise ServiceError(409, f"job {command.spec.job_id!r} belongs to another owner")
        if existing is None or existing["deleted"]:
            self._within_quota(command.spec.owner, quotas.check_job)
        live = existing if existing and not existing["deleted"] else None
        return self._upsert(doc, command, live, allow_missing_upstreams)

    def _within_quota(
        self, owner: str, check: Callable[..., None], *args: Any, job_id: str = ""
    ) -> None:
        """429 with Retry-After when `owner` is at one of its quotas (`check`'s); `job_id`:
        the job the request is for (not counted among its other jobs)."""
        quota = self.quotas.of(owner)
        (row,) = self._query(queries.owner_usage(owner, job_id))
        try:
            check(quota, owner, quotas.Usage.of(row), *args)
        except quotas.QuotaExceeded as exc:
            raise ServiceError(429, exc.message, None, exc.retry_after_s) from None

    def patch_job(
        self,
        who: Principal,
        job_id: str,
        patch: dict[str, Any],
        allow_missing_upstreams: bool = False,
    ) -> Accepted:
        current = self.job(who, job_id)
        if "job_id" in patch and patch["job_id"] != job_id:
            raise ServiceError(422, "job_id cannot be changed", "job_id")
        doc = self._owned_upsert(who, patched_document(current["spec"], patch))
        command = _upsert_command(doc)
        return self._upsert(doc, command, current, allow_missing_upstreams)

    def _check_graph(
        self,
        owner: str,
        job_id: str,
        upstreams: tuple[str, ...],
        had: tuple[str, ...] = (),
        allow_missing: bool = False,
    ) -> list[str]:
        """Refuse (422) a change that would close a dependency cycle in the owner's jobs
        as projected, or that names an upstream not registered (the job would wait for
        it; a typo would wait for ever) unless `allow_missing` or the job already named
        it (`had`: a change of another field is not refused for it). The warnings to
        answer with: the unregistered upstreams allowed."""
        if not upstreams:
            return []
        rows = self._query(queries.dependency_graph(owner))
        graph = {r["job_id"]: tuple(r["depends_on"] or ()) for r in rows}
        cycle = cycle_through(job_id, upstreams, graph)
        if cycle is not None:
            raise ServiceError(
                422,
                "depends_on would close a dependency cycle, in which no job ever runs "
                f"again: {' -> '.join(cycle)}",
                "depends_on",
            )
        unknown = [u for u in upstreams if u not in graph]
        new = [u for u in unknown if u not in had]
        if new and not allow_missing:
            names = ", ".join(repr(u) for u in new)
            raise ServiceError(
                422,
                f"depends_on names {names}, not registered: the job would wait until a job "
                "of that id is registered and runs (a typo waits for ever). Register it "
                "first, or allow it: ?allow_missing_upstreams=true "
                "(cronlog jobs add/apply --allow-missing-upstreams)",
                "depends_on",
            )
        return [
            f"depends_on names {u!r}, which is not registered: this job waits until a job "
            "of that id is registered and runs"
            for u in unknown
        ]

    def _check_notify(self, spec: JobSpec) -> None:
        """A webhook to an address the notifier refuses (loopback, private, link-local:
        connectors/webhooks.py) is refused now, with its reason, rather than dead-lettered
        at every failure. Judged without DNS: an address written in the URL, and
        `localhost`; a name is judged by the notifier when it resolves it."""
        if spec.notify is None:
            return
        host = (urlsplit(spec.notify.url).hostname or "").rstrip(".").lower()
        if host == "localhost" or host.endswith(".localhost"):
            address = "127.0.0.1"
        else:
            try:
                address = str(ipaddress.ip_address(host))
            except ValueError:
                return
        why = self.destinations.refusal(host, address)
        if why:
            raise ServiceError(
                422,
                f"notify.url: the notifier would refuse every call: {why}; an operator "
                "allows it with CRONLOG_NOTIFY_ALLOW",
                "notify.url",
            )

    def _check_secrets(self, spec: JobSpec) -> None:
        """A prompt answer for what the ledger refuses anyway: a secret the job's owner
        may not use (the grants, CRONLOG_SECRETS_GRANTS)."""
        refused = self.settings.secret_grants.refused(spec.owner, spec.secret_env)
        if refused:
            env, secret = refused[0]
            raise ServiceError(422, refusal(spec.owner, env, secret), f"env.{env}")

    def secrets(self, who: Principal) -> dict[str, Any]:
        """The secrets a caller may name, by name only (the API never holds a value): an
        owner's, or every granted secret with its owner patterns for an admin."""
        grants = self.settings.secret_grants
        if who.kind == "admin":
            items = [{"name": n, "owners": list(p)} for n, p in grants.grants]
        elif who.kind == "owner":
            items = [{"name": n} for n in grants.usable(who.name)]
        else:
            raise ServiceError(403, "workers cannot list secrets")
        return {"items": items}

    def _upsert(
        self,
        doc: dict[str, Any],
        command: UpsertJob,
        current: dict[str, Any] | None = None,
        allow_missing_upstreams: bool = False,
    ) -> Accepted:
        """Produce the upsert; `current`: the job's row before (its upstreams are not
        refused again for being missing)."""
        spec = command.spec
        self._check_secrets(spec)
        self._check_notify(spec)
        self._check_upstreams(spec.owner, spec.depends_on)
        had = tuple((current or {}).get("spec", {}).get("depends_on") or ())
        warnings = self._check_graph(
            spec.owner, spec.job_id, spec.depends_on, had, allow_missing_upstreams
        )
        warnings += [
            f"params.{name} has no default: runs of the schedule or upstreams are skipped "
            "without it; give it to run-now"
            for name in required(spec.params)
        ]
        self._produce_command(doc, command)
        job_id = spec.job_id
        # As the projection stores it (JSON: tuples become lists).
        stored = orjson.loads(orjson.dumps(to_plain(spec)))
        seen = self._wait(self._until_spec(job_id, stored))
        body = seen or {"job_id": job_id, "status": "accepted"}
        if warnings:
            body = {**body, "warnings": warnings}
        return Accepted(body, seen is not None)

    def job_command(self, who: Principal, job_id: str, kind: str, **fields: Any) -> Accepted:
        """pause, resume, delete, run_now, backfill of a job the caller may see."""
        row = self.job(who, job_id)
        doc: dict[str, Any] = {"type": f"job.{kind}", "job_id": job_id, **fields}
        if kind in ("run_now", "backfill"):
            doc.setdefault("request_id", uuid.uuid4().hex)
        command = _validated(doc)
        if isinstance(command, RunNow | Backfill):
            _check_values(row, command.params)
        body: dict[str, Any] = {"job_id": job_id, "command": doc["type"]}
        if isinstance(command, Backfill):
            body["runs_at_most"] = _backfill_size(row, command)
            self._within_quota(
                row["owner"], quotas.check_backfill, body["runs_at_most"], job_id=job_id
            )
        elif isinstance(command, RunNow):
            self._within_quota(row["owner"], quotas.check_in_flight)
        self._produce_command(doc, command)
        if kind in ("run_now", "backfill"):
            body["request_id"] = doc["request_id"]
        if kind == "run_now":
            body["run_id"] = manual_run_id(job_id, doc["request_id"])
        if kind in ("pause", "resume", "delete"):
            want = {"pause": ("paused", True), "resume": ("paused", False)}.get(
                kind, ("deleted", True)
            )

            def check() -> dict[str, Any] | None:
                row = self._job_row(job_id)
                return row if row and row[want[0]] is want[1] else None

            seen = self._wait(check)
            if seen is not None:
                return Accepted({**body, "job": seen}, True)
            return Accepted(body, False)
        return Accepted(body, False)

    # -- runs --------------------------------------------------------------------------------
    def runs(
        self,
        who: Principal,
        *,
        job_id: str | None = None,
        state: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> dict[str, Any]:
        """Newest first by scheduled time; `since` inclusive, `until` exclusive."""
        if job_id is not None:
            self.job(who, job_id)
        before: tuple[str, str] | None = None
        if cursor:
            at, run_id = _uncursor(cursor, 2)
            try:
                datetime.fromisoformat(at)
            except ValueError:
                raise ServiceError(400, "malformed cursor", "cursor") from None
            before = (at, run_id)
        rows = self._query(
            queries.runs_page(_scope(who), job_id, state, since, until, before, limit)
        )
        items = [_jsonable(r) for r in rows[:limit]]
        last = rows[limit - 1] if len(rows) > limit else None
        return {
            "items": items,
            "next": _cursor(last["scheduled_at"].isoformat(), last["run_id"]) if last else None,
        }

    def _run_row(
        self, who: Principal, run_id: str, rows: list[dict[str, Any]] | None = None
    ) -> dict[str, Any]:
        """The run's row if the caller may see it (`rows`: its query's, if already made)."""
        rows = self._query(queries.run(run_id)) if rows is None else rows
        if not rows or not who.may_see(rows[0]["owner"]):
            raise ServiceError(404, f"run {run_id!r} not found", "run_id")
        row = _jsonable(rows[0])
        row.pop("owner")
        return row

    def run(self, who: Principal, run_id: str, log_chunks: int = LOG_TAIL_CHUNKS) -> dict[str, Any]:
        run = self._run_row(who, run_id)
        run["transitions"] = [_jsonable(r) for r in self._query(queries.transitions(run_id))]
        tail = self._query(queries.log_tail(run_id, log_chunks))
        run["log_tail"] = "".join(r["data"] for r in tail)
        return run

    MAX_LOG_CHUNKS = 10_000

    def logs(
        self,
        who: Principal,
        run_id: str,
        attempt: int | None = None,
        stream: str | None = None,
        limit: int = MAX_LOG_CHUNKS,
    ) -> list[dict[str, Any]]:
        """The run's log chunks in order, at most `limit` (the first ones)."""
        self._run_row(who, run_id)
        query = queries.logs(run_id, attempt, stream, min(limit, self.MAX_LOG_CHUNKS))
        return [_jsonable(r) for r in self._query(query)]

    def run_command(self, who: Principal, run_id: str, kind: str, **fields: Any) -> Accepted:
        """cancel or rerun of a run the caller may see. A run the projection does not hold
        yet is commanded when its id is a run id of a job the caller may see: run-now
        answers with the id before the projector has read the run, and cancelling it at
        once is what a user does (the ledger ignores a command for a run it never made)."""
        rows = self._query(queries.run(run_id))
        if not rows and (parsed := parse_run_id(run_id)):
            self.job(who, parsed.job_id)
        else:
            self._run_row(who, run_id, rows)
        doc: dict[str, Any] = {"type": f"run.{kind}", "run_id": run_id, **fields}
        if kind == "rerun":
            doc.setdefault("request_id", uuid.uuid4().hex)
        self.send(doc)
        return Accepted({"run_id": run_id, "command": doc["type"]}, False)

    # -- the dashboard's reads ---------------------------------------------------------------
    RECENT_RUNS = 10

    def recent_states(
        self, job_ids: list[str], per_job: int = RECENT_RUNS
    ) -> dict[str, list[dict[str, str]]]:
        """The newest `per_job` runs of each job (oldest first): run_id and state. The
        caller has already scoped `job_ids` to what it may see."""
        rows = self._query(queries.recent_states(job_ids, per_job))
        found: dict[str, list[dict[str, str]]] = {job_id: [] for job_id in job_ids}
        for row in rows:
            found[row["job_id"]].append({"run_id": row["run_id"], "state": row["state"]})
        return found

    def lateness(self, who: Principal, job_id: str, limit: int = 500) -> list[float]:
        """Start lateness in seconds of the job's newest `limit` scheduled runs that
        started (manual runs have no schedule to be late for)."""
        self.job(who, job_id)
        rows = self._query(queries.lateness(job_id, limit))
        return [float(r["lateness_s"]) for r in rows]

    def workers(self) -> list[dict[str, Any]]:
        """Every worker the projection knows: capacity offered, free, liveness. Not scoped:
        workers belong to the installation, not to an owner, and carry no job data."""
        return [_jsonable(r) for r in self._query(queries.workers())]

    MAX_GRAPH_JOBS = 1000

    def dependencies(self, who: Principal) -> dict[str, list[str]]:
        """The visible jobs that depend on others, with their upstreams, and the visible
        upstreams themselves (with theirs): the dependency view's graph, at most
        MAX_GRAPH_JOBS dependents."""
        rows = self._query(queries.dependents(_scope(who), self.MAX_GRAPH_JOBS))
        graph = {r["job_id"]: [str(u) for u in r["ups"]] for r in rows}
        roots = sorted({u for ups in graph.values() for u in ups} - set(graph))
        for r in self._query(queries.visible_among(_scope(who), roots)):
            graph[r["job_id"]] = []
        return graph

    def downstream(self, who: Principal, job_id: str) -> list[str]:
        """The visible jobs that name `job_id` as an upstream."""
        rows = self._query(queries.downstream(_scope(who), job_id))
        return [r["job_id"] for r in rows]

    def dead_letters(self, who: Principal, limit: int = 50) -> list[DeadLetterView]:
        """The newest dead letters; an owner sees those whose command names it as owner or
        names one of its jobs (the rest may carry anyone's data, or none: admin only)."""
        try:
            letters = recent_dead_letters(self.settings, limit)
        except KafkaException as exc:
            raise ServiceError(503, f"Kafka is unavailable: {exc}") from exc
        if who.kind != "admin":
            job_ids = sorted({d.job_id for d in letters if d.job_id})
            mine = {r["job_id"] for r in self._query(queries.owned_jobs(job_ids, who.name))}
            letters = [
                d
                for d in letters
                if d.owner == who.name or (d.job_id in mine and d.owner in (None, who.name))
            ]
        return letters[:limit]

    # -- health ------------------------------------------------------------------------------
    READY_CACHE_S = 2.0
    _ready: tuple[float, dict[str, str]] = (0.0, {})

    def ready(self) -> dict[str, str]:
        """Whether PostgreSQL and Kafka answer, checked at most every READY_CACHE_S
        (the endpoint needs no token: a flood of probes must not become a flood of
        broker calls). The answer names the failure's kind only; the details are in the
        API's log."""
        at, checks = self._ready
        if checks and time.monotonic() - at < self.READY_CACHE_S:
            return checks
        checks = {}
        try:
            self._query(queries.projector_alive())
            checks["database"] = "ok"
        except (ServiceError, psycopg.Error) as exc:
            log.warning("readiness: PostgreSQL: %s", exc)
            checks["database"] = "unavailable"
        try:
            self.producer.list_topics(self.settings.topic("commands"), timeout=3)
            checks["kafka"] = "ok"
        except KafkaException as exc:
            log.warning("readiness: Kafka: %s", exc)
            checks["kafka"] = "unavailable"
        self._ready = (time.monotonic(), checks)
        return checks
