"""The ``cronlog`` command line. Thin: parses arguments, builds Settings once from the
environment, and calls into the packages that do the work."""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import orjson
import psycopg
import typer

from connectors.jobs_cli import apply_files, diff_files, jobs_app, runs_app
from connectors.stack import Stack, StackError, StackPaths, StackPorts
from connectors.stack.kafka import CONTROLLER_PORT
from connectors.stack.kafka import PORT as KAFKA_PORT
from connectors.stack.paths import DEMO
from connectors.stack.postgres import PORT as POSTGRES_PORT
from connectors.worker.confine import Confinement, confinement
from projections.migrate import MigrationError, migrate_for
from projections.retention import RetentionError, RetentionPolicy
from projections.retention import prune as prune_history
from streams.core.ledger import LedgerConfig
from streams.core.timing import TIMING
from streams.core.zones import use_tzdata_only
from streams.inboxes import WORKER_ID
from streams.logs import LogFormat, LogFormatError
from streams.logs import configure as configure_logging
from streams.logs import log_format as chosen_log_format
from streams.settings import Settings, SettingsError
from streams.topics import TopicError, ensure_topics

ENV_HELP = (
    "Environment: CRONLOG_KAFKA (bootstrap servers), CRONLOG_DATABASE_URL, "
    "CRONLOG_TOPIC_PREFIX, CRONLOG_PARTITIONS, CRONLOG_LEDGER_STORE (cronlog scheduler); "
    "for the local stack CRONLOG_STATE_DIR and "
    "CRONLOG_STACK_KAFKA_PORT / _CONTROLLER_PORT / _POSTGRES_PORT / CRONLOG_STACK_BROKERS."
)

LogFormatOption = Annotated[
    str | None,
    typer.Option(
        "--log-format",
        help="text, or json: one JSON object per line (CRONLOG_LOG_FORMAT; default text).",
    ),
]


MetricsPortOption = Annotated[
    int | None,
    typer.Option(
        "--metrics-port",
        help="Serve /metrics, /healthz and /readyz on this port (CRONLOG_METRICS_PORT; "
        "default none). A scheduler node's ledger process serves on the port + 1.",
    ),
]


def _metrics_port(option: int | None) -> int | None:
    from streams.metrics import metrics_port

    try:
        return metrics_port(option)
    except ValueError as exc:
        raise _fail(str(exc), 2) from None


def _logging(level: str, component: str, instance: str | None, fmt: str | None) -> LogFormat:
    try:
        return configure_logging(level, component, instance, fmt)
    except LogFormatError as exc:
        raise _fail(str(exc), 2) from None


app = typer.Typer(
    name="cronlog",
    help=f"cronlog: a distributed job scheduler on Kafka. {ENV_HELP}",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
stack_app = typer.Typer(
    help="The native local stack: Kafka (KRaft) and PostgreSQL.", no_args_is_help=True
)
topics_app = typer.Typer(help="The Kafka topics of the contract.", no_args_is_help=True)
app.add_typer(stack_app, name="stack")
app.add_typer(topics_app, name="topics")
db_app = typer.Typer(help="The PostgreSQL projections' schema.", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(jobs_app, name="jobs")
app.add_typer(runs_app, name="runs")
app.command("apply")(apply_files)
app.command("diff")(diff_files)


def _fail(message: str, code: int = 1) -> typer.Exit:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    return typer.Exit(code)


def _settings() -> Settings:
    try:
        return Settings.from_env()
    except SettingsError as exc:
        raise _fail(str(exc), 2) from exc


def _stack(brokers: int | None = None, secure: bool | None = None) -> Stack:
    """``brokers``: --brokers, else CRONLOG_STACK_BROKERS, else what the state folder
    holds (one broker for a new one). ``secure``: --secure, else CRONLOG_STACK_SECURE=1."""
    if secure is None:
        secure = os.environ.get("CRONLOG_STACK_SECURE", "") in ("1", "true", "yes")
    try:
        raw = os.environ.get("CRONLOG_STACK_BROKERS", "").strip()
        brokers = brokers if brokers is not None else (int(raw) if raw else None)
    except ValueError as exc:
        raise _fail(f"CRONLOG_STACK_BROKERS must be a number: {exc}", 2) from exc
    try:
        ports = StackPorts(
            kafka=int(os.environ.get("CRONLOG_STACK_KAFKA_PORT", KAFKA_PORT)),
            controller=int(os.environ.get("CRONLOG_STACK_CONTROLLER_PORT", CONTROLLER_PORT)),
            postgres=int(os.environ.get("CRONLOG_STACK_POSTGRES_PORT", POSTGRES_PORT)),
        )
    except ValueError as exc:
        raise _fail(f"CRONLOG_STACK_*_PORT must be a port number: {exc}", 2) from exc
    try:
        paths = StackPaths.default(os.environ.get("CRONLOG_STATE_DIR"))
        return Stack(paths, ports, brokers, secure)
    except StackError as exc:
        raise _fail(str(exc), 2) from exc


def _log(message: str) -> None:
    typer.echo(f"cronlog: {message}", err=True)


def _stop_watchdog(extra_s: float = 0.0) -> float:
    """Bound this command's stop: exit hard if it has not stopped within
    CRONLOG_STOP_TIMEOUT_S (default 20) + `extra_s` of the first stop signal, even when
    a client call hangs. Before the command installs its own handlers (they get wrapped)."""
    from streams.lifecycle import install_stop_watchdog, stop_timeout_s

    try:
        return install_stop_watchdog(stop_timeout_s() + extra_s)
    except ValueError as exc:
        raise _fail(str(exc), 2) from exc


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
    stack = _stack(brokers, secure or None)
    try:
        status = stack.up(_log)
        granted = stack.grant(_settings().topic_prefix) if stack.secure else 0
    except StackError as exc:
        raise _fail(str(exc)) from exc
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

    stack = _stack(secure=True)
    material = stack.kafka.material
    assert material is not None  # a secure stack has it
    admin = material.client_properties("admin")
    settings = _settings().with_(
        kafka=stack.kafka.bootstrap, kafka_config=tuple(sorted(admin.items()))
    )
    try:
        path = add_worker(material, settings, worker_id)
    except StackError as exc:
        raise _fail(str(exc)) from exc
    typer.echo(f"worker {worker_id}: CRONLOG_KAFKA_CONFIG={path} cronlog worker --id {worker_id}")


@stack_app.command("down")
def stack_down() -> None:
    """Stop Kafka and PostgreSQL cleanly; their data stays in the state folder."""
    try:
        kafka, postgres = _stack().down()
    except StackError as exc:
        raise _fail(str(exc)) from exc
    typer.echo(f"Kafka: {'stopped' if kafka else 'was not running'}")
    typer.echo(f"PostgreSQL: {'stopped' if postgres else 'was not running'}")


@stack_app.command("status")
def stack_status(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Tell what runs. Exit code 0 when both run, 3 otherwise."""
    status = _stack().status()
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
    settings = _settings()
    try:
        outcomes = ensure_topics(settings, timeout_s=timeout)
    except TopicError as exc:
        raise _fail(str(exc)) from exc
    except Exception as exc:
        raise _fail(f"cannot reach Kafka at {settings.kafka}: {exc}") from exc
    for outcome in outcomes:
        verb = "created" if outcome.created else "exists "
        typer.echo(
            f"{verb} {outcome.topic} ({outcome.partitions} partitions, "
            f"{outcome.replication} replicas)"
        )


@db_app.command("migrate")
def db_migrate() -> None:
    """Apply pending schema migrations to CRONLOG_DATABASE_URL (idempotent)."""
    settings = _settings()
    try:
        applied = migrate_for(settings)  # and record or check the deployment
    except MigrationError as exc:
        raise _fail(str(exc)) from exc
    except psycopg.OperationalError as exc:
        raise _fail(f"cannot reach PostgreSQL at {settings.database_url}: {exc}") from exc
    if applied:
        typer.echo("applied migrations " + ", ".join(f"{v:04d}" for v in applied))
    else:
        typer.echo("database schema is up to date")


def _retention() -> RetentionPolicy:
    try:
        return RetentionPolicy.from_env()
    except RetentionError as exc:
        raise _fail(str(exc), 2) from exc


@db_app.command("prune")
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
    settings = _settings()
    policy = _retention()
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
        raise _fail(str(exc), 2) from exc
    except psycopg.OperationalError as exc:
        raise _fail(f"cannot reach PostgreSQL at {settings.database_url}: {exc}") from exc
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


@app.command("scheduler")
def scheduler(
    node_id: Annotated[str | None, typer.Option(help="Name of this node (logs).")] = None,
    lead_s: Annotated[
        float, typer.Option(help="Propose runs this early (pre-dispatch).")
    ] = TIMING.lead_s,
    lookahead_s: Annotated[
        float,
        typer.Option(
            help="A burst due within this is proposed early, beginning as early as it "
            "needs at the ledger's rate, so it is decided before it is due; quiet jobs "
            "keep --lead-s (below --max-lead-s; 0 turns it off)."
        ),
    ] = 600.0,
    lookahead_rate: Annotated[
        float,
        typer.Option(
            help="Early proposals per second per node to begin a burst with; the node "
            "then follows what its ledgers answer."
        ),
    ] = 1000.0,
    max_lead_s: Annotated[
        float,
        typer.Option(
            help="The ledger refuses fire proposals made earlier than this before their "
            "time (a bound on how far ahead runs are decided). Give every node the same.",
        ),
    ] = LedgerConfig().max_lead_ms / 1000,
    ledgers: Annotated[
        int,
        typer.Option(
            help="Ledger processes on this node (1-8): members of the one ledger group, "
            "they split the node's share of the partitions and use a core each. Ledger i "
            "serves its metrics on the node's --metrics-port + 1 + i.",
            min=1,
            max=8,
        ),
    ] = 1,
    state_store: Annotated[
        str | None,
        typer.Option(
            help="Where the ledger keeps the job and run states it is not deciding about: a "
            "directory for its RocksDB scratch store (rebuilt from the topics on every "
            "takeover, deleted on exit), or 'memory' to keep them on the heap. Default: "
            "CRONLOG_LEDGER_STORE, else cronlog-ledger in the system's temporary directory.",
        ),
    ] = None,
    loglevel: Annotated[str, typer.Option(help="Log level.")] = "info",
    log_format: LogFormatOption = None,
    metrics_port: MetricsPortOption = None,
) -> None:
    """A scheduler node: ingress, ledger and scheduler. Run several for HA."""
    from streams.node import run_node  # imported late: the loops' imports are heavy

    settings = _settings()
    chosen = _logging(loglevel, "scheduler", node_id, log_format)
    if not 0 <= lookahead_s < max_lead_s or lookahead_rate < 0 or not 0 <= lead_s < max_lead_s:
        raise _fail(
            f"--lead-s and --lookahead-rate must not be negative, --lead-s and "
            f"--lookahead-s in [0, --max-lead-s = {max_lead_s:g})",
            2,
        )
    _stop_watchdog()  # the node's handlers, installed later, get wrapped
    run_node(
        settings,
        node_id=node_id,
        lead_ms=int(lead_s * 1000),
        lookahead_ms=int(lookahead_s * 1000),
        lookahead_per_s=lookahead_rate,
        ledger_config=LedgerConfig(max_lead_ms=int(max_lead_s * 1000)),
        loglevel=loglevel,
        store_dir=_ledger_store(state_store),
        log_format=chosen,
        metrics_port=_metrics_port(metrics_port),
        ledgers=ledgers,
    )


def _ledger_store(option: str | None) -> Path | None:
    """The ledger's store directory (None: on the heap), from --state-store or the env."""
    chosen = (option or os.environ.get("CRONLOG_LEDGER_STORE", "")).strip()
    if chosen == "memory":
        return None
    return Path(chosen) if chosen else Path(tempfile.gettempdir()) / "cronlog-ledger"


@app.command("login")
def login(
    api: Annotated[str, typer.Option("--api", help="The REST API's URL.")],
    token: Annotated[
        str | None, typer.Option(help="An API token (asked for when not given).")
    ] = None,
) -> None:
    """Keep the API's URL and a token in your profile (mode 600): `cronlog jobs` and
    `cronlog runs` then work over the API, with that token's rights."""
    from connectors.client import ApiError, Client
    from connectors.remote import save_profile

    token = token or typer.prompt("token", hide_input=True)
    with Client(api, token) as client:
        try:
            client.jobs_page(limit=1)  # the token is known and may read jobs
        except ApiError as exc:
            raise _fail(f"{api} refused: {exc.message}", 1 if exc.status < 500 else 2) from exc
    path = save_profile(api, token)
    typer.echo(f"logged in to {api}; profile {path}")


@app.command("logout")
def logout() -> None:
    """Forget the profile `cronlog login` wrote."""
    from connectors.remote import profile_path

    path = profile_path()
    path.unlink(missing_ok=True)
    typer.echo(f"profile {path} removed")


@app.command("submit")
def submit(
    command: Annotated[str, typer.Argument(help="A JSON command, or - to read one per line.")],
) -> None:
    """Validate JSON commands and produce them to `commands`, keyed by job_id."""
    from confluent_kafka import Producer

    from streams.core.commands import Rejection, command_job_id, parse_command
    from streams.kafka import producer_config

    settings = _settings()
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
        raise _fail(f"could not deliver to Kafka at {settings.kafka}")
    if failed:
        raise typer.Exit(1)


@app.command("events")
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

    settings = _settings()
    try:
        since_ms = None if since is None else parse_time(since)
    except AuditError as exc:
        raise _fail(f"--from: {exc}", 2) from exc
    try:
        for event in read_events(settings, since_ms=since_ms, job_id=job, follow=follow):
            sys.stdout.write(to_json(event).decode() + "\n")
    except KeyboardInterrupt:
        pass


def _confinement(
    states: tuple[Path, ...], secrets_dir: Path | None, confine: bool
) -> Confinement | None:
    """How this worker hides its files from jobs of its own user, or None, said plainly
    (docs/security.md, "Jobs not as root")."""
    from connectors.remote import profile_path

    log = logging.getLogger("cronlog.worker")
    exposed = (
        "jobs run as this worker's own user and can read its state folder (journal, "
        "seals), secrets folder and every file of that user"
    )
    if not confine:
        log.warning("--no-confine: %s", exposed)
        return None
    hidden = [*states, profile_path().parent]
    if secrets_dir is not None:
        hidden.append(secrets_dir)
    for variable in ("CRONLOG_KAFKA_CONFIG", "CRONLOG_API_TOKENS_FILE"):
        if os.environ.get(variable):
            hidden.append(Path(os.environ[variable]))
    made = confinement(hidden)
    if isinstance(made, str):
        log.warning(
            "%s: %s; install bubblewrap, or start the worker as root with --run-as USER",
            made,
            exposed,
        )
        return None
    log.info("jobs run as this worker's own user, with %s hidden", ", ".join(made.hidden))
    return made


@app.command("worker")
def worker(
    worker_id: Annotated[str, typer.Option("--id", help="Stable id of this worker.")],
    cpu: Annotated[float, typer.Option(help="CPUs this worker offers.")] = 1.0,
    memory_mb: Annotated[int, typer.Option(help="Memory (MiB) this worker offers.")] = 1024,
    gpu: Annotated[int, typer.Option(help="GPUs this worker offers.")] = 0,
    label: Annotated[list[str] | None, typer.Option(help="A label k=v (repeatable).")] = None,
    executor: Annotated[str, typer.Option(help="process, or noop (benchmarks).")] = "process",
    heartbeat_s: Annotated[
        float,
        typer.Option(
            help=f"Heartbeat interval (s), at most {TIMING.ack_window_s:g}: the window in "
            "which a beat must be acknowledged to renew the lease."
        ),
    ] = TIMING.heartbeat_s,
    keep_s: Annotated[
        float,
        typer.Option(
            envvar="CRONLOG_WORKER_KEEP_S",
            min=0,
            help="Keep a finished run's directory and journal entry this long (s) after "
            "its report was acknowledged.",
        ),
    ] = 3600.0,
    run_as: Annotated[
        str | None,
        typer.Option(
            envvar="CRONLOG_WORKER_RUN_AS",
            help="Run every job as this user (name or uid), each in a directory it owns; "
            "needs root. A worker running as root requires it, or --allow-root.",
        ),
    ] = None,
    allow_root: Annotated[
        bool,
        typer.Option(
            "--allow-root",
            envvar="CRONLOG_WORKER_ALLOW_ROOT",
            help="Let jobs run as root (a worker started as root without --run-as).",
        ),
    ] = False,
    secrets_dir: Annotated[
        Path | None,
        typer.Option(
            envvar="CRONLOG_SECRETS_DIR",
            help="Files named after the secrets jobs reference (`env: {X: {secret: NAME}}`); "
            "else CRONLOG_SECRET_<NAME> in this worker's environment.",
        ),
    ] = None,
    state_dir: Annotated[
        Path | None,
        typer.Option(
            envvar="CRONLOG_WORKER_STATE_DIR",
            help="The worker's own folder (journal, leases, run directories); "
            "default: workers/ in CRONLOG_STATE_DIR.",
        ),
    ] = None,
    confine: Annotated[
        bool,
        typer.Option(
            envvar="CRONLOG_WORKER_CONFINE",
            help="Jobs that run as this worker's own user (no --run-as) get its state "
            "folder, secrets folder and credential files hidden, with bubblewrap (bwrap) "
            "where it is installed and allowed.",
        ),
    ] = True,
    loglevel: Annotated[str, typer.Option(help="Log level.")] = "info",
    log_format: LogFormatOption = None,
    metrics_port: MetricsPortOption = None,
) -> None:
    """A worker: advertises capacity, claims runs placed on it and executes them."""
    from connectors.worker.runas import RunAsError, choose
    from connectors.worker.worker import Worker, WorkerConfig
    from streams.core.placement import Capacity

    settings = _settings()
    try:
        jobs_as = choose(run_as, allow_root) if executor == "process" else None
    except RunAsError as exc:
        raise _fail(str(exc), 2) from exc
    if executor not in ("process", "noop"):
        raise _fail("--executor must be process or noop", 2)
    if cpu < 0 or memory_mb < 0 or gpu < 0:
        raise _fail("--cpu, --memory-mb and --gpu must not be negative", 2)
    if not 0 < heartbeat_s <= TIMING.ack_window_s:
        # Beats further apart leave moments no beat's window covers: a broker failover
        # would then end the lease and fence running jobs (streams/core/timing.py).
        raise _fail(f"--heartbeat-s must be in (0, {TIMING.ack_window_s:g}]", 2)
    if WORKER_ID.fullmatch(worker_id) is None:
        raise _fail(
            f"--id {worker_id!r} must be 1 to 150 letters, digits, '.', '_' or '-' "
            "(it names the worker's inbox topic)",
            2,
        )
    labels: list[tuple[str, str]] = []
    for item in label or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise _fail(f"--label must be k=v, got {item!r}", 2)
        labels.append((key, value))
    shared = Path(os.environ.get("CRONLOG_STATE_DIR") or StackPaths.default().state)
    state = state_dir or shared / "workers"
    _logging(loglevel, "worker", worker_id, log_format)
    from connectors.worker.procs import conceal

    # Its environment and memory (credentials, CRONLOG_SECRET_*) out of reach of jobs
    # that run as its own user; files in its state folder are not (docs/security.md).
    problem = conceal()
    if problem:
        logging.getLogger("cronlog.worker").warning("%s: jobs may read its environment", problem)
    confinement = None
    if executor == "process" and jobs_as is None and os.geteuid() != 0:
        confinement = _confinement((shared, state), secrets_dir, confine)
    config = WorkerConfig(
        worker_id,
        Capacity(cpu, memory_mb, gpu),
        tuple(sorted(labels)),
        "noop" if executor == "noop" else "process",
        state,
        heartbeat_s,
        keep_s=keep_s,
        secrets_dir=secrets_dir,
        run_as=jobs_as,
        confinement=confinement,
    )
    running = Worker(settings, config)
    port = _metrics_port(metrics_port)
    if port is not None:
        from streams.metrics import WORKER, MetricsServer

        MetricsServer(port, [WORKER], running.ready, running.alive).start()
    _stop_watchdog()
    signal.signal(signal.SIGTERM, lambda *_: running.stop())
    try:
        running.run()
    except KeyboardInterrupt:
        running.stop()
    except PermissionError as exc:  # a secured cluster that does not know this worker
        raise _fail(str(exc)) from None


@app.command("projector")
def projector(
    loglevel: Annotated[str, typer.Option(help="Log level.")] = "info",
    rebuild: Annotated[
        bool,
        typer.Option(
            "--rebuild",
            help="Replay the topics from the start into fresh tables, swap them in "
            "atomically, and exit (a running projector may stay up).",
        ),
    ] = False,
    keep_previous: Annotated[
        bool, typer.Option(help="With --rebuild: keep the old tables in <schema>_previous.")
    ] = False,
    log_format: LogFormatOption = None,
    metrics_port: MetricsPortOption = None,
) -> None:
    """Project run-events, jobs, heartbeats and run-logs into PostgreSQL, exactly once."""
    from projections.projector import Projector

    settings = _settings()
    _logging(loglevel, "projector", None, log_format)
    if rebuild:
        _rebuild(settings, keep_previous)
        return
    running = Projector(settings, retention=_retention())
    port = _metrics_port(metrics_port)
    if port is not None:
        from streams.metrics import PROJECTOR, MetricsServer

        MetricsServer(port, [PROJECTOR], running.ready).start()
    _stop_watchdog()
    signal.signal(signal.SIGTERM, lambda *_: running.stop())
    try:
        running.run()
    except KeyboardInterrupt:
        running.stop()
    except MigrationError as exc:  # another deployment's database, or a changed migration
        raise _fail(str(exc), 2) from exc


def _rebuild(settings: Settings, keep_previous: bool) -> None:
    from projections.rebuild import RebuildError
    from projections.rebuild import rebuild as run_rebuild

    last = [0.0]

    def progress(events: int) -> None:
        if time.monotonic() - last[0] > 2:
            last[0] = time.monotonic()
            typer.echo(f"rebuild: {events} records replayed", err=True)

    try:
        result = run_rebuild(
            settings, keep_previous=keep_previous, progress=progress, retention=_retention()
        )
    except (RebuildError, psycopg.Error) as exc:
        raise _fail(f"rebuild failed, the live projection is unchanged: {exc}", 2) from exc
    typer.echo(
        f"rebuilt schema {result.schema}: {result.events} records in {result.seconds:.1f} s"
        + (f"; the old tables are in schema {result.previous}" if result.previous else "")
    )


@app.command("notifier")
def notifier(
    routes: Annotated[
        Path | None,
        typer.Option(
            help="Per-owner webhooks (YAML: `owners: {team-a: {url: ..., on: [failed]}}`); "
            "CRONLOG_NOTIFY_ROUTES. Jobs name their own with `notify` in their spec.",
        ),
    ] = None,
    max_attempts: Annotated[
        int, typer.Option(min=1, max=100, help="Calls per notification before the DLQ.")
    ] = 6,
    backoff_s: Annotated[
        float, typer.Option(min=0.0, help="Wait before the first retry; doubles, at most 60 s.")
    ] = 1.0,
    timeout_s: Annotated[float, typer.Option(min=0.1, help="Per call.")] = 10.0,
    allow_destination: Annotated[
        list[str] | None,
        typer.Option(
            help="A network (10.20.0.0/16), address or host name webhooks may reach besides "
            "public addresses (repeatable; CRONLOG_NOTIFY_ALLOW, comma-separated). Loopback, "
            "link-local, private and multicast addresses are refused otherwise.",
        ),
    ] = None,
    loglevel: Annotated[str, typer.Option(help="Log level.")] = "info",
    log_format: LogFormatOption = None,
    metrics_port: MetricsPortOption = None,
) -> None:
    """Call webhooks when runs fail, are lost, are skipped or start late (at least once,
    with a stable delivery id; dead letters in notifications.dlq)."""
    from connectors.notifier import DeliveryPolicy, Notifier, RoutesError, load_routes
    from connectors.webhooks import Destinations

    settings = _settings()
    _logging(loglevel, "notifier", None, log_format)
    where = routes or os.environ.get("CRONLOG_NOTIFY_ROUTES") or None
    try:
        owner_routes = load_routes(where)
    except RoutesError as exc:
        raise _fail(str(exc), 2) from exc
    policy = DeliveryPolicy(max_attempts, backoff_s, max(60.0, backoff_s), timeout_s)
    allowed = [*(allow_destination or []), *os.environ.get("CRONLOG_NOTIFY_ALLOW", "").split(",")]
    try:
        destinations = Destinations.parse(allowed)
    except ValueError as exc:
        raise _fail(str(exc), 2) from exc
    running = Notifier(settings, owner_routes, policy, destinations=destinations)
    port = _metrics_port(metrics_port)
    if port is not None:
        from streams.metrics import NOTIFIER, MetricsServer

        MetricsServer(port, [NOTIFIER], running.ready).start()
    _stop_watchdog()
    signal.signal(signal.SIGTERM, lambda *_: running.stop())
    try:
        running.run()
    except KeyboardInterrupt:
        running.stop()


@app.command("api")
def api(
    host: Annotated[str, typer.Option(help="Listen address.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Listen port.")] = 8080,
    loglevel: Annotated[str, typer.Option(help="Log level.")] = "info",
    log_format: LogFormatOption = None,
) -> None:
    """The REST API (OpenAPI at /docs and /openapi.json). Tokens: CRONLOG_API_TOKENS_FILE,
    CRONLOG_API_TOKENS (token=owner,...), CRONLOG_API_ADMIN_TOKENS, CRONLOG_WORKER_TOKENS.
    A TLS proxy in front: CRONLOG_API_TRUSTED_PROXIES (its addresses, comma-separated;
    127.0.0.1 by default) so its X-Forwarded-For/-Proto are believed."""
    import uvicorn

    chosen = _logging(loglevel, "api", None, log_format)

    from connectors.api.app import create_app
    from connectors.api.auth import AuthConfigError, Tokens
    from connectors.api.limits import RateLimiter
    from connectors.api.service import Service
    from connectors.api.worker_gateway import WorkerGateway

    settings = _settings()
    try:
        tokens = Tokens.from_env()
        limiter = RateLimiter.from_env()
    except (AuthConfigError, ValueError) as exc:
        raise _fail(str(exc), 2) from exc
    try:
        migrate_for(settings)  # the API reads the projection tables: this deployment's
    except MigrationError as exc:
        raise _fail(str(exc), 2) from exc
    service = Service(settings)
    service.open()
    gateway = WorkerGateway(service)
    gateway.start()
    try:
        app = create_app(service, tokens, gateway, limiter)
        _stop_watchdog()  # uvicorn's handlers, installed in run, get wrapped
        # JSON: uvicorn's loggers go through the root handler set above, not its own.
        log_config = None if chosen == "json" else uvicorn.config.LOGGING_CONFIG
        # Forwarded headers (the client's address for the rate limits, https for the
        # cookies' Secure flag) are believed from these proxies only.
        proxies = os.environ.get("CRONLOG_API_TRUSTED_PROXIES", "127.0.0.1")
        uvicorn.run(
            app,
            host=host,
            port=port,
            log_level=loglevel,
            log_config=log_config,
            proxy_headers=True,
            forwarded_allow_ips=proxies,
        )
    finally:
        gateway.stop()
        service.close()


@app.command("audit")
def audit(
    since: Annotated[str | None, typer.Option("--from", help="ISO-8601 or epoch ms.")] = None,
    until: Annotated[str | None, typer.Option("--to", help="ISO-8601 or epoch ms.")] = None,
    job: Annotated[str | None, typer.Option(help="Only this job.")] = None,
) -> None:
    """Replay run-events and verify them; exit 1 on any violation, 2 on errors."""
    from connectors.audit.replay import AuditError, parse_time, run_audit

    settings = _settings()
    try:
        from_ms = parse_time(since) if since else None
        to_ms = parse_time(until) if until else None
    except AuditError as exc:
        raise _fail(str(exc), 2) from exc
    raise typer.Exit(run_audit(settings, from_ms, to_ms, job, sys.stdout))


@app.command("run")
def run_all(
    lead_s: Annotated[
        float, typer.Option(help="Propose runs this early (pre-dispatch).")
    ] = TIMING.lead_s,
    loglevel: Annotated[str, typer.Option(help="Log level of the components.")] = "info",
    api_port: Annotated[int, typer.Option(help="Port of the REST API.")] = 8080,
    demo: Annotated[
        Path | None, typer.Option(help="Jobs to register at start (YAML); default: the demo.")
    ] = DEMO,
    no_demo: Annotated[bool, typer.Option("--no-demo", help="Register no demo jobs.")] = False,
    no_stack: Annotated[
        bool,
        typer.Option("--no-stack", help="Use CRONLOG_KAFKA/CRONLOG_DATABASE_URL as they are."),
    ] = False,
    log_format: LogFormatOption = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port",
            help="Metrics of the components from this port on (CRONLOG_METRICS_PORT): the "
            "node P, its ledger P+1, the workers P+10 and P+11, the projector P+20, the "
            "notifier P+21.",
        ),
    ] = None,
) -> None:
    """Everything on one machine (for `make run`): the local stack, the topics, a
    scheduler node, two workers, the projector, the notifier and the API under one
    supervisor, and
    the demo jobs. Ctrl-C, SIGTERM or closing the terminal (SIGHUP) stops it all; no
    component outlives it. One per state folder."""
    from connectors.supervisor import Supervisor, components, register_demo, token_file
    from streams.lifecycle import InstanceRunning, hold_instance_lock, stop_timeout_s

    settings = _settings()
    try:  # the components' logs (each child reads it)
        os.environ["CRONLOG_LOG_FORMAT"] = chosen_log_format(log_format)
    except LogFormatError as exc:
        raise _fail(str(exc), 2) from None
    state = StackPaths.default(os.environ.get("CRONLOG_STATE_DIR")).state
    try:
        # Held until this process ends, however it ends: the kernel drops an flock
        # with its holder, so a SIGKILLed supervisor leaves no stale lock.
        lock = hold_instance_lock(state / "run.lock")
    except InstanceRunning as exc:
        pid = exc.pid if exc.pid is not None else "?"
        raise _fail(
            f"cronlog run is already running with the state folder {state} (pid {pid}); "
            f"stop it first: Ctrl-C in its terminal, or `kill {pid}` (it stops every "
            "component), or use another CRONLOG_STATE_DIR"
        ) from exc
    try:
        component_bound_s = stop_timeout_s()
    except ValueError as exc:
        raise _fail(str(exc), 2) from exc
    if not no_stack:
        try:
            _stack().up(_log)
        except StackError as exc:
            raise _fail(str(exc)) from exc
    try:
        ensure_topics(settings)
        migrate_for(settings)
    except (TopicError, MigrationError, psycopg.Error) as exc:
        raise _fail(str(exc), 2) from exc
    tokens = token_file(state)
    env = {
        **os.environ,
        "CRONLOG_KAFKA": settings.kafka,
        "CRONLOG_DATABASE_URL": settings.database_url,
        "CRONLOG_TOPIC_PREFIX": settings.topic_prefix,
        "CRONLOG_PARTITIONS": str(settings.partitions),
        "CRONLOG_API_TOKENS_FILE": str(tokens),
    }
    env.pop("CRONLOG_METRICS_PORT", None)  # each child is given its own port instead
    first_port = _metrics_port(metrics_port)
    # A component gets its own stop bound (its watchdog) plus 10 s before the SIGKILL of
    # its process group; the supervisor's own watchdog fires only after that escalation
    # and the 10 s it then waits (and if it ever fires, the components die with it).
    escalate_s = component_bound_s + 10
    supervisor = Supervisor(
        components(state, lead_s, api_port, loglevel, first_port),
        env,
        _log,
        stop_bound_s=escalate_s,
    )
    _stop_watchdog(extra_s=10 + 10 + 5)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # SIGHUP: terminal closed
        signal.signal(signum, supervisor.stop)

    def started() -> None:
        if not no_demo and demo is not None and demo.exists():
            count = register_demo(settings, demo, _log)
            _log(f"registered {count} demo jobs from {demo}")
        sql = "SELECT run_id, state, exit_code FROM runs ORDER BY scheduled_at DESC LIMIT 10"
        # The tokens stay in their file (mode 600), never on a terminal or in its scrollback.
        lines = [
            "",
            "cronlog runs. Where to look:",
            f"  API    http://127.0.0.1:{api_port}/docs  (tokens, admin and the demo owner's,"
            f" in {tokens}, mode 600)",
            f"         cronlog login --api http://127.0.0.1:{api_port}   (asks for a token)",
            '         curl -H "Authorization: Bearer $CRONLOG_TOKEN" '
            f"http://127.0.0.1:{api_port}/runs",
            "  CLI    cronlog runs list | cronlog jobs list | cronlog runs show RUN_ID",
            f'  SQL    psql "{settings.database_url}" -c "{sql}"',
            "  audit  cronlog audit",
            f"  logs   {state / 'logs'}",
            "Ctrl-C stops everything (Kafka and PostgreSQL stay up: cronlog stack down).",
        ]
        typer.echo("\n".join(lines), err=True)

    supervisor.run(started)
    lock.close()


def main() -> None:
    # Every node computes fire times from the same time zone database: the tzdata
    # package pinned with cronlog, not whatever the host has in /usr/share/zoneinfo.
    # Schedule maths load zones from the package themselves (streams.core.zones), in
    # every process, spawned children included; this covers any other ZoneInfo use.
    use_tzdata_only()
    app()


if __name__ == "__main__":
    main()
