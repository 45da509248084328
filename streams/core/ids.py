"""Deterministic run ids (docs/architecture.md, "Records and their topics")."""

from __future__ import annotations

from datetime import UTC, datetime


def iso_utc(ms: int) -> str:
    """ISO-8601 UTC with a Z: seconds always, milliseconds only when not zero."""
    moment = datetime.fromtimestamp(ms / 1000, tz=UTC)
    if ms % 1000:
        return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def scheduled_run_id(job_id: str, scheduled_ms: int) -> str:
    return f"{job_id}@{iso_utc(scheduled_ms)}"


def manual_run_id(job_id: str, request_id: str) -> str:
    return f"{job_id}@manual:{request_id}"


def job_of(run_id: str) -> str:
    """The job id of a run id: the part before the first `@` (a job id has none)."""
    return run_id.partition("@")[0]
