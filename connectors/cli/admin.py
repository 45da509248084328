"""An operator's commands on the topics and the projections: `cronlog db prune`
(retention), `cronlog audit`, `cronlog events` and `cronlog submit`."""

from __future__ import annotations

import dataclasses
import sys
from datetime import UTC, datetime
from typing import Annotated

import orjson
import psycopg
import typer

from connectors.cli.common import fail, load_settings, retention_policy
from projections.migrate import MigrationError, migrate_for
from projections.retention import prune as prune_history


def db_prune(
    days: Annotated[
        float | None,
        typer.Option(min=0, help="Instead of CRONLOG_RETENTION_DAYS (90; 0 keeps runs for ever)."),
    ] = None,
    keep_runs: Annotated[
        int | None, typer.Option(min=0, help="Instead of CRONLOG_RETENTION_KEEP_RUNS (100).")
    ] = None,
    log_days: Annotated[
        float | None,
        typer.Option(min=0, help="Instead of CRONLOG_RETENTION_LOG_DAYS (7; 0: with runs only)."),
    ] = None,
    max_seconds: Annotated[
        float | None, typer.Option(min=0, help="Stop after this long; the next prune goes on.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Remove old history now, by the retention policy, and print what was removed: final
    runs scheduled and finished more than CRONLOG_RETENTION_DAYS ago, with their
    transitions and log chunks, except the newest CRONLOG_RETENTION_KEEP_RUNS runs of every
    job; log chunks older than CRONLOG_RETENTION_LOG_DAYS. Safe beside a running projector
    (which applies the same policy by itself every CRONLOG_RETENTION_INTERVAL_S)."""
    settings = load_settings()
    policy = retention_policy()
    policy = dataclasses.replace(
        policy,
        days=policy.days if days is None else days,
        keep_runs=policy.keep_runs if keep_runs is None else keep_runs,
        log_days=policy.log_days if log_days is None else log_days,
    )
    now = datetime.now(UTC)
    try:
        migrate_for(settings)  # the policy's index, and this deployment's database
        with psycopg.connect(settings.database_url, autocommit=True) as conn:
            done = prune_history(conn, policy, now=now, budget_s=max_seconds)
    except MigrationError as exc:
        raise fail(str(exc), 2) from exc
    except psycopg.OperationalError as exc:
        raise fail(f"cannot reach PostgreSQL at {settings.database_url}: {exc}") from exc
    if as_json:
        figures = {
            "runs": done.runs,
            "transitions": done.transitions,
            "log_chunks": done.logs,
            "seconds": round(done.seconds, 3),
            "complete": done.complete,
            "policy": {
                "days": policy.days,
                "keep_runs": policy.keep_runs,
                "log_days": policy.log_days,
            },
        }
        sys.stdout.write(orjson.dumps(figures).decode() + "\n")
        return
    typer.echo(f"policy: {policy.describe(now)}")
    typer.echo(
        f"removed {done.runs} runs, {done.transitions} transitions, {done.logs} log chunks"
        f" in {done.seconds:.1f} s"
        + ("" if done.complete else " (stopped early: run it again to go on)")
    )


def submit(
    command: Annotated[str, typer.Argument(help="A JSON command, or - to read one per line.")],
) -> None:
    """Validate JSON commands and produce them to `commands`, keyed by job_id."""
    from confluent_kafka import Producer

    from streams.core.commands import Rejection, command_job_id, parse_command
    from streams.kafka import producer_config

    settings = load_settings()
    lines = sys.stdin.read().splitlines() if command == "-" else [command]
    producer = Producer(producer_config(settings))
    failed = 0
    for line in (raw for raw in lines if raw.strip()):
        parsed = parse_command(line.encode())
        if isinstance(parsed, Rejection):
            typer.secho(f"rejected: {parsed.reason}", fg=typer.colors.RED, err=True)
            failed += 1
            continue
        producer.produce(
            settings.topic("commands"), key=command_job_id(parsed).encode(), value=line.encode()
        )
    if producer.flush(30):
        raise fail(f"could not deliver to Kafka at {settings.kafka}")
    if failed:
        raise typer.Exit(1)


def events(
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep reading.")] = False,
    job: Annotated[str | None, typer.Option(help="Only this job.")] = None,
    since: Annotated[
        str | None, typer.Option("--from", help="From this time on (ISO-8601, with an offset).")
    ] = None,
) -> None:
    """Print run-events (job and run transitions) as JSON lines, oldest first per job
    (connectors/events.py reads them as typed records for your own code)."""
    from connectors.audit.replay import AuditError, parse_time
    from connectors.events import read_events
    from schemas.json import to_json

    settings = load_settings()
    try:
        since_ms = None if since is None else parse_time(since)
    except AuditError as exc:
        raise fail(f"--from: {exc}", 2) from exc
    try:
        for event in read_events(settings, since_ms=since_ms, job_id=job, follow=follow):
            sys.stdout.write(to_json(event).decode() + "\n")
    except KeyboardInterrupt:
        pass


def audit(
    since: Annotated[str | None, typer.Option("--from", help="ISO-8601 or epoch ms.")] = None,
    until: Annotated[str | None, typer.Option("--to", help="ISO-8601 or epoch ms.")] = None,
    job: Annotated[str | None, typer.Option(help="Only this job.")] = None,
) -> None:
    """Replay run-events and verify them; exit 1 on any violation, 2 on errors."""
    from connectors.audit.replay import AuditError, parse_time, run_audit

    settings = load_settings()
    try:
        from_ms = parse_time(since) if since else None
        to_ms = parse_time(until) if until else None
    except AuditError as exc:
        raise fail(str(exc), 2) from exc
    raise typer.Exit(run_audit(settings, from_ms, to_ms, job, sys.stdout))
