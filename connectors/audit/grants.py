"""Who held and who ran each attempt of a run (its grants, see `Grants` in
`connectors/audit/history.py`), and how the ledger ended a claim without a start: what
worker reports are judged against (`connectors/audit/worker_reports.py`)."""

from __future__ import annotations

from typing import Final

from connectors.audit.history import MAX_TRACKED, AuditedRun, Grants, History
from schemas.records import RunEvent

# Per (attempt, worker): the worker held the attempt (a `dispatched` event by it) / ran it
# (a `running` event by it, or its outcome accepted while it held the claim).
HELD: Final = 1
RAN: Final = 2
# How the ledger ended a claim without a start: released (the ledger relies on the
# attempt never having started: dispatched again), cancelled, or lost (a verdict, the
# timeout backstop, or the holder's own report without an exit code): the attempt may
# have run until then.
RELEASED: Final = 0
CANCELLED: Final = 1
LOST: Final = 2
ENDED_HOW: Final = ("released", "cancelled", "ended without a start (lost or timed out)")


def grant(history: History, run: AuditedRun, attempt: int, worker: str, flag: int) -> None:
    if not worker or not 0 < attempt < MAX_TRACKED:
        return
    worker = history.intern(worker)
    grants = run.grants
    if grants is None:
        run.grants, run.gbits = worker, flag << (2 * attempt)
    elif grants is worker:
        run.gbits |= flag << (2 * attempt)
    else:
        if isinstance(grants, str):  # a second worker: spell the grants out
            bits = run.gbits
            entries = [
                (a, grants, (bits >> (2 * a)) & 3)
                for a in range(1, bits.bit_length() // 2 + 1)
                if (bits >> (2 * a)) & 3
            ]
        else:
            entries = list(grants)
        found = [x for x in entries if x[0] == attempt and x[1] == worker]
        merged = (attempt, worker, flag | (found[0][2] if found else 0))
        if found and not flag & HELD:
            entries[entries.index(found[0])] = merged
        else:  # the latest holder of the attempt goes last
            entries = [x for x in entries if x not in found] + [merged]
        run.grants, run.gbits = tuple(entries), 0


def claim_ended(history: History, run: AuditedRun, e: RunEvent, attempt_bit: int) -> None:
    """A claim that ends without a `running` event."""
    if e.exit_code is not None:
        # The holder's outcome, accepted while it held the claim: it ran the attempt
        # (its start report was lost or came late).
        grant(history, run, e.attempt, e.worker_id, RAN)
        return
    if e.state == "due":
        # Released before the start: the attempt may be claimed again.
        run.claimed &= ~attempt_bit
        run.released += 1
        how = RELEASED
    else:
        how = CANCELLED if e.state == "cancelled" else LOST
    found = holders(run.grants, run.gbits, e.attempt)
    worker = found[-1] if found else e.worker_id
    ended = history.ended.setdefault(e.run_id, [])
    ended.append((e.attempt, worker, how, e.at_ms))


def flags(grants: Grants, gbits: int, attempt: int, worker: str) -> int:
    """What run-events says of (attempt, worker): HELD and/or RAN bits."""
    if grants is None:
        return 0
    if isinstance(grants, str):
        return (gbits >> (2 * attempt)) & 3 if grants == worker and attempt > 0 else 0
    return next((f for a, w, f in grants if a == attempt and w == worker), 0)


def holders(grants: Grants, gbits: int, attempt: int) -> list[str]:
    if grants is None:
        return []
    if isinstance(grants, str):
        return [grants] if attempt > 0 and (gbits >> (2 * attempt)) & HELD else []
    return [w for a, w, f in grants if a == attempt and f & HELD]


def holds(run: AuditedRun, attempt: int, worker: str) -> bool:
    """Whether `worker` holds the claim of the run's current attempt, not yet started."""
    if run.state != "dispatched" or run.attempt != attempt:
        return False
    found = holders(run.grants, run.gbits, attempt)
    return bool(found) and found[-1] == worker
