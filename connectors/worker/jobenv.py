"""A job's environment, built from nothing (docs/security.md, "The job boundary"): the
job's own `env`, its resolved secrets (connectors/worker/secrets.py), a few variables of
the worker's own environment (`PASSED_ENV`, taken once), the run-as user's HOME, USER,
LOGNAME and a PATH it can use (`RunAs.path`), and the run's `CRONLOG_RUN_*` variables;
never anything else of the worker's (its database URL, its `CRONLOG_SECRET_*`). Under
bubblewrap it is applied inside the sandbox only, never to bwrap itself
(connectors/worker/confine.py)."""

from __future__ import annotations

from collections.abc import Mapping

from connectors.worker.runas import RunAs
from connectors.worker.secrets import Secrets
from schemas.records import DispatchRequest
from streams.core.ids import iso_utc

# What of the worker's own environment every job gets.
PASSED_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR", "PYTHONPATH")


class JobEnvironment:
    def __init__(self, worker_env: Mapping[str, str], run_as: RunAs | None, secrets: Secrets):
        self.base_env = {k: v for k, v in worker_env.items() if k in PASSED_ENV}
        self.run_as = run_as
        self.secrets = secrets
        # The run-as user's own variables and PATH, worked out once (`RunAs.path`).
        self.as_user: dict[str, str] = {}
        if run_as is not None:
            self.as_user = {**run_as.env, "PATH": run_as.path(self.base_env.get("PATH"))}

    def of(self, d: DispatchRequest) -> dict[str, str]:
        """The environment of the attempt `d` (MissingSecret, or a refusal of the
        secret's grants, if a secret it names cannot be given)."""
        return {
            **self.base_env,
            **self.as_user,
            **dict(d.env),
            **self.secrets.resolve(d.secret_env, d.owner),
            "CRONLOG_RUN_ID": d.run_id,
            "CRONLOG_JOB_ID": d.job_id,
            "CRONLOG_SCHEDULED_AT": iso_utc(d.scheduled_ms),
            "CRONLOG_ATTEMPT": str(d.attempt),
        }
