"""Per-owner quotas (issue 53 item 12): parsed from CRONLOG_OWNER_QUOTAS, checked against
an owner's usage, each refusal naming its quota; and the projection's estimate of the
runs a job's queued backfills have still to create."""

from __future__ import annotations

import pytest

from connectors.api.quotas import (
    DEFAULT_BACKFILL_RUNS,
    OwnerQuotas,
    Quota,
    QuotaExceeded,
    Usage,
    check_backfill,
    check_in_flight,
    check_job,
)
from projections.backlog import backfill_pending
from schemas.records import BackfillRequested, JobUpserted
from schemas.spec import CronSchedule
from streams.core.ledger import LedgerConfig
from tests.support.world import World
from tests.unit.test_ledger_edges import MIN, T0, spec

HOUR = 60 * MIN


def test_defaults_and_per_owner_overrides() -> None:
    quotas = OwnerQuotas.parse("jobs=50,runs_in_flight=7;noisy:backfill_runs=1000;big:jobs=0")
    assert quotas.of("anyone") == Quota(
        jobs=50, backfill_runs=DEFAULT_BACKFILL_RUNS, runs_in_flight=7
    )
    assert quotas.of("noisy") == Quota(jobs=50, backfill_runs=1000, runs_in_flight=7)
    assert quotas.of("big").jobs == 0  # no limit
    assert OwnerQuotas.parse("") == OwnerQuotas()
    assert OwnerQuotas.parse(";etl:jobs=3").of("etl").jobs == 3


@pytest.mark.parametrize("text", ["jobs=x", "nope=3", "jobs", "a=1;b=2"])
def test_a_malformed_setting_is_refused_naming_it(text: str) -> None:
    with pytest.raises(ValueError, match="CRONLOG_OWNER_QUOTAS"):
        OwnerQuotas.parse(text)


def test_each_refusal_names_its_quota() -> None:
    quota = Quota(jobs=2, backfill_runs=100, runs_in_flight=5)
    with pytest.raises(QuotaExceeded, match="quota jobs: owner 'o' has 2 jobs") as jobs:
        check_job(quota, "o", Usage(2, 0, 0, 0))
    assert jobs.value.retry_after_s > 0
    check_job(quota, "o", Usage(1, 0, 0, 0))
    with pytest.raises(QuotaExceeded, match="quota runs_in_flight"):
        check_in_flight(quota, "o", Usage(0, 0, 5, 0))
    with pytest.raises(QuotaExceeded, match="quota backfill_runs: owner 'o' has about 90"):
        check_backfill(quota, "o", Usage(0, 60, 0, 30), 11)
    check_backfill(quota, "o", Usage(0, 60, 0, 30), 10)
    check_backfill(Quota(backfill_runs=0), "o", Usage(0, 10**9, 0, 0), 10**5)  # 0: no limit


def test_a_backfill_of_one_more_job_past_the_backfill_jobs_quota_is_refused() -> None:
    quota = Quota(backfill_jobs=2)
    check_backfill(quota, "o", Usage(0, 0, 0, 0, backfill_jobs=1), 10)
    with pytest.raises(QuotaExceeded, match="quota backfill_jobs: owner 'o' has 2 other jobs"):
        check_backfill(quota, "o", Usage(0, 0, 0, 0, backfill_jobs=2), 10)
    assert OwnerQuotas.parse("backfill_jobs=5;etl:backfill_jobs=0").of("etl").backfill_jobs == 0


def test_the_projection_estimates_what_the_queued_backfills_still_create() -> None:
    hourly = spec(every=HOUR)
    cron = spec("c", schedule=CronSchedule("0 * * * *", "UTC"))
    w = World(LedgerConfig(backfill_live_runs=10))
    w.apply(JobUpserted(hourly, T0))
    w.apply(JobUpserted(cron, T0))
    for job_id in ("j", "c"):
        w.apply(BackfillRequested(job_id, T0 - 99 * HOUR, T0, T0 + 1, "a"))
        w.apply(BackfillRequested(job_id, T0 - 299 * HOUR, T0 - 200 * HOUR, T0 + 2, "b"))
        # 10 created of a's 100, b's 100 all queued: 190 still to create
        assert backfill_pending(w.jobs[job_id]) == 190
