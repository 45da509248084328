"""The `timers` header of a job state record: what the scheduler needs of the state.

The scheduler follows the `jobs` topic to know, per job, its next due time, the newest
time the ledger decided and whether its firings may be proposed early. Decoding the
whole Avro state for those four values was most of a takeover's catch-up (~25 us a job:
25 s for 1,000,000 jobs), so the ledger writes them beside the value, in a record header
of 17 bytes, and the scheduler reads the header alone. A record without the header (one
written before it existed) is decoded as before. The value stays the one source of
truth: the header is derived from it by the same ledger write, in the same record.
"""

from __future__ import annotations

import struct
from typing import Final, NamedTuple, TypeAlias

from streams.core.proposals import may_lead, may_look_ahead
from streams.core.records import JobState

TIMERS_HEADER: Final = "cronlog-timers"
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


Headers: TypeAlias = (
    dict[str, str | bytes | None] | list[tuple[str, str | bytes | None]] | None
)  # as confluent-kafka types them


def timers_of(headers: Headers) -> Timers | None:
    """The timers of a consumed record's headers (None: no such header)."""
    if not headers:
        return None
    pairs = headers.items() if isinstance(headers, dict) else headers
    for key, value in pairs:
        if key == TIMERS_HEADER and isinstance(value, bytes):
            return decode_timers(value)
    return None
