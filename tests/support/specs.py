"""A valid job registration for tests that write state records directly."""

from __future__ import annotations

from streams.core.commands import UpsertJob, validate_command


def upsert(job_id: str, **extra: object) -> UpsertJob:
    """A validated `job.upsert` for `job_id` (every 1 s, `true`); `extra` overrides."""
    command = validate_command(
        {
            "type": "job.upsert",
            "job_id": job_id,
            "owner": "o",
            "schedule": {"every": "1s"},
            "command": ["true"],
            **extra,
        }
    )
    assert isinstance(command, UpsertJob)
    return command
