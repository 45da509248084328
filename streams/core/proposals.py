"""When a scheduler node proposes each job's next firing (pure: no Kafka).

A job is proposed `lead_ms` before its due time (pre-dispatch: the run is created,
placed and claimed before it is due, and the worker starts it at the due time), and again
every `repeat_ms` until the ledger's answer (the job's new state) arrives.

Look-ahead: a burst (ten thousand jobs due in the same second) cannot be decided,
dispatched and claimed within `lead_ms`: the ledger decides on the order of a thousand
inputs per second per core. So, besides what is due within `lead_ms`, fires due within
`horizon_ms` are proposed early, earliest first, at a bounded rate shared by the node's
partitions (`Allowance`): a burst is spread over the minute before it instead of being
squeezed into the lead. Only once the job's previous firing time has passed, so a job
every few seconds never has more runs decided ahead than the lead gives it; and only
jobs whose runs may overlap (concurrency `allow`) without upstreams. `forbid` and
`replace` jobs are not proposed before their time at all (no lead either): the previous
run's state at the firing time decides, and deciding even the lead early would skip or
cancel on a run that was about to finish. An early
proposal is not repeated before its normal time (due minus lead), so a slow ledger is
never flooded with repeats of it; should the ledger reject it, the normal proposal
follows. `horizon_ms` must stay below the ledger's `max_lead_ms`, which rejects
proposals that come earlier than that.
"""

from __future__ import annotations

from dataclasses import dataclass

from schemas.spec import JobSpec
from streams.core.duequeue import DueQueue


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
    `forbid`/`replace`, whose overlap is decided at the firing time (the ledger refuses
    their proposals before it)."""
    return spec.concurrency == "allow"


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


class FireTimers:
    """One partition's jobs: their next due times and when to propose them."""

    def __init__(self, policy: ProposalPolicy) -> None:
        self.policy = policy
        self.due: dict[str, int] = {}  # job_id -> the scheduled time to propose
        self._normal: DueQueue[str] = DueQueue()  # job_id -> when to propose (again)
        # job_id -> when it may be proposed early (not yet proposed for this due time)
        self._early: DueQueue[str] = DueQueue()

    def __len__(self) -> int:
        return len(self.due)

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
        if next_due is None:
            self.due.pop(job_id, None)
            self._normal.set(job_id, None)
            self._early.set(job_id, None)
            return
        self.due[job_id] = next_due
        self._normal.set(job_id, next_due - (policy.lead_ms if lead else 0))
        at = max(next_due - policy.horizon_ms, fired_ms)
        ahead = early and lead and policy.horizon_ms and at < next_due
        self._early.set(job_id, at if ahead else None)

    def take(self, now: int, early_limit: int = 0) -> tuple[list[tuple[str, int]], int]:
        """The (job_id, scheduled_ms) to propose now, and how many of them are early."""
        policy = self.policy
        out: list[tuple[str, int]] = []
        for job_id, _ in self._normal.pop_due(now):
            due = self.due[job_id]
            out.append((job_id, due))
            self._early.set(job_id, None)
            self._normal.set(job_id, now + policy.repeat_ms)
        early = 0
        if early_limit > 0:
            for job_id, _ in self._early.pop_due(now, limit=early_limit):
                due = self.due[job_id]
                out.append((job_id, due))
                early += 1
                self._normal.set(job_id, max(now + policy.repeat_ms, due - policy.lead_ms))
        return out, early
