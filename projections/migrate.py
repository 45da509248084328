"""Versioned SQL migrations, applied idempotently at start.

Files are ``migrations/NNNN_name.sql``. Each runs in its own transaction with its row in
``schema_migrations``; an advisory lock serialises concurrent starters (two projectors,
or the API and the projector). An applied migration whose file changed afterwards is an
error, not something to paper over: the database would no longer match the code.

Given the deployment (``migrate_for``), it then checks, under the same lock, that the
database belongs to that deployment, and records it when the database belongs to none
yet (projections/deployment.py): every process that uses the database migrates it first.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import psycopg

from projections.deployment import Deployment, DeploymentError, claim, where
from streams.settings import Settings

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
# Any fixed 64-bit number, unique to cronlog's migrations.
LOCK_ID = 0x63726F6E6C6F67  # "cronlog"
_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


class MigrationError(RuntimeError):
    """The database's schema history does not match the migration files."""


class WrongDeployment(MigrationError, DeploymentError):
    """The database belongs to another deployment (or to several): see deployment.py."""


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def load_migrations(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    found: list[Migration] = []
    for path in sorted(directory.glob("*.sql")):
        match = _FILE.match(path.name)
        if match is None:
            raise MigrationError(f"migration file {path.name} is not named NNNN_name.sql")
        found.append(Migration(int(match.group(1)), match.group(2), path.read_text()))
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise MigrationError(f"duplicate migration versions in {directory}")
    return found


def migrate_for(settings: Settings) -> list[int]:
    """Migrate the database of `settings` and make sure it is this deployment's (what
    every process that uses the database does first)."""
    return migrate(settings.database_url, deployment=Deployment.of(settings))


def migrate(
    conninfo: str, directory: Path = MIGRATIONS_DIR, *, deployment: Deployment | None = None
) -> list[int]:
    """Apply the pending migrations; return the versions applied now (empty when none).
    With `deployment`, then check (or record) that the database belongs to it; raises
    WrongDeployment when it does not."""
    migrations = load_migrations(directory)
    applied_now: list[int] = []
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (LOCK_ID,))
        try:
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations ("
                " version integer PRIMARY KEY, name text NOT NULL, checksum text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
            rows = conn.execute("SELECT version, checksum FROM schema_migrations").fetchall()
            done = {int(version): str(checksum) for version, checksum in rows}
            for migration in migrations:
                if migration.version in done:
                    if done[migration.version] != migration.checksum:
                        raise MigrationError(
                            f"migration {migration.version:04d}_{migration.name} was changed "
                            "after it was applied; add a new migration instead"
                        )
                    continue
                with conn.transaction():
                    conn.execute(migration.sql.encode())
                    conn.execute(
                        "INSERT INTO schema_migrations (version, name, checksum)"
                        " VALUES (%s, %s, %s)",
                        (migration.version, migration.name, migration.checksum),
                    )
                applied_now.append(migration.version)
            if deployment is not None:
                try:
                    claim(conn, deployment, where(conninfo))
                except DeploymentError as exc:
                    raise WrongDeployment(str(exc)) from None
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (LOCK_ID,))
    return applied_now
