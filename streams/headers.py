"""The headers of state records: what the scheduler needs of a state, beside it.

The scheduler follows the `jobs` topic to know, per job, its next due time, the newest
time the ledger decided and whether its firings may be proposed early, and the `runs`
topic for each live run's next deadline. Decoding the whole Avro state for those few
values would be most of a takeover's catch-up, so the ledger writes them beside the
value, in a record header of 17 bytes (`cronlog-timers` on a job state,
`cronlog-deadline` on a run state), and the scheduler reads the header alone. A record
without the header (written by a version without it) is decoded whole. The value stays
the one source of truth: the header is derived from it by the same ledger write, in the
same record.
"""

from __future__ import annotations

import struct
from typing import Final, NamedTuple, TypeAlias

from schemas.records import DeadlineKind, JobState, RunState
from streams.core.proposals import may_lead, may_look_ahead

TIMERS_HEADER: Final = "cronlog-timers"
DEADLINE_HEADER: Final = "cronlog-deadline"
_FORMAT: Final = struct.Struct(">qqB")  # next_due_ms (-1: none), fired_ms, flags
_EARLY: Final = 1  # may be proposed before the lead (look-ahead)
_LEAD: Final = 2  # may be proposed before its time at all


class Timers(NamedTuple):
    next_due_ms: int | None
    fired_ms: int
    early: bool
    lead: bool


def job_timers(job: JobState) -> Timers:
    """What the scheduler needs of a job state."""
    return Timers(job.next_due_ms, job.fired_ms, may_look_ahead(job.spec), may_lead(job.spec))


def encode_timers(timers: Timers) -> bytes:
    due = -1 if timers.next_due_ms is None else timers.next_due_ms
    flags = (_EARLY if timers.early else 0) | (_LEAD if timers.lead else 0)
    return _FORMAT.pack(due, timers.fired_ms, flags)


def decode_timers(data: bytes) -> Timers | None:
    """The header's timers, or None if it is not one this version reads."""
    if len(data) != _FORMAT.size:
        return None
    due, fired, flags = _FORMAT.unpack(data)
    return Timers(None if due < 0 else due, fired, bool(flags & _EARLY), bool(flags & _LEAD))


class Deadline(NamedTuple):
    """A run state's next deadline (None: none pending, or the run is final)."""

    deadline_ms: int | None
    attempt: int
    kind: DeadlineKind | None


_KINDS: Final[tuple[DeadlineKind | None, ...]] = (None, "claim", "timeout", "retry", "dependency")


def run_deadline(run: RunState) -> Deadline:
    """What the scheduler needs of a run state."""
    if run.final or run.deadline_ms is None or run.deadline_kind is None:
        return Deadline(None, run.attempt, None)
    return Deadline(run.deadline_ms, run.attempt, run.deadline_kind)


def encode_deadline(deadline: Deadline) -> bytes:
    due = -1 if deadline.deadline_ms is None else deadline.deadline_ms
    return _FORMAT.pack(due, deadline.attempt, _KINDS.index(deadline.kind))


def decode_deadline(data: bytes) -> Deadline | None:
    """The header's deadline, or None if it is not one this version reads."""
    if len(data) != _FORMAT.size:
        return None
    due, attempt, kind = _FORMAT.unpack(data)
    if kind >= len(_KINDS) or (due < 0) != (kind == 0):
        return None
    return Deadline(None if due < 0 else due, attempt, _KINDS[kind])


Headers: TypeAlias = (
    dict[str, str | bytes | None] | list[tuple[str, str | bytes | None]] | None
)  # as confluent-kafka types them


ProducedHeaders: TypeAlias = list[tuple[str, str | bytes | None]]


def job_state_headers(job: JobState) -> ProducedHeaders:
    """The headers the ledger writes on a job state record."""
    return [(TIMERS_HEADER, encode_timers(job_timers(job)))]


def run_state_headers(run: RunState) -> ProducedHeaders:
    """The headers the ledger writes on a run state record."""
    return [(DEADLINE_HEADER, encode_deadline(run_deadline(run)))]


def _header(headers: Headers, name: str) -> bytes | None:
    if not headers:
        return None
    pairs = headers.items() if isinstance(headers, dict) else headers
    for key, value in pairs:
        if key == name and isinstance(value, bytes):
            return value
    return None


def timers_of(headers: Headers) -> Timers | None:
    """The timers of a consumed job state record's headers (None: no such header)."""
    data = _header(headers, TIMERS_HEADER)
    return None if data is None else decode_timers(data)


def deadline_of(headers: Headers) -> Deadline | None:
    """The deadline of a consumed run state record's headers (None: no such header)."""
    data = _header(headers, DEADLINE_HEADER)
    return None if data is None else decode_deadline(data)
