"""When a node proposes each job's next firing (pure: no Kafka).

A job is proposed `lead_ms` before its due time (pre-dispatch: the run is created,
placed and claimed before it is due, and the worker starts it at the due time), and again
every `repeat_ms` until the ledger's answer (the job's new state) arrives. A state that
keeps the due time proposed (an earlier run's end rewrote it) is no answer and leaves
the repeat where it was.

Look-ahead: a burst (ten thousand jobs due in the same second) cannot be decided,
dispatched and claimed within `lead_ms`: the ledger decides on the order of a thousand
inputs per second per core. So, besides what is due within `lead_ms`, fires due within
`horizon_ms` are proposed early, earliest first over all the node's partitions
(`take_early`), at a bounded rate (`Pacer`): a burst is spread over the minute before
it instead of being squeezed into the lead. Only once the job's previous firing time
has passed, so a job every few seconds never has more runs decided ahead than the lead
gives it; and only jobs whose runs may overlap (concurrency `allow`) without upstreams.
`forbid` and `replace` jobs are not proposed before their time at all (no lead
either): the previous run's state at the firing time decides, and deciding even the
lead early would skip or cancel on a run that was about to finish. An early proposal
is not repeated before its normal time (due minus lead), so a slow ledger is never
flooded with repeats of it; should the ledger reject it, the normal proposal follows.
`horizon_ms` must stay below the ledger's `max_lead_ms`, which rejects proposals that
come earlier than that.
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

from schemas.spec import JobSpec

# A heap item packs (time, slot) into one int: time * _SLOTS + slot, ordered as the pair
# (times may be negative: divmod floors). _NONE is "no time" in the arrays.
_SLOTS = 1 << 32
_NONE = -(1 << 63)
# Catching up, times this far beyond the last take get no heap item (FireTimers).
_BULK_WINDOW_MS = 60_000


@dataclass(frozen=True, slots=True)
class ProposalPolicy:
    lead_ms: int = 0  # propose every firing this early (pre-dispatch)
    repeat_ms: int = 3000  # re-propose when the ledger has not answered by then
    horizon_ms: int = 0  # look-ahead: fires due within this may be proposed earlier...
    early_per_s: float = 0.0  # ...at most this many per second per node

    def __post_init__(self) -> None:
        if min(self.lead_ms, self.repeat_ms, self.horizon_ms, self.early_per_s) < 0:
            raise ValueError(f"negative proposal timing: {self}")


def may_lead(spec: JobSpec) -> bool:
    """Whether the job's firings may be proposed before their time at all: not for
    `forbid`/`replace`, whose overlap is decided at the firing time, nor for a step (no
    schedule), whose proposal is the end of a dependency wait (the ledger refuses their
    proposals before it)."""
    return spec.concurrency == "allow" and spec.schedule is not None


def may_look_ahead(spec: JobSpec) -> bool:
    """Whether the job's firings may be proposed before the lead (see the docstring)."""
    return spec.concurrency == "allow" and not spec.depends_on


class Allowance:
    """A token bucket: `per_s` early proposals a second, at most one second's worth saved."""

    def __init__(self, per_s: float, now_ms: int) -> None:
        self.per_s = per_s
        self.tokens = 0.0
        self.at_ms = now_ms

    def grant(self, now_ms: int) -> int:
        elapsed = max(0, now_ms - self.at_ms)
        self.at_ms = now_ms
        self.tokens = min(self.per_s, self.tokens + elapsed * self.per_s / 1000)
        return int(self.tokens)

    def spend(self, used: int) -> None:
        self.tokens -= used


class Pacer:
    """How many firings to propose early, judged once a second from the burst ahead.

    The plan. `FireTimers.waiting` counts, per due second, the firings that may still be
    proposed early; `FireTimers.decided`, those decided early and not yet due. Proposing
    at `rate` from now, earliest due first, the firings due by second s must be decided
    by s minus the lead, and claimed too, while the runs due before s report: every
    firing still waiting costs the ledger `WORK` proposals' worth, every one decided
    and due by s its report (`REPORT`). So the firings due by s must be in flight once
    now reaches `s - lead - (WORK * waiting(<= s) + REPORT * decided(<= s)) / rate`
    (less `SLACK_MS`): that many, earliest first, are allowed early, at the rate. A
    quiet job is proposed at most the slack before its lead; a burst as early as it
    needs, within the horizon.

    The rate is the ledger's, measured on the early proposals it answers. In a burst,
    while it answers at least 70 % of what the node sent in the last second and the
    node used its whole allowance, the rate grows by a fifth a second; once the
    proposals it has not answered (`early_out`) pass three seconds of the rate while it
    answers less than 90 % of it, the rate shrinks by 30 %. (The answers trail the
    proposals by the ledger's round trip, about a second with its transactions: the
    backlog alone would hold the rate down where the ledger keeps up.) It starts at the
    configured rate and stays within [FLOOR_PER_S, CEILING_PER_S]; what it learnt is
    kept for the next burst."""

    SLACK_MS = 2000
    # Ledger inputs a firing still waiting costs, counted as proposals: its proposal, its
    # worker's claim, and its report (a short run's start and end, two transitions): a
    # claim not granted by its time waits behind the reports of the runs due before it.
    # The plan holds for a node's partitions together because `take_early` shares the
    # allowance earliest first over all of them.
    WORK = 4
    # A firing decided early and due by the second planned for: its report to come.
    REPORT = 2
    FLOOR_PER_S = 100.0
    CEILING_PER_S = 20_000.0

    def __init__(self, policy: ProposalPolicy, now_ms: int) -> None:
        self.policy = policy
        self.rate = max(self.FLOOR_PER_S, policy.early_per_s)
        self.bucket = Allowance(self.rate, now_ms)
        self.burst = False
        self.start_ms: int | None = None  # the latest moment to begin (None: no burst)
        self.needed = 0  # early proposals the burst needs in flight by now
        self._judged_ms: int | None = None
        self._spent = 0  # early proposals since the last judgement
        self._answered = 0  # `FireTimers.answered` of the partitions at the last one

    def judge(self, now_ms: int, partitions: Sequence[FireTimers]) -> None:
        """At most once a second: is a burst on, and at what rate?"""
        if self._judged_ms is not None and now_ms - self._judged_ms < 1000:
            return
        elapsed_ms = 1000 if self._judged_ms is None else now_ms - self._judged_ms
        self._judged_ms = now_ms
        answered = sum(p.answered for p in partitions)
        # Fewer than before: a partition left with its count; no measure this time.
        measured = answered >= self._answered
        answered_per_s = (answered - self._answered) * 1000 / elapsed_ms
        self._answered = answered
        spent_per_s, self._spent = self._spent * 1000 / elapsed_ms, 0
        policy = self.policy
        if policy.early_per_s <= 0 or policy.horizon_ms <= 0:
            self.burst, self.start_ms, self.needed = False, None, 0
            return
        since, until = now_ms // 1000, (now_ms + policy.horizon_ms) // 1000
        counts: dict[int, int] = {}
        reports: dict[int, int] = {}
        for partition in partitions:
            for second, n in partition.waiting.items():
                if second <= until:
                    counts[second] = counts.get(second, 0) + n
            for second, n in partition.decided.items():
                if since <= second <= until:
                    reports[second] = reports.get(second, 0) + n
        total, done, start, needed = 0, 0, None, 0
        for second in sorted(counts.keys() | reports.keys()):
            done += reports.get(second, 0)
            if second not in counts:
                continue
            total += counts[second]
            work = self.WORK * total + self.REPORT * done
            begin = second * 1000 - policy.lead_ms - int(work * 1000 / self.rate)
            start = begin if start is None else min(start, begin)
            if begin <= now_ms + self.SLACK_MS:
                needed = total  # these must be in flight by now, earliest first
        self.start_ms = start
        self.needed = needed
        self.burst = needed > 0
        if self.burst and measured:
            outstanding = sum(p.early_out for p in partitions)
            if outstanding > 3 * self.rate and answered_per_s < 0.9 * self.rate:
                self.rate = max(self.FLOOR_PER_S, self.rate * 0.7)
            elif spent_per_s >= 0.9 * self.rate and answered_per_s >= 0.7 * spent_per_s:
                # The whole allowance was used and the ledger kept up: it can take more.
                self.rate = min(self.CEILING_PER_S, self.rate * 1.2)
            self.bucket.per_s = self.rate

    def grant(self, now_ms: int) -> int:
        """Early proposals allowed now: at the rate, and only as many as the burst needs
        in flight by now (0 outside a burst)."""
        return min(self.bucket.grant(now_ms), self.needed)

    def spend(self, used: int) -> None:
        self.bucket.spend(used)
        self.needed = max(0, self.needed - used)
        self._spent += used


class FireTimers:
    """One partition's jobs: their next due times and when to propose them.

    Compact, since a node holds every job of the partitions it owns (dicts of job id ->
    int and heaps of (time, job id) tuples take far more: docs/performance.md, seventh
    round): each job gets a slot once, its three times live in arrays of machine integers,
    and a heap item is one int packing (time, slot). Heap items are replaced lazily, as
    in `DueQueue`: an item whose time is no longer its slot's is dropped when it surfaces.

    A firing that may be proposed early waits in the early heap by the time it may be
    (`at`), then in the ready heap by its due time: early proposals go earliest due
    first, as the pacer plans them. `at` alone is no such order: a job registered
    within the horizon of its first firing may be proposed from its registration on,
    so jobs registered together for a minute's burst have their `at`s in registration
    order, whatever second each is due in.

    Catching up (`bulk`, until `settle`), a job learnt with nothing to propose within
    `_BULK_WINDOW_MS` of the last `take` gets no heap item: its times are only written
    to the arrays, and the heaps are rebuilt from them in one pass (heapify) when the
    catch-up ends, or sooner should a `take` reach the earliest time that was left out.
    Learning a million jobs on a takeover costs about a fifth less that way.
    """

    def __init__(self, policy: ProposalPolicy, bulk: bool = False) -> None:
        self.policy = policy
        self._bulk = bulk
        self._now = 0  # the last take's time
        # Every time written without a heap item is later than this (none: None).
        self._unheaped_after: int | None = None
        self._slots: dict[str, int] = {}  # job_id -> slot
        self._ids: list[str] = []  # slot -> job_id ("" when free)
        self._free: list[int] = []
        self._due = array("q")  # slot -> the scheduled time to propose
        self._normal = array("q")  # slot -> when to propose (again)
        # slot -> when it may be proposed early (not yet proposed for this due time)
        self._early = array("q")
        self._normal_heap: list[int] = []
        self._early_heap: list[int] = []
        # Items (due, slot) of the slots whose early time has come, while `_ready` is 1.
        self._ready_heap: list[int] = []
        self._ready = bytearray()
        # Slots with an early time armed, by their due second: the burst ahead (`Pacer`).
        self.waiting: dict[int, int] = {}
        # Early proposals sent and not answered yet (the ledger's backlog of them), and
        # those answered with a decision so far.
        self.early_out = 0
        self.answered = 0
        self.held = 0  # repeats held: the ledger had not read their proposal yet
        # Firings decided early and not yet due, by due second: their reports to come.
        self.decided: dict[int, int] = {}
        self._pruned_s = 0  # `decided` holds no second before this
        self._awaiting = bytearray()  # slot -> 1 while its early proposal is unanswered
        self._sent = bytearray()  # slot -> 1 once its due time has been proposed
        # slot -> when it was last proposed (ms), while `_sent`: a repeat waits while the
        # ledger has not read that proposal (`take`'s `held_from`).
        self._sent_at = array("q")

    def __len__(self) -> int:
        return len(self._slots)

    def due_of(self, job_id: str) -> int | None:
        slot = self._slots.get(job_id)
        return None if slot is None else self._due[slot]

    @property
    def due(self) -> dict[str, int]:
        """Every job's scheduled time to propose (a copy, O(jobs): for tests and tools)."""
        return {job_id: self._due[slot] for job_id, slot in self._slots.items()}

    def armed_early(self) -> dict[int, int]:
        """The slots with an early time armed, by due second, counted afresh (O(jobs):
        for tests and tools; `waiting` is the running count the pacer reads)."""
        armed: dict[int, int] = {}
        for slot in self._slots.values():
            if self._early[slot] != _NONE:
                second = self._due[slot] // 1000
                armed[second] = armed.get(second, 0) + 1
        return armed

    def unanswered(self) -> int:
        """Early proposals awaiting the ledger's answer, counted afresh (O(jobs): for tests
        and tools; `early_out` is the running count)."""
        return sum(self._awaiting)

    def learn(
        self,
        job_id: str,
        next_due: int | None,
        fired_ms: int = 0,
        early: bool = True,
        lead: bool = True,
    ) -> None:
        """The job's committed next due time (None: nothing to propose), the newest
        time the ledger decided for it, whether it may be proposed before the lead
        (look-ahead) and whether before its time at all (the lead)."""
        policy = self.policy
        slot = self._slots.get(job_id)
        if slot is not None and self._sent[slot] and next_due == self._due[slot]:
            # The firing is proposed and not answered: a state written for another
            # reason (an earlier run's end) is no answer, and arming it afresh would
            # propose it again at once. Its repeat stays, moved only later (a spec
            # that no longer leads).
            normal = next_due - (policy.lead_ms if lead else 0)
            if normal > self._normal[slot]:
                self._arm(self._normal, self._normal_heap, slot, normal)
            return
        if slot is not None:
            if self._awaiting[slot] and next_due != self._due[slot]:
                self._answered(slot)  # the ledger decided the time proposed early
                self.answered += 1
                second = self._due[slot] // 1000
                if second >= self._pruned_s:
                    self.decided[second] = self.decided.get(second, 0) + 1
            self._unwait(slot)
            if self._ready[slot]:  # its ready item goes stale: armed afresh below
                self._ready[slot] = 0
                self._early[slot] = _NONE
        if next_due is None:
            if slot is not None:
                del self._slots[job_id]
                self._ids[slot] = ""
                self._due[slot] = self._normal[slot] = self._early[slot] = _NONE
                self._sent[slot] = 0
                self._free.append(slot)
            return
        if slot is None:
            slot = self._slot(job_id)
        self._due[slot] = next_due
        self._sent[slot] = 0
        normal = next_due - (policy.lead_ms if lead else 0)
        at = max(next_due - policy.horizon_ms, fired_ms)
        ahead = early and lead and policy.horizon_ms and at < next_due
        if ahead:
            second = next_due // 1000
            self.waiting[second] = self.waiting.get(second, 0) + 1
        if self._bulk:
            soon = self._now + _BULK_WINDOW_MS
            if min(normal, at if ahead else normal) > soon:
                self._normal[slot] = normal
                self._early[slot] = at if ahead else _NONE
                if self._unheaped_after is None:
                    self._unheaped_after = soon
                return
        self._arm(self._normal, self._normal_heap, slot, normal)
        self._arm(self._early, self._early_heap, slot, at if ahead else _NONE)

    def _unwait(self, slot: int) -> None:
        """The slot's early time is disarmed (proposed, changed, or gone)."""
        if self._early[slot] != _NONE:
            self._uncount(slot)

    def _uncount(self, slot: int) -> None:
        second = self._due[slot] // 1000
        left = self.waiting.get(second, 0) - 1
        if left > 0:
            self.waiting[second] = left
        else:
            self.waiting.pop(second, None)

    def _answered(self, slot: int) -> None:
        self._awaiting[slot] = 0
        self.early_out -= 1

    def settle(self) -> None:
        """The catch-up is over: every time gets its heap item, learning pushes them."""
        self._bulk = False
        if self._unheaped_after is not None:
            self._rebuild()

    def take(
        self, now: int, early_limit: int = 0, held_from: int | None = None
    ) -> tuple[list[tuple[str, int]], int]:
        """The (job_id, scheduled_ms) to propose now, and how many of them are early (at
        most `early_limit`, this partition's earliest: a node's partitions share theirs
        with `take_early`). `held_from`: a repeat of a proposal made at or after it is
        held, checked again a `repeat_ms` later (the ledger has not read it yet:
        streams/core/unread.py)."""
        policy = self.policy
        self._catch_up(now)
        ids, dues = self._ids, self._due
        out: list[tuple[str, int]] = []
        for slot, _ in self._pop(self._normal, self._normal_heap, now, 10_000):
            # Held while the ledger has not read the last proposal of it (made when
            # `_sent_at` says, however many times it was held since).
            if self._sent[slot] and held_from is not None and self._sent_at[slot] >= held_from:
                self.held += 1
                self._arm(self._normal, self._normal_heap, slot, now + policy.repeat_ms)
                continue
            out.append((ids[slot], dues[slot]))
            self._sent[slot] = 1
            self._sent_at[slot] = now
            self._unwait(slot)
            self._early[slot] = _NONE
            self._ready[slot] = 0
            if self._awaiting[slot]:  # not answered by its normal time: proposed again
                self._answered(slot)
            self._arm(self._normal, self._normal_heap, slot, now + policy.repeat_ms)
        early = self.pop_early(now, early_limit) if early_limit > 0 else []
        return out + early, len(early)

    def early_head(self, now: int) -> int | None:
        """The order (due, slot, packed) of the earliest due firing that may be proposed
        early now, None when there is none: `take_early` merges the partitions by it."""
        self._catch_up(now)
        self._surface(now)
        heap = self._ready_heap
        while heap and not self._is_ready(heap[0]):
            heapq.heappop(heap)  # stale
        return heap[0] if heap else None

    def pop_early(self, now: int, limit: int, until: int | None = None) -> list[tuple[str, int]]:
        """Up to `limit` firings proposed early now, earliest due first, none ordered
        after `until` (an `early_head` of another partition)."""
        self._catch_up(now)
        self._surface(now)
        policy = self.policy
        ids, dues, heap = self._ids, self._due, self._ready_heap
        out: list[tuple[str, int]] = []
        while heap and len(out) < limit:
            item = heap[0]
            if not self._is_ready(item):
                heapq.heappop(heap)  # stale
                continue
            if until is not None and item > until:
                break
            heapq.heappop(heap)
            slot = item % _SLOTS
            self._uncount(slot)
            self._early[slot] = _NONE
            self._ready[slot] = 0
            due = dues[slot]
            out.append((ids[slot], due))
            self._sent[slot] = 1
            self._sent_at[slot] = now
            self._awaiting[slot] = 1
            self.early_out += 1
            normal = max(now + policy.repeat_ms, due - policy.lead_ms)
            self._arm(self._normal, self._normal_heap, slot, normal)
        return out

    def _surface(self, now: int) -> None:
        """Move the firings whose early time has come from the early heap to the ready
        heap (their early time stays armed: they still count as waiting)."""
        heap, times, dues = self._early_heap, self._early, self._due
        while heap:
            at, slot = divmod(heap[0], _SLOTS)
            if at > now:
                break
            heapq.heappop(heap)
            if times[slot] != at or self._ready[slot]:
                continue  # stale, or a duplicate of an item already moved
            self._ready[slot] = 1
            heapq.heappush(self._ready_heap, dues[slot] * _SLOTS + slot)
        if len(self._ready_heap) > 2 * len(self._slots) + 1024:
            self._rebuild()  # stale items piled up

    def _is_ready(self, item: int) -> bool:
        due, slot = divmod(item, _SLOTS)
        return bool(self._ready[slot]) and self._due[slot] == due and self._early[slot] != _NONE

    def _catch_up(self, now: int) -> None:
        self._now = now
        if now // 1000 > self._pruned_s:  # once a second: the seconds gone by
            self._pruned_s = now // 1000
            for second in [s for s in self.decided if s < self._pruned_s]:
                del self.decided[second]
        if self._unheaped_after is not None and now >= self._unheaped_after:
            self._rebuild()  # a time without a heap item may be due

    def _slot(self, job_id: str) -> int:
        if self._free:
            slot = self._free.pop()
            self._ids[slot] = job_id
        else:
            slot = len(self._ids)
            if slot >= _SLOTS:
                raise OverflowError(f"more than {_SLOTS} jobs in one partition")
            self._ids.append(job_id)
            for times in (self._due, self._normal, self._early):
                times.append(_NONE)
            self._awaiting.append(0)
            self._sent.append(0)
            self._sent_at.append(0)
            self._ready.append(0)
        self._slots[job_id] = slot
        return slot

    def _arm(self, times: array[int], heap: list[int], slot: int, at: int) -> None:
        """Set the slot's time (_NONE: none); the old heap item goes stale."""
        if times[slot] == at:
            return
        times[slot] = at
        if at == _NONE:
            return
        heapq.heappush(heap, at * _SLOTS + slot)
        if len(heap) > 2 * len(self._slots) + 1024:
            self._rebuild()  # stale items piled up

    def _rebuild(self) -> None:
        """Both heaps afresh from the arrays: one item per slot that has a time."""
        ready, dues = self._ready, self._due
        self._normal_heap[:] = [t * _SLOTS + s for s, t in enumerate(self._normal) if t != _NONE]
        self._early_heap[:] = [
            t * _SLOTS + s for s, t in enumerate(self._early) if t != _NONE and not ready[s]
        ]
        self._ready_heap[:] = [
            dues[s] * _SLOTS + s for s, t in enumerate(self._early) if t != _NONE and ready[s]
        ]
        for heap in (self._normal_heap, self._early_heap, self._ready_heap):
            heapq.heapify(heap)
        self._unheaped_after = None

    @staticmethod
    def _pop(times: array[int], heap: list[int], now: int, limit: int) -> list[tuple[int, int]]:
        """Remove and return up to `limit` slots due at or before `now` with their times,
        earliest first."""
        out: list[tuple[int, int]] = []
        while heap and len(out) < limit:
            at, slot = divmod(heap[0], _SLOTS)
            if times[slot] != at:
                heapq.heappop(heap)  # stale
                continue
            if at > now:
                break
            heapq.heappop(heap)
            times[slot] = _NONE  # a duplicate item of the same time is stale now
            out.append((slot, at))
        return out


def take_early(
    partitions: Sequence[FireTimers], now: int, limit: int
) -> list[list[tuple[str, int]]]:
    """Up to `limit` firings proposed early now across a node's partitions, earliest first
    over all of them (each partition's list, in `partitions`' order). The pacer plans a
    burst in that order: shared any other way (turns, say), a partition served less
    often leaves its early seconds to the normal lead while another proposes its late
    ones, and their claims then meet the burst's reports (docs/performance.md, "Bursts
    with default options")."""
    taken: list[list[tuple[str, int]]] = [[] for _ in partitions]
    heads = [(h, i) for i, p in enumerate(partitions) if (h := p.early_head(now)) is not None]
    heapq.heapify(heads)
    while heads and limit > 0:
        _, i = heapq.heappop(heads)
        # Take this partition's firings up to the next partition's first (ties go by slot).
        fires = partitions[i].pop_early(now, limit, heads[0][0] if heads else None)
        taken[i] += fires
        limit -= len(fires)
        head = partitions[i].early_head(now)
        if head is not None:
            heapq.heappush(heads, (head, i))
    return taken
