"""Runs not final although older than their job could legitimately take (``not_final``).

Not final. A run is given `allowance_ms(spec)`: max_attempts x (timeout + the ledger's
timeout grace + a claim timeout), twice the nominal retry backoffs, 24 h more when the
job has dependencies (a run may wait that long for its upstreams), and 10 minutes of
slack, counted from the later of its scheduled time and its creation (or its rerun);
one more attempt's share for each claim released before its start.
A job whose spec is not in the replay gets `unknown_spec_allowance_ms`.
"""

from __future__ import annotations

from connectors.audit.config import AuditConfig
from connectors.audit.findings import Findings
from connectors.audit.history import History
from schemas.records import FINAL_STATES
from schemas.spec import JobSpec


def allowance_ms(
    spec: JobSpec,
    config: AuditConfig = AuditConfig(),
    released: int = 0,
) -> int:
    """How long a run of this job may legitimately stay not final (`released`: claims
    released before their start, each dispatched again)."""
    retry = spec.retry
    attempts = max(1, retry.max_attempts)
    per_attempt = int(spec.timeout_s * 1000) + config.timeout_grace_ms + config.claim_timeout_ms
    backoff_s, total_backoff_s = retry.backoff_s, 0.0
    for _ in range(attempts - 1):
        total_backoff_s += min(backoff_s, retry.max_backoff_s)
        backoff_s = min(backoff_s * retry.backoff_multiplier, retry.max_backoff_s)
    allowance = (
        (attempts + max(0, released)) * per_attempt
        + int(2 * total_backoff_s * 1000)
        + config.final_slack_ms
    )
    if spec.depends_on:
        allowance += config.dependency_wait_ms
    return allowance


def not_final(history: History, now: int | None, config: AuditConfig, findings: Findings) -> int:
    """Flag the runs older than their allowance at `now`; returns the runs not final."""
    live = 0
    for run_id, run in history.runs.items():
        if run.state in FINAL_STATES:
            continue
        live += 1
        if now is None:
            continue
        job = history.jobs.get(run.job_id)
        spec = job.spec if job is not None else None
        limit = (
            allowance_ms(spec, config, run.released)
            if spec is not None
            else config.unknown_spec_allowance_ms
        )
        age = now - max(run.since_ms, run.scheduled_ms)
        if age > limit:
            findings.violate(
                "not_final",
                run.job_id,
                run_id,
                run.partition,
                run.offset,
                f"still {run.state} (attempt {run.attempt}) {age / 1000:.0f} s after "
                f"{'its creation' if run.since_ms >= run.scheduled_ms else 'its time'}; "
                f"allowed {limit / 1000:.0f} s",
            )
    return live
