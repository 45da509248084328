"""`cronlog projector --rebuild`: replay the topics from the start into fresh tables, then
swap them in atomically.

The projection is never the source of truth, so it can always be thrown away and rebuilt:
after a bug in the projector, a hand edit, or a new migration that needs old history.

How, without stopping the live projector:
1. Create the schema ``<live>_rebuild`` and run a second projector into it (its own
   consumer group, its connection's search_path set to that schema, so the migrations
   and every statement land there) until it has read up to the topics' end as they were
   when the rebuild began.
2. Stop it, then in one transaction: lock the live ``projector_offsets`` (the same
   first lock every projector transaction takes, so the two never deadlock) and the live
   tables; if the live projector has meanwhile written past the rebuilt offsets, give the
   locks back, catch up to them and try again; otherwise move the live objects aside and
   the rebuilt ones in (``ALTER ... SET SCHEMA``, transactional in PostgreSQL). Readers
   see the old tables or the new ones, never a mix.
3. The live projector's next batch finds the stored offsets ahead of its position (its
   fence) and rewinds to them; nothing is lost or applied twice.

Views and indexes travel with their tables. A user's own views on the projection
tables (in any schema) would follow the old tables out and be dropped with them, so
the swap refuses instead, naming them (issue 55): nothing of the user's is dropped; the
user drops them and creates them again after the rebuild.

Termination. Only this deployment's topics count (`Deployment.topics`): the live
``projector_offsets`` of a database that served several deployments also held other
prefixes' offsets, the swap found the rebuilt tables "behind" on topics the replay never
reads, and the rebuild waited for them for an hour ("0 records replayed"). A database
recording another deployment is refused up front. A replay that stops advancing for
``stall_s`` (Kafka unreachable, a partition's records gone) ends the rebuild with the
partitions it is short of. And so that a live projector under steady load cannot keep it
catching up for ever, after a few optimistic rounds the swap holds the live
``projector_offsets`` (EXCLUSIVE: readers go on, the live projector waits) while the
replay catches up to it.

An interrupted rebuild (even SIGKILL) leaves a ``<live>_rebuild`` schema, dropped by the
next one, and never a half swap (one transaction). One rebuild at a time per database: a
session advisory lock, which PostgreSQL releases when the rebuild's connection dies.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from confluent_kafka import Consumer, KafkaException, TopicPartition
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from projections.deployment import TOPICS, Deployment, DeploymentError, refuse_other, where
from projections.projector import Projector
from projections.retention import RetentionPolicy, prune
from streams.kafka import consumer_config
from streams.settings import Settings

log = logging.getLogger("cronlog.rebuild")
Offsets = dict[tuple[str, int], int]
# Session advisory lock: one rebuild per database at a time (migrate.LOCK_ID + 1).
REBUILD_LOCK = 0x63726F6E6C6F68
# Swaps that may find the live projection ahead before the swap holds it still.
OPTIMISTIC_ROUNDS = 3


class RebuildError(RuntimeError):
    """The rebuild could not finish; the live projection is untouched."""


@dataclass(frozen=True, slots=True)
class RebuildResult:
    schema: str
    events: int
    seconds: float
    previous: str | None  # where the old tables were kept, when asked to


def with_search_path(conninfo: str, schema: str) -> str:
    options = conninfo_to_dict(conninfo).get("options") or ""
    kept = " ".join(o for o in str(options).split() if "search_path" not in o)
    return make_conninfo(conninfo, options=f"{kept} -csearch_path={schema}".strip())


def topic_ends(settings: Settings) -> Offsets:
    """The high watermark of every partition of the projected topics, now."""
    consumer = Consumer(consumer_config(settings, None))
    try:
        ends: Offsets = {}
        names = [settings.topic(t) for t in TOPICS]
        try:
            metadata = consumer.list_topics(timeout=30)
            for name in names:
                if name not in metadata.topics:
                    raise RebuildError(f"topic {name} does not exist (run `cronlog topics create`)")
                for partition in metadata.topics[name].partitions:
                    _, high = consumer.get_watermark_offsets(
                        TopicPartition(name, partition), timeout=30, cached=False
                    )
                    ends[(name, partition)] = high
        except KafkaException as exc:
            raise RebuildError(
                f"cannot read the topics' ends from Kafka at {settings.kafka}: {exc}"
            ) from exc
        return ends
    finally:
        consumer.close()


def _reached(positions: Offsets, targets: Offsets) -> bool:
    return all(positions.get(key, -1) >= want for key, want in targets.items() if want > 0)


def _short(positions: Offsets, targets: Offsets) -> str:
    """The partitions a replay has not reached yet, for messages."""
    short = [
        f"{t}[{p}] at {positions.get((t, p), 'start')} of {want}"
        for (t, p), want in sorted(targets.items())
        if want > 0 and positions.get((t, p), -1) < want
    ]
    return ", ".join(short[:6]) + (f" and {len(short) - 6} more" if len(short) > 6 else "")


def _offsets(
    conn: psycopg.Connection[Any], schema: str, topics: frozenset[str] | None = None
) -> Offsets:
    """The stored offsets of a schema, only of `topics` when given (this deployment's)."""
    table = sql.Identifier(schema, "projector_offsets")
    query = sql.SQL("SELECT topic, partition, next_offset FROM {}").format(table)
    rows = conn.execute(query).fetchall()
    return {(t, p): o for t, p, o in rows if topics is None or t in topics}


class _Replay:
    """A projector into the rebuild schema, on a thread."""

    def __init__(self, settings: Settings, group: str, before: int = 0):
        self.projector = Projector(settings, batch_size=5000, group=group)
        self.before = before  # records replayed by earlier rounds (progress counts all)
        self.failure: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.projector.run()
        except BaseException as exc:  # reported by wait_for, with its reason
            self.failure = exc
            raise

    def wait_for(
        self,
        targets: Offsets,
        timeout_s: float,
        stall_s: float,
        progress: Callable[[int], None],
    ) -> None:
        """Until the replay has read up to `targets`; RebuildError when its projector
        died, when it made no progress for `stall_s`, or after `timeout_s`."""
        started = changed = time.monotonic()
        seen: tuple[object, ...] = ()
        while not _reached(self.projector.idle_positions, targets):
            now = time.monotonic()
            positions = self.projector.idle_positions
            if not self.thread.is_alive():
                why = f": {self.failure}" if self.failure is not None else ""
                raise RebuildError(f"the rebuild's projector stopped unexpectedly{why}")
            if now - started > timeout_s:
                raise RebuildError(
                    f"the replay did not reach the topics' end in {timeout_s:.0f} s; "
                    f"short of it at {_short(positions, targets)}"
                )
            state = (self.projector.projected, tuple(sorted(positions.items())))
            if state != seen:
                seen, changed = state, now
            elif now - changed > stall_s:
                raise RebuildError(
                    f"the replay made no progress for {stall_s:.0f} s, short of the topics' "
                    f"end at {_short(positions, targets)} (are Kafka and PostgreSQL "
                    "reachable, and do those partitions still hold their records?)"
                )
            progress(self.before + self.projector.projected)
            time.sleep(0.2)

    def stop(self) -> None:
        self.projector.stop()
        self.thread.join(60)


def rebuild(
    settings: Settings,
    *,
    keep_previous: bool = False,
    timeout_s: float = 3600,
    stall_s: float = 120,
    progress: Callable[[int], None] = lambda _n: None,
    retention: RetentionPolicy | None = None,
) -> RebuildResult:
    started = time.monotonic()
    own = Deployment.of(settings)
    # Held for the whole rebuild: its session lock keeps a second rebuild out.
    with psycopg.connect(settings.database_url, autocommit=True) as guard:
        row = guard.execute("SELECT pg_try_advisory_lock(%s)", (REBUILD_LOCK,)).fetchone()
        if row is None or not row[0]:
            raise RebuildError("another rebuild of this database is running; wait for it")
        row = guard.execute("SELECT current_schema()").fetchone()
        if row is None or row[0] is None:
            raise RebuildError("the database connection has no current schema")
        live: str = row[0]
        try:
            refuse_other(guard, own, where(settings.database_url))
        except DeploymentError as exc:
            raise RebuildError(str(exc)) from None
        stage, previous = f"{live}_rebuild"[:63], f"{live}_previous"[:63]
        # What an interrupted rebuild left, if anything, goes first.
        guard.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(stage)))
        guard.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(stage)))
        events = _replay_and_swap(
            settings, own, live, stage, previous, timeout_s, stall_s, progress, retention
        )
        guard.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(stage)))
        if not keep_previous:
            drop = sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(previous))
            guard.execute(drop)
    return RebuildResult(
        live, events, time.monotonic() - started, previous if keep_previous else None
    )


def _replay_and_swap(
    settings: Settings,
    own: Deployment,
    live: str,
    stage: str,
    previous: str,
    timeout_s: float,
    stall_s: float,
    progress: Callable[[int], None],
    retention: RetentionPolicy | None = None,
) -> int:
    """Replay into `stage` up to the topics' end, then swap it in; the records replayed."""
    group = settings.group(f"projector-rebuild-{uuid.uuid4().hex[:8]}")
    stage_settings = settings.with_(database_url=with_search_path(settings.database_url, stage))
    targets = topic_ends(settings)
    log.info("replaying into schema %s up to %s", stage, targets)
    replay = _Replay(stage_settings, group)
    events = 0

    def catch_up(wanted: Offsets) -> None:
        """Replay on up to `wanted` (the live offsets, held still by the caller)."""
        nonlocal replay, events
        replay = _Replay(stage_settings, group, events)
        replay.wait_for(wanted, timeout_s, stall_s, progress)
        replay.stop()
        events += replay.projector.projected

    try:
        for attempt in range(1, OPTIMISTIC_ROUNDS + 2):
            replay.wait_for(targets, timeout_s, stall_s, progress)
            replay.stop()
            events += replay.projector.projected
            holding = attempt > OPTIMISTIC_ROUNDS
            if retention is not None:
                # The live projector prunes by this policy: so does the rebuild, before
                # the swap, or the replay would bring pruned history back (retention.py).
                with psycopg.connect(stage_settings.database_url, autocommit=True) as conn:
                    pruned = prune(conn, retention)
                log.info("retention removed %d runs from the rebuilt tables", pruned.runs)
            with psycopg.connect(settings.database_url) as conn:
                behind = _swap(
                    conn, live, stage, previous, own.topics, catch_up if holding else None
                )
            if not behind:
                return events
            # The live projector wrote past the replay while it ran: catch up, retry.
            targets = {key: max(targets.get(key, 0), want) for key, want in behind.items()}
            replay = _Replay(stage_settings, group, events)
        raise AssertionError("unreachable: the last round holds the live offsets still")
    except BaseException:
        replay.stop()
        raise


def _objects(conn: psycopg.Connection[Any], schema: str) -> list[tuple[str, str]]:
    """(name, kind) of the tables and views in a schema; kind 'r' table, 'v' view."""
    rows = conn.execute(
        "SELECT c.relname, c.relkind FROM pg_class c JOIN pg_namespace n"
        " ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relkind IN ('r', 'v', 'p')"
        " ORDER BY c.relname",
        (schema,),
    ).fetchall()
    return [(name, "v" if kind == "v" else "r") for name, kind in rows]


def _foreign_views(conn: psycopg.Connection[Any], live: str, own: set[str]) -> list[str]:
    """The views (plain or materialized, in any schema) built on the live schema's tables
    that are not the projection's own (`own`: the names its migrations make)."""
    rows = conn.execute(
        "SELECT DISTINCT vn.nspname, v.relname FROM pg_depend d"
        " JOIN pg_rewrite r ON r.oid = d.objid"
        " JOIN pg_class v ON v.oid = r.ev_class"
        " JOIN pg_namespace vn ON vn.oid = v.relnamespace"
        " JOIN pg_class t ON t.oid = d.refobjid"
        " JOIN pg_namespace tn ON tn.oid = t.relnamespace"
        " WHERE d.classid = 'pg_rewrite'::regclass AND d.refclassid = 'pg_class'::regclass"
        " AND tn.nspname = %s AND v.oid <> t.oid ORDER BY 1, 2",
        (live,),
    ).fetchall()
    return [f"{schema}.{name}" for schema, name in rows if not (schema == live and name in own)]


class _Behind(Exception):
    def __init__(self, offsets: Offsets):
        self.offsets = offsets


def _swap(
    conn: psycopg.Connection[Any],
    live: str,
    stage: str,
    previous: str,
    topics: frozenset[str],
    catch_up: Callable[[Offsets], None] | None = None,
) -> Offsets:
    """Swap the rebuilt objects in; or, when the live projection is ahead of them,
    change nothing and return the live offsets to catch up to. With `catch_up`, hold
    the live offsets still instead and have the replay catch up to them, then swap."""
    try:
        _swap_or_raise(conn, live, stage, previous, topics, catch_up)
    except _Behind as behind:
        return behind.offsets
    return {}


def _swap_or_raise(
    conn: psycopg.Connection[Any],
    live: str,
    stage: str,
    previous: str,
    topics: frozenset[str],
    catch_up: Callable[[Offsets], None] | None,
) -> None:
    with conn.transaction():
        if catch_up is not None and ("projector_offsets", "r") in _objects(conn, live):
            # EXCLUSIVE: the live projector's FENCE (FOR UPDATE) waits, readers do not.
            conn.execute(
                sql.SQL("LOCK TABLE {} IN EXCLUSIVE MODE").format(
                    sql.Identifier(live, "projector_offsets")
                )
            )
            ahead, rebuilt = _offsets(conn, live, topics), _offsets(conn, stage, topics)
            behind = {k: o for k, o in ahead.items() if rebuilt.get(k, -1) < o}
            if behind:
                catch_up(behind)  # the lock stays taken meanwhile: same transaction
        mine = _objects(conn, stage)
        theirs = {name for name, _ in _objects(conn, live)}
        tables = [name for name, kind in mine if kind == "r" and name in theirs]
        # projector_offsets first: every projector transaction starts with it (FENCE).
        tables.sort(key=lambda name: name != "projector_offsets")
        if tables:
            conn.execute(
                sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(
                    sql.SQL(", ").join(sql.Identifier(live, name) for name in tables)
                )
            )
        foreign = _foreign_views(conn, live, {name for name, _ in mine})
        if foreign:
            raise RebuildError(
                "the rebuild would drop views that are not the projection's, built on its "
                f"tables: {', '.join(foreign)}. Nothing was changed; drop them (keep their "
                "definitions: psql \\d+ VIEW), rebuild, then create them again"
            )
        if "projector_offsets" in theirs:
            ahead = _offsets(conn, live, topics)
            rebuilt = _offsets(conn, stage, topics)
            behind = {k: o for k, o in ahead.items() if rebuilt.get(k, -1) < o}
            if behind:
                raise _Behind(behind)  # leaves the transaction: locks given back
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(previous)))
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(previous)))
        for name, kind in _objects(conn, live):
            if name in {n for n, _ in mine}:
                what = sql.SQL("VIEW" if kind == "v" else "TABLE")
                conn.execute(
                    sql.SQL("ALTER {} {} SET SCHEMA {}").format(
                        what, sql.Identifier(live, name), sql.Identifier(previous)
                    )
                )
        for name, kind in mine:
            what = sql.SQL("VIEW" if kind == "v" else "TABLE")
            conn.execute(
                sql.SQL("ALTER {} {} SET SCHEMA {}").format(
                    what, sql.Identifier(stage, name), sql.Identifier(live)
                )
            )
