"""PostgreSQL: connect and migrate, idempotently and safely under concurrency."""

from __future__ import annotations

import threading
from pathlib import Path

import psycopg
import pytest

from projections.migrate import MigrationError, load_migrations, migrate
from streams.settings import Settings

CONTRACT_TABLES = {"jobs", "runs", "run_transitions", "workers", "run_logs"}


def _tables(conninfo: str) -> set[str]:
    with psycopg.connect(conninfo) as conn:
        rows = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
        ).fetchall()
    return {row[0] for row in rows}


def test_connects_to_a_real_server(settings: Settings) -> None:
    with psycopg.connect(settings.database_url) as conn:
        version = conn.execute("SHOW server_version_num").fetchone()
    assert version is not None
    assert int(version[0]) >= 130000


def test_migrate_creates_the_contract_tables_once(settings: Settings) -> None:
    applied = migrate(settings.database_url)
    assert applied == [m.version for m in load_migrations()]
    assert _tables(settings.database_url) >= CONTRACT_TABLES
    assert migrate(settings.database_url) == []  # idempotent

    with psycopg.connect(settings.database_url) as conn:
        # The one-run-per-firing rule holds in the projection too.
        insert = (
            "INSERT INTO runs (run_id, job_id, scheduled_at, trigger, state, created_at,"
            " updated_at) VALUES (%s, 'j', '2026-01-01T00:00Z', %s, 'due', now(), now())"
        )
        conn.execute(insert, ("j@2026-01-01T00:00:00Z", "schedule"))
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute(insert, ("j@other-id", "backfill"))
        conn.rollback()
        # Manual runs are outside the rule.
        conn.execute(insert, ("j@manual:1", "manual"))
        conn.execute(insert, ("j@manual:2", "manual"))
        conn.execute(
            "INSERT INTO runs (run_id, job_id, scheduled_at, trigger, state, created_at,"
            " updated_at, started_at) VALUES ('k@t', 'k', '2026-01-01T00:00Z', 'schedule',"
            " 'running', now(), now(), '2026-01-01T00:00:02.5Z')"
        )
        lateness = conn.execute(
            "SELECT runs, p50_s, max_s FROM job_lateness WHERE job_id = 'k'"
        ).fetchone()
    assert lateness == (1, 2.5, 2.5)


def test_concurrent_migrators_apply_each_migration_once(settings: Settings, tmp_path: Path) -> None:
    (tmp_path / "0001_one.sql").write_text("CREATE TABLE mig_probe (n int);")
    (tmp_path / "0002_two.sql").write_text("INSERT INTO mig_probe VALUES (1);")
    results: list[list[int]] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(migrate(settings.database_url, tmp_path))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    # Its own schema history: point the probe at a fresh schema.
    with psycopg.connect(settings.database_url, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA probe")
    probe_url = psycopg.conninfo.make_conninfo(settings.database_url, options="-csearch_path=probe")
    settings = settings.with_(database_url=probe_url)
    threads = [threading.Thread(target=run) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert sorted(results) == [[], [], [], [1, 2]]
    with psycopg.connect(probe_url) as conn:
        assert conn.execute("SELECT count(*) FROM mig_probe").fetchone() == (1,)


def test_an_edited_applied_migration_is_refused(settings: Settings, tmp_path: Path) -> None:
    with psycopg.connect(settings.database_url, autocommit=True) as conn:
        conn.execute("CREATE SCHEMA edited")
    url = psycopg.conninfo.make_conninfo(settings.database_url, options="-csearch_path=edited")
    (tmp_path / "0001_one.sql").write_text("CREATE TABLE t1 (n int);")
    assert migrate(url, tmp_path) == [1]
    (tmp_path / "0001_one.sql").write_text("CREATE TABLE t1 (n bigint);")
    with pytest.raises(MigrationError, match="changed after it was applied"):
        migrate(url, tmp_path)
