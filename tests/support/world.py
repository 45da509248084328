"""An in-memory ledger for pure tests: one partition decided and changed by the ledger
process's own code (`PartitionState`, over dicts), every output kept for checks."""

from __future__ import annotations

from dataclasses import dataclass, field

from schemas.records import (
    CancelOrder,
    ClaimReply,
    DispatchRequest,
    JobEvent,
    JobState,
    LedgerInput,
    RunEvent,
    RunState,
)
from schemas.spec import JobSpec
from streams.core.ledger import Decision, LedgerConfig, input_job
from streams.core.partition import PartitionState


@dataclass
class World:
    config: LedgerConfig = field(default_factory=LedgerConfig)
    jobs: dict[str, JobState] = field(default_factory=dict)
    runs: dict[str, RunState] = field(default_factory=dict)
    events: list[RunEvent | JobEvent] = field(default_factory=list)
    dispatch: list[DispatchRequest] = field(default_factory=list)
    replies: list[ClaimReply | CancelOrder] = field(default_factory=list)
    rejections: list[str] = field(default_factory=list)
    # Notices for other jobs' logs; delivered at once unless a test takes them itself.
    outbox: list[LedgerInput] = field(default_factory=list)
    deliver_notices: bool = True
    # The job's specs that may have been in force when each dispatch request was made,
    # index for index with `dispatch`: its job's spec after the decision that made it,
    # and for a change, the spec before it too (the firings due before a change are
    # decided under the old spec in the change's own decision).
    dispatch_specs: list[tuple[JobSpec, ...]] = field(default_factory=list)

    def apply(self, inp: LedgerInput, now: int | None = None) -> Decision:
        """Apply one input; `now` is the broker's append time (default: its at_ms)."""
        decision = self._apply_one(inp, now)
        while self.deliver_notices and self.outbox:
            self._apply_one(self.outbox.pop(0), now)
        return decision

    def _apply_one(self, inp: LedgerInput, now: int | None = None) -> Decision:
        before = self.jobs.get(input_job(inp))
        state = PartitionState(self.jobs, self.runs)  # over this world's own dicts
        decision = state.decide(input_job(inp), inp, self.config, now)
        state.apply(decision)
        self.events.extend(decision.events)
        self.dispatch.extend(decision.dispatch)
        if decision.dispatch:
            job = self.jobs.get(input_job(inp))
            if job is not None:
                specs = (job.spec,) if before is None else (job.spec, before.spec)
                self.dispatch_specs.extend(specs for _ in decision.dispatch)
        self.replies.extend(decision.replies)
        self.outbox.extend(decision.notices)
        if decision.rejected:
            self.rejections.append(decision.rejected)
        return decision

    def snapshot(self) -> World:
        """A copy that shares the (frozen) records: cheap, and safe to apply to."""
        return World(
            self.config,
            dict(self.jobs),
            dict(self.runs),
            list(self.events),
            list(self.dispatch),
            list(self.replies),
            list(self.rejections),
            list(self.outbox),
            self.deliver_notices,
            list(self.dispatch_specs),
        )

    def run_events(self, run_id: str | None = None) -> list[RunEvent]:
        return [
            e
            for e in self.events
            if isinstance(e, RunEvent) and (run_id is None or e.run_id == run_id)
        ]

    def states(self, run_id: str) -> list[str]:
        return [e.state for e in self.run_events(run_id)]
