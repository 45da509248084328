"""Least privilege per role: the Kafka ACLs each kind of cronlog process needs, as data.

One principal per process kind (a process has one client configuration):
- ``node``: ingress (and the worker-reports gate), scheduler, ledger and dispatcher, the
  four loops of `cronlog node`;
- ``worker``: what every `cronlog worker` may write (its reports, heartbeats and logs,
  nothing that registers, changes or fires a job, nor dispatch requests). Each native
  worker has its own principal, ``cronlog-worker-<id>`` (`worker_grants`, made by
  `cronlog stack add-worker`), with these grants and one more: reading its own inbox
  topic. No worker reads another's (streams/inboxes.py);
- ``api``: `cronlog api` (commands; for HTTP workers what workers write; the dead
  letters it shows);
- ``projector`` and ``notifier``: readers, the notifier writing its dead letters;
- ``admin``: the super user (`cronlog topics create`, `audit`, `events`, operators).

Names are after the installation's prefix (`CRONLOG_TOPIC_PREFIX`), which topics and
groups share. `cronlog stack up --secure` applies these; docs/security.md lists them.
Why each grant exists is next to it; a test runs the product over SASL_SSL with them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Literal

ROLES: tuple[str, ...] = ("admin", "node", "worker", "api", "projector", "notifier")
Resource = Literal["topic", "group", "transactional_id"]
Operation = Literal["read", "write", "create", "describe"]
# The group id librdkafka is given by consumers that only assign() partitions and never
# join a group (streams/kafka.py): it still looks up that group's coordinator.
UNUSED_GROUP = "cronlog-unused"


@dataclass(frozen=True, slots=True)
class Grant:
    role: str
    resource: Resource
    name: str  # after the prefix, unless `absolute`
    operations: tuple[Operation, ...]
    prefixed: bool = False  # every name starting with it (ids with a variable part)
    absolute: bool = False  # not under the installation's prefix
    why: str = ""


def _topics(role: str, ops: tuple[Operation, ...], why: str, names: str) -> list[Grant]:
    """Grants on the topics `names` (separated by spaces)."""
    return [Grant(role, "topic", name, ops, why=why) for name in names.split()]


GRANTS: tuple[Grant, ...] = (
    # -- node ------------------------------------------------------------------------------
    *_topics(
        "node",
        ("read",),
        "ingress reads commands and worker reports; the ledger job-log and its state; the "
        "scheduler jobs, runs and heartbeats; the dispatcher dispatch, heartbeats and "
        "releases",
        "commands worker-reports job-log jobs runs heartbeats dispatch worker-handbacks",
    ),
    *_topics(
        "node",
        ("read", "write"),
        "the placement key: the dispatcher seals assignments with it and the ledger checks "
        "the seals of claims; the first node writes it; no other role may read it",
        "node-keys",
    ),
    *_topics(
        "node",
        ("write",),
        "ingress and the gate write job-log and the dead letters; the scheduler proposes "
        "to job-log; the ledger writes its state, run-events, dispatch, replies to workers "
        "and notices to other jobs' logs; the dispatcher assignments and verdicts",
        "job-log commands.dlq jobs runs run-events dispatch worker-inbox",
    ),
    Grant(
        "node",
        "topic",
        "worker-inbox.",
        ("write",),
        prefixed=True,
        why="the ledger's replies and the dispatcher's assignments to each native worker's "
        "own inbox (Write lets the nodes see which exist)",
    ),
    *(
        Grant("node", "group", name, ("read",), why="the node loops' consumer groups")
        for name in ("ingress", "gate", "scheduler", "ledger", "dispatcher")
    ),
    Grant(
        "node",
        "transactional_id",
        "ledger-",
        ("write", "describe"),
        prefixed=True,
        why="the ledger's fenced transactions, one id per node",
    ),
    # -- worker (every worker's principal: the template of `worker_grants`) ----------------
    *_topics(
        "worker",
        ("write",),
        "claims and outcomes (to the gate), liveness, job output, assignments released",
        "worker-reports heartbeats run-logs worker-handbacks",
    ),
    # -- api -------------------------------------------------------------------------------
    *_topics(
        "api",
        ("write",),
        "commands; for HTTP workers their heartbeats and reports",
        "commands heartbeats worker-reports",
    ),
    *_topics(
        "api",
        ("read",),
        "HTTP workers' inboxes; the dead letters the dashboard shows",
        "worker-inbox commands.dlq",
    ),
    # -- projector -------------------------------------------------------------------------
    *_topics(
        "projector",
        ("read",),
        "what PostgreSQL's tables are built from",
        "run-events jobs heartbeats run-logs",
    ),
    Grant("projector", "group", "projector", ("read",), why="its group (offsets in PostgreSQL)"),
    Grant(
        "projector",
        "group",
        "projector-rebuild-",
        ("read",),
        prefixed=True,
        why="`projector --rebuild`'s one-off groups",
    ),
    # -- notifier --------------------------------------------------------------------------
    *_topics("notifier", ("read",), "runs' outcomes and the jobs to watch", "run-events jobs"),
    *_topics("notifier", ("write",), "notifications a receiver refused", "notifications.dlq"),
    Grant("notifier", "group", "notifier", ("read",), why="its consumer group"),
    # -- every role that reads ---------------------------------------------------------------
    *(
        Grant(
            role,
            "group",
            UNUSED_GROUP,
            ("describe",),
            absolute=True,
            why="readers that assign() partitions still look up this group's coordinator",
        )
        for role in ("node", "worker", "api", "projector", "notifier")
    ),
)


@dataclass(frozen=True, slots=True)
class Acl:
    """One ALLOW entry, ready for the broker."""

    principal: str
    resource: Resource
    name: str
    prefixed: bool
    operation: Operation


def worker_grants(worker_id: str) -> tuple[Grant, ...]:
    """The grants of one native worker's own principal (role ``worker-<id>``): what any
    worker may write, and reading its own inbox topic with its own consumer group."""
    role = f"worker-{worker_id}"
    return (
        *(replace(g, role=role) for g in GRANTS if g.role == "worker"),
        Grant(
            role,
            "topic",
            f"worker-inbox.{worker_id}",
            ("read",),
            why="its assignments, claim replies and stop orders, with the seals of its "
            "placements: its own inbox and no other",
        ),
        Grant(role, "group", f"worker-{worker_id}", ("read",), why="its inbox's offsets"),
    )


def acls(
    prefix: str, username: str = "cronlog-{role}", grants: Iterable[Grant] = GRANTS
) -> list[Acl]:
    """Every ALLOW entry of `grants` (the roles but admin, a super user, by default) for
    one installation."""
    found: list[Acl] = []
    for grant in grants:
        name = grant.name if grant.absolute else f"{prefix}{grant.name}"
        principal = "User:" + username.format(role=grant.role)
        found.extend(
            Acl(principal, grant.resource, name, grant.prefixed, op) for op in grant.operations
        )
    return found


def table() -> str:
    """The grants as the Markdown table docs/security.md shows (a test keeps it equal)."""
    rows: dict[tuple[str, str, tuple[Operation, ...], str], list[str]] = {}
    own = worker_grants("<id>")[-2:]  # beside the worker role's, each worker's own
    for g in (*GRANTS, *own):
        name = f"`{g.name}{'*' if g.prefixed else ''}`" + (" (no prefix)" if g.absolute else "")
        rows.setdefault((g.role, g.resource.replace("_", " "), g.operations, g.why), []).append(
            name
        )
    lines = [
        "| role | resource | name (after the prefix; `*`: prefixed) | operations | why |",
        "|---|---|---|---|---|",
    ]
    for (role, resource, ops, why), names in rows.items():
        lines.append(f"| {role} | {resource} | {', '.join(names)} | {', '.join(ops)} | {why} |")
    return "\n".join(lines)
