"""One database, one deployment, on real Kafka and PostgreSQL.

The database records the deployment (topic prefix) it belongs to: a second deployment
pointed at it is refused by every process that uses it, with both prefixes named. A
database that served several deployments before it recorded one (the user's case: its
rebuild replayed nothing and never returned) is refused too, and a rebuild repairs it, in
seconds. A rebuild killed with SIGKILL mid-way leaves nothing that breaks the next one;
a replay that cannot progress ends with the partitions it is short of."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from projections.migrate import MIGRATIONS_DIR, WrongDeployment, migrate, migrate_for
from projections.rebuild import (
    REBUILD_LOCK,
    RebuildError,
    _Replay,
    rebuild,
    topic_ends,
    with_search_path,
)
from streams.settings import Settings
from tests.support.isolation import create_database, drop_database, unique_name
from tests.support.kafka import SYNTHETIC_STATES, produce_runs
from tests.support.nodes import env_for
from tests.support.services import Services
from tests.support.waiting import eventually


def cronlog(
    settings: Settings, *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "connectors.cli", *args],
        env={**env_for(settings), "CRONLOG_API_ADMIN_TOKENS": "test-admin-0123456789ab"},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def other(settings: Settings) -> Settings:
    """Another deployment (topic prefix) on the same database."""
    return settings.with_(topic_prefix=f"{settings.topic_prefix}other.")


def recorded_prefix(url: str) -> str | None:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT topic_prefix FROM deployment").fetchone()
    return None if row is None else str(row[0])


def events_in_topic(settings: Settings) -> int:
    """Records in run-events: produced without transactions here, so no markers."""
    name = settings.topic("run-events")
    return sum(high for (topic, _), high in topic_ends(settings).items() if topic == name)


def live_schema(url: str) -> str:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT current_schema()").fetchone()
    assert row is not None
    return str(row[0])


def count(url: str, query: str, *params: object) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(query, params).fetchone()
    return int(row[0]) if row else 0


@pytest.fixture
def fresh_database(services: Services) -> Iterator[str]:
    name = unique_name("deploy")
    url, kind = create_database(services.database_url, name)
    yield url
    drop_database(services.database_url, name, kind)


def test_a_second_deployment_is_refused_by_every_process(topics: Settings) -> None:
    first, second = topics, other(topics)
    done = cronlog(first, "db", "migrate")
    assert done.returncode == 0, done.stderr
    assert recorded_prefix(first.database_url) == first.topic_prefix

    refusals = {
        "db migrate": cronlog(second, "db", "migrate"),
        "jobs list": cronlog(second, "jobs", "list"),
        "projector": cronlog(second, "projector"),
        "api": cronlog(second, "api", "--port", "18999"),
        "rebuild": cronlog(second, "projector", "--rebuild"),
    }
    for what, refused in refusals.items():
        assert refused.returncode != 0, what
        message = " ".join(refused.stderr.split())  # rich/typer may wrap lines
        assert f"topic prefix '{first.topic_prefix}'" in message, (what, refused.stderr)
        assert f"CRONLOG_TOPIC_PREFIX='{second.topic_prefix}'" in message, what
        assert "database of its own" in message, what
    # Nothing of the second deployment was recorded; the first one goes on.
    assert recorded_prefix(first.database_url) == first.topic_prefix
    assert migrate_for(first) == []
    with pytest.raises(WrongDeployment):
        migrate_for(second)


def test_a_database_mixed_before_it_recorded_a_deployment_is_refused_and_a_rebuild_repairs_it(
    topics: Settings, fresh_database: str, tmp_path: Path
) -> None:
    """The user's case: a database at the schema before 0003 that projected two
    prefixes. The rebuild used to wait for the other prefix's offsets for an hour."""
    old = tmp_path / "migrations"
    old.mkdir()
    for path in sorted(MIGRATIONS_DIR.glob("000[12]_*.sql")):
        shutil.copy(path, old / path.name)
    assert migrate(fresh_database, old) == [1, 2]
    mine = topics.with_(database_url=fresh_database)
    with psycopg.connect(fresh_database) as conn:  # what the other deployment left
        conn.execute(
            "INSERT INTO projector_offsets VALUES (%s, 0, 5000), (%s, 1, 7000)",
            ("elsewhere.run-events", "elsewhere.jobs"),
        )
        conn.execute(
            "INSERT INTO jobs (job_id, owner, spec, created_at, updated_at)"
            " VALUES ('theirs', 'x', '{}', now(), now())"
        )
    produce_runs(mine, range(20_000, 20_100))

    with pytest.raises(WrongDeployment) as refused:
        migrate_for(mine)
    assert "elsewhere.run-events" in str(refused.value)
    assert "records no deployment yet" in str(refused.value)
    assert recorded_prefix(fresh_database) is None

    started = time.monotonic()
    done = cronlog(mine, "projector", "--rebuild", timeout=300)
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    assert "rebuilt schema" in done.stdout
    print(f"rebuild of the mixed database: {took:.1f} s ({done.stdout.strip()})")

    assert recorded_prefix(fresh_database) == mine.topic_prefix
    with psycopg.connect(fresh_database) as conn:
        offsets = conn.execute("SELECT DISTINCT topic FROM projector_offsets").fetchall()
        theirs = conn.execute("SELECT count(*) FROM jobs WHERE job_id = 'theirs'").fetchone()
    assert {t for (t,) in offsets} <= {
        mine.topic(t) for t in ("run-events", "jobs", "heartbeats", "run-logs")
    }
    assert theirs == (0,)
    wanted = events_in_topic(mine)
    assert count(fresh_database, "SELECT count(*) FROM run_transitions") == wanted
    assert migrate_for(mine) == []  # accepted from now on
    with pytest.raises(WrongDeployment):
        migrate_for(other(mine))


def test_a_rebuild_killed_mid_way_leaves_nothing_that_breaks_the_next(topics: Settings) -> None:
    produce_runs(topics, range(0, 15_000))
    url = topics.database_url
    migrate_for(topics)
    stage = f"{live_schema(url)}_rebuild"
    stage_rows = sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(stage, "run_transitions"))
    proc = subprocess.Popen(
        [sys.executable, "-m", "connectors.cli", "projector", "--rebuild"],
        env=env_for(topics),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    killed_at = 0

    def killed_or_ended() -> bool:
        """Kills the rebuild as soon as its stage has rows; True once killed or ended."""
        nonlocal killed_at
        if proc.poll() is not None:
            return True
        try:
            with psycopg.connect(url) as conn:
                row = conn.execute(stage_rows).fetchone()
            killed_at = row[0] if row else 0
        except psycopg.errors.UndefinedTable:
            killed_at = 0
        if killed_at > 0:
            proc.send_signal(signal.SIGKILL)
            return True
        return False

    try:
        eventually(killed_or_ended, "the rebuild's stage to have rows", 120, interval_s=0.05)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)
    assert killed_at > 0, "the rebuild ended before it could be killed mid-way"
    assert proc.returncode == -signal.SIGKILL
    wanted = events_in_topic(topics)
    assert killed_at < wanted  # it was killed mid-way indeed

    done = cronlog(topics, "projector", "--rebuild", timeout=300)
    assert done.returncode == 0, done.stderr
    assert "rebuilt schema" in done.stdout
    assert count(url, "SELECT count(*) FROM run_transitions") == wanted
    # Every run of the topic (this test's, and any earlier test's of the module).
    runs = wanted // len(SYNTHETIC_STATES)
    assert count(url, "SELECT count(*) FROM runs WHERE run_id LIKE 'job-%%'") == runs
    left = count(url, "SELECT count(*) FROM pg_namespace WHERE nspname LIKE %s", "%\\_rebuild")
    assert left == 0
    assert recorded_prefix(url) == topics.topic_prefix


def test_a_second_rebuild_at_the_same_time_is_refused(topics: Settings) -> None:
    migrate_for(topics)
    with psycopg.connect(topics.database_url, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", (REBUILD_LOCK,))
        with pytest.raises(RebuildError, match="another rebuild of this database is running"):
            rebuild(topics)


def test_a_replay_that_cannot_progress_ends_with_the_partitions_it_is_short_of(
    topics: Settings,
) -> None:
    """Targets the topics will never reach (a partition whose records are gone, say): the
    replay ends after `stall_s` without progress, naming the partition."""
    schema = f"stall_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(topics.database_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    stage = topics.with_(database_url=with_search_path(topics.database_url, schema))
    replay = _Replay(stage, topics.group(f"stall-{uuid.uuid4().hex[:6]}"))
    topic = topics.topic("run-events")
    started = time.monotonic()
    try:
        with pytest.raises(RebuildError) as stalled:
            replay.wait_for(
                {(topic, 0): 10**12}, timeout_s=600, stall_s=5, progress=lambda _n: None
            )
    finally:
        replay.stop()
        with psycopg.connect(topics.database_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
    assert "no progress for 5 s" in str(stalled.value)
    assert f"{topic}[0]" in str(stalled.value)
    assert time.monotonic() - started < 300  # ended by the stall, not the overall timeout
