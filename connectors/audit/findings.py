"""What the audit finds: the kinds of violation (described in
`connectors/audit/checker.py`), each violation with where its record is, the report of a
replay, and the violations of one replay as they are found (`Findings`)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Final, Literal, TypeAlias, get_args

from connectors.audit.lateness import Lateness

ViolationKind: TypeAlias = Literal[
    "duplicate_run",
    "missing_firing",
    "illegal_transition",
    "double_claim",
    "double_start",
    "not_final",
    "unsanctioned_execution",
    "overlapping_attempts",
    "missing_period",
    "undecodable",
]
# Every kind, in the Literal's order (the report counts each).
KINDS: Final[tuple[ViolationKind, ...]] = get_args(ViolationKind)
Source: TypeAlias = Literal["run-events", "job-log"]


@dataclass(frozen=True, slots=True)
class Violation:
    kind: ViolationKind
    job_id: str
    run_id: str  # "" when the violation concerns the job (or an undecodable record)
    partition: int
    offset: int
    detail: str
    source: Source = "run-events"  # the topic of partition/offset


@dataclass(frozen=True, slots=True)
class AuditReport:
    jobs: int
    runs: int
    events: int  # decoded records (run and job events)
    job_events: int
    undecodable: int
    live_runs: int  # not final at the end
    # jobs with runs but no `upserted` in the replay, or a schedule that cannot be evaluated
    unchecked_jobs: int
    expected_firings: int  # fire times checked for a record
    excused_firings: int  # missing, but older than the catch-up window of their decision
    counts: dict[ViolationKind, int]
    violations: tuple[Violation, ...]  # the first `keep_violations`, in the order found
    lateness: Lateness
    now_ms: int | None  # the newest event time
    reports: int = 0  # worker reports (starts, finishes) judged against run-events
    unjudged_reports: int = 0  # undecided yet, or about runs the replay cannot judge
    reports_note: str = ""  # why no worker reports were read, if none were
    dag_steps: int = 0  # DAG steps whose periods were checked
    dag_periods: int = 0  # their records (runs and skips) in the replay

    @property
    def total_violations(self) -> int:
        return sum(self.counts.values())

    @property
    def clean(self) -> bool:
        return self.total_violations == 0

    def of_kind(self, kind: ViolationKind) -> list[Violation]:
        return [v for v in self.violations if v.kind == kind]


class Findings:
    """The violations of one replay: every one counted, the first `keep` kept with their
    details, in the order found."""

    def __init__(self, keep: int) -> None:
        self.counts: Counter[ViolationKind] = Counter({k: 0 for k in KINDS})
        self.violations: list[Violation] = []
        self._keep = keep

    def violate(
        self,
        kind: ViolationKind,
        job_id: str,
        run_id: str,
        partition: int,
        offset: int,
        detail: str,
        source: Source = "run-events",
    ) -> None:
        self.counts[kind] += 1
        if len(self.violations) < self._keep:
            self.violations.append(
                Violation(kind, job_id, run_id, partition, offset, detail, source)
            )
