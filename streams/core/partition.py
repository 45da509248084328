"""One job-log partition's jobs and runs, and how a ledger decision changes them (pure).

The ledger process holds one per partition it owns, over tables that may keep cold states
encoded (streams/state_table.py); the seeded simulation and the unit tests hold one over
plain dicts. Both decide and apply through this class, so the state a test checks is
changed by the very code the ledger runs. What a decision sends (run-events, dispatch
requests, replies, notices) is the caller's to write: Kafka in a transaction for the
ledger, lists for a test.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from schemas.records import JobState, LedgerInput, RunState
from streams.core.ledger import Decision, LedgerConfig, decide

T = TypeVar("T")


class Table(Protocol[T]):
    """What a partition needs of a table of states: a dict has it."""

    def get(self, key: str, /) -> T | None: ...

    def __setitem__(self, key: str, value: T, /) -> None: ...

    def pop(self, key: str, default: None, /) -> object: ...


@dataclass
class PartitionState:
    jobs: Table[JobState] = field(default_factory=dict)
    runs: Table[RunState] = field(default_factory=dict)

    def decide(
        self, job_id: str, inp: LedgerInput, config: LedgerConfig, now_ms: int | None
    ) -> Decision:
        """What `inp`, read from `job_id`'s log at broker time `now_ms`, changes."""
        return decide(self.jobs.get(job_id), self.runs.get, inp, config, now_ms)

    def apply(self, decision: Decision) -> None:
        """Change the tables as `decision` says: the next input of this partition is
        decided against them (persisting them is the caller's)."""
        if decision.job is not None:
            self.jobs[decision.job.spec.job_id] = decision.job
        for run in decision.runs:
            self.runs[run.run_id] = run
        for run_id in decision.forget:
            self.runs.pop(run_id, None)
