"""Setting a deployment up: `cronlog stack ...` (the native local stack), `cronlog topics
create` and `cronlog db migrate`."""

from __future__ import annotations

import os
import sys
from typing import Annotated

import orjson
import psycopg
import typer

from connectors.cli.common import fail, load_settings, say
from connectors.stack import Stack, StackError, StackPaths, StackPorts
from connectors.stack.kafka import CONTROLLER_PORT
from connectors.stack.kafka import PORT as KAFKA_PORT
from connectors.stack.postgres import PORT as POSTGRES_PORT
from projections.migrate import MigrationError, migrate_for
from streams.groups import HEARTBEAT_KEY, SESSION_KEY, ensure_groups, group_settings, refusal_advice
from streams.kafka import KAFKA_CLIENTS, admin_config
from streams.topics import TopicError, ensure_topics

stack_app = typer.Typer(
    help="The native local stack: Kafka (KRaft) and PostgreSQL.", no_args_is_help=True
)
topics_app = typer.Typer(help="The Kafka topics of the contract.", no_args_is_help=True)


def local_stack(brokers: int | None = None, secure: bool | None = None) -> Stack:
    """``brokers``: --brokers, else CRONLOG_STACK_BROKERS, else what the state folder
    holds (one broker for a new one). ``secure``: --secure, else CRONLOG_STACK_SECURE=1."""
    if secure is None:
        secure = os.environ.get("CRONLOG_STACK_SECURE", "") in ("1", "true", "yes")
    try:
        raw = os.environ.get("CRONLOG_STACK_BROKERS", "").strip()
        brokers = brokers if brokers is not None else (int(raw) if raw else None)
    except ValueError as exc:
        raise fail(f"CRONLOG_STACK_BROKERS must be a number: {exc}", 2) from exc
    try:
        ports = StackPorts(
            kafka=int(os.environ.get("CRONLOG_STACK_KAFKA_PORT", KAFKA_PORT)),
            controller=int(os.environ.get("CRONLOG_STACK_CONTROLLER_PORT", CONTROLLER_PORT)),
            postgres=int(os.environ.get("CRONLOG_STACK_POSTGRES_PORT", POSTGRES_PORT)),
        )
    except ValueError as exc:
        raise fail(f"CRONLOG_STACK_*_PORT must be a port number: {exc}", 2) from exc
    try:
        paths = StackPaths.default(os.environ.get("CRONLOG_STATE_DIR"))
        return Stack(paths, ports, brokers, secure)
    except StackError as exc:
        raise fail(str(exc), 2) from exc


@stack_app.command("up")
def stack_up(
    brokers: Annotated[
        int | None,
        typer.Option(
            "--brokers",
            min=1,
            help="Kafka brokers: 1, or 3 for a replicated cluster (ports 9092/9094/9096, "
            "controllers 9093/9095/9097). Fixed once the state folder is formatted; "
            "default: what it holds, 1 when new (or CRONLOG_STACK_BROKERS).",
        ),
    ] = None,
    secure: Annotated[
        bool,
        typer.Option(
            "--secure",
            help="The broker with SASL_SSL (SCRAM-SHA-512 users per role, a local CA) and "
            "ACLs per role for CRONLOG_TOPIC_PREFIX; client properties per role under "
            "<state>/kafka-secure/tls/ (or CRONLOG_STACK_SECURE=1).",
        ),
    ] = False,
) -> None:
    """Install what is missing, start Kafka and PostgreSQL (or reuse them), and wait."""
    stack = local_stack(brokers, secure or None)
    try:
        status = stack.up(say)
        granted = stack.grant(load_settings().topic_prefix) if stack.secure else 0
    except StackError as exc:
        raise fail(str(exc)) from exc
    typer.echo(
        f"Kafka:      {status.kafka.bootstrap}  (CRONLOG_KAFKA; {status.kafka.brokers} "
        f"broker{'s' if status.kafka.brokers > 1 else ''})"
    )
    if stack.kafka.material is not None:
        tls = stack.kafka.material.dir
        typer.echo(
            f"Security:   SASL_SSL, {granted} ACL entries; per role: CRONLOG_KAFKA_CONFIG="
            f"{tls}/<role>.properties (admin node worker api projector notifier)"
        )
    typer.echo(f"PostgreSQL: {status.postgres.database_url}  (CRONLOG_DATABASE_URL)")
    typer.echo(f"State:      {status.state_dir}   stop with: cronlog stack down")


@stack_app.command("add-worker")
def stack_add_worker(
    worker_id: Annotated[str, typer.Argument(help="The worker's --id.")],
) -> None:
    """Provision a native worker on the secured broker (stack up --secure): its own
    SCRAM user, ACLs that let it read its own inbox and no other, its inbox topic, and
    its client properties file (printed) for CRONLOG_KAFKA_CONFIG. Repeatable."""
    from connectors.stack.secure import add_worker

    stack = local_stack(secure=True)
    material = stack.kafka.material
    assert material is not None  # a secure stack has it
    admin = material.client_properties("admin")
    settings = load_settings().with_(
        kafka=stack.kafka.bootstrap, kafka_config=tuple(sorted(admin.items()))
    )
    try:
        path = add_worker(material, settings, worker_id)
    except StackError as exc:
        raise fail(str(exc)) from exc
    typer.echo(f"worker {worker_id}: CRONLOG_KAFKA_CONFIG={path} cronlog worker --id {worker_id}")


@stack_app.command("down")
def stack_down() -> None:
    """Stop Kafka and PostgreSQL cleanly; their data stays in the state folder."""
    try:
        kafka, postgres = local_stack().down()
    except StackError as exc:
        raise fail(str(exc)) from exc
    typer.echo(f"Kafka: {'stopped' if kafka else 'was not running'}")
    typer.echo(f"PostgreSQL: {'stopped' if postgres else 'was not running'}")


@stack_app.command("status")
def stack_status(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Tell what runs. Exit code 0 when both run, 3 otherwise."""
    status = local_stack().status()
    if as_json:
        sys.stdout.write(orjson.dumps(status.as_json()).decode() + "\n")
    else:
        for name, running, where in (
            ("Kafka", status.kafka.running, status.kafka.bootstrap),
            ("PostgreSQL", status.postgres.running, status.postgres.database_url),
        ):
            typer.echo(f"{name:<11} {'running' if running else 'stopped':<8} {where}")
        if status.kafka.brokers > 1:
            for node in status.kafka.nodes:
                state = "running" if node.running else "stopped"
                typer.echo(f"  broker {node.node_id:<3} {state:<8} {node.bootstrap}")
    raise typer.Exit(0 if status.running else 3)


@topics_app.command("create")
def topics_create(
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the broker.")] = 30.0,
) -> None:
    """Create every contract topic under CRONLOG_TOPIC_PREFIX (idempotent)."""
    settings = load_settings()
    try:
        outcomes = ensure_topics(settings, timeout_s=timeout)
    except TopicError as exc:
        raise fail(str(exc)) from exc
    except Exception as exc:
        raise fail(f"cannot reach Kafka at {settings.kafka}: {exc}") from exc
    for outcome in outcomes:
        verb = "created" if outcome.created else "exists "
        typer.echo(
            f"{verb} {outcome.topic} ({outcome.partitions} partitions, "
            f"{outcome.replication} replicas)"
        )
    try:
        groups = ensure_groups(
            settings, KAFKA_CLIENTS.admin(admin_config(settings)), timeout_s=timeout
        )
    except Exception as exc:
        raise fail(f"cannot set the consumer groups' sessions at {settings.kafka}: {exc}") from exc
    wanted = group_settings()
    for group in groups:
        if group.refused is None:
            typer.echo(
                f"group   {group.group} (session {wanted[SESSION_KEY]} ms, "
                f"heartbeat {wanted[HEARTBEAT_KEY]} ms)"
            )
    advice = refusal_advice(groups)
    if advice is not None:
        typer.echo(f"warning: {advice}", err=True)


def db_migrate() -> None:
    """Apply pending schema migrations to CRONLOG_DATABASE_URL (idempotent)."""
    settings = load_settings()
    try:
        applied = migrate_for(settings)  # and record or check the deployment
    except MigrationError as exc:
        raise fail(str(exc)) from exc
    except psycopg.OperationalError as exc:
        raise fail(f"cannot reach PostgreSQL at {settings.database_url}: {exc}") from exc
    if applied:
        typer.echo("applied migrations " + ", ".join(f"{v:04d}" for v in applied))
    else:
        typer.echo("database schema is up to date")
