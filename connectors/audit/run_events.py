"""Each run's events, checked in log order: ``duplicate_run``, ``illegal_transition``,
``double_claim`` / ``double_start``, and a firing of a ``forbid`` or ``replace`` job
created beside a live run (``overlapping_attempts``); and what the other checks read of
them, kept in the `History` (grants, later starts, claims ended, finals, lateness, the
events that count for ``max_runs``, the policy each firing was decided under, the
firings its schedule recorded and whether each stands withdrawn).

What counts for ``max_runs`` (`AuditedJob.counted`, read by
`connectors/audit/firings.py`), as the ledger counts `JobState.schedule_runs`: a run its
schedule made (trigger ``schedule``, created ``due`` or ``waiting``: not a skipped
firing), a withdrawn firing revived (``cancelled`` -> ``due``/``waiting``, "revived"; a
rerun is the operator's and does not count), and, given back, a scheduled run cancelled
with exactly one of the withdrawal reasons (`WITHDRAWN`: "... before the run was due";
one that had started, or may have, says so and gives nothing back). A firing is decided
under the policy of the newest spec when its run is created or revived
(`AuditedRun.forbid`: the ledger writes a change's job event before the firings it
decides under the new spec).

Transitions follow the ledger (`streams/core/ledger/`), including ``skipped -> due``:
the ledger's rerun accepts every final state, a skipped firing included; and
``dispatched -> due`` with the same attempt: a claimed attempt that never started is
dispatched again.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Final

from connectors.audit.config import AuditConfig
from connectors.audit.findings import Findings, ViolationKind
from connectors.audit.grants import HELD, RAN, claim_ended, grant
from connectors.audit.history import (
    ATTEMPT_MASK,
    COUNTED,
    DECIDED_UNDER_ALLOW,
    GIVEN_BACK,
    KEPT,
    MAX_TRACKED,
    WITHDRAWN_AHEAD,
    AuditedJob,
    AuditedRun,
    History,
    bit,
)
from connectors.audit.periods import is_outcome
from schemas.records import FINAL_STATES, TRANSITIONS, RunEvent
from streams.core.ids import iso_utc
from streams.core.ledger.decision import WITHDRAWN

# Transitions into `due` or `waiting` from these begin a new attempt (a retry, a rerun,
# a revival of a firing withdrawn ahead of its time).
_NEW_ATTEMPT_FROM: Final = frozenset({"retrying", *FINAL_STATES})
_NEW_ATTEMPT_INTO: Final = frozenset({"due", "waiting"})
_LIVE_AT_CREATION: Final = frozenset({"due", "waiting"})
_FIRST_STATES: Final = TRANSITIONS[None]
# Concurrency policies under which a firing is not created beside a live run.
_EXCLUSIVE: Final = frozenset({"forbid", "replace"})
# The reason of a revival (the ledger's `Kernel._revive`: "revived: due again", or
# "revived" into `waiting`); a rerun's is "rerun <request id>".
_REVIVED: Final = "revived"
_HUGE: Final = 1 << 62


class RunEvents:
    """The checks of run events, one at a time, in log order, into `history`."""

    def __init__(self, config: AuditConfig, history: History, findings: Findings) -> None:
        self._config = config
        self._history = history
        self._runs = history.runs
        self._workers = history.workers
        self._midlife = history.midlife
        self._later_starts = history.later_starts
        self._lateness = history.lateness
        self._violate = findings.violate

    def check(self, job: AuditedJob, e: RunEvent, partition: int, offset: int) -> None:
        head, sep, tail = e.event_id.rpartition("#")
        if not sep or head != e.run_id or not tail.isdigit():
            self._violate(
                "illegal_transition",
                e.job_id,
                e.run_id,
                partition,
                offset,
                f"malformed event id {e.event_id!r} (expected '{e.run_id}#<seq>')",
            )
            return
        seq = int(tail)
        state, attempt = e.state, e.attempt
        # A rerun of a skipped run (seq 0) is seq 1 too, but with attempt 2.
        creation = seq <= 1 and state in _FIRST_STATES and attempt == 1
        run = self._runs.get(e.run_id)
        if run is None:
            self._create(job, e, seq, creation, partition, offset)
            return
        attempt_bit = 1 << attempt if 0 <= attempt < MAX_TRACKED else 0
        seq_bit = 1 << seq if 0 <= seq < MAX_TRACKED else 0
        kind: ViolationKind | None = None
        detail = ""
        if state == "dispatched" and run.claimed & attempt_bit:
            kind, detail = "double_claim", f"attempt {attempt} dispatched again (seq {seq})"
        elif state == "running" and run.started & attempt_bit:
            kind, detail = "double_start", f"attempt {attempt} started again (seq {seq})"
        elif creation:
            kind, detail = "duplicate_run", f"created again ({state}, seq {seq})"
        elif run.seqs & seq_bit:
            kind, detail = "duplicate_run", f"seq {seq} repeated ({state})"
        elif seq < run.seq:
            kind = "illegal_transition"
            detail = f"out-of-order seq {seq} after seq {run.seq} ({state})"
        elif seq > run.seq + 1:
            kind = "illegal_transition"
            detail = f"seq gap: {run.seq} -> {seq} ({run.state} -> {state})"
        elif seq == run.seq + 1:
            before = run.state
            if state not in TRANSITIONS.get(before, ()) or attempt != (
                run.attempt + 1
                if state in _NEW_ATTEMPT_INTO and before in _NEW_ATTEMPT_FROM
                else run.attempt
            ):
                kind, detail = "illegal_transition", self._check_transition(run, e)
        if kind is not None:
            self._violate(kind, e.job_id, e.run_id, partition, offset, detail)
        if state == "dispatched":
            run.claimed |= attempt_bit
            grants, worker = run.grants, e.worker_id
            if grants is None and attempt_bit and worker:  # the common first claim
                run.grants = self._workers.get(worker) or self._history.intern(worker)
                run.gbits = HELD << (2 * attempt)
            elif grants == worker and attempt_bit:
                run.gbits |= HELD << (2 * attempt)
            else:
                grant(self._history, run, attempt, worker, HELD)
        elif state == "running":
            if run.started and not run.started & attempt_bit:  # a later attempt's start
                later = self._later_starts
                later[e.run_id] = (*later.get(e.run_id, ()), attempt, e.at_ms)
            run.started |= attempt_bit
            if run.grants == e.worker_id and attempt_bit:
                run.gbits |= RAN << (2 * attempt)
            else:
                grant(self._history, run, attempt, e.worker_id, RAN)
            if job.forbid:
                job.starts.extend((e.scheduled_ms, e.at_ms, _mark(run, e)))
            if kind is None and attempt == 1 and e.trigger != "backfill":
                self._lateness.append(e.happened_ms - e.scheduled_ms)
        else:
            if state in FINAL_STATES and is_outcome(e):
                at = e.at_ms
                job.finals.extend((e.scheduled_ms, at if state == "succeeded" else -at - 1))
            if kind is None and run.state == "dispatched":
                claim_ended(self._history, run, e, attempt_bit)
        run.seqs |= seq_bit
        if seq > run.seq:
            if e.trigger == "schedule":
                if state == "cancelled" and e.reason in WITHDRAWN:
                    _count(job, e, GIVEN_BACK)
                    _decided(job, e.scheduled_ms, WITHDRAWN_AHEAD)
                elif run.state == "cancelled":
                    if state in _NEW_ATTEMPT_INTO and e.reason.startswith(_REVIVED):
                        _count(job, e, COUNTED)
                        run.forbid = job.forbid  # decided again, under the policy now
                    _decided(job, e.scheduled_ms, KEPT)  # withdrawn no more, if it was
            if run.state in FINAL_STATES:
                if state not in FINAL_STATES:
                    job.live += 1
                    run.since_ms = e.at_ms  # a rerun, a revival: a new life
            elif state in FINAL_STATES:
                job.live -= 1
            job.claimed += (state == "dispatched") - (run.state == "dispatched")
            run.seq, run.state, run.attempt = seq, state, attempt
            run.partition, run.offset = partition, offset

    def _create(
        self, job: AuditedJob, e: RunEvent, seq: int, creation: bool, partition: int, offset: int
    ) -> None:
        run = self._runs[e.run_id] = AuditedRun(e, seq, partition, offset)
        run.forbid = job.forbid
        if creation and e.trigger == "schedule" and e.state in _LIVE_AT_CREATION:
            _count(job, e, COUNTED)
        if e.trigger != "manual":
            other = job.fires.get(e.scheduled_ms)
            if other is None:
                job.fires[e.scheduled_ms] = (e.run_id, e.at_ms, partition, offset)
                if e.trigger == "schedule":
                    ahead = e.state == "cancelled" and e.reason in WITHDRAWN
                    _decided(job, e.scheduled_ms, WITHDRAWN_AHEAD if ahead else KEPT, new=True)
            elif other[0] != e.run_id:
                self._violate(
                    "duplicate_run",
                    e.job_id,
                    e.run_id,
                    partition,
                    offset,
                    f"a second run for {iso_utc(e.scheduled_ms)}: {other[0]!r} exists",
                )
        if e.state in FINAL_STATES:
            if is_outcome(e):
                ok = e.state == "succeeded"
                job.finals.extend((e.scheduled_ms, e.at_ms if ok else -e.at_ms - 1))
        else:
            # `replace` stops the live runs first: cancelled at once, but for those claimed
            # and not started, which the ledger cancels when their holder answers.
            replace = job.spec is not None and job.spec.concurrency == "replace"
            unstopped = job.live - job.claimed if replace else job.live
            if (
                creation
                and unstopped
                and e.trigger == "schedule"
                and e.state in _LIVE_AT_CREATION
                and job.spec is not None
                and job.spec.concurrency in _EXCLUSIVE
            ):
                self._violate(
                    "overlapping_attempts",
                    e.job_id,
                    e.run_id,
                    partition,
                    offset,
                    f"created while {unstopped} other run(s) of the job were live "
                    f"(concurrency {job.spec.concurrency})",
                )
            job.live += 1
            job.claimed += e.state == "dispatched"
        if e.state == "dispatched":
            run.claimed = bit(e.attempt)
            grant(self._history, run, e.attempt, e.worker_id, HELD)
        elif e.state == "running":
            run.started = bit(e.attempt)
            grant(self._history, run, e.attempt, e.worker_id, RAN)
            if job.forbid:
                job.starts.extend((e.scheduled_ms, e.at_ms, _mark(run, e)))
        if creation and (seq == 0) == (e.state == "skipped") and e.attempt == 1:
            return
        self._midlife[e.run_id] = e.attempt  # its earlier attempts are not in the replay
        if self._config.partial and seq > 1:
            if e.state == "running":  # the run began before the replayed range
                self._start_lateness(e)
            return
        self._violate(
            "illegal_transition",
            e.job_id,
            e.run_id,
            partition,
            offset,
            f"first event is {e.state} with seq {seq}, attempt {e.attempt}: a run begins "
            "with due or waiting (seq 1) or skipped (seq 0), attempt 1",
        )

    @staticmethod
    def _check_transition(run: AuditedRun, e: RunEvent) -> str:
        """Why run.state -> e.state is illegal, or "" if it is legal."""
        if e.state not in TRANSITIONS.get(run.state, frozenset()):
            return f"{run.state} -> {e.state} is not a legal transition"
        if e.state in _NEW_ATTEMPT_INTO and run.state in _NEW_ATTEMPT_FROM:
            expected = run.attempt + 1
        else:
            expected = run.attempt
        if e.attempt != expected:
            return (
                f"{run.state} -> {e.state} with attempt {e.attempt}, expected {expected} "
                f"(was {run.attempt})"
            )
        return ""

    def _start_lateness(self, e: RunEvent) -> None:
        if e.attempt == 1 and e.trigger != "backfill":
            self._lateness.append(e.happened_ms - e.scheduled_ms)


def _mark(run: AuditedRun, e: RunEvent) -> int:
    """A start's mark in `AuditedJob.starts` (see there)."""
    mark = min(max(e.attempt, 0), ATTEMPT_MASK) | (0 if run.forbid else DECIDED_UNDER_ALLOW)
    return mark if e.trigger == "schedule" else -mark


def _count(job: AuditedJob, e: RunEvent, code: int) -> None:
    """An event that counts for max_runs, in `AuditedJob.counted` (see there); a time
    no schedule has (beyond 2**62 ms either way) is not kept."""
    if -_HUGE <= e.scheduled_ms < _HUGE:
        job.counted.append(2 * e.scheduled_ms + code)


def _decided(job: AuditedJob, t: int, code: int, new: bool = False) -> None:
    """A firing its schedule recorded at `t` (`new`: its first record, kept in time
    order), or its run's withdrawal confirmed (WITHDRAWN_AHEAD) or ended (KEPT), in
    `AuditedJob.decided` (see there); a time no schedule has is not kept."""
    if not -_HUGE <= t < _HUGE:
        return
    decided = job.decided
    if new and (not decided or decided[-1] >> 1 < t):  # the common case: the newest
        decided.append(2 * t + code)
        return
    i = bisect_left(decided, 2 * t)
    if i < len(decided) and decided[i] >> 1 == t:
        decided[i] = 2 * t + code
    elif new:
        decided.insert(i, 2 * t + code)
