"""Deterministic run ids (docs/architecture.md, "Records and their topics")."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

MANUAL = "manual:"
# What iso_utc writes: seconds always, milliseconds only when not zero, Z.
_RUN_TIME = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.(?!000)\d{3})?Z", re.ASCII)


def iso_utc(ms: int) -> str:
    """ISO-8601 UTC with a Z: seconds always, milliseconds only when not zero."""
    moment = datetime.fromtimestamp(ms / 1000, tz=UTC)
    if ms % 1000:
        return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def scheduled_run_id(job_id: str, scheduled_ms: int) -> str:
    return f"{job_id}@{iso_utc(scheduled_ms)}"


def manual_run_id(job_id: str, request_id: str) -> str:
    return f"{job_id}@{MANUAL}{request_id}"


@dataclass(frozen=True, slots=True)
class RunId:
    """The parts of a run id: a scheduled run's time, or a manual run's request id."""

    job_id: str
    scheduled_ms: int | None = None
    request_id: str | None = None


def parse_run_id(run_id: str) -> RunId | None:
    """The parts of an id of the shape `scheduled_run_id` or `manual_run_id` builds; None
    for another shape. The one parser (commands, the API and the processes use it); what
    characters a job or request id may have is checked by streams/core/commands.py."""
    job_id, at, suffix = run_id.partition("@")
    if not at:
        return None
    if suffix.startswith(MANUAL):
        return RunId(job_id, request_id=suffix[len(MANUAL) :])
    if not _RUN_TIME.fullmatch(suffix):
        return None
    try:
        moment = datetime.fromisoformat(suffix)
    except ValueError:  # the right shape, no such time (a 31st of February)
        return None
    return RunId(job_id, scheduled_ms=round(moment.timestamp() * 1000))


def job_of(run_id: str) -> str:
    """The job id of a run id: the part before the first `@` (a job id has none), the
    split `parse_run_id` makes, without checking the rest (the hot loops' fast path)."""
    return run_id.partition("@")[0]
