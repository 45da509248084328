"""Shared set-up for benchmarks: a private topic prefix on the running stack, real node
and worker processes, figures printed as a table and written as JSON."""

from __future__ import annotations

import io
import json
import os
import platform
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from streams.core.percentile import nearest_rank
from streams.settings import Settings
from streams.topics import ensure_topics
from tests.support.isolation import delete_topics_with_prefix
from tests.support.nodes import EventReader
from tests.support.services import real_services

REPORTS = Path(__file__).resolve().parents[1] / ".state" / "reports"


@contextmanager
def bench_settings(name: str, partitions: int = 12) -> Iterator[Settings]:
    with real_services() as services:
        settings = Settings(
            kafka=services.kafka,
            database_url=services.database_url,
            topic_prefix=f"bench.{name}.{uuid.uuid4().hex[:6]}.",
            partitions=partitions,
        )
        ensure_topics(settings)
        try:
            yield settings
        finally:
            if os.environ.get("CRONLOG_BENCH_KEEP_TOPICS") == "1":  # to read them afterwards
                print(f"topics kept: {settings.topic_prefix}*", file=sys.stderr)
            else:
                delete_topics_with_prefix(settings, settings.topic_prefix)


def percentile(values: list[float], q: float) -> float:
    """The nearest-rank percentile (streams/core/percentile.py); NaN for no values."""
    found = nearest_rank(values, q)
    return float("nan") if found is None else found


def report(name: str, figures: dict[str, object]) -> None:
    machine = {
        "cores": os.cpu_count(),
        "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "python": platform.python_version(),
    }
    document = {
        "benchmark": name,
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine,
        **figures,
    }
    REPORTS.mkdir(parents=True, exist_ok=True)
    (REPORTS / f"bench-{name}.json").write_text(json.dumps(document, indent=2))
    width = max(len(k) for k in figures)
    print(f"\n{name}  ({machine['cores']} cores, {machine['memory_gb']} GB)")
    for key, value in figures.items():
        shown = f"{value:.3f}" if isinstance(value, float) else str(value)
        print(f"  {key:<{width}}  {shown}")


def lateness(values_s: list[float], prefix: str = "start_lateness") -> dict[str, float]:
    """Exact p50/p99/max (the samples are kept; at bench sizes that is cheap)."""
    return {
        f"{prefix}_p50_s": percentile(values_s, 0.5),
        f"{prefix}_p99_s": percentile(values_s, 0.99),
        f"{prefix}_max_s": max(values_s, default=float("nan")),
    }


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    found = [int(p) for p in text.split()]
    return found + [g for c in found for g in _children(c)]


def tree_stats(pid: int) -> tuple[float, float]:
    """(resident MiB, CPU seconds) of a process and its descendants, from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    rss_mb = cpu_s = 0.0
    for p in (pid, *_children(pid)):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            cpu_s += (int(fields[11]) + int(fields[12])) / tick
        except OSError:
            continue
        rss_mb += _rss_mb(p)
    return rss_mb, cpu_s


def rss_split(pid: int) -> tuple[float, float]:
    """(resident MiB of the process itself, of its descendants), from /proc: a node's
    main process (ingress, scheduler, dispatcher) apart from its ledger processes."""
    return _rss_mb(pid), sum(_rss_mb(c) for c in _children(pid))


def _rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def table(name: str, rows: list[dict[str, object]]) -> None:
    """Print rows as an aligned table (and keep them in the JSON report)."""
    if not rows:
        return
    columns = list(rows[0])

    def cell(value: object) -> str:
        return f"{value:.3f}" if isinstance(value, float) else str(value)

    widths = {c: max(len(c), *(len(cell(r.get(c))) for r in rows)) for c in columns}
    print(f"\n{name}")
    print("  " + "  ".join(c.rjust(widths[c]) for c in columns))
    for row in rows:
        print("  " + "  ".join(cell(row.get(c)).rjust(widths[c]) for c in columns))


def audit(settings: Settings) -> tuple[int, str]:
    """`cronlog audit` over the whole run-events topic: (exit code, its report). Every
    benchmark ends with it: figures from a run that broke a guarantee are worthless."""
    from connectors.audit.replay import run_audit

    out, err = io.StringIO(), io.StringIO()
    code = run_audit(settings, None, None, None, out, err=err)
    return code, out.getvalue() + err.getvalue()


def verdict(code: int) -> str:
    return {0: "clean", 1: "VIOLATIONS"}.get(code, "ERROR")


def window_lateness(
    events: EventReader, window_start_ms: int, window_end_ms: int
) -> tuple[int, int, list[float]]:
    """First attempts scheduled in [start, end): (due, started, start lateness in s)."""
    starts = {
        e.run_id: e for e, _ in events.run_events() if e.state == "running" and e.attempt == 1
    }
    due = started = 0
    late: list[float] = []
    for e, _ in events.run_events():
        if (
            e.state == "due"
            and e.attempt == 1
            and window_start_ms <= e.scheduled_ms < window_end_ms
        ):
            due += 1
            if e.run_id in starts:
                started += 1
                late.append((starts[e.run_id].happened_ms - e.scheduled_ms) / 1000)
    return due, started, late


def step_figures(
    due: int, started: int, window_start_ms: int, window_end_ms: int, late: list[float]
) -> dict[str, object]:
    """One step of a rate benchmark: what was due and started, the rate achieved, and
    the start lateness of its runs."""
    figures = lateness(late)
    return {
        "due": due,
        "started": started,
        "achieved_per_s": started / ((window_end_ms - window_start_ms) / 1000),
        "p50_s": figures["start_lateness_p50_s"],
        "p99_s": figures["start_lateness_p99_s"],
        "max_s": figures["start_lateness_max_s"],
    }
