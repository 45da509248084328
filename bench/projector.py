"""Projector throughput: N synthetic run transitions produced to run-events, then the time
for a fresh projector to write them all into PostgreSQL.
`python -m bench.projector --events 100000`."""

from __future__ import annotations

import argparse
import io
import threading
import time

import psycopg

from bench.common import bench_settings, report
from connectors.audit.replay import run_audit
from projections.projector import Projector
from tests.support.isolation import create_database, drop_database, unique_name
from tests.support.kafka import produce_runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--quick", action="store_true", help="100,000 events")
    args = parser.parse_args()
    if args.quick:
        args.events = 100_000
    with bench_settings("projector") as settings:
        name = unique_name("bench_projector")
        url, kind = create_database(settings.database_url, name)
        try:
            total = produce_runs(settings, range(args.events // 4))
            projector = Projector(settings.with_(database_url=url), batch_size=5000)
            thread = threading.Thread(target=projector.run, daemon=True)
            started = time.monotonic()
            thread.start()
            while projector.projected < total and time.monotonic() - started < 600:
                time.sleep(0.2)
            elapsed = time.monotonic() - started
            projector.stop()
            thread.join(30)
            with psycopg.connect(url) as conn:
                row = conn.execute("SELECT count(*) FROM run_transitions").fetchone()
            audit_started = time.monotonic()
            run_audit(settings, None, None, None, io.StringIO())  # its verdict is not the point
            audit_s = time.monotonic() - audit_started
            report(
                "projector",
                {
                    "events": total,
                    "projected_rows": row[0] if row else 0,
                    "seconds": elapsed,
                    "events_per_s": total / elapsed,
                    "audit_replay_s": audit_s,
                    "audit_events_per_s": total / audit_s,
                },
            )
        finally:
            drop_database(settings.database_url, name, kind)


if __name__ == "__main__":
    main()
