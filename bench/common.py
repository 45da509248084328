"""Shared set-up for benchmarks: a private topic prefix on the running stack, real node
and worker processes, figures printed as a table and written as JSON."""

from __future__ import annotations

import json
import os
import platform
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from streams.settings import Settings
from streams.topics import ensure_topics
from tests.support.isolation import delete_topics_with_prefix
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
            delete_topics_with_prefix(settings.kafka, settings.topic_prefix)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


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
