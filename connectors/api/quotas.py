"""Per-owner quotas (issue 53 item 12, owner fairness): what one owner may hold at once,
so that no owner's volume delays another owner's firings.

- ``jobs``: jobs registered (not deleted). A new job past it is refused.
- ``backfill_runs``: backfill runs pending: created and not final, plus those its queued
  backfills have still to create (the ledger creates them as earlier ones finish:
  streams/core/ledger/firing.py, `pace_backfills`), plus what the new backfill may
  create (its `runs_at_most`). A backfill past it is refused.
- ``runs_in_flight``: runs not final, of every trigger. A run-now or backfill asked
  while the owner holds that many is refused.
- ``backfill_jobs``: the owner's jobs with a backfill pending (queued, or a backfill run
  not final). A backfill of another job is refused while that many are. The ledger
  bounds each job's live backfill runs (`LedgerConfig.backfill_live_runs`, 10), so this
  bounds what an owner's backfills put before other owners' firings: at most
  backfill_jobs x 10 runs in flight.

Each refusal is a 429 with Retry-After naming the quota, its limit and the owner's use.
The counts come from the projection (a few seconds behind the ledger), so an owner may
pass a quota by what it sent in those seconds; the ledger bounds what reaches it anyway
(`LedgerConfig.max_pending_backfills` a job, dead-lettered naming it, and a job's live
backfill runs). The API's rate limit (connectors/api/limits.py) bounds the rest.

Configured by ``CRONLOG_OWNER_QUOTAS``: ``name=value`` pairs, comma-separated, for every
owner, then ``;owner:name=value,...`` overrides per owner (0: no limit), e.g.
``jobs=10000,backfill_runs=100000,runs_in_flight=10000,backfill_jobs=50;etl:backfill_jobs=200``.
The defaults are far above a team's normal use (docs/operations.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

DEFAULT_JOBS = 10_000
DEFAULT_BACKFILL_RUNS = 100_000  # one backfill of the largest size at a time
DEFAULT_RUNS_IN_FLIGHT = 10_000
DEFAULT_BACKFILL_JOBS = 50  # x 10 live backfill runs a job: 500 in flight at most
RETRY_AFTER_S = {"jobs": 60, "backfill_runs": 30, "runs_in_flight": 10, "backfill_jobs": 30}


@dataclass(frozen=True, slots=True)
class Quota:
    jobs: int = DEFAULT_JOBS
    backfill_runs: int = DEFAULT_BACKFILL_RUNS
    runs_in_flight: int = DEFAULT_RUNS_IN_FLIGHT
    backfill_jobs: int = DEFAULT_BACKFILL_JOBS


@dataclass(frozen=True, slots=True)
class Usage:
    jobs: int
    backfill_queued: int
    in_flight: int
    backfill_live: int
    backfill_jobs: int = 0  # other jobs of the owner with a backfill pending

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> Usage:
        return cls(
            int(row["jobs"]),
            int(row["backfill_queued"]),
            int(row["in_flight"]),
            int(row["backfill_live"]),
            int(row.get("backfill_jobs") or 0),
        )


class QuotaExceeded(Exception):
    def __init__(self, name: str, message: str):
        super().__init__(message)
        self.name = name
        self.message = message
        self.retry_after_s = RETRY_AFTER_S[name]


def _pairs(text: str, where: str) -> dict[str, int]:
    known = {f.name for f in fields(Quota)}
    found: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, eq, value = part.partition("=")
        name = name.strip()
        if not eq or name not in known or not value.strip().isdigit():
            raise ValueError(
                f"CRONLOG_OWNER_QUOTAS: {where}: {part!r} is not one of "
                f"{', '.join(sorted(known))} = a whole number"
            )
        found[name] = int(value)
    return found


@dataclass(frozen=True, slots=True)
class OwnerQuotas:
    default: Quota = Quota()
    owners: tuple[tuple[str, Quota], ...] = ()

    @classmethod
    def parse(cls, text: str) -> OwnerQuotas:
        default = Quota()
        overrides: list[tuple[str, str]] = []
        for n, section in enumerate(s.strip() for s in text.split(";")):
            owner, colon, rest = section.partition(":")
            if colon and "=" not in owner and owner.strip():
                overrides.append((owner.strip(), rest))
            elif n == 0:
                default = replace(default, **_pairs(section, "the defaults"))
            elif section:
                raise ValueError(
                    f"CRONLOG_OWNER_QUOTAS: {section!r}: an override is owner:name=value,..."
                )
        owners = tuple(
            (owner, replace(default, **_pairs(rest, f"owner {owner}"))) for owner, rest in overrides
        )
        return cls(default, owners)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> OwnerQuotas:
        return cls.parse(env.get("CRONLOG_OWNER_QUOTAS", ""))

    def of(self, owner: str) -> Quota:
        for name, quota in self.owners:
            if name == owner:
                return quota
        return self.default


def check_job(quota: Quota, owner: str, usage: Usage) -> None:
    if quota.jobs and usage.jobs >= quota.jobs:
        raise QuotaExceeded(
            "jobs",
            f"quota jobs: owner {owner!r} has {usage.jobs} jobs registered, at most "
            f"{quota.jobs} (CRONLOG_OWNER_QUOTAS); delete some first",
        )


def check_in_flight(quota: Quota, owner: str, usage: Usage) -> None:
    if quota.runs_in_flight and usage.in_flight >= quota.runs_in_flight:
        raise QuotaExceeded(
            "runs_in_flight",
            f"quota runs_in_flight: owner {owner!r} has {usage.in_flight} runs not finished, "
            f"at most {quota.runs_in_flight} (CRONLOG_OWNER_QUOTAS); retry once some end",
        )


def check_backfill(quota: Quota, owner: str, usage: Usage, runs_at_most: int) -> None:
    check_in_flight(quota, owner, usage)
    if quota.backfill_jobs and usage.backfill_jobs >= quota.backfill_jobs:
        raise QuotaExceeded(
            "backfill_jobs",
            f"quota backfill_jobs: owner {owner!r} has {usage.backfill_jobs} other jobs "
            f"with a backfill pending, at most {quota.backfill_jobs} (CRONLOG_OWNER_QUOTAS); "
            "retry once one has run",
        )
    pending = usage.backfill_queued + usage.backfill_live
    if quota.backfill_runs and pending + runs_at_most > quota.backfill_runs:
        raise QuotaExceeded(
            "backfill_runs",
            f"quota backfill_runs: owner {owner!r} has about {pending} backfill runs "
            f"pending and this backfill may create {runs_at_most}; at most "
            f"{quota.backfill_runs} (CRONLOG_OWNER_QUOTAS); retry once they have run, or "
            "backfill a smaller range",
        )
