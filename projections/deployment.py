"""One database, one deployment.

The projection tables carry no topic prefix: two deployments (CRONLOG_TOPIC_PREFIX)
pointed at one database would write their jobs and runs into the same rows, and a
rebuild would wait for the other deployment's offsets. So the database records the
deployment it belongs to (table ``deployment``, migration 0003), written by the first
process of a deployment that migrates it, and every process that uses the database checks
it, under the migrations' advisory lock, and refuses another deployment's database.

A database migrated before it recorded a deployment is claimed by the first deployment
that migrates it, unless its ``projector_offsets`` name topics of another deployment:
then its rows are already mixed, cannot be told apart, and it is refused too. A
``cronlog projector --rebuild`` repairs such a database (it replaces the tables with
this deployment's records only, and records the deployment).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from streams.settings import Settings

# The topics the projector reads (and stores offsets of), by their names before the prefix:
# here, at the bottom of the projections, since the deployment a database belongs to is
# defined by them and the projector (above migrate, above this module) reads them.
TOPICS = ("run-events", "jobs", "heartbeats", "run-logs")


class DeploymentError(RuntimeError):
    """The database belongs to another deployment (or to several)."""


@dataclass(frozen=True, slots=True)
class Deployment:
    topic_prefix: str
    topics: frozenset[str]  # the topics whose offsets this deployment's projector stores

    @classmethod
    def of(cls, settings: Settings) -> Deployment:
        return cls(settings.topic_prefix, frozenset(settings.topic(t) for t in TOPICS))


def where(conninfo: str) -> str:
    """The database of a connection string, for messages (no password)."""
    parts = conninfo_to_dict(conninfo)
    host = parts.get("host") or "localhost"
    return (
        f"{parts.get('dbname') or parts.get('user') or '?'} on {host}:{parts.get('port') or 5432}"
    )


def _table_exists(conn: psycopg.Connection[Any], name: str) -> bool:
    row = conn.execute("SELECT to_regclass(%s)", (name,)).fetchone()
    return row is not None and row[0] is not None


def recorded(conn: psycopg.Connection[Any]) -> tuple[str, str] | None:
    """(topic prefix, when recorded) of the deployment the database belongs to, if any
    (in the connection's current schema)."""
    if not _table_exists(conn, "deployment"):
        return None
    row = conn.execute("SELECT topic_prefix, claimed_at FROM deployment").fetchone()
    return None if row is None else (str(row[0]), row[1].isoformat(timespec="seconds"))


def refuse_other(conn: psycopg.Connection[Any], deployment: Deployment, db: str) -> None:
    """Raise DeploymentError if the database records a deployment other than this one."""
    found = recorded(conn)
    if found is not None and found[0] != deployment.topic_prefix:
        theirs, when = found
        raise DeploymentError(
            f"the database {db} belongs to the deployment with topic prefix {theirs!r} "
            f"(recorded {when}), not to this one (CRONLOG_TOPIC_PREFIX="
            f"{deployment.topic_prefix!r}): one database serves one deployment, or their "
            "rows would mix. Give this deployment a database of its own "
            "(CRONLOG_DATABASE_URL; `cronlog projector --rebuild` fills it from the "
            f"topics), or set CRONLOG_TOPIC_PREFIX={theirs!r} if this process belongs to "
            "that deployment."
        )


def claim(conn: psycopg.Connection[Any], deployment: Deployment, db: str) -> None:
    """Check that the database belongs to this deployment; record it if it belongs to
    none yet. The caller holds the migrations' advisory lock (no two claims race)."""
    refuse_other(conn, deployment, db)
    if recorded(conn) is not None:
        return
    foreign: list[str] = []
    if _table_exists(conn, "projector_offsets"):
        rows = conn.execute("SELECT DISTINCT topic FROM projector_offsets ORDER BY 1")
        foreign = [str(t) for (t,) in rows.fetchall() if t not in deployment.topics]
    if foreign:
        shown = ", ".join(foreign[:8]) + (", ..." if len(foreign) > 8 else "")
        raise DeploymentError(
            f"the database {db} records no deployment yet but holds the projection of "
            f"topics of other deployments ({shown}) besides or instead of this one's "
            f"(CRONLOG_TOPIC_PREFIX={deployment.topic_prefix!r}): their rows are mixed and "
            "cannot be told apart. Give each deployment a database of its own "
            "(CRONLOG_DATABASE_URL) and fill it with `cronlog projector --rebuild`; to keep "
            "this database for this deployment, stop the other deployments' projectors "
            "and run `cronlog projector --rebuild` here: it replaces the tables with this "
            "deployment's records only and records the deployment."
        )
    conn.execute(
        "INSERT INTO deployment (topic_prefix) VALUES (%s) ON CONFLICT DO NOTHING",
        (deployment.topic_prefix,),
    )
