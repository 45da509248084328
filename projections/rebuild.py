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

Views and indexes travel with their tables; other objects in the live schema (a user's
own views on the projection) are dropped with the old tables unless ``keep_previous``.
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
from confluent_kafka import Consumer, TopicPartition
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from projections.projector import TOPICS, Projector
from streams.kafka import consumer_config
from streams.settings import Settings

log = logging.getLogger("cronlog.rebuild")
Offsets = dict[tuple[str, int], int]


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
        metadata = consumer.list_topics(timeout=30)
        for name in names:
            if name not in metadata.topics:
                raise RebuildError(f"topic {name} does not exist (run `cronlog topics create`)")
            for partition in metadata.topics[name].partitions:
                _, high = consumer.get_watermark_offsets(
                    TopicPartition(name, partition), timeout=30, cached=False
                )
                ends[(name, partition)] = high
        return ends
    finally:
        consumer.close()


def _reached(positions: Offsets, targets: Offsets) -> bool:
    return all(positions.get(key, -1) >= want for key, want in targets.items() if want > 0)


def _offsets(conn: psycopg.Connection[Any], schema: str) -> Offsets:
    table = sql.Identifier(schema, "projector_offsets")
    query = sql.SQL("SELECT topic, partition, next_offset FROM {}").format(table)
    return {(t, p): o for t, p, o in conn.execute(query).fetchall()}


class _Replay:
    """A projector into the rebuild schema, on a thread."""

    def __init__(self, settings: Settings, group: str):
        self.projector = Projector(settings, batch_size=5000, group=group)
        self.thread = threading.Thread(target=self.projector.run, daemon=True)
        self.thread.start()

    def wait_for(self, targets: Offsets, timeout_s: float, progress: Callable[[int], None]) -> None:
        deadline = time.monotonic() + timeout_s
        while not _reached(self.projector.idle_positions, targets):
            if not self.thread.is_alive():
                raise RebuildError("the rebuild's projector stopped unexpectedly")
            if time.monotonic() > deadline:
                raise RebuildError(f"the replay did not reach the topics' end in {timeout_s} s")
            progress(self.projector.projected)
            time.sleep(0.2)

    def stop(self) -> None:
        self.projector.stop()
        self.thread.join(60)


def rebuild(
    settings: Settings,
    *,
    keep_previous: bool = False,
    timeout_s: float = 3600,
    progress: Callable[[int], None] = lambda _n: None,
) -> RebuildResult:
    started = time.monotonic()
    with psycopg.connect(settings.database_url, autocommit=True) as conn:
        row = conn.execute("SELECT current_schema()").fetchone()
        if row is None or row[0] is None:
            raise RebuildError("the database connection has no current schema")
        live: str = row[0]
        stage, previous = f"{live}_rebuild"[:63], f"{live}_previous"[:63]
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(stage)))
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(stage)))
    group = settings.group(f"projector-rebuild-{uuid.uuid4().hex[:8]}")
    stage_settings = settings.with_(database_url=with_search_path(settings.database_url, stage))
    targets = topic_ends(settings)
    log.info("replaying into schema %s up to %s", stage, targets)
    replay = _Replay(stage_settings, group)
    events = 0
    try:
        while True:
            replay.wait_for(targets, timeout_s, progress)
            replay.stop()
            events += replay.projector.projected
            with psycopg.connect(settings.database_url) as conn:
                behind = _swap(conn, live, stage, previous)
            if not behind:
                break
            # The live projector wrote past the replay while it ran: catch up, retry.
            targets = {key: max(targets.get(key, 0), want) for key, want in behind.items()}
            replay = _Replay(stage_settings, group)
    except BaseException:
        replay.stop()
        raise
    with psycopg.connect(settings.database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(stage)))
        if not keep_previous:
            drop = sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(previous))
            conn.execute(drop)
    return RebuildResult(
        live, events, time.monotonic() - started, previous if keep_previous else None
    )


def _objects(conn: psycopg.Connection[Any], schema: str) -> list[tuple[str, str]]:
    """(name, kind) of the tables and views in a schema; kind 'r' table, 'v' view."""
    rows = conn.execute(
        "SELECT c.relname, c.relkind FROM pg_class c JOIN pg_namespace n"
        " ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relkind IN ('r', 'v', 'p')"
        " ORDER BY c.relname",
        (schema,),
    ).fetchall()
    return [(name, "v" if kind == "v" else "r") for name, kind in rows]


class _Behind(Exception):
    def __init__(self, offsets: Offsets):
        self.offsets = offsets


def _swap(conn: psycopg.Connection[Any], live: str, stage: str, previous: str) -> Offsets:
    """Swap the rebuilt objects in; or, when the live projection is ahead of them,
    change nothing and return the live offsets to catch up to."""
    try:
        _swap_or_raise(conn, live, stage, previous)
    except _Behind as behind:
        return behind.offsets
    return {}


def _swap_or_raise(conn: psycopg.Connection[Any], live: str, stage: str, previous: str) -> None:
    with conn.transaction():
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
        if "projector_offsets" in theirs:
            ahead = _offsets(conn, live)
            rebuilt = _offsets(conn, stage)
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
