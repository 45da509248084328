"""The long-running components, one command each: `cronlog scheduler` (a node),
`cronlog worker`, `cronlog projector` (and its `--rebuild`), `cronlog notifier` and
`cronlog api`. Each imports its component inside the command: those imports are heavy."""

from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path
from typing import Annotated

import psycopg
import typer

from connectors.cli.common import (
    LogFormatOption,
    MetricsPortOption,
    chosen_metrics_port,
    fail,
    load_settings,
    notify_destinations,
    retention_policy,
    start_logging,
    stop_watchdog,
)
from connectors.private_files import NotPrivate, private_dir
from connectors.stack import StackPaths
from connectors.worker.confine import Confinement, confinement
from projections.migrate import MigrationError, migrate_for
from streams.core.ledger import LedgerConfig
from streams.core.timing import TIMING
from streams.inboxes import WORKER_ID
from streams.lifecycle import space_out_full_collections
from streams.settings import Settings


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
            "takeover, deleted on exit), or 'memory' to keep them on the heap; made 0700, "
            "refused if another user's or writable by others. Default: "
            "CRONLOG_LEDGER_STORE, else ledger/ in CRONLOG_STATE_DIR (.state).",
        ),
    ] = None,
    loglevel: Annotated[str, typer.Option(help="Log level.")] = "info",
    log_format: LogFormatOption = None,
    metrics_port: MetricsPortOption = None,
) -> None:
    """A node: ingress, gate, ledger, scheduler and dispatcher. Run several for HA."""
    from streams.lifecycle import TRIM_ENV, malloc_trim_s
    from streams.node import run_node  # imported late: the loops' imports are heavy

    settings = load_settings()
    if not 0 <= lookahead_s < max_lead_s or lookahead_rate < 0 or not 0 <= lead_s < max_lead_s:
        raise fail(
            f"--lead-s and --lookahead-rate must not be negative, --lead-s and "
            f"--lookahead-s in [0, --max-lead-s = {max_lead_s:g})",
            2,
        )
    chosen = start_logging(loglevel, "scheduler", node_id, log_format)
    stop_watchdog()  # the node's handlers, installed later, get wrapped
    run_node(
        settings,
        node_id=node_id,
        lead_ms=int(lead_s * 1000),
        lookahead_ms=int(lookahead_s * 1000),
        lookahead_per_s=lookahead_rate,
        ledger_config=LedgerConfig(
            max_lead_ms=int(max_lead_s * 1000), secret_grants=settings.secret_grants
        ),
        loglevel=loglevel,
        store_dir=_ledger_store(state_store),
        log_format=chosen,
        metrics_port=chosen_metrics_port(metrics_port),
        ledgers=ledgers,
        malloc_trim_s=malloc_trim_s(os.environ.get(TRIM_ENV)),
    )


def _ledger_store(option: str | None) -> Path | None:
    """The ledger's store directory (None: on the heap), from --state-store or the env,
    else `ledger` in the node's state folder (CRONLOG_STATE_DIR, else .state). It holds
    every owner's job states: made 0700, and one that is another user's or writable by
    its group or others is refused (a fixed folder in /tmp, made first by another local
    user, would have received them)."""
    chosen = (option or os.environ.get("CRONLOG_LEDGER_STORE", "")).strip()
    if chosen == "memory":
        return None
    if chosen:
        store = Path(chosen)
    else:
        store = Path(os.environ.get("CRONLOG_STATE_DIR") or StackPaths.default().state) / "ledger"
    try:
        return private_dir(store, "the ledger's store (--state-store, CRONLOG_LEDGER_STORE)")
    except NotPrivate as exc:
        raise fail(str(exc), 2) from None
    except OSError as exc:
        raise fail(f"the ledger's store {store}: {exc}", 2) from None


def _confinement(
    states: tuple[Path, ...],
    secrets_dir: Path | None,
    confine: bool,
    run_as: tuple[int, int] | None = None,
) -> Confinement | None:
    """The sandbox of this worker's jobs (connectors/worker/confine.py), or None, said
    plainly (docs/security.md, "The job boundary"). Jobs of its own user need it to be
    kept from its files; jobs of another user (`run_as`) get it too where bubblewrap
    works for that user: a private /tmp and a PID namespace of their own."""
    from connectors.remote import profile_path

    log = logging.getLogger("cronlog.worker")
    exposed = (
        "jobs run as this worker's own user and can read its state folder (journal, "
        "seals), secrets folder and every file of that user"
    )
    shared = (
        "jobs are kept from this worker's files by permissions, but share /tmp and "
        "see (and may signal) each other's processes, all running as one user"
    )
    if run_as is not None and not confine:
        log.info("--no-confine: %s", shared)
        return None
    if not confine:
        log.warning("--no-confine: %s", exposed)
        return None
    hidden = [*states, profile_path().parent]
    if secrets_dir is not None:
        hidden.append(secrets_dir)
    for variable in ("CRONLOG_KAFKA_CONFIG", "CRONLOG_API_TOKENS_FILE"):
        if os.environ.get(variable):
            hidden.append(Path(os.environ[variable]))
    state = states[-1]
    state.mkdir(parents=True, exist_ok=True)  # the worker's runs are made in it
    # Jobs of another user are kept from the worker's files by their permissions: only
    # the private /tmp and PID namespace are theirs to get (covers of paths that user
    # may not reach, root's home say, could not even be made).
    made = confinement([] if run_as is not None else hidden, run_as=run_as, probe_in=state)
    if isinstance(made, str) and run_as is not None:
        log.warning("%s: %s", made, shared)
        return None
    if isinstance(made, str):
        log.warning(
            "%s: %s; install bubblewrap, or start the worker as root with --run-as USER",
            made,
            exposed,
        )
        return None
    if not made.own_pids:
        log.warning(
            "bubblewrap cannot give jobs a PID namespace here (no fresh /proc): jobs see "
            "(and may signal) the processes of this worker's user, this worker's included"
        )
    log.info(
        "jobs run under bubblewrap (own /tmp%s), with %s hidden",
        ", own PID namespace" if made.own_pids else "",
        ", ".join(made.hidden) or "nothing",
    )
    return made


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
    arm_ahead_s: Annotated[
        float,
        typer.Option(
            envvar="CRONLOG_WORKER_ARM_AHEAD_S",
            help="How far ahead (s) each acknowledged beat arms starts: a run starts only "
            "once a beat armed its start time. Of a worker lost for good, the runs due "
            "within this of its last beat fail `lost` (the rest run elsewhere); starts due "
            "during a broker failover longer than this wait for it. At least the "
            "heartbeat interval + 0.5, at most the lease - 1 (a shorter heartbeat "
            "allows a shorter horizon).",
        ),
    ] = TIMING.arm_ahead_s,
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
            "else CRONLOG_SECRET_<NAME> in this worker's environment. A job may use a "
            "secret only if CRONLOG_SECRETS_GRANTS grants it to the job's owner (read per run).",
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
            help="Jobs run under bubblewrap (bwrap) where it is installed and allowed: "
            "a private /tmp and PID namespace each, and, when they run as this worker's "
            "own user (no --run-as), its state folder, secrets folder and credential "
            "files hidden.",
        ),
    ] = True,
    output_cap_mb: Annotated[
        float,
        typer.Option(
            envvar="CRONLOG_WORKER_OUTPUT_CAP_MB",
            min=0,
            help="No file a job writes, its stdout and stderr included, grows past this "
            "(MiB, RLIMIT_FSIZE; 0: no cap); a run whose output reached it fails, "
            "saying so. The first 1 MiB of output is shipped whatever this is.",
        ),
    ] = 64.0,
    loglevel: Annotated[str, typer.Option(help="Log level.")] = "info",
    log_format: LogFormatOption = None,
    metrics_port: MetricsPortOption = None,
) -> None:
    """A worker: advertises capacity, claims runs placed on it and executes them."""
    from connectors.worker.runas import RunAsError, choose
    from connectors.worker.worker import Worker, WorkerConfig
    from streams.core.placement import Capacity

    settings = load_settings()
    try:
        jobs_as = choose(run_as, allow_root) if executor == "process" else None
    except RunAsError as exc:
        raise fail(str(exc), 2) from exc
    if executor not in ("process", "noop"):
        raise fail("--executor must be process or noop", 2)
    if cpu < 0 or memory_mb < 0 or gpu < 0:
        raise fail("--cpu, --memory-mb and --gpu must not be negative", 2)
    if not 0 < heartbeat_s <= TIMING.ack_window_s:
        # Beats further apart leave moments no beat's window covers: a broker failover
        # would then end the lease and fence running jobs (streams/core/timing.py).
        raise fail(f"--heartbeat-s must be in (0, {TIMING.ack_window_s:g}]", 2)
    if not heartbeat_s + 0.5 <= arm_ahead_s <= TIMING.lease_s - 1.0:
        # Closer than a beat and its acknowledgement, every start would wait for arming;
        # past the lease, arming tells the verdict nothing the lease does not.
        raise fail(
            f"--arm-ahead-s must be in [{heartbeat_s + 0.5:g}, {TIMING.lease_s - 1.0:g}] "
            "(the heartbeat interval + 0.5 s, the lease - 1 s)",
            2,
        )
    if WORKER_ID.fullmatch(worker_id) is None:
        raise fail(
            f"--id {worker_id!r} must be 1 to 150 letters, digits, '.', '_' or '-' "
            "(it names the worker's inbox topic)",
            2,
        )
    labels: list[tuple[str, str]] = []
    for item in label or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise fail(f"--label must be k=v, got {item!r}", 2)
        labels.append((key, value))
    shared = Path(os.environ.get("CRONLOG_STATE_DIR") or StackPaths.default().state)
    state = state_dir or shared / "workers"
    start_logging(loglevel, "worker", worker_id, log_format)
    from connectors.worker.procs import conceal

    # Its environment and memory (credentials, CRONLOG_SECRET_*) out of reach of jobs
    # that run as its own user; files in its state folder are not (docs/security.md).
    problem = conceal()
    if problem:
        logging.getLogger("cronlog.worker").warning("%s: jobs may read its environment", problem)
    confinement = None
    if executor == "process" and (jobs_as is not None or os.geteuid() != 0):
        ids = None if jobs_as is None else jobs_as.ids
        confinement = _confinement((shared, state), secrets_dir, confine, ids)
    config = WorkerConfig(
        worker_id,
        Capacity(cpu, memory_mb, gpu),
        tuple(sorted(labels)),
        "noop" if executor == "noop" else "process",
        state,
        heartbeat_s,
        keep_s=keep_s,
        arm_ahead_s=arm_ahead_s,
        secrets_dir=secrets_dir,
        run_as=jobs_as,
        confinement=confinement,
        output_cap_mb=output_cap_mb,
    )
    space_out_full_collections()  # a burst's held attempts, walked without pauses
    running = Worker(settings, config)
    port = chosen_metrics_port(metrics_port)
    if port is not None:
        from streams.metrics import WORKER, MetricsServer

        MetricsServer(port, [WORKER], running.ready, running.alive).start()
    stop_watchdog()
    signal.signal(signal.SIGTERM, lambda *_: running.stop())
    try:
        running.run()
    except KeyboardInterrupt:
        running.stop()
    except PermissionError as exc:  # a secured cluster that does not know this worker
        raise fail(str(exc)) from None


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

    settings = load_settings()
    start_logging(loglevel, "projector", None, log_format)
    if rebuild:
        _rebuild(settings, keep_previous)
        return
    running = Projector(settings, retention=retention_policy())
    port = chosen_metrics_port(metrics_port)
    if port is not None:
        from streams.metrics import PROJECTOR, MetricsServer

        MetricsServer(port, [PROJECTOR], running.ready).start()
    stop_watchdog()
    signal.signal(signal.SIGTERM, lambda *_: running.stop())
    try:
        running.run()
    except KeyboardInterrupt:
        running.stop()
    except MigrationError as exc:  # another deployment's database, or a changed migration
        raise fail(str(exc), 2) from exc


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
            settings, keep_previous=keep_previous, progress=progress, retention=retention_policy()
        )
    except (RebuildError, psycopg.Error) as exc:
        raise fail(f"rebuild failed, the live projection is unchanged: {exc}", 2) from exc
    typer.echo(
        f"rebuilt schema {result.schema}: {result.events} records in {result.seconds:.1f} s"
        + (f"; the old tables are in schema {result.previous}" if result.previous else "")
    )


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

    settings = load_settings()
    start_logging(loglevel, "notifier", None, log_format)
    where = routes or os.environ.get("CRONLOG_NOTIFY_ROUTES") or None
    try:
        owner_routes = load_routes(where)
    except RoutesError as exc:
        raise fail(str(exc), 2) from exc
    policy = DeliveryPolicy(max_attempts, backoff_s, max(60.0, backoff_s), timeout_s)
    allowed = [*(allow_destination or []), *os.environ.get("CRONLOG_NOTIFY_ALLOW", "").split(",")]
    try:
        destinations = Destinations.parse(allowed)
    except ValueError as exc:
        raise fail(str(exc), 2) from exc
    running = Notifier(settings, owner_routes, policy, destinations=destinations)
    port = chosen_metrics_port(metrics_port)
    if port is not None:
        from streams.metrics import NOTIFIER, MetricsServer

        MetricsServer(port, [NOTIFIER], running.ready).start()
    stop_watchdog()
    signal.signal(signal.SIGTERM, lambda *_: running.stop())
    try:
        running.run()
    except KeyboardInterrupt:
        running.stop()


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

    chosen = start_logging(loglevel, "api", None, log_format)

    from connectors.api.app import create_app
    from connectors.api.auth import AuthConfigError, TokenSource
    from connectors.api.limits import RateLimiter
    from connectors.api.quotas import OwnerQuotas
    from connectors.api.service import Service
    from connectors.api.worker_gateway import WorkerGateway

    settings = load_settings()
    try:
        tokens = TokenSource(os.environ)  # read again when its file changes
        limiter = RateLimiter.from_env(os.environ)
        quotas = OwnerQuotas.from_env(os.environ)
    except (AuthConfigError, ValueError) as exc:
        raise fail(str(exc), 2) from exc
    try:
        migrate_for(settings)  # the API reads the projection tables: this deployment's
    except MigrationError as exc:
        raise fail(str(exc), 2) from exc
    service = Service(settings, quotas=quotas, destinations=notify_destinations())
    service.open()
    gateway = WorkerGateway(service)
    gateway.start()
    try:
        app = create_app(service, tokens, gateway, limiter)
        stop_watchdog()  # uvicorn's handlers, installed in run, get wrapped
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
