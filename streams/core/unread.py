"""The proposals a node delivered that the ledger has not read yet (pure: no Kafka).

A proposal not answered by a state change is repeated (streams/core/proposals.py), for
the one the ledger read and refused (too early by its clock) and the one that never
reached the log (the producer's queue was full). A repeat of a proposal the ledger has
not read yet is neither: it is only more for the ledger to read. While the ledger is
behind (a burst, a takeover, an overloaded machine) such repeats came every `repeat_ms`
for every waiting run, faster than the ledger read them, and the gap grew for as long
as they came (the soak of issue 54: 22,000 overdue claim deadlines repeated every 3 s
left the ledger 931,831 records behind and never settled).

So the node keeps, per job-log partition, when its oldest delivered proposal the ledger
has not read was appended (`since`): from its own delivery reports (offset and the
broker's append time) and the ledger group's committed offsets. A repeat of a proposal
made at or after that time, less `APPEND_SLACK_MS`, is held (`held_from`): the ledger has
not read the first one yet, and will. It is checked again a `repeat_ms` later. The view
fails open: without an answer about the ledger's offsets for `STALE_S`, nothing is held
and repeats are made as before.

The slack: a proposal is made at the node's broker time, a lower bound, and appended a
little later, so a proposal that is itself the oldest unread has `since` just after its
making; the slack also covers the brokers' clocks differing by up to a second (the
partition's leader stamps the append; the node's clock is learnt from every broker).
Proposals made by the node's wall clock before its first broker sample are never held
(the scheduler passes no `held_from` then). A proposal made up to the slack before
`since` may have been read and still be held; the ledger answers most with a new state,
which ends the repeats, and for the others (a step proposed a moment early, a proposal
it refused) the hold lasts only until the ledger reads the proposals appended in the
slack after it, since a repeat is judged by when its proposal was sent, however often it
was held (`FireTimers._sent_at`, `PartitionTimers.noticed`).

Delivery reports are kept coarsely, one mark per `MARK_MS` of append time, so the memory
follows the ledger's delay in seconds, not the number of proposals. A mark's time is the
last append it covers, so `since` can only be late, which holds less, never more.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

# Delivery reports within this much append time share one mark.
MARK_MS = 100
# A proposal is appended within this of its making, unless the broker is slow (above).
APPEND_SLACK_MS = 1000
# An answer about the ledger's offsets older than this is no answer (fail open): the
# node asks every second, so this is several lost answers in a row.
STALE_S = 5.0
# At most this many marks a partition (1,000 s of appends a mark every MARK_MS): the
# oldest go first, which makes `since` later, so it only ever holds less. Without the
# ledger's answers (no right to read its group's offsets) they would grow for ever.
MAX_MARKS = 10_000


@dataclass(slots=True)
class _Partition:
    marks: deque[tuple[int, int]] = field(default_factory=deque)  # (last offset, last append)
    read_to: int = -1  # the ledger's committed offset: the next it reads
    read_at: float = float("-inf")  # when that was learnt (monotonic)
    opened_ms: int = 0  # the first append time of the newest mark


class UnreadProposals:
    def __init__(self) -> None:
        self._partitions: dict[int, _Partition] = {}

    def delivered(self, partition: int, offset: int, appended_ms: int) -> None:
        """A proposal the broker appended to job-log `partition` at `offset`."""
        part = self._partitions.setdefault(partition, _Partition())
        if offset < part.read_to:
            return  # already read (a late report)
        marks = part.marks
        if marks and appended_ms - part.opened_ms < MARK_MS:
            marks[-1] = (max(offset, marks[-1][0]), max(appended_ms, marks[-1][1]))
        else:
            marks.append((offset, appended_ms))
            part.opened_ms = appended_ms
            if len(marks) > MAX_MARKS:
                marks.popleft()

    def read(self, partition: int, offset: int, at: float) -> None:
        """The ledger's committed offset on `partition` (the next record it reads), learnt
        at monotonic time `at`."""
        part = self._partitions.setdefault(partition, _Partition())
        part.read_to = max(part.read_to, offset)
        part.read_at = at
        marks = part.marks
        while marks and marks[0][0] < part.read_to:
            marks.popleft()

    def since(self, partition: int, now: float) -> int | None:
        """The append time of the oldest proposal on `partition` the ledger has not read,
        None when it has read them all or its offsets are not known lately."""
        part = self._partitions.get(partition)
        if part is None or not part.marks or now - part.read_at > STALE_S:
            return None
        return part.marks[0][1]

    def held_from(self, partition: int, now: float) -> int | None:
        """Repeats on `partition` of proposals made at or after this (broker ms) wait: the
        ledger has not read a proposal appended before them. None: none waits."""
        since = self.since(partition, now)
        return None if since is None else since - APPEND_SLACK_MS

    def marks(self) -> int:
        """The marks held over all partitions (memory; for tests and the gauge)."""
        return sum(len(p.marks) for p in self._partitions.values())
