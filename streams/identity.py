"""One live ledger per node id: the group membership is the lease.

A ledger's transactional.id is derived from its node id (streams/ledger.py says why: a
restart aborts its predecessor's open transaction at once). Two live processes under one
node id would fence each other for ever: each recovery re-initialises the shared id and
fences the other, and almost nothing commits. That happens when an operator gives two
machines the same `--node-id`, or when a ledger frozen past its session (a stopped VM, a
SIGSTOP) is replaced by a restart under its fixed id and then wakes.

So every ledger process has an incarnation (its start time, then random digits: later
starts sort higher) and announces both in its consumer's client.id, which the group's
description shows for every live member:

- at start, a ledger that sees a live member with its node id and another incarnation
  waits for it to leave (a predecessor killed a moment ago stays a member until its
  session lapses) and, if it is still there after `patience_s`, refuses to start;
- after every assignment, and when its producer is fenced, a ledger looks again: if a
  live member holds its node id under a *newer* incarnation, it is the one to go
  (`NodeIdTaken` ends the node): a frozen ledger that wakes beside its replacement
  goes, whether or not it has a transaction to be fenced in. Fenced with no newer twin
  (its own replaced producer, a transaction timeout), it recovers as usual.

Both sides order the same two incarnations the same way, so exactly one goes on. The
check asks the broker; when the broker does not answer, fencing still keeps every
decision exactly-once.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from typing import Any, Final

from confluent_kafka import KafkaException

log = logging.getLogger("cronlog.identity")

_PREFIX: Final = "cronlog-ledger-"


class NodeIdTaken(RuntimeError):
    """Another live ledger process runs under this node id."""


def new_incarnation() -> str:
    """This process's start (ms, fixed-width hex: ordered as text) and 16 random bits."""
    return f"{time.time_ns() // 1_000_000:011x}{secrets.token_hex(2)}"


def ledger_client_id(share: int, incarnation: str, node_id: str) -> str:
    """The ledger consumer's client.id. The share index comes first: the range assignor
    orders members by their id, which begins with the client.id (streams/ledger.py)."""
    return f"{_PREFIX}{share:03d}.{incarnation}.{node_id}"


def parse_client_id(client_id: str) -> tuple[str, str] | None:
    """(incarnation, node id) of a ledger's client.id, None for any other client."""
    if not client_id.startswith(_PREFIX):
        return None
    parts = client_id[len(_PREFIX) :].split(".", 2)
    return (parts[1], parts[2]) if len(parts) == 3 else None


def twins(
    members: list[tuple[str, str]], node_id: str, incarnation: str, newer: bool = False
) -> list[str]:
    """Of a group's live members, given as (client.id, host), those of another process
    under `node_id` (only those started after this one, if `newer`), for a log line."""
    found = []
    for client_id, host in members:
        parsed = parse_client_id(client_id)
        if parsed is None or parsed[1] != node_id or parsed[0] == incarnation:
            continue
        if not newer or parsed[0] > incarnation:
            found.append(f"incarnation {parsed[0]} on {host}")
    return found


def newer_twins(admin: Any, group: str, node_id: str, incarnation: str) -> list[str]:
    """The live ledgers under `node_id` started after this one (none if unknown)."""
    members = live_members(admin, group)
    return [] if members is None else twins(members, node_id, incarnation, newer=True)


def live_members(admin: Any, group: str, timeout_s: float = 5.0) -> list[tuple[str, str]] | None:
    """The group's live members as (client.id, host); None when the broker did not say."""
    try:
        futures = admin.describe_consumer_groups([group], request_timeout=timeout_s)
        description = futures[group].result(timeout=timeout_s + 1)
    except (KafkaException, TimeoutError, ValueError) as exc:
        log.warning("group %s could not be described (%s)", group, exc)
        return None
    return [(m.client_id, m.host) for m in description.members]


def await_node_id(
    admin: Any,
    group: str,
    node_id: str,
    incarnation: str,
    patience_s: float,
    stop: threading.Event,
) -> None:
    """Return once no other live ledger holds `node_id` (waiting up to `patience_s` for a
    predecessor's session to lapse); raise NodeIdTaken if one still does."""
    deadline = time.monotonic() + patience_s
    while True:
        members = live_members(admin, group)
        others = [] if members is None else twins(members, node_id, incarnation)
        if not others:
            return
        if time.monotonic() >= deadline:
            raise NodeIdTaken(
                f"node id {node_id!r} is held by a live ledger ({', '.join(others)}): give "
                "each node its own --node-id"
            )
        log.warning(
            "node id %s is held by %s; waiting up to %.0f s for it to leave",
            node_id,
            ", ".join(others),
            max(0.0, deadline - time.monotonic()),
        )
        if stop.wait(1.0):
            return
