"""The audit's report as text (`format_report`): what `cronlog audit` prints."""

from __future__ import annotations

from typing import Final, TextIO

from connectors.audit.findings import KINDS, AuditReport
from streams.core.ids import iso_utc

_KIND_WIDTH: Final = max(len(kind) for kind in KINDS)


def _seconds(ms: int | None) -> str:
    return "-" if ms is None else f"{ms / 1000:.2f} s"


def format_report(
    report: AuditReport,
    out: TextIO,
    *,
    topic: str = "run-events",
    limit: int = 20,
    job_log_topic: str = "job-log",
) -> None:
    """The human summary: counts, lateness with a histogram, the first violations."""
    w = out.write
    w(
        f"events   {report.events:,} ({report.job_events:,} job events), "
        f"undecodable {report.undecodable:,}\n"
    )
    w(f"jobs     {report.jobs:,}\n")
    w(f"runs     {report.runs:,} ({report.live_runs:,} not final at the end)\n")
    w(
        f"firings  {report.expected_firings:,} due firings checked, "
        f"{report.excused_firings:,} excused (beyond the catch-up window)"
    )
    if report.unchecked_jobs:
        w(f", {report.unchecked_jobs:,} jobs unchecked (no registration in the replay)")
    w("\n")
    if report.dag_steps:
        w(
            f"periods  {report.dag_periods:,} records of {report.dag_steps:,} DAG steps, "
            "their upstreams' outcomes checked\n"
        )
    if report.reports_note:
        w(f"reports  worker reports not checked: {report.reports_note}\n")
    else:
        w(
            f"reports  {report.reports:,} worker reports checked against the ledger's "
            f"record, {report.unjudged_reports:,} not judged (undecided, or runs the "
            "replay does not know)\n"
        )
    if report.now_ms is not None:
        w(f"newest   {iso_utc(report.now_ms)}\n")
    lat = report.lateness
    w(
        f"start lateness (first attempts, n={lat.count:,}): p50 {_seconds(lat.p50_ms)}, "
        f"p99 {_seconds(lat.p99_ms)}, max {_seconds(lat.max_ms)}\n"
    )
    if lat.count:
        used = [i for i, (_, count) in enumerate(lat.histogram) if count]
        shown_buckets = lat.histogram[used[0] : used[-1] + 1]  # without empty ends
        top = max(count for _, count in shown_buckets)
        for label, count in shown_buckets:
            bar = "#" * (0 if not count else max(1, round(40 * count / top)))
            w(f"  {label:>9} |{bar:<40}| {count:,}\n")
    total = report.total_violations
    w(f"violations {total:,}" + (" (clean)\n" if total == 0 else "\n"))
    for kind in KINDS:
        if report.counts.get(kind):
            w(f"  {kind:<{_KIND_WIDTH}} {report.counts[kind]:,}\n")
    if total:
        shown = report.violations[:limit]
        w(f"first {len(shown)} violations:\n")
        for v in shown:
            subject = v.run_id or v.job_id or "?"
            where = f"{job_log_topic if v.source == 'job-log' else topic}[{v.partition}]@{v.offset}"
            w(f"  {v.kind:<{_KIND_WIDTH}} {where}  {subject}: {v.detail}\n")
