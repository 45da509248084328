"""What the audit is told of the ledger's settings, and its own limits (`AuditConfig`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

MINUTE_MS: Final = 60_000
HOUR_MS: Final = 60 * MINUTE_MS


@dataclass(frozen=True, slots=True)
class AuditConfig:
    # Firings due less than this before the newest event are not checked (in flight).
    safety_margin_ms: int = 2 * MINUTE_MS
    # The ledger's catch-up window: older misfires may be decided without a record.
    catchup_window_ms: int = 24 * HOUR_MS
    # The ledger's cap on the firings one late proposal records.
    max_catchup_runs: int = 1000
    # not_final: the ledger's grace after a timeout, one claim round, slack on top.
    timeout_grace_ms: int = 30_000
    claim_timeout_ms: int = 30_000
    dependency_wait_ms: int = 24 * HOUR_MS
    final_slack_ms: int = 10 * MINUTE_MS
    unknown_spec_allowance_ms: int = 24 * HOUR_MS + 10 * MINUTE_MS
    # The replay starts inside the log (--from): a run first seen mid-life is accepted.
    partial: bool = False
    # overlapping_attempts: how far a worker's clock (a RunFinished's at_ms) may be ahead
    # of the time the ledger recorded another attempt's start.
    clock_tolerance_ms: int = 1_000
    # missing_period: the most an upstream's final event may precede the step's ledger
    # deciding its notice (the upstream's ledger lag, the link of a new step).
    notice_lag_ms: int = 2 * MINUTE_MS
    # The ledger keeps this many upstream outcomes per job.
    keep_upstream_outcomes: int = 256
    # Violations kept with their details (all are counted).
    keep_violations: int = 10_000
